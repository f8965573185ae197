import type { Db } from '../db/database.js';
import { toOutboxRow, type ClaimResult, type OutboxRow, type OutboxStore } from './outbox.js';

/**
 * Outbox on MariaDB/MySQL, shared by many relay processes. A claim is one transaction: lock the
 * oldest rows nobody else holds (`FOR UPDATE SKIP LOCKED`), publish, delete, commit. A crashed relay
 * loses its connection, the transaction rolls back and the rows become claimable again.
 *
 * SKIP LOCKED alone would let a second relay publish a later row of a key while the first still
 * holds an earlier one, so rows with an older, still-present row of the same topic and key outside
 * the claim are left for a later round.
 */
export class MysqlOutboxStore implements OutboxStore {
  constructor(private readonly db: Db) {
    if (db.dialect !== 'mysql') throw new Error('MysqlOutboxStore needs the mysql dialect');
  }

  async claim(limit: number, work: (rows: OutboxRow[]) => Promise<number[]>): Promise<ClaimResult> {
    return this.db.kysely
      .transaction()
      .setIsolationLevel('read committed')
      .execute(async (trx) => {
        const locked = (
          await trx
            .selectFrom('outbox')
            .selectAll()
            .orderBy('id')
            .limit(limit)
            .forUpdate()
            .skipLocked()
            .execute()
        ).map(toOutboxRow);
        if (locked.length === 0) return { handed: 0, full: false };

        const mine = new Set(locked.map((r) => r.id));
        const lastId = locked[locked.length - 1]!.id;
        // A plain read: sees rows other relays hold (they are not deleted until those commit).
        const older = await trx
          .selectFrom('outbox')
          .select(['id', 'topic', 'msg_key'])
          .where('id', '<', lastId)
          .where('msg_key', 'in', [...new Set(locked.map((r) => r.key))])
          .execute();
        const firstForeign = new Map<string, number>();
        for (const row of older) {
          const id = Number(row.id);
          if (mine.has(id)) continue;
          const k = slot(row.topic, row.msg_key);
          const seen = firstForeign.get(k);
          if (seen === undefined || id < seen) firstForeign.set(k, id);
        }
        const ready = locked.filter((r) => {
          const foreign = firstForeign.get(slot(r.topic, r.key));
          return foreign === undefined || r.id < foreign;
        });
        // Everything taken waits behind other claimers: the next round after a poll interval.
        if (ready.length === 0) return { handed: 0, full: false };

        const done = await work(ready);
        // Deletes touch no row another relay holds, so they never wait, and a batch already
        // published is never rolled back by a deadlock. Ids are unique integers, so a run of
        // consecutive ids this transaction holds contains nobody else's row. A range scan reads one
        // record past its end before it stops, and under InnoDB that read takes the record's lock:
        // each run's range therefore ends at its own last row, which a unique equality lookup then
        // deletes. A claim is usually one run, as committed rows get consecutive ids. (A multi-row
        // `IN` delete was seen to scan past its rows and deadlock with other relays.)
        for (const [from, to] of consecutiveRuns(done)) {
          if (from < to)
            await trx.deleteFrom('outbox').where('id', '>=', from).where('id', '<', to).execute();
          await trx.deleteFrom('outbox').where('id', '=', to).execute();
        }
        return { handed: ready.length, full: locked.length >= limit };
      });
  }
}

/** Sorted runs `[from, to]` of consecutive integers covering exactly the given ids. */
export function consecutiveRuns(ids: readonly number[]): [number, number][] {
  const sorted = [...new Set(ids)].sort((x, y) => x - y);
  const runs: [number, number][] = [];
  for (const id of sorted) {
    const last = runs[runs.length - 1];
    if (last && id === last[1] + 1) last[1] = id;
    else runs.push([id, id]);
  }
  return runs;
}

function slot(topic: string, key: string): string {
  return `${topic}\u0000${key}`;
}
