# Shared by scripts/kafka-broker.sh and scripts/s3-server.sh: running one Java server process from a
# run directory (pid file, lock, logs, class-data archive), waiting for it to answer and stopping it.
# Sourced, not run. The sourcing script sets, before it calls `java_service_main "$@"`:
#
#   SERVICE        prefix of every line printed (the script's name)
#   WHAT           the server in messages ("the Kafka broker")
#   VERSION_LABEL  what runs, with its version ("Kafka 4.2.2"); also part of the archive id
#   RUN_DIR DATA_DIR LOG_DIR PID_FILE HOST PORT START_TIMEOUT STOP_TIMEOUT
#   ENDPOINT       the address printed as the last line of a start ("127.0.0.1:19092")
#   LOG_FILES      array: the logs whose tails a failure shows
#   LOG_ERROR_RE   extended regex of an error line in those logs
#   PID_MARK       text in the command line of our process (tells it from a recycled pid)
#   CDS_NAME       file name stem of the class-data archive in RUN_DIR
#   PORT_SETTING   the environment variable that moves the server to another port
#   JAVA_ID_FILES  array: files whose size and time also identify the archive (may be empty)
#
# and defines `serves` (true when the server answers on HOST:PORT) and `cmd_start`.

say() { printf '%s: %s\n' "$SERVICE" "$*"; }
fail() {
  printf '\n%s: ERROR: %s\n\n' "$SERVICE" "$*" >&2
  exit 1
}

# Sizes of the log files when this start launched the server: only what it wrote since then is shown.
declare -A LOG_MARK=()
mark_logs() {
  local f
  for f in "${LOG_FILES[@]}"; do
    LOG_MARK[$f]="$(stat -c %s "$f" 2>/dev/null || echo 0)"
  done
}

show_log_tail() {
  local f mark text errors
  for f in "${LOG_FILES[@]}"; do
    [[ -s "$f" ]] || continue
    mark="${LOG_MARK[$f]:-0}"
    ((mark <= $(stat -c %s "$f"))) || mark=0 # rolled over since
    text="$(tail -c "+$((mark + 1))" "$f")"
    [[ -n "${text//[[:space:]]/}" ]] || continue
    errors="$(grep -E "$LOG_ERROR_RE" <<<"$text" | tail -n 10 || true)"
    if [[ -n "$errors" && ${#LOG_MARK[@]} -gt 0 ]]; then
      printf '\n----- errors in %s -----\n%s\n' "$f" "$errors" >&2
    fi
    printf '\n----- last lines of %s -----\n' "$f" >&2
    tail -n "${1:-40}" <<<"$text" >&2
  done
  printf -- '-----\n' >&2
}

# True when something accepts TCP connections on HOST:$1.
port_open() {
  timeout 3 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null
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
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$PID_MARK"; then
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
  [[ -n "$v" && "$v" -ge 17 ]] || fail "$VERSION_LABEL needs Java 17 or newer; $JAVA is version '${v:-unknown}'"
  # Identifies the JDK build, its own class-data archive and what runs on it (see cds_opts).
  local bin
  bin="$(readlink -f "$(command -v "$JAVA")")"
  JAVA_ID="$(
    printf '%s\n%s\n%s\n' "$bin" "$out" "$VERSION_LABEL"
    stat -c '%s %Y' "$(dirname "$bin")"/../lib/server/classes*.jsa "${JAVA_ID_FILES[@]}" 2>/dev/null || true
  )"
  JAVA_ID="$(cksum <<<"$JAVA_ID" | cut -d' ' -f1)"
}

# Class-data sharing: the first run of a JDK + server pair dumps the classes it loaded into an archive
# when it stops gracefully; later starts map it and come up faster. A missing, stale or foreign
# archive only costs that time (the JVM then runs without it). Prints the JVM options.
cds_opts() {
  local jsa="$RUN_DIR/$CDS_NAME-$JAVA_ID.jsa"
  rm -f "$RUN_DIR/cds-pending"
  if [[ -f "$jsa" ]]; then
    echo "-XX:SharedArchiveFile=$jsa" -Xlog:cds*=error
  else
    rm -f "$RUN_DIR/$CDS_NAME"-*.jsa "$RUN_DIR/$CDS_NAME"-*.jsa.new
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

# Waits for $1 to answer; on timeout or death prints the log tail, stops it and fails.
wait_ready() {
  local pid="$1" started="$SECONDS"
  while ((SECONDS - started < START_TIMEOUT)); do
    if ! alive "$pid"; then
      rm -f "$PID_FILE"
      cds_finish killed
      show_log_tail 60
      fail "$WHAT (pid $pid) exited during startup; logs in $LOG_DIR" \
        "(a damaged data directory is wiped by: bash $0 reset)"
    fi
    if serves; then
      return 0
    fi
    sleep 0.2
  done
  show_log_tail 60
  kill_server "$pid"
  fail "$WHAT did not answer on $ENDPOINT within ${START_TIMEOUT}s; stopped it (logs in $LOG_DIR)"
}

kill_server() {
  local pid="$1" started="$SECONDS" how=graceful
  kill -TERM "$pid" 2>/dev/null || true
  while alive "$pid"; do
    if ((SECONDS - started >= STOP_TIMEOUT)); then
      say "$WHAT (pid $pid) still running after ${STOP_TIMEOUT}s; sending SIGKILL"
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

# The start of `cmd_start`: when ours already runs, waits for it, prints its endpoint and returns 0;
# fails when another process holds one of the ports given; returns 1 when a server is to be started.
start_unless_running() {
  lock
  local pid port
  if pid="$(our_pid)"; then
    wait_ready "$pid"
    say "already running (pid $pid)"
    echo "$ENDPOINT"
    return 0
  fi
  for port in "$@"; do
    if port_open "$port"; then
      fail "port $port on $HOST is taken by another process (not ours in $RUN_DIR); stop it or set $PORT_SETTING"
    fi
  done
  return 1
}

# Runs `java` in its own session (it outlives the shell and the test runner that started it, with
# no terminal output and not the lock descriptor), output appended to $1, then waits until it
# answers and prints the endpoint. $2 is an array name: the JVM options, which the class-data
# options follow; the remaining arguments (class path, main class, its arguments) come last.
launch() {
  local out="$1" t0="$SECONDS" cds pid
  local -n opts="$2"
  shift 2
  mark_logs
  printf '\n===== %s starting %s =====\n' "$(date -Is)" "$VERSION_LABEL" >>"$out"
  read -r -a cds <<<"$(cds_opts)"
  (exec setsid "$JAVA" "${opts[@]}" "${cds[@]}" "$@" </dev/null >>"$out" 2>&1 9>&-) &
  pid=$!
  echo "$pid" >"$PID_FILE"
  wait_ready "$pid"
  say "$VERSION_LABEL ready in $((SECONDS - t0))s (pid $pid, data $DATA_DIR, logs $LOG_DIR)"
  echo "$ENDPOINT"
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
  if serves; then
    say "running (pid $pid) on $ENDPOINT, $VERSION_LABEL, data $DATA_DIR"
    return 0
  fi
  say "process $pid is alive but does not answer on $ENDPOINT"
  return 1
}

cmd_reset() {
  cmd_stop
  rm -rf "$DATA_DIR"
  say "deleted $DATA_DIR"
}

java_service_main() {
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
}
