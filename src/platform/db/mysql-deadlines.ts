import type { MysqlPool, MysqlPoolConnection, MysqlQueryResult } from 'kysely';

/** The code of `MysqlDeadlineError`; `isDependencyOutage` counts it as an outage (503). */
export const MYSQL_DEADLINE_CODE = 'ZG_MYSQL_DEADLINE';

/** Waiting for a pooled connection, or a statement, took longer than the deadline. */
export class MysqlDeadlineError extends Error {
  readonly code = MYSQL_DEADLINE_CODE;

  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = 'MysqlDeadlineError';
  }
}

/** What mysql2's pool offers that the deadlines use. */
export interface RawMysqlPool {
  getConnection(callback: (error: unknown, connection: RawMysqlConnection) => void): void;
  end(callback: (error: unknown) => void): void;
}

type QueryCallback = (error: unknown, result: MysqlQueryResult) => void;

export interface RawMysqlConnection extends Omit<MysqlPoolConnection, 'query'> {
  query(options: { sql: string; values?: unknown; timeout: number }, callback: QueryCallback): unknown;
  query(sql: string, parameters: unknown): ReturnType<MysqlPoolConnection['query']>;
  /** mysql2's socket. */
  stream?: { destroy(error?: Error): void };
}

export interface DeadlineOptions {
  /** How long a wait for a connection, and a statement, may take; 0 or less sets no deadline. */
  timeoutMs: number;
  /** The pool's size: at most this many requests wait on it at once, the others wait here. */
  size: number;
  /** Where the pool keeps whether the database answers (its owner may read it); a new one by default. */
  reach?: MysqlReachability;
  now?: () => number;
}

/** Failures of the database to answer in a row, with no answer between them, that make it out of reach. */
export const FAILURES_TO_FAIL_FAST = 3;
/** While the database counts as out of reach, it is tried this often (`SELECT 1`, no request waiting on it). */
export const FAIL_FAST_PROBE_MS = 1_000;

/**
 * Whether the database answers: out of reach after `FAILURES_TO_FAIL_FAST` failures in a row (a
 * connection that could not be made, a statement past the deadline), until anything answers again.
 * An answer is any reply of the server, an SQL error included. A pooled connection found closed
 * (left over from before an outage) is neither: it tells nothing of the server now.
 */
export class MysqlReachability {
  private failures = 0;
  private triedAt = Number.NEGATIVE_INFINITY;

  constructor(private readonly now: () => number = () => performance.now()) {}

  /** Whether requests fail at once now (while a probe a second finds whether it answers again). */
  get outOfReach(): boolean {
    return this.failures >= FAILURES_TO_FAIL_FAST;
  }

  answered(): void {
    this.failures = 0;
  }

  failed(): void {
    this.failures++;
  }

  /** Whether a probe of the database is due (at most one a probe interval), taking it if so. */
  probeDue(): boolean {
    const now = this.now();
    if (now - this.triedAt < FAIL_FAST_PROBE_MS && now >= this.triedAt) return false;
    this.triedAt = now;
    return true;
  }

  /**
   * Sorts a failure to make a connection: no answer (refused, unreachable, timed out) or the
   * server's own refusal (too many connections, access denied), which is an answer.
   */
  connectFailed(error: unknown): void {
    if (typeof (error as { errno?: unknown } | null)?.errno === 'number' && !isNetworkError(error))
      this.answered();
    else this.failed();
  }

  /** Sorts a statement's outcome: the server's reply (an SQL error too) or none. */
  settled(error: unknown): void {
    if (error === null || error === undefined) return this.answered();
    const e = error as { code?: unknown; fatal?: unknown };
    if (e.code === MYSQL_DEADLINE_CODE) this.failed();
    else if (e.fatal !== true) this.answered();
  }
}

/** Socket-level failures: Node's errno names (a server's own refusals carry a MySQL error code instead). */
function isNetworkError(error: unknown): boolean {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^E[A-Z]+$/.test(code) && !code.startsWith('ER_');
}

/**
 * A pool for Kysely whose every wait has an end. A MySQL primary that vanishes without resetting its
 * connections (a host gone, a partition, a failover behind a virtual address) otherwise holds each
 * statement until TCP gives up, a quarter of an hour, and every request behind it in the pool's
 * queue as long. With a deadline:
 * - a request waits at most that long for a pooled connection. The wait is kept here, not in
 *   mysql2's queue, which cannot drop a waiter: one that gave up leaves at once, and no more than
 *   `size` requests are ever handed to the pool (a connection that comes after its request gave up
 *   goes back at once);
 * - a statement that has no answer within that long fails, and its connection is closed, with
 *   whatever was queued on it: the statement may still be running there, and a ROLLBACK sent after
 *   it would wait behind it. The server rolls back the open transaction of a connection that went
 *   away once it notices (a statement still running goes on until then, unless the session limits
 *   statements itself, see `openMysql`: it is not killed, since behind a failover's virtual
 *   address a thread id may name another server's thread); a write or COMMIT that had already
 *   reached it may still have been done.
 * Both fail with `MysqlDeadlineError`. Streamed queries (none in this code) have no deadline.
 *
 * After `FAILURES_TO_FAIL_FAST` failures in a row with no answer between them, the database counts
 * as out of reach: requests fail at once with `MysqlDeadlineError` (503), and while they come a
 * probe (`SELECT 1`) tries it once a second, until an answer comes. So a primary that hangs costs
 * the deadline to a few requests, not to each one for as long as it hangs (nor its place in the
 * queue to those behind it), and no request is kept waiting to find out whether it is back.
 */
