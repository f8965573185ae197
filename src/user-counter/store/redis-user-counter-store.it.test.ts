import { createServer, Socket, type Server } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { deleteByPrefix, services, uniqueName } from '../../../test/rig/resources.js';
import { ZERO_USER_COUNTS, type UserCounterDelta } from '../model.js';
import { RedisUserCounterStore, type RedisUserCounterStoreOptions } from './redis-user-counter-store.js';
import { defineUserCounterStoreContract } from './user-counter-store.contract.js';

function redisFixture(base: Omit<RedisUserCounterStoreOptions, 'prefix'>) {
  return async (options: { retentionMs?: number } = {}) => {
    const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    const others: Redis[] = [];
    const prefix = `${uniqueName('uc')}:`;
    const open = (client: Redis) => new RedisUserCounterStore(client, { prefix, ...base, ...options });
    return {
      sut: open(redis),
      another: () => {
        const client = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
        others.push(client);
        return open(client);
      },
      cleanup: async () => {
        for (const client of others) client.disconnect();
        await deleteByPrefix(redis, prefix);
        await redis.quit();
      },
    };
  };
}

// One group puts every user into one hash (and one script per batch); the default spreads them.
defineUserCounterStoreContract('redis (1 group)', redisFixture({ groups: 1 }));
defineUserCounterStoreContract('redis (defaults)', redisFixture({}));

const NOW = Date.parse('2030-01-01T00:00:00Z');

/** A TCP proxy that holds every chunk for `delayMs` in each direction: each round trip costs 2 × delayMs. */
async function slowProxy(target: URL, delayMs: number): Promise<{ url: string; close: () => Promise<void> }> {
  const sockets = new Set<Socket>();
  const server: Server = createServer((client) => {
    const upstream = new Socket();
    sockets.add(client).add(upstream);
    upstream.connect(Number(target.port || 6379), target.hostname);
    const relay = (from: Socket, to: Socket) =>
      from.on('data', (chunk) => setTimeout(() => to.writable && to.write(chunk), delayMs));
    relay(client, upstream);
    relay(upstream, client);
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on('close', end).on('error', end);
    upstream.on('close', end).on('error', end);
  });
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
  const { port } = server.address() as { port: number };
  const url = new URL(target.toString());
  url.hostname = '127.0.0.1';
  url.port = String(port);
  return {
    url: url.toString(),
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((ok) => server.close(() => ok()));
    },
  };
}

function hashTag(key: string): string | undefined {
  return /\{([^}]*)\}/.exec(key)?.[1];
}

describe('RedisUserCounterStore (cluster specifics)', () => {
  let redis: Redis;
  let prefix: string;
  const closers: (() => Promise<void> | void)[] = [];

  beforeEach(() => {
    redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    prefix = `${uniqueName('uc')}:`;
  });
  afterEach(async () => {
    for (const close of closers.splice(0).reverse()) await close();
    await deleteByPrefix(redis, prefix);
    await redis.quit();
  });

  it('reads a page of users spread over many groups, and applies a batch, in one round trip each', async () => {
    const proxy = await slowProxy(new URL(services.redisUrl()), 60);
    closers.push(proxy.close);
    const slow = new Redis(proxy.url, { maxRetriesPerRequest: 1 });
    closers.push(() => slow.disconnect());
    const sut = new RedisUserCounterStore(slow, { prefix, groups: 64 });
    await slow.ping();

    const users = Array.from({ length: 200 }, (_, i) => 10 + i * 13);
    const setup = new RedisUserCounterStore(redis, { prefix, groups: 64 });
    for (const u of users) await setup.write(u, { ...ZERO_USER_COUNTS, posts: u }, {}, NOW);
    expect(new Set(users.map((u) => setup.groupOf(u))).size).toBe(64);

    let started = performance.now();
    const read = await sut.read(users);
    const readMs = performance.now() - started;
    expect(read.map((c) => c?.posts)).toEqual(users);

    const batch: UserCounterDelta[] = users.map((u) => ({
      eventId: `e${u}`,
      userId: u,
      field: 'posts',
      delta: 1,
    }));
    started = performance.now();
    expect(await sut.apply(batch, NOW)).toEqual({ applied: 200, skipped: 0 });
    const applyMs = performance.now() - started;
    // One round trip is 120 ms through the proxy; two would be 240.
    expect({ readMs: readMs < 220, applyMs: applyMs < 220 }).toEqual({ readMs: true, applyMs: true });
    expect((await setup.read(users.slice(0, 3))).map((c) => c?.posts)).toEqual(
      users.slice(0, 3).map((u) => u + 1),
    );
  });

  it('declares only keys of one group, under the prefix, on every script', async () => {
    const sut = new RedisUserCounterStore(redis, { prefix, groups: 16 });
    const monitor = await redis.monitor();
    const calls: string[][] = [];
    let listening = true;
    monitor.on('monitor', (_time: string, args: string[]) => {
      if (listening && /^eval(sha)?$/i.test(args[0] ?? '') && args.some((a) => a.startsWith(prefix)))
        calls.push(args);
    });
    monitor.on('error', () => undefined);
    await sleep(50);

    const users = [1, 2, 17, 33, 40];
    await sut.apply(
      users.map((u) => ({ eventId: `x${u}`, userId: u, field: 'followers', delta: 1 })),
      NOW,
    );
    await sut.write(17, { ...ZERO_USER_COUNTS, posts: 2 }, { ifAbsent: true, markApplied: ['a', 'b'] }, NOW);
    await sut.inspect(33, ['x33']);
    await sleep(200);
    listening = false;
    monitor.disconnect();

    // Applies to groups 1, 2 and 8 (1, 17 and 33 share group 1), a write and an inspect.
    expect(calls.length).toBe(5);
    for (const args of calls) {
      const keys = args.slice(3, 3 + Number(args[2]));
      expect(keys.length).toBe(4);
      expect(keys.every((k) => k.startsWith(`${prefix}uc:`))).toBe(true);
      expect(new Set(keys.map(hashTag)).size).toBe(1);
    }
    expect(await redis.hlen(sut.groupKey('s', 1))).toBe(1);
    expect((await redis.zrange(sut.groupKey('ap', 1), '0', '-1')).sort()).toEqual(
      ['1:x1', '17:a', '17:b', '17:x17', '33:x33'].sort(),
    );
  });

  it('keeps a group of a few hundred users compact (listpack hashes, 20 bytes a snapshot)', async () => {
    const sut = new RedisUserCounterStore(redis, { prefix, groups: 1 });
    for (let u = 1; u <= 400; u++) await sut.write(u, { ...ZERO_USER_COUNTS, posts: u }, {}, NOW);
    const key = sut.groupKey('s', 0);
    expect(await redis.object('ENCODING', key)).toBe('listpack');
    expect((await redis.hgetBuffer(key, '400'))!.length).toBe(20);
    const bytes = Number(await redis.memory('USAGE', key));
    expect(bytes / 400).toBeLessThan(32);
  });

  it('refuses a prefix that would break the hash tag', () => {
    expect(() => new RedisUserCounterStore(redis, { prefix: 'a{b' })).toThrow(/prefix/);
  });
});
