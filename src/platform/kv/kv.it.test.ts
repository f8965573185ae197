import { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { deleteByPrefix, openTempSqlite, services, uniqueName } from '../../../test/rig/resources.js';
import type { Db } from '../db/database.js';
import { createRedisKv, createSqliteKv } from './create.js';
import { defineKeyValueStoreContract } from './kv.contract.js';

defineKeyValueStoreContract('sqlite (advanced clock)', async () => {
  const { db, dispose } = await openTempSqlite();
  let now = Date.parse('2030-01-01T00:00:00Z');
  return {
    sut: createSqliteKv(db, { now: () => now }),
    advance: (ms) => {
      now += ms;
    },
    cleanup: dispose,
  };
});

defineKeyValueStoreContract('sqlite (real clock)', async () => {
  const { db, dispose } = await openTempSqlite();
  return { sut: createSqliteKv(db), cleanup: dispose };
});

defineKeyValueStoreContract('redis', async () => {
  const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
  const prefix = `${uniqueName('kv')}:`;
  return {
    sut: createRedisKv(redis, prefix),
    cleanup: async () => {
      await deleteByPrefix(redis, prefix);
      await redis.quit();
    },
  };
});

describe('RedisKeyValueStore key prefix', () => {
  let redis: Redis;
  const prefixes: string[] = [];

  beforeEach(() => {
    redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
  });
  afterEach(async () => {
    for (const p of prefixes.splice(0)) await deleteByPrefix(redis, p);
    await redis.quit();
  });

  it('keeps stores with different prefixes apart', async () => {
    const [pa, pb] = [`${uniqueName('kv')}:`, `${uniqueName('kv')}:`];
    prefixes.push(pa, pb);
    const a = createRedisKv(redis, pa);
    const b = createRedisKv(redis, pb);
    await a.set('shared', 'from-a');
    await a.incr('count', 3);
    expect(await b.get('shared')).toBeNull();
    expect(await b.mget(['shared', 'count'])).toEqual([null, null]);
    expect(await b.setIfAbsent('shared', 'from-b')).toBe(true);
    expect(await b.incr('count')).toBe(1);
    expect(await b.delete('shared')).toBe(true);
    expect(await a.get('shared')).toBe('from-a');
    expect(await a.getDel('count')).toBe('3');
    expect(await b.ttl('count')).toBe(-1);
  });

  it('stores keys under the prefix and nowhere else', async () => {
    const p = `${uniqueName('kv')}:`;
    prefixes.push(p);
    const kv = createRedisKv(redis, p);
    await kv.set('x', '1', 60_000);
    await kv.incr('y', 1, 60_000);
    expect(await redis.get(`${p}x`)).toBe('1');
    expect(await redis.pttl(`${p}y`)).toBeGreaterThan(50_000);
    expect(await redis.exists('x', 'y')).toBe(0);
  });
});

describe('SqliteKeyValueStore expired-row sweep', () => {
  let db: Db;
  let dispose: () => Promise<void>;
  let now: number;

  beforeEach(async () => {
    ({ db, dispose } = await openTempSqlite());
    now = Date.parse('2030-01-01T00:00:00Z');
  });
  afterEach(async () => {
    await dispose();
  });

  const rowCount = async (): Promise<number> => {
    const row = await db.kysely
      .selectFrom('kv')
      .select((eb) => eb.fn.countAll<number>().as('n'))
      .executeTakeFirstOrThrow();
    return Number(row.n);
  };

  it('deletes expired rows in bounded batches and keeps live ones', async () => {
    const kv = createSqliteKv(db, { now: () => now, sweepIntervalMs: 1e12 });
    for (let i = 0; i < 25; i++) await kv.set(`t${i}`, 'v', 1_000);
    await kv.set('forever', 'v');
    await kv.set('later', 'v', 60_000);
    now += 5_000;
    expect(await kv.sweepExpired(10)).toBe(10);
    expect(await rowCount()).toBe(17);
    expect(await kv.sweepExpired()).toBe(15);
    expect(await kv.sweepExpired()).toBe(0);
    expect(await kv.mget(['forever', 'later'])).toEqual(['v', 'v']);
  });

  it('sweeps opportunistically from writes once the interval has passed', async () => {
    const kv = createSqliteKv(db, { now: () => now, sweepIntervalMs: 10_000, sweepBatch: 100 });
    for (let i = 0; i < 50; i++) await kv.set(`t${i}`, 'v', 1_000);
    now += 5_000;
    await kv.set('trigger', 'v');
    expect(await rowCount()).toBe(51);
    now += 6_000;
    await kv.incr('trigger2');
    expect(await rowCount()).toBe(2);
  });

  it('keeps sweeping on following writes while a backlog remains', async () => {
    const kv = createSqliteKv(db, { now: () => now, sweepIntervalMs: 10_000, sweepBatch: 10 });
    for (let i = 0; i < 25; i++) await kv.set(`t${i}`, 'v', 1_000);
    now += 11_000;
    await kv.set('w1', 'v');
    expect(await rowCount()).toBe(16);
    await kv.set('w2', 'v');
    expect(await rowCount()).toBe(7);
    await kv.set('w3', 'v');
    expect(await rowCount()).toBe(3);
    for (let i = 0; i < 5; i++) await kv.set(`u${i}`, 'v', 1_000);
    now += 2_000;
    await kv.set('w4', 'v');
    expect(await rowCount()).toBe(9);
  });

  it('refuses a database of another dialect', () => {
    expect(() => createSqliteKv({ ...db, dialect: 'mysql' })).toThrow(/sqlite/);
  });
});
