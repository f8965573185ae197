import type { DatabaseSync, StatementSync } from 'node:sqlite';
import type { Kysely } from 'kysely';
import type { Database } from './schema.js';

/** Prepared `BEGIN IMMEDIATE`, `BEGIN` and `COMMIT` of one connection. */
export interface TransactionStatements {
  begin: StatementSync;
  beginRead: StatementSync;
  commit: StatementSync;
}

export function prepareTransactionStatements(raw: DatabaseSync): TransactionStatements {
  return {
    begin: raw.prepare('BEGIN IMMEDIATE'),
    beginRead: raw.prepare('BEGIN'),
    commit: raw.prepare('COMMIT'),
  };
}

/**
 * Runs the synchronous `work` in one transaction while holding Kysely's connection lock: no Kysely
 * query or transaction can interleave, and since `work` is synchronous neither can anything else.
 * Writes take the write lock up front, so a second process cannot make the transaction fail half-way.
 */
export function runExclusive<T>(
  kysely: Kysely<Database>,
  raw: DatabaseSync,
  statements: TransactionStatements,
  work: () => T,
  mode: 'write' | 'read' = 'write',
): Promise<T> {
  return kysely.connection().execute(async () => {
    (mode === 'write' ? statements.begin : statements.beginRead).run();
    try {
      const result = work();
      statements.commit.run();
      return result;
    } catch (err) {
      if (raw.isTransaction) raw.exec('ROLLBACK');
      throw err;
    }
  });
}
