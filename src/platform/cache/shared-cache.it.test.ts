import { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { deleteByPrefix, services, uniqueName } from '../../../test/rig/resources.js';
import { createNoSharedCache, createRedisSharedCache } from './create.js';
import { defineSharedCacheContract } from './shared-cache.contract.js';

async function keysByPrefix(redis: Redis, prefix: string): Promise<string[]> {
  const pattern = `${prefix.replace(/[*?[\]\\]/g, '\\$&')}*`;
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1_000);
    found.push(...keys);
    cursor = next;
  } while (cursor !== '0');
  return found;
}

defineSharedCacheContract('none (embedded)', async () => ({
  sut: createNoSharedCache(),
  remembers: false,
  cleanup: async () => {},
}));

defineSharedCacheContract('redis', async () => {
  const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
  const prefix = `${uniqueName('cache')}:`;
  return {
    sut: createRedisSharedCache(redis, prefix),
    remembers: true,
    cleanup: async () => {
      await deleteByPrefix(redis, prefix);
      await redis.quit();
    },
  };
});

describe('RedisSharedCache keys', () => {
  let redis: Redis;
  let prefix: string;

  beforeEach(() => {
    redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    prefix = `${uniqueName('cache')}:`;
  });
  afterEach(async () => {
    await deleteByPrefix(redis, prefix);
    await redis.quit();
  });

  it('keeps a guard and its values in one hash slot, under the prefix, with expiries', async () => {
    const sut = createRedisSharedCache(redis, prefix);
    const slot = { key: 'feed:1:20', guard: 'feed' };
    const [r] = await sut.get([slot]);
    await sut.fill([{ ...slot, gen: r!.gen, value: '[1,2]' }], 5_000);
    await sut.invalidate(['feed']);
    const keys = (await keysByPrefix(redis, prefix)).sort();
    expect(keys).toEqual([`${prefix}c:{feed}`, `${prefix}c:{feed}:feed:1:20`]);
    for (const key of keys) expect(await redis.pttl(key)).toBeGreaterThan(0);
  });

  it('makes no key for a miss nothing is filled for, and keeps a guard a day once something was', async () => {
    const sut = createRedisSharedCache(redis, prefix);
    const slots = [1, 2].map((n) => ({ key: `post:${n}`, guard: `post:${n}` }));
    const [missing, found] = await sut.get(slots);
    // Only the second is found and filled; the first (an id no post has) stays a miss.
    await sut.fill([{ ...slots[1]!, gen: found!.gen, value: 'v' }], 10_000);
    expect(await redis.exists(`${prefix}c:{post:1}`)).toBe(0);
    expect(await redis.pttl(`${prefix}c:{post:2}`)).toBeGreaterThan(23 * 3600_000);
    // Asked for again and again (a crawler's ids), still nothing.
    for (let i = 0; i < 3; i++) expect((await sut.get([slots[0]!]))[0]).toEqual(missing);
    expect(await keysByPrefix(redis, `${prefix}c:{post:1}`)).toEqual([]);
    expect((await sut.get([slots[1]!]))[0]!.value).toBe('v');
  });

  it('stores nothing read before an invalidation that made the guard', async () => {
    const sut = createRedisSharedCache(redis, prefix);
    const slot = { key: 'post:3', guard: 'post:3' };
    const [before] = await sut.get([slot]);
    await sut.invalidate(['post:3']);
    await sut.fill([{ ...slot, gen: before!.gen, value: 'public v1' }], 10_000);
    expect((await sut.get([slot]))[0]!.value).toBeNull();
    // Two readers of a missing guard: the first fill makes it, the second stores nothing.
    const other = { key: 'post:4', guard: 'post:4' };
    const [[a], [b]] = await Promise.all([sut.get([other]), sut.get([other])]);
    await sut.fill([{ ...other, gen: a!.gen, value: 'first' }], 10_000);
    await sut.fill([{ ...other, gen: b!.gen, value: 'second' }], 10_000);
    expect((await sut.get([other]))[0]!.value).toBe('first');
    // So with a family under one guard nobody made yet: one value is kept, the rest at the next miss.
    const family = ['feed:1', 'feed:2'].map((key) => ({ key, guard: 'feed' }));
    const reads = await sut.get(family);
    await sut.fill(
      family.map((slot, i) => ({ ...slot, gen: reads[i]!.gen, value: slot.key })),
      10_000,
    );
    expect((await sut.get(family)).map((r) => r.value)).toEqual(['feed:1', null]);
  });

  it('keeps hiding a value that outlived its guard after the next invalidation', async () => {
    const sut = createRedisSharedCache(redis, prefix);
    const slot = { key: 'post:1', guard: 'post:1' };
    await sut.invalidate(['post:1']);
    const [r] = await sut.get([slot]);
    await sut.fill([{ ...slot, gen: r!.gen, value: 'public v1' }], 10_000);
    // The guard expires (a day after it last moved) while the value, filled just before, lives on.
    await redis.del(`${prefix}c:{post:1}`);
    await sut.invalidate(['post:1']);
    const [after] = await sut.get([slot]);
    expect(after!.value).toBeNull();
    expect(after!.gen).not.toBe(r!.gen);
  });

  it('never shows a value again once its guard was lost, also one filled before any invalidation', async () => {
    const sut = createRedisSharedCache(redis, prefix);
    const slot = { key: 'post:2', guard: 'post:2' };
    // Filled while the post was public, before its guard ever moved.
    const [first] = await sut.get([slot]);
    await sut.fill([{ ...slot, gen: first!.gen, value: 'public v1' }], 10_000);
    expect((await sut.get([slot]))[0]!.value).toBe('public v1');
    // Made private: hidden.
    await sut.invalidate(['post:2']);
    expect((await sut.get([slot]))[0]!.value).toBeNull();
    // The guard is lost (evicted, or a failover to a replica that had not seen it): still hidden.
    await redis.del(`${prefix}c:{post:2}`);
    const [lost] = await sut.get([slot]);
    expect(lost!.value).toBeNull();
    // Filled again, under a generation it never had.
    await sut.fill([{ ...slot, gen: lost!.gen, value: 'private now' }], 10_000);
    const [again] = await sut.get([slot]);
    expect(again).toEqual({ gen: expect.not.stringMatching(`^(${first!.gen})?$`), value: 'private now' });
  });

  it('refuses guards that would break the hash tag', async () => {
    const sut = createRedisSharedCache(redis, prefix);
    await expect(sut.get([{ key: 'k', guard: 'a}b' }])).rejects.toThrow(RangeError);
  });
});
