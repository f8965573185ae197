import { EventEmitter } from 'node:events';
import { setTimeout as delay } from 'node:timers/promises';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterEach, describe, expect, it } from 'vitest';
import { pino, type Logger } from 'pino';
import { openTempSqlite, services, uniqueName, userRow } from '../../test/rig/resources.js';
import { tcpProxy } from '../../test/rig/tcp-proxy.js';
import { RedisCounterStore } from '../counter/store/redis-counter-store.js';
import { migrate, openSqlite, type Db } from './db/database.js';
import {
  checkCounterGroups,
  checkRedisAtStart,
  checkRedisEviction,
  clusterRedisOptions,
  keepDataPrivate,
  sealCounters,
  SUBSCRIBER_OPTIONS,
  watchRedisConnection,
  watchRedisDataLoss,
} from './wiring.js';

function capturingLog() {
  const messages: { level: number; msg: string }[] = [];
  const log = pino({ level: 'info' }, { write: (line: string) => void messages.push(JSON.parse(line)) });
  return { log, messages };
}

/** A cluster client through a TCP proxy in front of Redis, its connection watched with a PING every 100 ms. */
async function watchedThroughProxy(commandTimeoutMs: number) {
  const proxy = await tcpProxy(new URL(services.redisUrl()));
  const client = new Redis(proxy.url, await clusterRedisOptions(commandTimeoutMs));
  const { log, messages } = capturingLog();
  watchRedisConnection(client, log, 'commands', 100);
  const close = async (): Promise<void> => {
    client.disconnect();
    await proxy.close();
  };
  return { proxy, client, messages, close };
}

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

  it('never sends again, once connected anew, a command that was answered as failed', async () => {
    const proxy = await tcpProxy(new URL(services.redisUrl()));
    const direct = new Redis(services.redisUrl());
    const key = `${uniqueName('wiring')}:resent`;
    const clients: Redis[] = [];
    try {
      const client = new Redis(proxy.url, await clusterRedisOptions(300));
      clients.push(client);
      client.on('error', () => undefined);
      await client.ping();
      // Redis stops answering: the command fails (a like answered 503, "changing nothing").
      proxy.freeze();
      await expect(client.set(key, 'late')).rejects.toThrow(/timed out/i);
      // The connection is reset and made anew: the failed command must not run now.
      const back = new Promise((resolve) => client.once('ready', resolve));
      proxy.cut();
      proxy.thaw();
      await back;
      await client.ping();
      await new Promise((resolve) => setTimeout(resolve, 200));
      expect(await direct.get(key)).toBeNull();
    } finally {
      await direct.del(key);
      direct.disconnect();
      for (const client of clients) client.disconnect();
      await proxy.close();
    }
  });

  it('refuses commands at once after a PING goes unanswered, and serves again once Redis answers', async () => {
    const { proxy, client, messages, close } = await watchedThroughProxy(300);
    try {
      await client.ping();
      // Neither answers nor resets: a stopped server, or a network dropping packets.
      proxy.freeze();
      const found = Date.now() + 5_000;
      while (!messages.some((m) => /connection lost/.test(m.msg)) && Date.now() < found) await delay(20);
      const started = performance.now();
      await expect(client.get('x')).rejects.toThrow();
      expect(performance.now() - started).toBeLessThan(100);
      proxy.thaw();
      const back = Date.now() + 5_000;
      while (client.status !== 'ready' && Date.now() < back) await delay(20);
      expect(await client.ping()).toBe('PONG');
      expect(messages.map((m) => m.msg)).toEqual([
        'Redis connection lost; requests that need it answer 503 until it is back',
        'Redis connection back',
      ]);
    } finally {
      await close();
    }
  });

  it('notices a stopped Redis within a probe and a timeout, also with commands waiting behind others', async () => {
    const { proxy, client, messages, close } = await watchedThroughProxy(1_000);
    try {
      await client.ping();
      proxy.freeze();
      const started = performance.now();
      const failedAt = (command: Promise<unknown>) =>
        command.then(
          () => Number.NaN,
          () => performance.now() - started,
        );
      // One on its way, and one the client holds behind it.
      const first = failedAt(client.get('a'));
      await delay(50);
      const second = failedAt(client.get('b'));
      while (messages.length === 0 && performance.now() - started < 5_000) await delay(10);
      const noticedAt = performance.now() - started;
      expect(noticedAt).toBeLessThan(1_400);
      expect(await first).toBeLessThan(1_400);
      expect(await second).toBeLessThan(1_400);
    } finally {
      await close();
    }
  });

  it('takes a PING answered while the event loop was blocked past the timeout for an answer', async () => {
    const client = new Redis(services.redisUrl(), await clusterRedisOptions(300));
    const { log, messages } = capturingLog();
    watchRedisConnection(client, log, 'commands', 50);
    try {
      await client.ping();
      const connection = client.stream;
      // Blocked (a long GC, a synchronous task) right after each PING went out, past its timeout,
      // its answer waiting to be read.
      const ping = client.ping.bind(client);
      let blocked = 0;
      client.ping = ((...args: Parameters<typeof ping>) => {
        const answer = ping(...args);
        // Once it is written (the client sends at the end of the tick), before its answer is read.
        if (blocked++ < 3)
          setImmediate(() => {
            const until = performance.now() + 450;
            while (performance.now() < until);
          });
        return answer;
      }) as typeof client.ping;
      while (blocked < 4) await delay(20);
      await delay(100);
      expect(messages).toEqual([]);
      expect([client.status, client.stream]).toEqual(['ready', connection]);
    } finally {
      client.disconnect();
    }
  });

  it('bounds commands and connection attempts by the command timeout, or neither when it is 0', async () => {
    expect(await clusterRedisOptions(300)).toMatchObject({ commandTimeout: 300, connectTimeout: 300 });
    const unbounded = await clusterRedisOptions(0);
    expect(unbounded).not.toHaveProperty('commandTimeout');
    expect(unbounded).not.toHaveProperty('connectTimeout');
    // A command lost with its connection is dropped unanswered unless sent again: without a timeout
    // to end it, it is sent again.
    expect(unbounded).toMatchObject({ autoResendUnfulfilledCommands: true });
    expect(await clusterRedisOptions(300)).toMatchObject({ autoResendUnfulfilledCommands: false });
  });

  it('gives the invalidation subscriber neither the command limits nor the fail-fast state', async () => {
    const commands = new Redis(services.redisUrl(), {
      ...(await clusterRedisOptions(300)),
      lazyConnect: true,
    });
    // As fail-fast leaves it while Redis is away.
    commands.options.enableOfflineQueue = false;
    const subscriber = commands.duplicate(SUBSCRIBER_OPTIONS);
    try {
      expect(subscriber.options).toMatchObject({
        enableOfflineQueue: true,
        maxRetriesPerRequest: null,
        enableAutoPipelining: false,
        autoResendUnfulfilledCommands: true,
      });
      expect(subscriber.options.commandTimeout).toBeUndefined();
      expect(commands.options).toMatchObject({ commandTimeout: 300, maxRetriesPerRequest: 2 });
    } finally {
      subscriber.disconnect();
      commands.disconnect();
    }
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

describe('the start-up check of Redis', () => {
  /** Runs `body` with a Redis client, a fresh prefix, a store on it and a database (with a user: `users`). */
  async function withDeployment(
    users: boolean,
    body: (d: {
      redis: Redis;
      prefix: string;
      db: Db;
      store: RedisCounterStore;
      log: Logger;
      messages: { level: number; msg: string }[];
    }) => Promise<void>,
  ): Promise<void> {
    const redis = new Redis(services.redisUrl());
    const prefix = `${uniqueName('startcheck')}:`;
    const { db, dispose } = await openTempSqlite();
    const store = new RedisCounterStore(redis, { prefix, groups: 8, requireSeal: true });
    try {
      if (users) await db.kysely.insertInto('users').values(userRow()).execute();
      await body({ redis, prefix, db, store, ...capturingLog() });
    } finally {
      await store.reset();
      await redis.del(`${prefix}meta:counter-groups`, `${prefix}meta:counter-sealed`);
      await redis.quit();
      await dispose().catch(() => undefined);
    }
  }
  const ref = { etype: 'knowpost', eid: '7300000000000000011' } as const;
  const like = (store: RedisCounterStore, user = 1) => store.toggle(ref, 'like', user, true, Date.now());

  it('marks and seals a new deployment (no users yet), which then takes likes', async () => {
    await withDeployment(false, async ({ redis, prefix, db, store, log, messages }) => {
      await expect(like(store)).rejects.toThrow(/being restored/);
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: true }, log);
      expect(messages).toEqual([]);
      expect(await redis.get(`${prefix}meta:counter-groups`)).toBe('8');
      expect(await redis.get(`${prefix}meta:counter-sealed`)).toBe('1');
      expect((await like(store)).changed).toBe(true);
    });
  });

  it('seals once a deployment whose Redis kept its data but whose groups were never sealed', async () => {
    await withDeployment(true, async ({ redis, prefix, db, store, log, messages }) => {
      await redis.set(`${prefix}meta:counter-groups`, '8');
      // An admin command does not write.
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: false }, log);
      await expect(like(store)).rejects.toThrow(/being restored/);
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: true }, log);
      expect(messages).toEqual([]);
      expect((await like(store)).changed).toBe(true);
    });
  });

  it('seals a marked deployment never sealed unless Redis is behind the database', async () => {
    await withDeployment(true, async ({ redis, prefix, db, store, log, messages }) => {
      await redis.set(`${prefix}meta:counter-groups`, '8');
      // The database has applied the post's changes up to seq 3; Redis numbers them from 1 again
      // (a process of an earlier release took a toggle after a loss and set the mark again).
      await db.kysely
        .insertInto('likes_received_marks')
        .values({ post_id: ref.eid, applied_seq: 3 })
        .execute();
      const unguarded = new RedisCounterStore(redis, { prefix, groups: 8 });
      expect((await unguarded.toggle(ref, 'like', 9, true, Date.now())).changed).toBe(true);
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: true }, log);
      expect(messages.map((m) => [m.level, m.msg.split(':')[0]])).toEqual([
        [50, 'Redis holds no data of this deployment'],
      ]);
      await expect(like(store)).rejects.toThrow(/being restored/);
      // Redis as far as the database (a release before seals, its data whole): sealed.
      for (const user of [10, 11]) await unguarded.toggle(ref, 'like', user, true, Date.now());
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: true }, log);
      expect(messages).toHaveLength(1);
      expect((await like(store, 12)).changed).toBe(true);
    });
  });

  it('reports a Redis that lost the data of a deployment with users, and leaves it unmarked and unsealed until the replay', async () => {
    await withDeployment(true, async ({ redis, prefix, db, store, log, messages }) => {
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: true }, log);
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: true }, log);
      expect(messages.map((m) => [m.level, m.msg.split(':')[0]])).toEqual([
        [50, 'Redis holds no data of this deployment'],
        [50, 'Redis holds no data of this deployment'],
      ]);
      expect(messages[0]!.msg).toContain('counters replay --yes');
      expect(await redis.exists(`${prefix}meta:counter-groups`, `${prefix}meta:counter-sealed`)).toBe(0);
      await expect(like(store)).rejects.toMatchObject({ status: 503, code: 'UNAVAILABLE' });
      // The replay itself says nothing of it, and once done marks and seals the deployment.
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: false, replaying: true }, log);
      expect(messages).toHaveLength(2);
      await sealCounters(redis, prefix, 8, store);
      expect((await like(store)).changed).toBe(true);
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: true }, log);
      expect(messages).toHaveLength(2);
    });
  });

  it('refuses likes in a group that lost its keys after it was sealed, and a reset unseals every group', async () => {
    await withDeployment(false, async ({ redis, prefix, db, store, log }) => {
      const told: number[] = [];
      const watched = new RedisCounterStore(redis, {
        prefix,
        groups: 8,
        requireSeal: true,
        onUnsealed: (group) => told.push(group),
      });
      await checkRedisAtStart(redis, db, prefix, 8, store, { markRedis: true }, log);
      expect((await like(watched)).changed).toBe(true);
      // As a failed-over shard would: the group's keys are gone, the other groups' are not.
      const group = watched.groupOf(ref);
      await redis.del(watched.groupKey('seq', group), watched.factKey(ref, 'like', false));
      await expect(like(watched, 2)).rejects.toThrow(/being restored/);
      expect(told).toEqual([group]);
      const elsewhere = Array.from(
        { length: 40 },
        (_, i) => ({ etype: 'knowpost', eid: String(9000 + i) }) as const,
      ).find((r) => watched.groupOf(r) !== group)!;
      expect((await watched.toggle(elsewhere, 'like', 1, true, Date.now())).changed).toBe(true);
      // The sentinel is no entity.
      const scanned = await watched.scanEntities('', 100);
      expect(scanned.refs.map((r) => r.eid)).toEqual([elsewhere.eid]);
      await watched.reset();
      await expect(watched.toggle(elsewhere, 'like', 2, true, Date.now())).rejects.toThrow(/being restored/);
    });
  });
});

