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

SERVICE=s3-server
WHAT=S3Mock
VERSION_LABEL="S3Mock $S3MOCK_VERSION"
ENDPOINT="http://$HOST:$PORT"
LOG_FILES=("$LOG_DIR/s3mock.out" "$LOG_DIR/s3mock.log")
LOG_ERROR_RE='^[0-9TZ:.+-]+ +(ERROR|FATAL) '
PID_MARK="$MAIN_CLASS --zg.run-dir=$RUN_DIR "
CDS_NAME=s3mock
PORT_SETTING=ZG_S3MOCK_PORT
JAVA_ID_FILES=("$LOOPBACK_JAR")
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=lib/java-service.sh
source "$HERE/lib/java-service.sh"

# True when the port answers an S3 ListBuckets (GET /) with 200 and the S3 XML body: a server that
# merely accepts connections (Tomcat is up before the application is) does not count.
serves() {
  local response
  response="$(timeout 4 bash -c '
    exec 3<>"/dev/tcp/$0/$1" || exit 1
    printf "GET / HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\n\r\n" "$0" "$1" >&3
    head -c 4096 <&3
  ' "$HOST" "$PORT" 2>/dev/null)" || return 1
  [[ "$response" == "HTTP/1.1 200"* && "$response" == *ListAllMyBucketsResult* ]]
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
cmd_start() {
  start_unless_running "$PORT" && return 0
  find_java
  ensure_dist
  find_java # the archive id covers the freshly compiled customizer
  mkdir -p "$DATA_DIR" "$LOG_DIR"
  jvm_opts
  app_args
  launch "$LOG_DIR/s3mock.out" JVM_OPTS -cp "$APP_JAR:$LOOPBACK_JAR" "$MAIN_CLASS" "${APP_ARGS[@]}"
}

java_service_main "$@"
