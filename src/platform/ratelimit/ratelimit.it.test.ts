import { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { deleteByPrefix, openTempSqlite, services, uniqueName } from '../../../test/rig/resources.js';
import type { Db } from '../db/database.js';
import { createSqliteKv } from '../kv/create.js';
import { createRedisRateLimiter, createSqliteRateLimiter } from './create.js';
import { defineRateLimiterContract } from './ratelimit.contract.js';

defineRateLimiterContract('sqlite (advanced clock)', async () => {
  const { db, dispose } = await openTempSqlite();
  let now = Date.parse('2030-01-01T00:00:00Z');
  return {
    sut: createSqliteRateLimiter(db, { now: () => now }),
    advance: (ms) => {
      now += ms;
    },
    cleanup: dispose,
  };
});

defineRateLimiterContract('sqlite (real clock)', async () => {
  const { db, dispose } = await openTempSqlite();
  return { sut: createSqliteRateLimiter(db), cleanup: dispose };
});

defineRateLimiterContract('redis', async () => {
  const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
  const prefix = `${uniqueName('rl')}:`;
  return {
    sut: createRedisRateLimiter(redis, prefix),
    cleanup: async () => {
      await deleteByPrefix(redis, prefix);
      await redis.quit();
    },
  };
});

describe('RedisRateLimiter storage', () => {
  let redis: Redis;
  let prefix: string;

  beforeEach(() => {
    redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    prefix = `${uniqueName('rl')}:`;
  });
  afterEach(async () => {
    await deleteByPrefix(redis, prefix);
    await redis.quit();
  });

  it('gives every window key an expiry, even one found without', async () => {
    const rl = createRedisRateLimiter(redis, prefix);
    await rl.hit('ip:1', 5, 30_000);
    const ttl = await redis.pttl(`${prefix}rl:ip:1`);
    expect(ttl).toBeGreaterThan(25_000);
    expect(ttl).toBeLessThanOrEqual(30_000);

    await redis.set(`${prefix}rl:ip:2`, '3');
    const d = await rl.hit('ip:2', 5, 30_000);
    expect(d).toEqual({ allowed: true, remaining: 1, retryAfterMs: 0 });
    expect(await redis.pttl(`${prefix}rl:ip:2`)).toBeGreaterThan(25_000);
  });

  it('shares a window between limiter instances on separate connections', async () => {
    const other = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    try {
      const a = createRedisRateLimiter(redis, prefix);
      const b = createRedisRateLimiter(other, prefix);
      const decisions = await Promise.all(
        Array.from({ length: 20 }, (_, i) => (i % 2 === 0 ? a : b).hit('shared', 7, 60_000)),
      );
      expect(decisions.filter((d) => d.allowed)).toHaveLength(7);
    } finally {
      await other.quit();
    }
  });
});

describe('SqliteRateLimiter storage', () => {
  let db: Db;
  let dispose: () => Promise<void>;

  beforeEach(async () => {
    ({ db, dispose } = await openTempSqlite());
  });
  afterEach(async () => {
    await dispose();
  });

  it('sweeps ended windows so rows do not pile up', async () => {
    let now = Date.parse('2030-01-01T00:00:00Z');
    const rl = createSqliteRateLimiter(db, { now: () => now, sweepIntervalMs: 10_000 });
    for (let i = 0; i < 40; i++) await rl.hit(`ip:${i}`, 5, 1_000);
    now += 11_000;
    await rl.hit('ip:new', 5, 1_000);
    const rows = await db.kysely.selectFrom('kv').select('k').execute();
    expect(rows.map((r) => r.k)).toEqual(['rl:ip:new']);
  });

  it('keeps its rows apart from the key-value store sharing the table', async () => {
    const kv = createSqliteKv(db);
    const rl = createSqliteRateLimiter(db);
    await kv.set('login', 'value');
    await rl.hit('login', 1, 60_000);
    expect((await rl.hit('login', 1, 60_000)).allowed).toBe(false);
    expect(await kv.get('login')).toBe('value');
    await rl.reset('login');
    expect(await kv.get('login')).toBe('value');
  });

  it('decides hits made together one after the other, on the count each one left', async () => {
    const rl = createSqliteRateLimiter(db);
    const decisions = await Promise.all(Array.from({ length: 40 }, () => rl.hit('together', 10, 60_000)));
    expect(decisions.slice(0, 10).map((d) => [d.allowed, d.remaining])).toEqual(
      Array.from({ length: 10 }, (_, i) => [true, 9 - i]),
    );
    expect(decisions.slice(10).every((d) => !d.allowed && d.remaining === 0)).toBe(true);
  });

  it('fails every hit waiting for a commit that cannot be made, and takes hits again afterwards', async () => {
    const rl = createSqliteRateLimiter(db);
    await rl.hit('k', 5, 60_000);
    db.raw!.exec("CREATE TRIGGER refuse BEFORE UPDATE ON kv BEGIN SELECT RAISE(ABORT, 'refused'); END");
    const failed = await Promise.allSettled([rl.hit('k', 5, 60_000), rl.hit('k', 5, 60_000)]);
    expect(failed.map((r) => r.status)).toEqual(['rejected', 'rejected']);
    db.raw!.exec('DROP TRIGGER refuse');
    expect(await rl.hit('k', 5, 60_000)).toEqual({ allowed: true, remaining: 3, retryAfterMs: 0 });
  });
});
