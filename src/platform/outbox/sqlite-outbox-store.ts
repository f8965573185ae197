import type { Db } from '../db/database.js';
import { toOutboxRow, type ClaimResult, type OutboxRow, type OutboxStore } from './outbox.js';

const DELETE_CHUNK = 500;

/**
 * Outbox of the embedded profile: one process, so a plain select suffices; claims made through one
 * store instance run one after another. No transaction spans `work`, because the embedded event
 * log writes to the same single-connection database while it runs.
 */
export class SqliteOutboxStore implements OutboxStore {
  private tail: Promise<unknown> = Promise.resolve();

  constructor(private readonly db: Db) {}

  claim(limit: number, work: (rows: OutboxRow[]) => Promise<number[]>): Promise<ClaimResult> {
    const run = this.tail.then(() => this.claimNow(limit, work));
    this.tail = run.catch(() => undefined);
    return run;
  }

  private async claimNow(
    limit: number,
    work: (rows: OutboxRow[]) => Promise<number[]>,
  ): Promise<ClaimResult> {
    const rows = await this.db.kysely.selectFrom('outbox').selectAll().orderBy('id').limit(limit).execute();
    if (rows.length === 0) return { handed: 0, full: false };
    const done = await work(rows.map(toOutboxRow));
    for (let i = 0; i < done.length; i += DELETE_CHUNK) {
      await this.db.kysely
        .deleteFrom('outbox')
        .where('id', 'in', done.slice(i, i + DELETE_CHUNK))
        .execute();
    }
    return { handed: rows.length, full: rows.length >= limit };
  }
}
