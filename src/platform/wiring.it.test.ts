import { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { openTempSqlite, services, uniqueName, userRow } from '../../test/rig/resources.js';
import { RedisCounterStore } from '../counter/store/redis-counter-store.js';
import { checkCounterGroups, clusterRedisOptions, reportEmptyRedis } from './wiring.js';

describe('the cluster profile’s Redis client', () => {
  let redis: Redis | undefined;
  afterEach(async () => {
    await redis?.quit();
    redis = undefined;
  });

  it('sends a page’s flags at once and auto-pipelines the rest', async () => {
    redis = new Redis(services.redisUrl(), await clusterRedisOptions());
    const store = new RedisCounterStore(redis, { prefix: `${uniqueName('wiring')}:` });
    await redis.ping();
    const refs = [{ etype: 'knowpost', eid: '7300000000000000011' }] as const;
    const flags = store.flags(3, refs);
    expect(redis.autoPipelineQueueSize).toBe(0);
    const snapshots = store.readSnapshots(refs);
    expect(redis.autoPipelineQueueSize).toBe(1);
    expect(await flags).toEqual([{ like: false, fav: false }]);
    expect(await snapshots).toEqual([null]);
  });
});

describe('the counter groups of a deployment', () => {
  it('are recorded by the first process, and a process started with another number refuses to start', async () => {
    const redis = new Redis(services.redisUrl());
    const prefix = `${uniqueName('groups')}:`;
    try {
      // An admin command only reads the mark: finding none, it leaves none.
      expect(await checkCounterGroups(redis, prefix, 4096, false)).toBe('missing');
      expect(await redis.exists(`${prefix}meta:counter-groups`)).toBe(0);
      expect(await checkCounterGroups(redis, prefix, 4096)).toBe('created');
      expect(await checkCounterGroups(redis, prefix, 4096)).toBe('found');
      expect(await checkCounterGroups(redis, prefix, 4096, false)).toBe('found');
      await expect(checkCounterGroups(redis, prefix, 1024, false)).rejects.toThrow(
        /ZG_COUNTER_GROUPS is 1024/,
      );
      await expect(checkCounterGroups(redis, prefix, 1024)).rejects.toThrow(
        /ZG_COUNTER_GROUPS is 1024, but .* laid out in 4096 groups/,
      );
      expect(await redis.get(`${prefix}meta:counter-groups`)).toBe('4096');
    } finally {
      await redis.del(`${prefix}meta:counter-groups`);
      await redis.quit();
    }
  });
});

describe('a Redis without the data of a deployment that has users', () => {
  it('is reported at error level, and a new deployment is not', async () => {
    const messages: { level: number; msg: string }[] = [];
    const log = pino({ level: 'info' }, { write: (line: string) => void messages.push(JSON.parse(line)) });
    const { db, dispose } = await openTempSqlite();
    try {
      await reportEmptyRedis(db, 'zg:', log);
      expect(messages).toEqual([]);
      await db.kysely.insertInto('users').values(userRow()).execute();
      await reportEmptyRedis(db, 'zg:', log);
      expect(messages.map((m) => [m.level, m.msg.split(':')[0]])).toEqual([
        [50, 'Redis holds no data of this deployment'],
      ]);
      expect(messages[0]!.msg).toContain('counters replay --yes');
    } finally {
      await dispose();
    }
  });
});
