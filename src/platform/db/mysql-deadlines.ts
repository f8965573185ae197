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
  query(options: { sql: string; values: unknown; timeout: number }, callback: QueryCallback): unknown;
  query(sql: string, parameters: unknown): ReturnType<MysqlPoolConnection['query']>;
}

/**
 * A pool for Kysely whose every wait has an end. A MySQL primary that vanishes without resetting its
 * connections (a host gone, a partition, a failover behind a virtual address) otherwise holds each
 * statement until TCP gives up, a quarter of an hour, and every request behind it in the pool's
 * queue as long. With `timeoutMs`:
 * - a request waits at most that long for a pooled connection; one that comes later is handed back;
 * - a statement that has no answer within that long fails, and its connection is destroyed: the
 *   statement may still be running there, and a ROLLBACK sent after it would wait behind it. The
 *   server rolls back the open transaction of a connection that went away.
 * Both fail with `MysqlDeadlineError`. Streamed queries (none in this code) have no deadline.
 */
export function poolWithDeadlines(pool: RawMysqlPool, timeoutMs: number): MysqlPool {
  if (timeoutMs <= 0) return pool;
  // One wrapper per pooled connection: Kysely keeps its own state per connection object.
  const wrapped = new WeakMap<RawMysqlConnection, MysqlPoolConnection>();
  const wrap = (raw: RawMysqlConnection): MysqlPoolConnection => {
    let connection = wrapped.get(raw);
    if (!connection) {
      connection = connectionWithDeadline(raw, timeoutMs);
      wrapped.set(raw, connection);
    }
    return connection;
  };
  return {
    getConnection(callback) {
      let settled = false;
      const timer = setTimeout(() => {
        settled = true;
        callback(
          new MysqlDeadlineError(`no MySQL connection of the pool came free within ${timeoutMs} ms`),
          undefined as unknown as MysqlPoolConnection,
        );
      }, timeoutMs);
      pool.getConnection((error, raw) => {
        if (settled) {
          // The request went on without it: the connection goes back to the pool at once.
          if (!error) raw.release();
          return;
        }
        settled = true;
        clearTimeout(timer);
        if (error) callback(error, undefined as unknown as MysqlPoolConnection);
        else callback(null, wrap(raw));
      });
    },
    end: (callback) => pool.end(callback),
  };
}

function connectionWithDeadline(raw: RawMysqlConnection, timeoutMs: number): MysqlPoolConnection {
  return {
    get config() {
      return raw.config;
    },
    get threadId() {
      return raw.threadId;
    },
    connect: (callback) => raw.connect(callback),
    destroy: () => raw.destroy(),
    release: () => raw.release(),
    query: ((sql: string, parameters: unknown, callback?: QueryCallback) => {
      if (!callback) return raw.query(sql, parameters);
      let answered = false;
      return raw.query({ sql, values: parameters, timeout: timeoutMs }, (error, result) => {
        // Destroying the connection may report the abandoned statement's end a second time.
        if (answered) return;
        answered = true;
        if ((error as { code?: unknown } | null)?.code === 'PROTOCOL_SEQUENCE_TIMEOUT') {
          raw.destroy();
          callback(
            new MysqlDeadlineError(`a MySQL statement had no answer within ${timeoutMs} ms`, {
              cause: error,
            }),
            result,
          );
          return;
        }
        callback(error, result);
      });
    }) as MysqlPoolConnection['query'],
  };
}
