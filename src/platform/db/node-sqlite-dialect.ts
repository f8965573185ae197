import { DatabaseSync, type SQLInputValue } from 'node:sqlite';
import { SqliteDialect, type SqliteDatabase, type SqliteStatement } from 'kysely';

/**
 * Kysely's SQLite dialect speaks to a better-sqlite3-shaped handle; this adapts Node's built-in
 * `node:sqlite` to it, so the embedded profile needs no native addon. Booleans become 0/1 and
 * dates epoch milliseconds, the only conversions node:sqlite does not do itself.
 */
export function createNodeSqliteDialect(path: string): { dialect: SqliteDialect; raw: DatabaseSync } {
  const raw = new DatabaseSync(path);
  raw.exec('PRAGMA journal_mode = WAL');
  raw.exec('PRAGMA synchronous = NORMAL');
  raw.exec('PRAGMA foreign_keys = ON');
  raw.exec('PRAGMA busy_timeout = 5000');

  const toParams = (params: readonly unknown[]): SQLInputValue[] =>
    params.map((p) => {
      if (typeof p === 'boolean') return p ? 1 : 0;
      if (p instanceof Date) return p.getTime();
      if (p === undefined) return null;
      return p as SQLInputValue;
    });

  const database: SqliteDatabase = {
    close: () => raw.close(),
    prepare(sql: string): SqliteStatement {
      const stmt = raw.prepare(sql);
      return {
        reader: stmt.columns().length > 0,
        all: (params) => stmt.all(...toParams(params)),
        run: (params) => {
          const r = stmt.run(...toParams(params));
          return { changes: r.changes, lastInsertRowid: r.lastInsertRowid };
        },
        iterate: (params) => stmt.iterate(...toParams(params)),
      };
    },
  };
  return { dialect: new SqliteDialect({ database }), raw };
}