describe('the start-up check of Redis’ eviction policy', () => {
  it('says when keys may be evicted: at error level those without an expiry, and nothing otherwise', async () => {
    const redis = new Redis(services.redisUrl());
    try {
      const { log, messages } = capturingLog();
      // The machine's Redis runs with the default policy.
      expect(await checkRedisEviction(redis, log)).toBeNull();
      const fake = (policy: string, maxmemory = '1073741824') =>
        ({
          config: async (_get: string, name: string) => [name, name === 'maxmemory' ? maxmemory : policy],
        }) as unknown as Pick<Redis, 'config'>;
      // No memory limit: nothing is ever evicted.
      expect(await checkRedisEviction(fake('allkeys-lru', '0'), log)).toBeNull();
      expect(await checkRedisEviction(fake('noeviction'), log)).toBeNull();
      expect(messages).toEqual([]);
      expect(await checkRedisEviction(fake('allkeys-lru'), log)).toBe('allkeys-lru');
      expect(await checkRedisEviction(fake('volatile-ttl'), log)).toBe('volatile-ttl');
      expect(messages.map((m) => [m.level, m.msg.split(':')[0]])).toEqual([
        [50, 'Redis evicts any key when its memory is full (maxmemory-policy allkeys-lru)'],
        [40, 'Redis evicts keys with an expiry when its memory is full (maxmemory-policy volatile-ttl)'],
      ]);
      // A Redis that keeps its configuration to itself is not checked.
      const closed = { config: async () => Promise.reject(new Error('unknown command')) };
      expect(await checkRedisEviction(closed as unknown as Pick<Redis, 'config'>, log)).toBeNull();
      expect(messages).toHaveLength(2);
    } finally {
      await redis.quit();
    }
  });
});

