import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { openTempSqlite } from '../../../test/rig/resources.js';
import type { Db } from '../../platform/db/database.js';
import { ZERO_USER_COUNTS } from '../model.js';
import { SqliteUserCounterStore } from './sqlite-user-counter-store.js';
import { defineUserCounterStoreContract } from './user-counter-store.contract.js';

defineUserCounterStoreContract('sqlite', async (options = {}) => {
  const { db, dispose } = await openTempSqlite();
  return {
    sut: new SqliteUserCounterStore(db, options),
    // One process owns the embedded database; "another process" shares its connection.
    another: () => new SqliteUserCounterStore(db, options),
    cleanup: dispose,
  };
});

const NOW = Date.parse('2030-01-01T00:00:00Z');

describe('SqliteUserCounterStore (embedded specifics)', () => {
  let db: Db;
  let dispose: () => Promise<void>;

  beforeEach(async () => {
    ({ db, dispose } = await openTempSqlite());
  });
  afterEach(async () => {
    await dispose();
  });

  const count = (table: string): number =>
    (db.raw!.prepare(`SELECT count(*) AS n FROM ${table}`).get() as { n: number }).n;

  it('applies nothing of a batch whose transaction fails, so the redelivery counts once', async () => {
    const sut = new SqliteUserCounterStore(db);
    await sut.write(1, { ...ZERO_USER_COUNTS, posts: 1 }, {}, NOW);
    db.raw!.exec(`CREATE TRIGGER die_mid_apply BEFORE INSERT ON user_counter_applied
                  WHEN NEW.event_id = 'e3' BEGIN SELECT RAISE(ABORT, 'injected crash'); END`);
    const batch = ['e1', 'e2', 'e3'].map((eventId) => ({
      eventId,
      userId: 1,
      field: 'posts' as const,
      delta: 1,
    }));
    await expect(sut.apply(batch, NOW)).rejects.toThrow(/injected crash/);
    // As the write left it.
    expect(await sut.inspect(1, ['e1'])).toEqual({
      counts: { ...ZERO_USER_COUNTS, posts: 1 },
      version: 1,
      applied: [false],
    });
    db.raw!.exec('DROP TRIGGER die_mid_apply');
    expect(await sut.apply(batch, NOW)).toEqual({ applied: 3, skipped: 0 });
    expect(await sut.apply(batch, NOW)).toEqual({ applied: 0, skipped: 3 });
    expect(await sut.read([1])).toEqual([{ ...ZERO_USER_COUNTS, posts: 4 }]);
  });

  it('trims expired applied ids in bounded steps as applies go on', async () => {
    const sut = new SqliteUserCounterStore(db, { retentionMs: 1_000 });
    const old = Array.from({ length: 2_500 }, (_, i) => ({
      eventId: `old-${i}`,
      userId: 1 + (i % 10),
      field: 'posts' as const,
      delta: 1,
    }));
    await sut.apply(old, NOW);
    expect(count('user_counter_applied')).toBe(2_500);
    await sut.apply([{ eventId: 'new-1', userId: 1, field: 'posts', delta: 1 }], NOW + 5_000);
    // At least 1,000 a call: the table cannot grow faster than it is trimmed.
    expect(count('user_counter_applied')).toBe(2_500 - 1_000 + 1);
    await sut.apply([{ eventId: 'new-2', userId: 1, field: 'posts', delta: 1 }], NOW + 5_000);
    await sut.apply([{ eventId: 'new-3', userId: 1, field: 'posts', delta: 1 }], NOW + 5_000);
    expect(count('user_counter_applied')).toBe(3);
  });

  it('refuses a database it cannot use', () => {
    expect(() => new SqliteUserCounterStore({ ...db, dialect: 'mysql' })).toThrow(/sqlite/);
  });
});
