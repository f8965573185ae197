import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { freshDatabases, type FreshDatabase } from '../../test/rig/resources.js';
import type { Db } from '../platform/db/database.js';
import { LoginAuditRepository } from './login-audit.repository.js';

describe.each(freshDatabases({ migrated: true }))(`${LoginAuditRepository.name} on %s`, (_, open) => {
  let fresh: FreshDatabase;
  let db: Db;
  let clock = 0;
  let sut: LoginAuditRepository;

  beforeAll(async () => {
    fresh = await open();
    db = fresh.db;
    sut = new LoginAuditRepository(db, () => clock);
  });
  afterAll(async () => fresh?.close());
  beforeEach(async () => {
    await db.kysely.deleteFrom('login_audit').execute();
  });

  /** Attempts recorded at these times, in this order. */
  const recordAt = async (...times: number[]) => {
    for (const time of times) {
      clock = time;
      await sut.record({
        userId: null,
        identifier: `at-${time}@example.test`,
        channel: 'PASSWORD',
        success: false,
        reason: 'INVALID_CREDENTIALS',
        ip: '10.0.0.1',
        userAgent: 'test',
      });
    }
  };
  const remaining = async () =>
    (await db.kysely.selectFrom('login_audit').select('created_at').orderBy('id').execute()).map((r) =>
      Number(r.created_at),
    );

  it('deletes the attempts older than the cutoff, over several ranges, and keeps the rest', async () => {
    await recordAt(...Array.from({ length: 23 }, (_, i) => 1_000 + i), 5_000, 5_001);
    // Stopped (the worker shuts down): no further range.
    const stop = new AbortController();
    stop.abort();
    expect(await sut.deleteBefore(1_020, { batch: 4, signal: stop.signal })).toBe(0);
    expect(await sut.deleteBefore(1_020, { batch: 4 })).toBe(20);
    expect(await remaining()).toEqual([1_020, 1_021, 1_022, 5_000, 5_001]);
    expect(await sut.deleteBefore(1_020, { batch: 4 })).toBe(0);
    expect(await sut.deleteBefore(5_001)).toBe(4);
    expect(await remaining()).toEqual([5_001]);
  });

  it('stops after its ranges and goes on where it stopped', async () => {
    await recordAt(...Array.from({ length: 10 }, (_, i) => 1_000 + i));
    expect(await sut.deleteBefore(2_000, { batch: 3, maxBatches: 2 })).toBe(6);
    expect(await remaining()).toEqual([1_006, 1_007, 1_008, 1_009]);
    expect(await sut.deleteBefore(2_000, { batch: 3, maxBatches: 2 })).toBe(4);
    expect(await remaining()).toEqual([]);
  });

  it('deletes an old attempt recorded after a newer one (another process’s clock) with its range', async () => {
    await recordAt(1_000, 1_003, 1_001, 1_002, 3_000);
    expect(await sut.deleteBefore(1_003)).toBe(3);
    expect(await remaining()).toEqual([1_003, 3_000]);
  });

  it('goes on past an attempt stamped far ahead by a wrong clock', async () => {
    await recordAt(1_000, 9_000_000_000_000, ...Array.from({ length: 9 }, (_, i) => 1_001 + i), 5_000);
    expect(await sut.deleteBefore(2_000, { batch: 3 })).toBe(10);
    expect(await remaining()).toEqual([9_000_000_000_000, 5_000]);
    // Later, alone in its range, it still does not stop the rounds.
    clock = 6_000;
    expect(await sut.deleteBefore(5_500, { batch: 3 })).toBe(1);
    expect(await remaining()).toEqual([9_000_000_000_000]);
  });

  it('does nothing on an empty table or when the oldest attempt is recent', async () => {
    expect(await sut.deleteBefore(10_000)).toBe(0);
    await recordAt(20_000);
    expect(await sut.deleteBefore(10_000)).toBe(0);
    expect(await remaining()).toEqual([20_000]);
  });
});