describe('the data-loss watch of a Redis connection', () => {
  /** A connection that emits what it is told to and answers `EXISTS` as `answers` says. */
  function fakeConnection(answers: (() => Promise<number>)[]) {
    const connection = Object.assign(new EventEmitter(), {
      checks: 0,
      exists: () => answers[connection.checks++]!(),
    });
    return connection;
  }
  const settle = () => new Promise((resolve) => setTimeout(resolve, 10));

  it('says so after a reconnection that finds the mark gone, and checks again when a check failed', async () => {
    const connection = fakeConnection([
      () => Promise.reject(new Error('Connection is closed.')),
      () => Promise.resolve(0),
      () => Promise.resolve(0),
      () => Promise.resolve(1),
    ]);
    const { log, messages } = capturingLog();
    watchRedisDataLoss(connection as unknown as Redis, 'zg:', log);
    connection.emit('ready');
    expect(connection.checks).toBe(0);
    connection.emit('close');
    connection.emit('ready');
    await settle();
    expect(messages.map((m) => m.level)).toEqual([40]);
    // No close in between: the failed check is made again all the same, and finds the data gone.
    connection.emit('ready');
    await settle();
    expect(connection.checks).toBe(2);
    expect(messages.map((m) => m.level)).toEqual([40, 50]);
    expect(messages[1]!.msg).toContain('counters replay --yes');
    // Still gone after the next reconnection (nothing set it back): said again.
    connection.emit('close');
    connection.emit('ready');
    await settle();
    expect(messages.map((m) => m.level)).toEqual([40, 50, 50]);
    // Back (a replay ran): nothing to say.
    connection.emit('close');
    connection.emit('ready');
    await settle();
    expect(connection.checks).toBe(4);
    expect(messages).toHaveLength(3);
  });
});

