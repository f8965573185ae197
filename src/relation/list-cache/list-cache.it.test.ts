import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { deleteByPrefix, services, uniqueName } from '../../../test/rig/resources.js';
import { defineListCacheContract } from './list-cache.contract.js';
import { MemoryListCache } from './memory-list-cache.js';
import { DEFAULT_MARK_TTL_MS, RedisListCache } from './redis-list-cache.js';

defineListCacheContract('memory', async () => {
  let now = Date.parse('2030-01-01T00:00:00Z');
  const ttlMs = 60_000;
  const maxEntries = 50;
  return {
    sut: new MemoryListCache({ ttlMs, maxEntries, maxLists: 1000, now: () => now }),
    ttlMs,
    maxEntries,
    advance: (ms) => {
      now += ms;
    },
    cleanup: async () => undefined,
  };
});

defineListCacheContract('redis', async () => {
  const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1, enableAutoPipelining: true });
  const prefix = `${uniqueName('rel')}:`;
  const ttlMs = 600;
  const maxEntries = 1200;
  return {
    sut: new RedisListCache(redis, { prefix, ttlMs, maxEntries }),
    ttlMs,
    maxEntries,
    cleanup: async () => {
      await deleteByPrefix(redis, prefix);
      await redis.quit();
    },
  };
});

describe('memory list cache', () => {
  it('keeps at most its total of entries over all lists, dropping the least recently used', async () => {
    const sut = new MemoryListCache({ ttlMs: 60_000, maxEntries: 50, maxLists: 1000, maxTotalEntries: 100 });
    const entries = (n: number) => Array.from({ length: n }, (_, i) => ({ userId: i + 1, createdAt: i }));
    const lists = [1, 2, 3].map((owner) => ({ owner, kind: 'followers' as const }));
    for (const list of lists) expect((await sut.fill(list, async () => entries(40))).cached).toBe(true);
    // 3 × (40 + 1) > 100: the first list went.
    expect(await sut.all(lists[0]!)).toBeNull();
    expect((await sut.all(lists[1]!))?.length).toBe(40);
    expect((await sut.all(lists[2]!))?.length).toBe(40);
  });
});

describe('redis list cache marks', () => {
  it('keeps a change mark minutes, not a day: every follow moves two', async () => {
    const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    const prefix = `${uniqueName('rel')}:`;
    try {
      const sut = new RedisListCache(redis, { prefix, ttlMs: 60_000, maxEntries: 100 });
      await sut.apply([{ owner: 7, kind: 'followers', userId: 8, createdAt: Date.now() }]);
      const ttl = await redis.pttl(`${prefix}rel:{u7}:followers:mark`);
      expect(ttl).toBeGreaterThan(DEFAULT_MARK_TTL_MS - 5_000);
      expect(ttl).toBeLessThanOrEqual(10 * 60_000);
    } finally {
      await deleteByPrefix(redis, prefix);
      await redis.quit();
    }
  });

  it('refuses a fill that read a mark which expired and moved again before it installed', async () => {
    const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    const prefix = `${uniqueName('rel')}:`;
    try {
      const sut = new RedisListCache(redis, { prefix, ttlMs: 60_000, maxEntries: 100 });
      const list = { owner: 7, kind: 'followers' as const };
      await sut.apply([{ ...list, userId: 8, createdAt: 1 }]);
      const filled = await sut.fill(list, async () => {
        // The mark read before this load expires, and a follow moves it again.
        await redis.del(`${prefix}rel:{u7}:followers:mark`);
        await sut.apply([{ ...list, userId: 9, createdAt: 2 }]);
        return [{ userId: 8, createdAt: 1 }];
      });
      expect(filled.cached).toBe(false);
      expect(await sut.all(list)).toBeNull();
    } finally {
      await deleteByPrefix(redis, prefix);
      await redis.quit();
    }
  });

  it('refuses a fill begun before any change when a change moved the mark and the mark was lost', async () => {
    const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    const prefix = `${uniqueName('rel')}:`;
    try {
      const sut = new RedisListCache(redis, { prefix, ttlMs: 60_000, maxEntries: 100 });
      const list = { owner: 7, kind: 'followers' as const };
      const filled = await sut.fill(list, async () => {
        // A follow lands after the load read the database, then its mark goes (eviction, a failover).
        await sut.apply([{ ...list, userId: 9, createdAt: 2 }]);
        await redis.del(`${prefix}rel:{u7}:followers:mark`);
        return [];
      });
      expect(filled.cached).toBe(false);
      expect(await sut.all(list)).toBeNull();
    } finally {
      await deleteByPrefix(redis, prefix);
      await redis.quit();
    }
  });
});
