#!/usr/bin/env bash
#
# A real S3-compatible server (Adobe S3Mock, a Spring Boot application from Maven Central) for local
# development and the test suites. Plain HTTP, path-style addressing, any credentials accepted.
#
#   bash scripts/s3-server.sh start|stop|restart|status|reset|log
#
#   start    start the server unless ours already runs; waits until it answers ListBuckets (or fails
#            loudly with the tail of its log) and prints the endpoint as the last line of stdout
#            (http://127.0.0.1:<port>). Another process on the port is an error, not a server to reuse.
#   stop     SIGTERM, wait, SIGKILL after ZG_S3MOCK_STOP_TIMEOUT seconds; buckets and objects are kept
#   restart  stop + start on the same data directory
#   status   exit 0 when running and answering, 1 when running but not answering, 3 when stopped
#   reset    stop and delete the data directory (every bucket and object)
#   log      print the tail of the server log
#
# What S3Mock does NOT do: it checks no signature at all (a presigned URL with a wrong Content-Type,
# a tampered signature or a past expiry is accepted), and it keeps no access policies. Tests of those
# rules need a real S3 or another signature-checking server.
#
# Loopback only: S3Mock adds its plain-HTTP connector without an address, which Tomcat binds on every
# interface. This script therefore runs S3Mock with TLS off on its main connector (server.port bound to
# server.address=127.0.0.1, the endpoint printed) and adds a small customizer (compiled once from the
# source below) that binds that extra connector to 127.0.0.1 as well, on an ephemeral port nobody uses.
#
# Only Java 17+ (with javac) and Maven are needed. The first start resolves the executable jar from
# Maven Central into ${ZG_CACHE_DIR:-~/.cache/zhiguang}/s3mock-<version> and unpacks it there; later
# starts never touch the network. A class-data-sharing archive written at the first graceful stop makes
# later starts faster.
#
# Environment:
#   ZG_S3MOCK_VERSION        S3Mock version (default 4.7.0, the newest line that runs on Java 17)
#   ZG_CACHE_DIR             jar cache root (default ~/.cache/zhiguang)
#   ZG_S3MOCK_DIR            run directory: data, logs, pid file (default $ZG_CACHE_DIR/s3mock-run)
#   ZG_S3MOCK_PORT           HTTP port on 127.0.0.1 (default 19090)
#   ZG_S3MOCK_REGION         region the server reports (default us-east-1)
#   ZG_S3MOCK_BUCKETS        comma-separated buckets created at start when missing (default zhiguang)
#   ZG_S3MOCK_HEAP           JVM -Xmx (default 256m)
#   ZG_S3MOCK_JAVA_OPTS      extra JVM options, split on spaces
#   ZG_S3MOCK_START_TIMEOUT  seconds to wait for readiness (default 90)
#   ZG_S3MOCK_STOP_TIMEOUT   seconds to wait after SIGTERM before SIGKILL (default 30)
set -euo pipefail

S3MOCK_VERSION="${ZG_S3MOCK_VERSION:-4.7.0}"
CACHE_DIR="${ZG_CACHE_DIR:-$HOME/.cache/zhiguang}"
DIST="$CACHE_DIR/s3mock-$S3MOCK_VERSION"
APP_JAR="$DIST/app/s3mock-$S3MOCK_VERSION-exec.jar"
LOOPBACK_JAR="$DIST/app/zg-loopback-connectors.jar"
RUN_DIR="${ZG_S3MOCK_DIR:-$CACHE_DIR/s3mock-run}"
DATA_DIR="$RUN_DIR/data"
LOG_DIR="$RUN_DIR/logs"
PID_FILE="$RUN_DIR/s3mock.pid"
HOST=127.0.0.1
PORT="${ZG_S3MOCK_PORT:-19090}"
REGION="${ZG_S3MOCK_REGION:-us-east-1}"
BUCKETS="${ZG_S3MOCK_BUCKETS-zhiguang}"
HEAP="${ZG_S3MOCK_HEAP:-256m}"
START_TIMEOUT="${ZG_S3MOCK_START_TIMEOUT:-90}"
STOP_TIMEOUT="${ZG_S3MOCK_STOP_TIMEOUT:-30}"
MAIN_CLASS=com.adobe.testing.s3mock.S3MockApplication

say() { printf 's3-server: %s\n' "$*"; }
fail() {
  printf '\ns3-server: ERROR: %s\n\n' "$*" >&2
  exit 1
}

