/**
 * Whether an error says a backing service (database, Redis, object storage, …) could not be reached
 * or is overloaded, as opposed to a bug or a misconfiguration: such a request may well succeed if
 * tried again shortly, and answers 503 rather than 500. Looks through `cause` chains and the
 * `errors` of an AggregateError.
 */
export function isDependencyOutage(err: unknown): boolean {
  return walk(err, 0);
}

/** Socket and DNS failures (Node), and the drivers' own codes for a lost or refused connection. */
const CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ECONNABORTED',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EAI_AGAIN',
  'ENOTFOUND',
  // mysql2
  'PROTOCOL_CONNECTION_LOST',
  'PROTOCOL_SEQUENCE_TIMEOUT',
  'ER_CON_COUNT_ERROR',
  'ER_SERVER_SHUTDOWN',
  // No pooled connection came free, or a statement had no answer, in time (see `poolWithDeadlines`).
  'ZG_MYSQL_DEADLINE',
  // A row lock held past innodb_lock_wait_timeout (a long rebuild), a deadlock retried no more:
  // contention, which passes.
  'ER_LOCK_WAIT_TIMEOUT',
  'ER_LOCK_DEADLOCK',
]);

/**
 * A MySQL primary that turned read-only (a failover under way), as Redis's `READONLY`: the option
 * error is an outage only when it names that option.
 */
const READ_ONLY = /--(?:super-)?read-only/;

/** Error names: ioredis giving up on a command, the AWS SDK's timeouts and S3's throttling answers. */
const NAMES = new Set([
  'MaxRetriesPerRequestError',
  'TimeoutError',
  'RequestTimeout',
  'SlowDown',
  'ServiceUnavailable',
]);

/**
 * SQLite's busy timeout run out (another process held the write lock), ioredis on a closed
 * connection, a command past its timeout, cut off with its pipeline by a reset or refused while the
 * connection is lost, Redis replies
 * that mean "not now" (a failover under way, a Redis out of memory), and mysql2 refusing a command
 * on a connection it lost (a transaction's ROLLBACK after the connection dropped: Kysely throws
 * that error in place of the one that lost the connection).
 */
const MESSAGE =
  /^(?:database is locked|Connection is closed\.|Command timed out|Command aborted due to connection close|Stream isn't writeable|LOADING |TRYAGAIN |CLUSTERDOWN |MASTERDOWN |BUSY |READONLY |OOM |Can't add new command when connection is in closed state|Can't write in closed state)/;

/** MariaDB's ER_STATEMENT_TIMEOUT, which mysql2 has no code name for. */
const MARIADB_STATEMENT_TIMEOUT = 1969;

interface Described {
  name?: unknown;
  code?: unknown;
  errno?: unknown;
  message?: unknown;
  cause?: unknown;
  errors?: unknown;
  $metadata?: { httpStatusCode?: unknown };
}

function walk(err: unknown, depth: number): boolean {
  if (depth > 5 || typeof err !== 'object' || err === null) return false;
  const e = err as Described;
  if (typeof e.code === 'string' && CODES.has(e.code)) return true;
  // MariaDB ended a statement at its max_statement_time (the MySQL deadline, see `openMysql`).
  if (e.errno === MARIADB_STATEMENT_TIMEOUT) return true;
  if (e.code === 'ER_OPTION_PREVENTS_STATEMENT' && typeof e.message === 'string' && READ_ONLY.test(e.message))
    return true;
  if (typeof e.name === 'string' && NAMES.has(e.name)) return true;
  if (typeof e.message === 'string' && MESSAGE.test(e.message)) return true;
  // An HTTP service (the object store) answered that it, or a gateway before it, is not available.
  const status = e.$metadata?.httpStatusCode;
  if (status === 502 || status === 503 || status === 504) return true;
  if (Array.isArray(e.errors) && e.errors.some((inner) => walk(inner, depth + 1))) return true;
  return walk(e.cause, depth + 1);
}

/** Lock contention: a row lock waited on too long, a deadlock, SQLite's busy timeout run out. */
const CONTENTION_CODES = new Set(['ER_LOCK_WAIT_TIMEOUT', 'ER_LOCK_DEADLOCK']);

/**
 * Whether an error is lock contention (see `CONTENTION_CODES`) rather than a service out of reach:
 * it passes, and a smaller transaction may well get through at once. Looks through `cause` chains.
 */
export function isContention(err: unknown, depth = 0): boolean {
  if (depth > 5 || typeof err !== 'object' || err === null) return false;
  const e = err as Described;
  if (typeof e.code === 'string' && CONTENTION_CODES.has(e.code)) return true;
  if (typeof e.message === 'string' && e.message.startsWith('database is locked')) return true;
  return isContention(e.cause, depth + 1);
}