describe('the embedded data directory', () => {
  it('is kept from other local users, also when it was left open by an earlier release', async () => {
    const parent = mkdtempSync(join(tmpdir(), 'zg-private-'));
    const mode = (path: string) => statSync(path).mode & 0o777;
    try {
      const fresh = join(parent, 'fresh');
      keepDataPrivate(fresh);
      expect([mode(fresh), mode(join(fresh, 'objects')), mode(join(fresh, 'zhiguang.db'))]).toEqual([
        0o700, 0o700, 0o600,
      ]);

      const older = join(parent, 'older');
      mkdirSync(join(older, 'objects'), { recursive: true, mode: 0o755 });
      chmodSync(join(older, 'objects'), 0o755);
      writeFileSync(join(older, 'zhiguang.db'), '', { mode: 0o644 });
      writeFileSync(join(older, 'zhiguang.db-wal'), '', { mode: 0o644 });
      chmodSync(join(older, 'zhiguang.db'), 0o644);
      chmodSync(join(older, 'zhiguang.db-wal'), 0o644);
      keepDataPrivate(older);
      expect([
        mode(join(older, 'objects')),
        mode(join(older, 'keys')),
        mode(join(older, 'zhiguang.db')),
        mode(join(older, 'zhiguang.db-wal')),
      ]).toEqual([0o700, 0o700, 0o600, 0o600]);

      // SQLite's own files follow the database's mode.
      const db = openSqlite(join(fresh, 'zhiguang.db'));
      try {
        await migrate(db);
        expect([mode(join(fresh, 'zhiguang.db-wal')), mode(join(fresh, 'zhiguang.db-shm'))]).toEqual([
          0o600, 0o600,
        ]);
      } finally {
        await db.close();
      }
    } finally {
      rmSync(parent, { recursive: true, force: true });
    }
  });
});
