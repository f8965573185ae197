import { mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import type { DatabaseSync } from 'node:sqlite';
import { Kysely } from 'kysely';
import { DEFAULT_MIGRATION_TABLE, Migrator, type MigrationProvider } from 'kysely/migration';
import { createNodeSqliteDialect } from './node-sqlite-dialect.js';
import { migrationsFor } from './migrations/index.js';
import { MysqlExactIdsPlugin } from './mysql-exact-ids.js';
import {
  MysqlReachability,
  poolWithDeadlines,
  queryWithin,
  type RawMysqlConnection,
  type RawMysqlPool,
} from './mysql-deadlines.js';
import type { Database } from './schema.js';
import { UniqueViolationError } from '../errors/errors.js';

export type Dialect = 'sqlite' | 'mysql';

/** The system-of-record database: a Kysely handle plus the facts code needs about its dialect. */
export interface Db {
  readonly kysely: Kysely<Database>;
  readonly dialect: Dialect;
  /**
   * The embedded database's own handle, for hot paths that keep prepared statements. It is the
   * connection Kysely uses, so work on it must hold Kysely's connection lock when it spans statements.
   */
  readonly raw?: DatabaseSync;
  /**
   * MySQL with deadlines: whether requests fail at once because the database has not answered
   * lately (see `poolWithDeadlines`), so that work queued behind one that may hang on it fails too.
   */
  outOfReach?: () => boolean;
  close(): Promise<void>;
}

export function openSqlite(path: string): Db {
  if (path !== ':memory:') mkdirSync(dirname(path), { recursive: true });
  const { dialect, raw } = createNodeSqliteDialect(path);
  const kysely = new Kysely<Database>({ dialect });
  return { kysely, dialect: 'sqlite', raw, close: () => kysely.destroy() };
}

/**
 * mysql2 is loaded lazily so the embedded profile never needs it. With `timeoutMs` above 0, waiting
 * for a pooled connection and each statement fail after that long (see `poolWithDeadlines`), and a
 * row or table lock is waited for at most half as long (whole seconds, at least one: with a deadline
 * under 2 s, longer than half), so that lock
 * contention ends as such (`ER_LOCK_WAIT_TIMEOUT`, which the follow group commit tries again alone)
 * before the deadline gives the connection up. A migration, which may rightly take longer, needs a
 * database opened without.
 */
export async function openMysql(url: string, poolSize = 10, timeoutMs = 0): Promise<Db> {
  const [{ createPool }, { MysqlDialect }] = await Promise.all([import('mysql2'), import('kysely')]);
  const pool = createPool({
    uri: url,
    connectionLimit: poolSize,
    supportBigNumbers: true,
    charset: 'utf8mb4',
    timezone: 'Z',
    // A connection still being made past the deadline holds a place in the pool for nothing.
    ...(timeoutMs > 0 ? { connectTimeout: timeoutMs } : {}),
  });
  if (timeoutMs > 0) {
    const lockWaitSeconds = Math.max(1, Math.floor(timeoutMs / 2_000));
    pool.on('connection', (connection) => {
      // Queued before the connection's first statement; a failure is that statement's to report.
      queryWithin(
        connection as unknown as RawMysqlConnection,
        {
          // MariaDB (`/*M!`) also ends a statement itself at the deadline, so one the client gave
          // up on does not run on; `KILL QUERY` could not be trusted to name the right server.
          sql:
            `SET SESSION innodb_lock_wait_timeout = ${lockWaitSeconds}, lock_wait_timeout = ${lockWaitSeconds}` +
            ` /*M!, max_statement_time = ${timeoutMs / 1000} */`,
          timeout: timeoutMs,
        },
        () => undefined,
      );
    });
  }
  const reach = new MysqlReachability();
  const kysely = new Kysely<Database>({
    dialect: new MysqlDialect({
      pool: poolWithDeadlines(pool as unknown as RawMysqlPool, { timeoutMs, size: poolSize, reach }),
    }),
    plugins: [new MysqlExactIdsPlugin()],
  });
  return {
    kysely,
    dialect: 'mysql',
    ...(timeoutMs > 0 ? { outOfReach: () => reach.outOfReach } : {}),
    close: () => kysely.destroy(),
  };
}

/** Whether migrations ever ran on this database: a deployment, not an empty database. */
export async function isDeployed(db: Db): Promise<boolean> {
  const tables = await db.kysely.introspection.getTables({ withInternalKyselyTables: true });
  return tables.some((table) => table.name === DEFAULT_MIGRATION_TABLE);
}

export async function migrate(db: Db): Promise<void> {
  const provider: MigrationProvider = { getMigrations: () => Promise.resolve(migrationsFor(db.dialect)) };
  const migrator = new Migrator({ db: db.kysely, provider });
  const { error, results } = await migrator.migrateToLatest();
  const failed = results?.find((r) => r.status === 'Error');
  if (error || failed) {
    let reason = error instanceof Error ? `: ${error.message}` : '';
    // ER_BAD_DB_ERROR: migrations make tables, not the database.
    if ((error as { errno?: unknown } | undefined)?.errno === 1049) {
      reason += ' (create it first: CREATE DATABASE <name> CHARACTER SET utf8mb4)';
    }
    throw new Error(
      failed ? `migration ${failed.migrationName} failed${reason}` : `migrations could not run${reason}`,
      { cause: error },
    );
  }
}

/** Translates each dialect's unique-key violation into one error type; rethrows anything else. */
export function translateDbError(err: unknown): never {
  const e = err as { code?: string; errno?: number; message?: string };
  if (e.code === 'ER_DUP_ENTRY' || e.errno === 1062) {
    const match = /for key '([^']+)'/.exec(e.message ?? '');
    throw new UniqueViolationError(match?.[1]?.split('.').pop(), { cause: err });
  }
  if (typeof e.message === 'string' && e.message.includes('UNIQUE constraint failed')) {
    const match = /UNIQUE constraint failed: ([\w.]+)/.exec(e.message);
    throw new UniqueViolationError(match?.[1]?.replace('.', '_'), { cause: err });
  }
  throw err;
}
