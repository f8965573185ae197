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

SERVICE=kafka-broker
WHAT="the Kafka broker"
VERSION_LABEL="Kafka $KAFKA_VERSION"
ENDPOINT="$HOST:$PORT"
LOG_FILES=("$LOG_DIR/broker.out" "$LOG_DIR/server.log")
LOG_ERROR_RE='^\[[^]]*\] (ERROR|FATAL) '
PID_MARK="kafka.Kafka $CONFIG"
CDS_NAME=broker
PORT_SETTING=ZG_KAFKA_PORT
JAVA_ID_FILES=()
# shellcheck source=lib/java-service.sh
source "$HERE/lib/java-service.sh"

# True when a Kafka broker on the client port answers a Metadata request (v4: all topics, no auto-creation)
# and lists at least one live broker, i.e. it has caught up with the metadata log and is unfenced.
serves() {
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

format_storage() {
  [[ -f "$DATA_DIR/meta.properties" ]] && return 0
  local cluster_id
  # 16 random bytes, URL-safe base64 as Kafka writes them; an id starting with "-" would be read
  # as an option by the storage tool (Kafka's own generator redraws those too).
  cluster_id="-"
  while [[ "$cluster_id" == -* ]]; do
    cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
  done
  say "formatting $DATA_DIR (cluster id $cluster_id) ..."
  if ! "$JAVA" "${JVM_OPTS[@]}" -cp "$LIBS/*" kafka.tools.StorageTool format \
    --config "$CONFIG" --cluster-id "$cluster_id" --ignore-formatted >"$LOG_DIR/format.out" 2>&1; then
    cat "$LOG_DIR/format.out" >&2
    fail "kafka-storage format failed (output above)"
  fi
}
cmd_start() {
  start_unless_running "$PORT" "$CONTROLLER_PORT" && return 0
  find_java
  ensure_libs
  write_config
  jvm_opts
  format_storage
  launch "$LOG_DIR/broker.out" JVM_OPTS -cp "$LIBS/*" kafka.Kafka "$CONFIG"
}

java_service_main "$@"
