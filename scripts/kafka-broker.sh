#!/usr/bin/env bash
#
# A real single-node Apache Kafka broker (KRaft, one process acting as broker and controller) for local
# development and the test suites, run straight from the official org.apache.kafka Maven artifacts.
#
#   bash scripts/kafka-broker.sh start|stop|restart|status|reset|log
#
#   start    start the broker unless ours already runs; waits until it serves metadata (or fails
#            loudly with the tail of its log) and prints the bootstrap address as the last line
#            of stdout (host:port). Another process on the port is an error, not a broker to reuse.
#   stop     SIGTERM, wait, SIGKILL after ZG_KAFKA_STOP_TIMEOUT seconds; data is kept
#   restart  stop + start on the same data directory (what the outage tests do)
#   status   exit 0 when running and serving, 1 when running but not answering, 3 when stopped
#   reset    stop and delete the data directory (topics, offsets, cluster id)
#   log      print the tail of the broker log
#
# Several brokers can run side by side, each with its own ZG_KAFKA_DIR and ZG_KAFKA_PORT (a test that
# stops its broker to simulate an outage should use one of its own).
#
# Only Java 17+ and Maven are needed. The first start resolves the jars from Maven Central into
# ${ZG_CACHE_DIR:-~/.cache/zhiguang}/kafka-<version>/libs; later starts never touch the network.
# A class-data-sharing archive written at the first graceful stop makes later starts faster.
#
# Environment:
#   ZG_KAFKA_VERSION          Kafka version (default 4.2.2, the newest line @platformatic/kafka supports)
#   ZG_CACHE_DIR              jar cache root (default ~/.cache/zhiguang)
#   ZG_KAFKA_DIR              run directory: data, logs, config, pid file (default $ZG_CACHE_DIR/kafka-run)
#   ZG_KAFKA_PORT             client listener on 127.0.0.1 (default 19092)
#   ZG_KAFKA_CONTROLLER_PORT  KRaft controller listener on 127.0.0.1 (default client port + 1)
#   ZG_KAFKA_HEAP             JVM -Xmx (default 512m)
#   ZG_KAFKA_JAVA_OPTS        extra JVM options, split on spaces
#   ZG_KAFKA_START_TIMEOUT    seconds to wait for readiness (default 60)
#   ZG_KAFKA_STOP_TIMEOUT     seconds to wait after SIGTERM before SIGKILL (default 30)
#
# Broker settings worth knowing (see write_config below):
#   auto.create.topics.enable=false  topics exist only when created explicitly (the event log's
#                                    ensureTopics does it), so a forgotten creation fails in tests too
#   delete.topic.enable=true, num.partitions=1, every replication factor / min ISR = 1,
#   group.initial.rebalance.delay.ms=0, group.min.session.timeout.ms=1000 (short test sessions allowed),
#   offsets.topic.num.partitions=5 (the first consumer group starts quickly).
set -euo pipefail

KAFKA_VERSION="${ZG_KAFKA_VERSION:-4.2.2}"
CACHE_DIR="${ZG_CACHE_DIR:-$HOME/.cache/zhiguang}"
LIBS="$CACHE_DIR/kafka-$KAFKA_VERSION/libs"
RUN_DIR="${ZG_KAFKA_DIR:-$CACHE_DIR/kafka-run}"
DATA_DIR="$RUN_DIR/data"
LOG_DIR="$RUN_DIR/logs"
CONFIG="$RUN_DIR/server.properties"
PID_FILE="$RUN_DIR/broker.pid"
HOST=127.0.0.1
PORT="${ZG_KAFKA_PORT:-19092}"
CONTROLLER_PORT="${ZG_KAFKA_CONTROLLER_PORT:-$((PORT + 1))}"
HEAP="${ZG_KAFKA_HEAP:-512m}"
START_TIMEOUT="${ZG_KAFKA_START_TIMEOUT:-60}"
STOP_TIMEOUT="${ZG_KAFKA_STOP_TIMEOUT:-30}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOG4J_CONFIG="$HERE/kafka/log4j2.properties"
POM="$HERE/kafka/pom.xml"

say() { printf 'kafka-broker: %s\n' "$*"; }
fail() {
  printf '\nkafka-broker: ERROR: %s\n\n' "$*" >&2
  exit 1
}

