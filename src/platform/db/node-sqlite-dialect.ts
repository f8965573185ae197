import { DatabaseSync, type SQLInputValue, type StatementSync } from 'node:sqlite';
import {
  CompiledQuery,
  SqliteAdapter,
  SqliteDialect,
  SqliteDriver,
  type DatabaseConnection,
  type Driver,
  type DialectAdapter,
  type SqliteDatabase,
  type SqliteDialectConfig,
  type SqliteStatement,
} from 'kysely';
import { trimOldest } from '../cache/trim.js';

/** Prepared statements kept per connection; the least recently used one goes first. */
export const STATEMENT_CACHE_SIZE = 200;

interface Prepared {
  stmt: StatementSync;
  reader: boolean;
}

/**
 * Kysely's SQLite dialect speaks to a better-sqlite3-shaped handle; this adapts Node's built-in
 * `node:sqlite` to it, so the embedded profile needs no native addon. Booleans become 0/1 and
 * dates epoch milliseconds, the only conversions node:sqlite does not do itself.
 */
export function createNodeSqliteDialect(
  path: string,
  cacheSize = STATEMENT_CACHE_SIZE,
): { dialect: SqliteDialect; raw: DatabaseSync } {
  const raw = new DatabaseSync(path);
  // First: the pragmas after it wait for a lock another process holds (a server recovering its WAL).
  raw.exec('PRAGMA busy_timeout = 5000');
  raw.exec('PRAGMA journal_mode = WAL');
  raw.exec('PRAGMA synchronous = NORMAL');
  raw.exec('PRAGMA foreign_keys = ON');
  return { dialect: new NodeSqliteDialect({ database: nodeSqliteDatabase(raw, cacheSize) }), raw };
}

/**
 * Kysely's SQLite dialect with two changes. Its transactions begin `IMMEDIATE`: in WAL mode a
 * transaction that reads and then writes while another process (a CLI command beside the server)
 * holds the write lock fails at once with SQLITE_BUSY, the busy timeout notwithstanding; one that
 * takes the lock first waits for it. And migrations run in a transaction (SQLite's DDL is
 * transactional; Kysely assumes it is not), so a step cut short by a killed process leaves nothing
 * behind to fail the next start, and processes starting together migrate one after the other.
 */
class NodeSqliteDialect extends SqliteDialect {
  constructor(private readonly settings: SqliteDialectConfig) {
    super(settings);
  }

  override createDriver(): Driver {
    return new ImmediateSqliteDriver(this.settings);
  }

  override createAdapter(): DialectAdapter {
    return new TransactionalDdlSqliteAdapter();
  }
}

class ImmediateSqliteDriver extends SqliteDriver {
  override async beginTransaction(connection: DatabaseConnection): Promise<void> {
    await connection.executeQuery(CompiledQuery.raw('begin immediate'));
  }
}

class TransactionalDdlSqliteAdapter extends SqliteAdapter {
  override get supportsTransactionalDdl(): boolean {
    return true;
  }
}

const toParams = (params: readonly unknown[]): SQLInputValue[] =>
  params.map((p) => {
    if (typeof p === 'boolean') return p ? 1 : 0;
    if (p instanceof Date) return p.getTime();
    if (p === undefined) return null;
    return p as SQLInputValue;
  });

/**
 * The handle Kysely's dialect drives. Kysely prepares every query it runs, and preparing costs
 * about as much as running a small query, so statements are kept by their SQL text (at most
 * `cacheSize`, the least recently used evicted first). A kept statement is only ever run to
 * completion (`all`, `run`); `iterate` gets a statement of its own, since running a statement again
 * resets an iteration still reading it. Closing drops the cache with the database (node:sqlite
 * finalizes statements when their database closes).
 */
export function nodeSqliteDatabase(
  raw: DatabaseSync,
  cacheSize = STATEMENT_CACHE_SIZE,
): SqliteDatabase & { readonly cachedStatements: number } {
  const cache = new Map<string, Prepared>();
  const cached = (sql: string): Prepared => {
    const hit = cache.get(sql);
    if (hit) {
      // Map order is insertion order: moving a hit to the end keeps the first key the least recently used.
      cache.delete(sql);
      cache.set(sql, hit);
      return hit;
    }
    const stmt = raw.prepare(sql);
    const prepared = { stmt, reader: stmt.columns().length > 0 };
    if (cacheSize > 0) {
      cache.set(sql, prepared);
      trimOldest(cache, cacheSize);
    }
    return prepared;
  };

  return {
    get cachedStatements() {
      return cache.size;
    },
    close: () => {
      cache.clear();
      raw.close();
    },
    prepare(sql: string): SqliteStatement {
      const { stmt, reader } = cached(sql);
      return {
        reader,
        all: (params) => stmt.all(...toParams(params)),
        run: (params) => {
          const r = stmt.run(...toParams(params));
          return { changes: r.changes, lastInsertRowid: r.lastInsertRowid };
        },
        iterate: (params) => raw.prepare(sql).iterate(...toParams(params)),
      };
    },
  };
}