# Sizes of the log files when this start launched the server: only what it wrote since then is shown.
declare -A LOG_MARK=()
mark_logs() {
  local f
  for f in "$LOG_DIR/s3mock.out" "$LOG_DIR/s3mock.log"; do
    LOG_MARK[$f]="$(stat -c %s "$f" 2>/dev/null || echo 0)"
  done
}

show_log_tail() {
  local f mark text errors
  for f in "$LOG_DIR/s3mock.out" "$LOG_DIR/s3mock.log"; do
    [[ -s "$f" ]] || continue
    mark="${LOG_MARK[$f]:-0}"
    ((mark <= $(stat -c %s "$f"))) || mark=0 # rolled over since
    text="$(tail -c "+$((mark + 1))" "$f")"
    [[ -n "${text//[[:space:]]/}" ]] || continue
    errors="$(grep -E '^[0-9TZ:.+-]+ +(ERROR|FATAL) ' <<<"$text" | tail -n 10 || true)"
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

# True when the port answers an S3 ListBuckets (GET /) with 200 and the S3 XML body: a server that
# merely accepts connections (Tomcat is up before the application is) does not count.
serves_s3() {
  local response
  response="$(timeout 4 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "GET / HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n" "$0" "$1" >&3
    head -c 4096 <&3
  ' "$HOST" "$PORT" 2>/dev/null)" || return 1
  [[ "$response" == "HTTP/1.1 200"* && "$response" == *ListAllMyBucketsResult* ]]
}

# True while process $1 exists and is not a zombie (a server started by this very shell is its child).
alive() {
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
  stat="${stat##*) }"
  [[ "${stat:0:1}" != Z ]]
}

# Prints the pid of our server when its process is alive; removes a stale pid file.
our_pid() {
  [[ -f "$PID_FILE" ]] || return 1
  local pid
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  if [[ "$pid" =~ ^[0-9]+$ ]] && [[ -r "/proc/$pid/cmdline" ]] &&
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$MAIN_CLASS --zg.run-dir=$RUN_DIR "; then
    echo "$pid"
    return 0
  fi
  rm -f "$PID_FILE"
  return 1
}

JAVA=
JAVAC=
JAVA_ID=
find_java() {
  JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  JAVAC="${JAVA_HOME:+$JAVA_HOME/bin/}javac"
  command -v "$JAVA" >/dev/null 2>&1 || fail "java not found (install a JDK 17+ or set JAVA_HOME)"
  local out v
  out="$("$JAVA" -version 2>&1)"
  v="$(sed -n 's/.*version "\([0-9]*\).*/\1/p' <<<"$out" | head -n 1)"
  [[ -n "$v" && "$v" -ge 17 ]] || fail "S3Mock $S3MOCK_VERSION needs Java 17 or newer; $JAVA is version '${v:-unknown}'"
  # Identifies the JDK build, its own class-data archive and the S3Mock version (see cds_opts).
  local bin
  bin="$(readlink -f "$(command -v "$JAVA")")"
  JAVA_ID="$(
    printf '%s\n%s\n%s\n' "$bin" "$out" "$S3MOCK_VERSION"
    stat -c '%s %Y' "$(dirname "$bin")"/../lib/server/classes*.jsa "$LOOPBACK_JAR" 2>/dev/null || true
  )"
  JAVA_ID="$(cksum <<<"$JAVA_ID" | cut -d' ' -f1)"
}

# Binds the connectors S3Mock adds itself (its plain-HTTP one) to the main connector's address, which
# Spring Boot sets from server.address; customizers run after S3Mock's factory method added them and
# before Tomcat binds anything.
write_loopback_source() {
  mkdir -p "$1/dev/zhiguang/s3mock"
  cat >"$1/dev/zhiguang/s3mock/LoopbackConnectors.java" <<'EOF'
package dev.zhiguang.s3mock;

import java.net.InetAddress;
import org.apache.catalina.connector.Connector;
import org.springframework.boot.web.embedded.tomcat.TomcatServletWebServerFactory;
import org.springframework.boot.web.server.WebServerFactoryCustomizer;

public class LoopbackConnectors implements WebServerFactoryCustomizer<TomcatServletWebServerFactory> {
  @Override
  public void customize(TomcatServletWebServerFactory factory) {
    InetAddress address = factory.getAddress();
    if (address == null) throw new IllegalStateException("server.address must be set");
    for (Connector connector : factory.getAdditionalTomcatConnectors()) {
      if (!connector.setProperty("address", address.getHostAddress())) {
        throw new IllegalStateException("cannot bind " + connector + " to " + address.getHostAddress());
      }
    }
  }
}
EOF
}