export function poolWithDeadlines(pool: RawMysqlPool, options: DeadlineOptions): MysqlPool {
  const { timeoutMs, size } = options;
  if (timeoutMs <= 0) return pool;
  const reach = options.reach ?? new MysqlReachability(options.now);
  // One wrapper per pooled connection: Kysely keeps its own state per connection object.
  const wrapped = new WeakMap<RawMysqlConnection, Wrapped>();
  // Requests handed to the pool and not given back yet; the others wait in `waiting`, oldest first.
  let busy = 0;
  const waiting = new Set<Waiter>();
  const next = (): void => {
    for (const waiter of waiting) {
      if (busy >= size) return;
      waiting.delete(waiter);
      acquire(waiter);
    }
  };
  const giveBack = (raw: RawMysqlConnection): void => {
    raw.release();
    busy--;
    next();
  };
  const acquire = (waiter: Waiter): void => {
    busy++;
    pool.getConnection((error, raw) => {
      if (error) {
        busy--;
        next();
        reach.connectFailed(error);
        waiter.settle(error, undefined);
        return;
      }
      // The request went on without it: the connection goes back to the pool at once.
      if (waiter.settled) return giveBack(raw);
      let connection = wrapped.get(raw);
      if (!connection) {
        connection = connectionWithDeadline(raw, timeoutMs, giveBack, reach);
        wrapped.set(raw, connection);
      }
      connection.lent = true;
      waiter.settle(null, connection.api);
    });
  };
  /** Lends a connection to `use`, which gets an error instead if none comes free within the deadline. */
  const lend = (
    use: (error: unknown, connection: MysqlPoolConnection | undefined) => void,
    late: string,
  ): NodeJS.Timeout => {
    const waiter: Waiter = {
      settled: false,
      settle(error, connection) {
        if (waiter.settled) return;
        waiter.settled = true;
        clearTimeout(timer);
        waiting.delete(waiter);
        use(error, connection);
      },
    };
    const timer = setTimeout(() => waiter.settle(new MysqlDeadlineError(late), undefined), timeoutMs);
    if (busy < size) acquire(waiter);
    else waiting.add(waiter);
    return timer;
  };
  /**
   * `SELECT 1` on a pooled connection, one a probe interval; its outcome is sorted as any
   * statement's. One does not wait for the one before: after a failover that left the pool's idle
   * connections hanging, each probe may draw one of them and run out the deadline on it, and
   * probes one after another would take a deadline per connection to reach a fresh one.
   */
  const probe = (): void => {
    if (!reach.probeDue()) return;
    const use = (error: unknown, connection: MysqlPoolConnection | undefined): void => {
      if (error === null && connection) connection.query('SELECT 1', [], () => connection.release());
    };
    // Nobody waits on its wait for a connection.
    lend(use, 'no MySQL connection came free for a probe').unref();
  };
  return {
    getConnection(callback) {
      if (reach.outOfReach) {
        // The database did not answer lately: failing at once beats each request waiting it out,
        // and no request is the one that finds out whether it is back (it would wait the deadline
        // for each of its statements): a probe does, in the background.
        probe();
        const error = new MysqlDeadlineError(
          'MySQL has not answered lately; requests fail at once until it does (tried every second)',
        );
        queueMicrotask(() => callback(error, undefined as unknown as MysqlPoolConnection));
        return;
      }
      // Not a failure of the database: requests may hold its connections (their statements'
      // deadlines and the connections that cannot be made tell whether it answers).
      lend(
        (error, connection) => callback(error, connection as MysqlPoolConnection),
        `no MySQL connection of the pool came free within ${timeoutMs} ms`,
      );
    },
    end: (callback) => pool.end(callback),
  };
}

interface Waiter {
  settled: boolean;
  settle(error: unknown, connection: MysqlPoolConnection | undefined): void;
}

interface Wrapped {
  api: MysqlPoolConnection;
  /** Handed to a request and not released yet. */
  lent: boolean;
}

function connectionWithDeadline(
  raw: RawMysqlConnection,
  timeoutMs: number,
  giveBack: (raw: RawMysqlConnection) => void,
  reach: MysqlReachability,
): Wrapped {
  const state: Wrapped = {
    lent: false,
    api: {
      get config() {
        return raw.config;
      },
      get threadId() {
        return raw.threadId;
      },
      connect: (callback) => raw.connect(callback),
      destroy: () => raw.destroy(),
      release: () => {
        if (!state.lent) return;
        state.lent = false;
        giveBack(raw);
      },
      query: ((sql: string, parameters: unknown, callback?: QueryCallback) => {
        if (!callback) return raw.query(sql, parameters);
        return queryWithin(raw, { sql, values: parameters, timeout: timeoutMs }, (error, result) => {
          reach.settled(error);
          callback(error, result);
        });
      }) as MysqlPoolConnection['query'],
    },
  };
  return state;
}

/** Runs a statement with mysql2's `timeout`; past it, the connection is given up (see `poolWithDeadlines`). */
export function queryWithin(
  raw: RawMysqlConnection,
  options: { sql: string; values?: unknown; timeout: number },
  callback: QueryCallback,
): unknown {
  let answered = false;
  return raw.query(options, (error, result) => {
    // Giving the connection up reports the abandoned statement's end a second time.
    if (answered) return;
    answered = true;
    if ((error as { code?: unknown } | null)?.code !== 'PROTOCOL_SEQUENCE_TIMEOUT') {
      callback(error, result);
      return;
    }
    const late = new MysqlDeadlineError(`a MySQL statement had no answer within ${options.timeout} ms`, {
      cause: error,
    });
    // Destroying the socket with an error fails every command queued on the connection and takes
    // it out of the pool; `destroy` alone would only half-close it and leave them waiting.
    if (raw.stream) raw.stream.destroy(late);
    else raw.destroy();
    callback(late, result);
  });
}