# Sizes of the log files when this start launched the broker: only what it wrote since then is shown.
declare -A LOG_MARK=()
mark_logs() {
  local f
  for f in "$LOG_DIR/broker.out" "$LOG_DIR/server.log"; do
    LOG_MARK[$f]="$(stat -c %s "$f" 2>/dev/null || echo 0)"
  done
}

show_log_tail() {
  local f mark text errors
  for f in "$LOG_DIR/broker.out" "$LOG_DIR/server.log"; do
    [[ -s "$f" ]] || continue
    mark="${LOG_MARK[$f]:-0}"
    ((mark <= $(stat -c %s "$f"))) || mark=0 # rolled over since
    text="$(tail -c "+$((mark + 1))" "$f")"
    [[ -n "${text//[[:space:]]/}" ]] || continue
    errors="$(grep -E '^\[[^]]*\] (ERROR|FATAL) ' <<<"$text" | tail -n 10 || true)"
    if [[ -n "$errors" && ${#LOG_MARK[@]} -gt 0 ]]; then
      printf '\n----- errors in %s -----\n%s\n' "$f" "$errors" >&2
    fi
    printf '\n----- last lines of %s -----\n' "$f" >&2
    tail -n "${1:-40}" <<<"$text" >&2
  done
  printf -- '-----\n' >&2
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_open() {
  timeout 3 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
}

# True when a Kafka broker on the client port answers a Metadata request (v4: all topics, no auto-creation)
# and lists at least one live broker, i.e. it has caught up with the metadata log and is unfenced.
serves_metadata() {
  local bytes
  # size=23 | api_key=3 | api_version=4 | correlation_id=1 | client_id="zg-probe" | topics=null | auto_create=false
  bytes=$(timeout 4 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "\x00\x00\x00\x17\x00\x03\x00\x04\x00\x00\x00\x01\x00\x08zg-probe\xff\xff\xff\xff\x00" >&3
    head -c 16 <&3 | od -An -v -tu1
  ' "$HOST" "$PORT" 2>/dev/null) || return 1
  # response: size(4) correlation_id(4) throttle_time_ms(4) broker_count(4)
  set -- $bytes
  (($# == 16)) || return 1
  (((${13} << 24 | ${14} << 16 | ${15} << 8 | ${16}) >= 1))
}

# True while process $1 exists and is not a zombie (a broker started by this very shell is its child).
alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [[ "${stat:0:1}" != Z ]]
}

# Prints the pid of our broker when its process is alive; removes a stale pid file.
our_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  if [[ "$pid" =~ ^[0-9]+$ ]] && [[ -r "/proc/$pid/cmdline" ]] &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "kafka.Kafka $CONFIG"; then
    echo "$pid"
    return 0
  fi
  rm -f "$PID_FILE"
  return 1
}

JAVA=
JAVA_ID=
find_java() {
  JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$JAVA" >/dev/null 2>&1 || fail "java not found (install a JDK 17+ or set JAVA_HOME)"
  local out v
  out="$("$JAVA" -version 2>&1)"
  v="$(sed -n 's/.*version "\([0-9]*\).*/\1/p' <<<"$out" | head -n 1)"
  [[ -n "$v" && "$v" -ge 17 ]] || fail "Kafka $KAFKA_VERSION needs Java 17 or newer; $JAVA is version '${v:-unknown}'"
  # Identifies the JDK build, its own class-data archive and the Kafka version (see cds_opts).
  local bin
  bin="$(readlink -f "$(command -v "$JAVA")")"
  JAVA_ID="$(
    printf '%s\n%s\n%s\n' "$bin" "$out" "$KAFKA_VERSION"
    stat -c '%s %Y' "$(dirname "$bin")"/../lib/server/classes*.jsa 2>/dev/null || true
  )"
  JAVA_ID="$(cksum <<<"$JAVA_ID" | cut -d' ' -f1)"
}

ensure_libs() {
  [[ -f "$LIBS/.complete" ]] && return 0
  command -v mvn >/dev/null 2>&1 || fail "the Kafka $KAFKA_VERSION jars are not cached in $LIBS and mvn is not installed"
  say "resolving Apache Kafka $KAFKA_VERSION from Maven Central into $LIBS (first run only) ..."
  mkdir -p "$(dirname "$LIBS")"
  local work
  work="$(mktemp -d "$(dirname "$LIBS")/.download.XXXXXX")"
  cp "$POM" "$work/pom.xml"
  if ! (cd "$work" && mvn -B -q -Dstyle.color=never -f pom.xml \
    -Dkafka.version="$KAFKA_VERSION" -DincludeScope=runtime -DoutputDirectory="$work/libs" \
    dependency:copy-dependencies >"$work/mvn.log" 2>&1); then
    cat "$work/mvn.log" >&2
    rm -rf "$work"
    fail "could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION with Maven (output above)"
  fi
  ls "$work/libs"/kafka_2.13-*.jar >/dev/null 2>&1 || fail "Maven finished but $work/libs has no kafka_2.13 jar"
  touch "$work/libs/.complete"
  if [[ -f "$LIBS/.complete" ]]; then
    rm -rf "$work" # someone else finished first
  else
    rm -rf "$LIBS"
    mv "$work/libs" "$LIBS"
    rm -rf "$work"
  fi
  say "cached $(find "$LIBS" -name '*.jar' | wc -l) jars"
}

write_config() {
  mkdir -p "$DATA_DIR" "$LOG_DIR"
  cat >"$CONFIG.tmp" <<EOF
# Written by scripts/kafka-broker.sh on every start; edit the script, not this file.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$DATA_DIR

auto.create.topics.enable=false
delete.topic.enable=true
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=5
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=5
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000

num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
background.threads=4
log.retention.hours=24
log.segment.bytes=67108864
log.cleaner.threads=1
log.cleaner.dedupe.buffer.size=8388608
EOF
  mv "$CONFIG.tmp" "$CONFIG"
}

JVM_OPTS=()
jvm_opts() {
  JVM_OPTS=(
    "-Xms128m" "-Xmx$HEAP"
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent
    -XX:+ExitOnOutOfMemoryError -XX:-OmitStackTraceInFastThrow
    -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$LOG4J_CONFIG" -Dlog4j2.shutdownHookEnabled=false "-Dkafka.logs.dir=$LOG_DIR"
  )
  if [[ -n "${ZG_KAFKA_JAVA_OPTS:-}" ]]; then
    local extra
    read -r -a extra <<<"$ZG_KAFKA_JAVA_OPTS"
    JVM_OPTS+=("${extra[@]}")
  fi
}

# Class-data sharing: the first broker run of a JDK + Kafka pair dumps the classes it loaded into an
# archive when it stops gracefully; later starts map it and come up about a second faster. A missing,
# stale or foreign archive only costs that second (the JVM then runs without it).
cds_opts() {
  local jsa="$RUN_DIR/broker-$JAVA_ID.jsa"
  rm -f "$RUN_DIR/cds-pending"
  if [[ -f "$jsa" ]]; then
    echo "-XX:SharedArchiveFile=$jsa" -Xlog:cds*=error
  else
    rm -f "$RUN_DIR"/broker-*.jsa "$RUN_DIR"/broker-*.jsa.new
    echo "$jsa" >"$RUN_DIR/cds-pending"
    echo "-XX:ArchiveClassesAtExit=$jsa.new" -Xlog:cds*=error
  fi
}

# After a graceful exit, keeps the archive the broker dumped; after a kill, drops what it left.
cds_finish() {
  [[ -f "$RUN_DIR/cds-pending" ]] || return 0
  local jsa
  jsa="$(cat "$RUN_DIR/cds-pending")"
  rm -f "$RUN_DIR/cds-pending"
  if [[ "$1" == graceful && -s "$jsa.new" ]]; then
    mv -f "$jsa.new" "$jsa"
  else
    rm -f "$jsa.new"
  fi
}

format_storage() {
  [[ -f "$DATA_DIR/meta.properties" ]] && return 0
  local cluster_id
  cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
  say "formatting $DATA_DIR (cluster id $cluster_id) ..."
  if ! "$JAVA" "${JVM_OPTS[@]}" -cp "$LIBS/*" kafka.tools.StorageTool format \
    --config "$CONFIG" --cluster-id "$cluster_id" --ignore-formatted >"$LOG_DIR/format.out" 2>&1; then
    cat "$LOG_DIR/format.out" >&2
    fail "kafka-storage format failed (output above)"
  fi
}

# Waits for $1 to serve metadata; on timeout or death prints the log tail, stops it and fails.
wait_ready() {
  local pid="$1" started="$SECONDS"
  while ((SECONDS - started < START_TIMEOUT)); do
    if ! alive "$pid"; then
      rm -f "$PID_FILE"
      show_log_tail 60
      fail "the Kafka broker (pid $pid) exited during startup; logs in $LOG_DIR" \
        "(a damaged data directory is wiped by: bash $0 reset)"
    fi
    if serves_metadata; then
      return 0
    fi
    sleep 0.2
  done
  show_log_tail 60
  kill_broker "$pid"
  fail "the Kafka broker did not serve metadata on $HOST:$PORT within ${START_TIMEOUT}s; stopped it (logs in $LOG_DIR)"
}

kill_broker() {
  local pid="$1" started="$SECONDS" how=graceful
  kill -TERM "$pid" 2>/dev/null || true
  while alive "$pid"; do
    if ((SECONDS - started >= STOP_TIMEOUT)); then
      say "broker (pid $pid) still running after ${STOP_TIMEOUT}s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      how=killed
      while alive "$pid"; do sleep 0.1; done
      break
    fi
    sleep 0.1
  done
  rm -f "$PID_FILE"
  cds_finish "$how"
}

# Serialises start/stop/restart on one run directory (held until the script exits).
LOCKED=
lock() {
  [[ -z "$LOCKED" ]] || return 0
  mkdir -p "$RUN_DIR"
  exec 9>"$RUN_DIR/.lock"
  flock -w $((START_TIMEOUT + STOP_TIMEOUT + 600)) 9 || fail "could not lock $RUN_DIR/.lock"
  LOCKED=1
}

cmd_start() {
  lock
  local pid
  if pid="$(our_pid)"; then
    wait_ready "$pid"
    say "already running (pid $pid)"
    echo "$HOST:$PORT"
    return 0
  fi
  if port_open "$PORT" || port_open "$CONTROLLER_PORT"; then
    fail "port $PORT or $CONTROLLER_PORT on $HOST is taken by another process (not our broker in $RUN_DIR); stop it or set ZG_KAFKA_PORT"
  fi
  find_java
  ensure_libs
  write_config
  jvm_opts
  format_storage
  local t0="$SECONDS"
  mark_logs
  printf '\n===== %s starting Kafka %s =====\n' "$(date -Is)" "$KAFKA_VERSION" >>"$LOG_DIR/broker.out"
  # setsid: the broker outlives the shell (and the test runner) that started it; it gets no terminal
  # output and not the lock descriptor.
  local cds
  read -r -a cds <<<"$(cds_opts)"
  (exec setsid "$JAVA" "${JVM_OPTS[@]}" "${cds[@]}" -cp "$LIBS/*" kafka.Kafka "$CONFIG" </dev/null >>"$LOG_DIR/broker.out" 2>&1 9>&-) &
  pid=$!
  echo "$pid" >"$PID_FILE"
  wait_ready "$pid"
  say "Kafka $KAFKA_VERSION ready in $((SECONDS - t0))s (pid $pid, data $DATA_DIR, logs $LOG_DIR)"
  echo "$HOST:$PORT"
}

cmd_stop() {
  lock
  local pid
  if ! pid="$(our_pid)"; then
    say "not running"
    return 0
  fi
  kill_broker "$pid"
  say "stopped (pid $pid)"
}

cmd_status() {
  local pid
  if ! pid="$(our_pid)"; then
    say "not running"
    return 3
  fi
  if serves_metadata; then
    say "running (pid $pid) on $HOST:$PORT, Kafka $KAFKA_VERSION, data $DATA_DIR"
    return 0
  fi
  say "process $pid is alive but does not serve metadata on $HOST:$PORT"
  return 1
}

cmd_reset() {
  cmd_stop
  rm -rf "$DATA_DIR"
  say "deleted $DATA_DIR"
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
restart)
  cmd_stop
  cmd_start
  ;;
status) cmd_status ;;
reset) cmd_reset ;;
log) show_log_tail "${2:-80}" 2>&1 ;;
*)
  echo "usage: $0 start|stop|restart|status|reset|log [lines]" >&2
  exit 2
  ;;
esac