# Fetches the executable jar, unpacks it (a plain class path starts faster than the nested-jar launcher
# and is what class-data sharing needs) and compiles the loopback customizer next to it.
ensure_dist() {
  [[ -f "$DIST/.complete" ]] && return 0
  command -v mvn >/dev/null 2>&1 || fail "S3Mock $S3MOCK_VERSION is not cached in $DIST and mvn is not installed"
  command -v "$JAVAC" >/dev/null 2>&1 || fail "javac not found (S3Mock needs a small customizer compiled; install a JDK, not a JRE)"
  say "resolving com.adobe.testing:s3mock:$S3MOCK_VERSION:exec from Maven Central into $DIST (first run only) ..."
  mkdir -p "$CACHE_DIR"
  local work jar
  work="$(mktemp -d "$CACHE_DIR/.s3mock-download.XXXXXX")"
  # Run where no pom.xml can be picked up: dependency:copy needs no project.
  if ! (cd "$work" && mvn -B -q -Dstyle.color=never \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy \
    -Dartifact="com.adobe.testing:s3mock:$S3MOCK_VERSION:jar:exec" -DoutputDirectory="$work" \
    >"$work/mvn.log" 2>&1); then
    cat "$work/mvn.log" >&2
    rm -rf "$work"
    fail "could not resolve com.adobe.testing:s3mock:$S3MOCK_VERSION:jar:exec with Maven (output above)"
  fi
  jar="$work/s3mock-$S3MOCK_VERSION-exec.jar"
  [[ -f "$jar" ]] || fail "Maven finished but $work has no s3mock-$S3MOCK_VERSION-exec.jar"
  if ! "$JAVA" -Djarmode=tools -jar "$jar" extract --destination "$work/app" >"$work/extract.log" 2>&1; then
    cat "$work/extract.log" >&2
    rm -rf "$work"
    fail "could not unpack $jar (output above)"
  fi
  write_loopback_source "$work/src"
  # Class-data sharing accepts jars only on the class path, hence the jar rather than a directory.
  if ! { "$JAVAC" -nowarn -proc:none --release 17 -cp "$work/app/lib/*" -d "$work/classes" \
    "$work/src/dev/zhiguang/s3mock/LoopbackConnectors.java" &&
    "${JAVAC%javac}jar" cf "$work/app/$(basename "$LOOPBACK_JAR")" -C "$work/classes" .; } >"$work/javac.log" 2>&1; then
    cat "$work/javac.log" >&2
    rm -rf "$work"
    fail "could not build the loopback customizer against S3Mock $S3MOCK_VERSION (output above)"
  fi
  rm -rf "$work/classes" "$work/src" "$work"/*.log
  touch "$work/.complete"
  if [[ -f "$DIST/.complete" ]]; then
    rm -rf "$work" # someone else finished first
  else
    rm -rf "$DIST"
    mv "$work" "$DIST"
  fi
  say "cached S3Mock $S3MOCK_VERSION ($(find "$DIST/app/lib" -name '*.jar' | wc -l) jars)"
}

JVM_OPTS=()
jvm_opts() {
  # A test server: C1 only and the serial collector start faster and use less memory on small machines.
  JVM_OPTS=(
    "-Xms64m" "-Xmx$HEAP" -XX:+UseSerialGC -XX:TieredStopAtLevel=1
    -XX:+ExitOnOutOfMemoryError -XX:-OmitStackTraceInFastThrow -Djava.awt.headless=true
  )
  if [[ -n "${ZG_S3MOCK_JAVA_OPTS:-}" ]]; then
    local extra
    read -r -a extra <<<"$ZG_S3MOCK_JAVA_OPTS"
    JVM_OPTS+=("${extra[@]}")
  fi
}

# Class-data sharing: the first run of a JDK + S3Mock pair dumps the classes it loaded into an archive
# when it stops gracefully; later starts map it. A missing, stale or foreign archive only costs that
# time (the JVM then runs without it).
cds_opts() {
  local jsa="$RUN_DIR/s3mock-$JAVA_ID.jsa"
  rm -f "$RUN_DIR/cds-pending"
  if [[ -f "$jsa" ]]; then
    echo "-XX:SharedArchiveFile=$jsa" -Xlog:cds*=error
  else
    rm -f "$RUN_DIR"/s3mock-*.jsa "$RUN_DIR"/s3mock-*.jsa.new
    echo "$jsa" >"$RUN_DIR/cds-pending"
    echo "-XX:ArchiveClassesAtExit=$jsa.new" -Xlog:cds*=error
  fi
}

# After a graceful exit, keeps the archive the server dumped; after a kill, drops what it left.
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

APP_ARGS=()
app_args() {
  # --zg.run-dir is ignored by S3Mock; it marks the process as ours (see our_pid).
  APP_ARGS=(
    "--zg.run-dir=$RUN_DIR"
    --spring.main.sources=dev.zhiguang.s3mock.LoopbackConnectors
    --spring.main.banner-mode=off
    "--server.address=$HOST" "--server.port=$PORT" --server.ssl.enabled=false
    --com.adobe.testing.s3mock.http-port=0
    "--com.adobe.testing.s3mock.store.root=$DATA_DIR"
    --com.adobe.testing.s3mock.store.retain-files-on-exit=true
    "--com.adobe.testing.s3mock.store.region=$REGION"
    "--logging.file.name=$LOG_DIR/s3mock.log"
    --logging.logback.rollingpolicy.max-file-size=20MB --logging.logback.rollingpolicy.max-history=3
    --logging.threshold.console=OFF
  )
  [[ -z "$BUCKETS" ]] || APP_ARGS+=("--com.adobe.testing.s3mock.store.initial-buckets=$BUCKETS")
}

# Waits for $1 to answer S3 requests; on timeout or death prints the log tail, stops it and fails.
wait_ready() {
  local pid="$1" started="$SECONDS"
  while ((SECONDS - started < START_TIMEOUT)); do
    if ! alive "$pid"; then
      rm -f "$PID_FILE"
      cds_finish killed
      show_log_tail 60
      fail "S3Mock (pid $pid) exited during startup; logs in $LOG_DIR" \
        "(a damaged data directory is wiped by: bash $0 reset)"
    fi
    if serves_s3; then
      return 0
    fi
    sleep 0.2
  done
  show_log_tail 60
  kill_server "$pid"
  fail "S3Mock did not answer on http://$HOST:$PORT within ${START_TIMEOUT}s; stopped it (logs in $LOG_DIR)"
}

kill_server() {
  local pid="$1" started="$SECONDS" how=graceful
  kill -TERM "$pid" 2>/dev/null || true
  while alive "$pid"; do
    if ((SECONDS - started >= STOP_TIMEOUT)); then
      say "S3Mock (pid $pid) still running after ${STOP_TIMEOUT}s; sending SIGKILL"
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
    echo "http://$HOST:$PORT"
    return 0
  fi
  if port_open "$PORT"; then
    fail "port $PORT on $HOST is taken by another process (not our S3Mock in $RUN_DIR); stop it or set ZG_S3MOCK_PORT"
  fi
  find_java
  ensure_dist
  find_java # the archive id covers the freshly compiled customizer
  mkdir -p "$DATA_DIR" "$LOG_DIR"
  jvm_opts
  app_args
  local t0="$SECONDS"
  mark_logs
  printf '\n===== %s starting S3Mock %s =====\n' "$(date -Is)" "$S3MOCK_VERSION" >>"$LOG_DIR/s3mock.out"
  # setsid: the server outlives the shell (and the test runner) that started it; it gets no terminal
  # output and not the lock descriptor.
  local cds
  read -r -a cds <<<"$(cds_opts)"
  (exec setsid "$JAVA" "${JVM_OPTS[@]}" "${cds[@]}" -cp "$APP_JAR:$LOOPBACK_JAR" "$MAIN_CLASS" "${APP_ARGS[@]}" \
    </dev/null >>"$LOG_DIR/s3mock.out" 2>&1 9>&-) &
  pid=$!
  echo "$pid" >"$PID_FILE"
  wait_ready "$pid"
  say "S3Mock $S3MOCK_VERSION ready in $((SECONDS - t0))s (pid $pid, data $DATA_DIR, logs $LOG_DIR)"
  echo "http://$HOST:$PORT"
}

cmd_stop() {
  lock
  local pid
  if ! pid="$(our_pid)"; then
    say "not running"
    return 0
  fi
  kill_server "$pid"
  say "stopped (pid $pid)"
}

cmd_status() {
  local pid
  if ! pid="$(our_pid)"; then
    say "not running"
    return 3
  fi
  if serves_s3; then
    say "running (pid $pid) on http://$HOST:$PORT, S3Mock $S3MOCK_VERSION, data $DATA_DIR"
    return 0
  fi
  say "process $pid is alive but does not answer on http://$HOST:$PORT"
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
