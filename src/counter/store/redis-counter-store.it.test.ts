import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { deleteByPrefix, services, uniqueName } from '../../../test/rig/resources.js';
import { entityKey, type CounterEvent, type EntityRef } from '../model.js';
import { encodeSnapshot } from '../snapshot.js';
import { defineCounterStoreContract } from './counter-store.contract.js';
import {
  counterGroup,
  fnv1a32,
  MAX_PACKED,
  RedisCounterStore,
  SHARD_USERS,
  SNAPSHOTS_SCRIPT_GROUPS,
  type RedisCounterStoreOptions,
} from './redis-counter-store.js';

function redisFixture(options: Omit<RedisCounterStoreOptions, 'prefix'>) {
  return async () => {
    const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    const prefix = `${uniqueName('c')}:`;
    return {
      sut: new RedisCounterStore(redis, { prefix, ...options }),
      cleanup: async () => {
        await deleteByPrefix(redis, prefix);
        await redis.quit();
      },
    };
  };
}

defineCounterStoreContract('redis (64 groups, sparse up to 20)', redisFixture({ groups: 64, sparseMax: 20 }));
defineCounterStoreContract('redis (defaults)', redisFixture({}));

const NOW = Date.parse('2030-01-01T00:00:00Z');
const post = (eid: string): EntityRef => ({ etype: 'knowpost', eid });

function hashTag(key: string): string | undefined {
  return /\{([^}]*)\}/.exec(key)?.[1];
}

describe('RedisCounterStore (cluster specifics)', () => {
  let redis: Redis;
  let prefix: string;
  const extra: Redis[] = [];

  beforeEach(() => {
    redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    prefix = `${uniqueName('c')}:`;
  });
  afterEach(async () => {
    await deleteByPrefix(redis, prefix);
    for (const r of extra.splice(0)) r.disconnect();
    await redis.quit();
  });

  const open = (options: Omit<RedisCounterStoreOptions, 'prefix'> = {}, client = redis): RedisCounterStore =>
    new RedisCounterStore(client, { prefix, ...options });

  const member = (bytes: Buffer, offset: number): boolean =>
    bytes.length === 4096
      ? ((bytes[offset >> 3]! >> (7 - (offset & 7))) & 1) === 1
      : Array.from({ length: bytes.length / 2 }, (_, i) => bytes.readUInt16BE(i * 2)).includes(offset);

  it('says it is restoring until every group is sealed, wherever a seal stops', async () => {
    const store = open({ groups: 600, requireSeal: true });
    expect(await store.restoring()).toBe(true);
    // The second of three pipelines fails (a timeout, a process killed).
    const real = redis.pipeline.bind(redis);
    let made = 0;
    const spy = vi.spyOn(redis, 'pipeline').mockImplementation((...args: Parameters<typeof real>) => {
      const pipeline = real(...args);
      if (++made === 2) pipeline.exec = () => Promise.reject(new Error('Command timed out'));
      return pipeline;
    });
    await expect(store.seal()).rejects.toThrow('Command timed out');
    spy.mockRestore();
    expect(await store.unsealedGroups()).toBeGreaterThan(0);
    expect(await store.restoring()).toBe(true);
    await store.seal();
    expect(await store.restoring()).toBe(false);
  });

  it('refuses toggles in groups not sealed, and unseals and seals again the groups it is told', async () => {
    const store = open({ groups: 4, requireSeal: true });
    const refs = ['7300000000000000001', '7300000000000000002', '7300000000000000003', '7300000000000000004']
      .map(post)
      .filter((r, i, all) => all.findIndex((o) => store.groupOf(o) === store.groupOf(r)) === i);
    expect(refs.length).toBeGreaterThan(1);
    const toggle = (ref: EntityRef, user: number) => store.toggle(ref, 'like', user, true, NOW);
    expect(await store.unsealedGroups()).toBe(4);
    expect(await store.restoring()).toBe(true);
    await expect(toggle(refs[0]!, 1)).rejects.toThrow(/being restored/);
    expect((await store.inspect(refs[0]!)).sealed).toBe(false);
    await store.seal([store.groupOf(refs[0]!)]);
    expect(await store.unsealedGroups()).toBe(3);
    expect((await toggle(refs[0]!, 1)).changed).toBe(true);
    expect((await store.inspect(refs[0]!)).sealed).toBe(true);
    expect((await store.inspect(refs[1]!)).sealed).toBe(false);
    // A store that does not require seals takes every group's facts as whole.
    expect((await open({ groups: 4 }).inspect(refs[1]!)).sealed).toBe(true);
    expect(await open({ groups: 4 }).unsealedGroups()).toBe(0);
    expect(await open({ groups: 4 }).restoring()).toBe(false);
    await expect(toggle(refs[1]!, 1)).rejects.toThrow(/being restored/);
    // Nothing was changed by the refused ones.
    expect(await store.factCounts(refs[1]!)).toEqual({ like: 0, fav: 0 });
    expect(await store.unseal()).toEqual([store.groupOf(refs[0]!)]);
    await expect(toggle(refs[0]!, 2)).rejects.toThrow(/being restored/);
    await store.seal();
    expect(await store.unsealedGroups()).toBe(0);
    expect(await store.restoring()).toBe(false);
    for (const ref of refs) expect((await toggle(ref, 3)).changed).toBe(true);
    expect((await store.unseal()).length).toBe(4);
    expect(await store.restoring()).toBe(true);
  });

  it('converts sparse → sharded packed → bitmap and keeps membership exact throughout', async () => {
    const store = open({ groups: 16, sparseMax: 20 });
    const ref = post('7300000000000000001');
    const sparse = store.factKey(ref, 'like', false);
    const sharded = store.factKey(ref, 'like', true);
    const model = new Set<number>();
    const set = async (users: number[], on: boolean): Promise<void> => {
      const results = await Promise.all(users.map((u) => store.toggle(ref, 'like', u, on, NOW)));
      for (const [i, u] of users.entries()) {
        expect(results[i]!.changed).toBe(on ? !model.has(u) : model.has(u));
        if (on) model.add(u);
        else model.delete(u);
      }
    };
    const verify = async (probe: number[]): Promise<void> => {
      expect(await store.factCounts(ref)).toEqual({ like: model.size, fav: 0 });
      const flags = await Promise.all(probe.map((u) => store.flags(u, [ref])));
      probe.forEach((u, i) => expect({ u, like: flags[i]![0]!.like }).toEqual({ u, like: model.has(u) }));
    };
    const range = (from: number, to: number): number[] =>
      Array.from({ length: to - from }, (_, i) => from + i);

    await set(range(0, 20), true);
    expect(await redis.type(sparse)).toBe('set');
    expect(await redis.object('ENCODING', sparse)).toBe('intset');
    expect(await redis.exists(sharded)).toBe(0);
    await verify(range(0, 30));

    await set([20, SHARD_USERS + 5, 3 * SHARD_USERS + 32_767], true);
    expect(await redis.exists(sparse)).toBe(0);
    expect(await redis.hget(sharded, 'n')).toBe('23');
    expect((await redis.hgetBuffer(sharded, '0'))!.length).toBe(21 * 2);
    expect(member((await redis.hgetBuffer(sharded, '3'))!, 32_767)).toBe(true);
    await verify([...range(0, 30), SHARD_USERS + 4, SHARD_USERS + 5, SHARD_USERS + 6, 4 * SHARD_USERS - 1]);

    // Shard 0 up to the largest packed list, in a shuffled order so inserts land everywhere.
    const fill = range(21, MAX_PACKED).sort(() => Math.random() - 0.5);
    await set(fill, true);
    const packed = (await redis.hgetBuffer(sharded, '0'))!;
    expect(packed.length).toBe(MAX_PACKED * 2);
    const offsets = Array.from({ length: MAX_PACKED }, (_, i) => packed.readUInt16BE(i * 2));
    expect(offsets).toEqual(range(0, MAX_PACKED));

    await set([5_000], true);
    const bitmap = (await redis.hgetBuffer(sharded, '0'))!;
    expect(bitmap.length).toBe(4096);
    for (const u of [0, 7, 8, 2046, 2047, 4_999, 5_000, 5_001]) expect(member(bitmap, u)).toBe(model.has(u));
    // The layout is Redis' own bit order, so GETBIT on a copy agrees.
    await redis.set(`${prefix}bitmap-copy`, bitmap);
    expect(await redis.getbit(`${prefix}bitmap-copy`, 5_000)).toBe(1);
    expect(await redis.getbit(`${prefix}bitmap-copy`, 4_999)).toBe(0);
    await set(range(6_000, 6_300), true);
    await verify([...range(0, 2_100), ...range(4_990, 5_010), ...range(5_990, 6_310), SHARD_USERS + 5]);

    await set(
      range(0, 2_100).filter((u) => u % 2 === 0),
      false,
    );
    await set([5_000, SHARD_USERS + 5], false);
    await verify([...range(0, 2_100), ...range(4_990, 5_010), SHARD_USERS + 5]);

    // A bitmap whose members all left goes, while other shards keep theirs.
    await set(
      [...model].filter((u) => u < SHARD_USERS),
      false,
    );
    expect(await redis.hexists(sharded, '0')).toBe(0);
    expect(await redis.hget(sharded, 'n')).toBe(String(model.size));
    await verify([0, 1, 5_000, 6_001, SHARD_USERS + 4, 4 * SHARD_USERS - 1]);

    await set([...model], false);
    expect(await store.factCounts(ref)).toEqual({ like: 0, fav: 0 });
    expect(await redis.exists(sharded, sparse)).toBe(0);
    await set([9], true);
    expect(await redis.type(sparse)).toBe('set');
    await verify([8, 9, 10]);
  });

  it('replays into either encoding with the same result as the toggles', async () => {
    const store = open({ groups: 8, sparseMax: 10 });
    const ref = post('42');
    const events: CounterEvent[] = [];
    for (let u = 0; u < 2_200; u++) events.push((await store.toggle(ref, 'fav', u * 3, true, NOW)).event!);
    for (let u = 0; u < 2_200; u += 4)
      events.push((await store.toggle(ref, 'fav', u * 3, false, NOW)).event!);
    const before = await store.factCounts(ref);
    const probe = Array.from({ length: 400 }, (_, i) => i * 17);
    const flagsBefore = await Promise.all(probe.map((u) => store.flags(u, [ref])));
    // The shared cache's keys share the prefix: not the reset's.
    await redis.set(`${prefix}c:{posts}`, '7', 'EX', 60);
    await redis.set(`${prefix}c:{posts}:detail:42`, 'x', 'EX', 60);
    await store.reset();
    expect(await redis.mget(`${prefix}c:{posts}`, `${prefix}c:{posts}:detail:42`)).toEqual(['7', 'x']);
    expect(await redis.keys(`${prefix}c:[a-z]*`)).toEqual([]);
    await store.replayFacts(events);
    expect(await store.factCounts(ref)).toEqual(before);
    expect(await Promise.all(probe.map((u) => store.flags(u, [ref])))).toEqual(flagsBefore);
    expect((await store.inspect(ref)).seq).toBe(events.length);
  });

  it('declares only keys of the entity’s group, on every script (Redis Cluster mode)', async () => {
    const store = open({ groups: 64, sparseMax: 5, singleNode: false });
    const recorder = recordCommands(redis, prefix);
    const calls: string[][] = [];
    const stop = (): void => {
      recorder.stop();
      calls.push(...recorder.seen.filter((args) => /^eval(sha)?$/i.test(args[0] ?? '')));
    };
    const refs = [post('7300000000000000011'), post('7300000000000000012'), post('12')];
    const events: CounterEvent[] = [];
    for (const ref of refs) {
      for (let u = 0; u < 8; u++)
        events.push((await store.toggle(ref, u % 2 ? 'like' : 'fav', u, true, NOW)).event!);
    }
    await store.applyEvents(events);
    await store.writeRawSnapshot(refs[0]!, null);
    while ((await store.flush(10)) > 0);
    await store.flags(1, refs);
    await store.factCounts(refs[0]!);
    await store.rebuild(refs[1]!);
    await store.inspect(refs[2]!);
    await store.replayFacts(events.slice(0, 3));
    await store.addViews(refs.map((ref) => ({ ref, n: 2 })));
    await sleep(200);
    stop();

    // 24 toggles, at least one apply and one fold, 3 flags, count, rebuild, inspect, 2 replays (one
    // per entity and metric), 3 views (the three entities fall in different groups).
    expect(new Set(refs.map((ref) => store.groupOf(ref))).size).toBe(3);
    expect(calls.length).toBeGreaterThanOrEqual(24 + 1 + 1 + 3 + 1 + 1 + 1 + 2 + 3);
    let unmarks = 0;
    let flagCalls = 0;
    for (const args of calls) {
      const numKeys = Number(args[2]);
      const keys = args.slice(3, 3 + numKeys);
      if (keys.length === 1 && keys[0] === `${prefix}c:dirty`) {
        // The flusher's unmark touches the dirty hash alone.
        unmarks++;
        continue;
      }
      const tags = new Set(keys.map(hashTag));
      expect({ keys, tags: [...tags].filter((t) => t !== undefined).length }).toEqual({ keys, tags: 1 });
      expect(tags.size).toBe(1);
      const argv = args.slice(3 + numKeys);
      if (argv[3] === prefix) {
        // Flags: keys are built inside from the bare prefix and each entity's group, which must be
        // the routing key's group for every entity.
        flagCalls++;
        const entities = argv[4]!.trim().split(' ');
        expect(entities.length).toBeGreaterThan(0);
        for (let i = 0; i < entities.length; i += 2) expect(entities[i]).toBe(hashTag(keys[0]!));
        continue;
      }
      // Key-name prefixes passed for keys built inside the script carry the same tag.
      for (const arg of argv) {
        if (arg.startsWith(prefix)) expect(hashTag(arg)).toBe(hashTag(keys[0]!));
      }
      expect(keys.every((k) => k.startsWith(prefix))).toBe(true);
    }
    expect(unmarks).toBeGreaterThan(0);
    expect(flagCalls).toBe(3);
    const toggleKeys = calls[0]!.slice(3, 3 + Number(calls[0]![2]));
    expect(toggleKeys).toEqual([
      store.factKey(refs[0]!, 'fav', false),
      store.factKey(refs[0]!, 'fav', true),
      store.groupKey('seq', store.groupOf(refs[0]!)),
      store.groupKey('un', store.groupOf(refs[0]!)),
    ]);
  });

  it('keeps every group with pending deltas in the dirty set while appliers and flushers race', async () => {
    const clients = [1, 2, 3].map(() => new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 }));
    extra.push(...clients);
    const appliers = [open({ groups: 32 }), open({ groups: 32 }, clients[0])];
    const flushers = [open({ groups: 32 }, clients[1]), open({ groups: 32 }, clients[2])];
    const store = appliers[0]!;
    const refs = Array.from({ length: 60 }, (_, i) => post(String(7_300_000_000_000_000_000n + BigInt(i))));
    const events: CounterEvent[] = [];
    for (let n = 0; n < 1_500; n++) {
      const r = await store.toggle(refs[n % refs.length]!, n % 3 ? 'like' : 'fav', n % 41, n % 7 !== 3, NOW);
      if (r.event) events.push(r.event);
    }
    let done = false;
    const apply = async (applier: RedisCounterStore, part: number): Promise<void> => {
      for (let i = part * 10; i < events.length; i += 20) await applier.applyEvents(events.slice(i, i + 10));
    };
    const flushLoop = async (flusher: RedisCounterStore): Promise<void> => {
      while (!done) {
        await flusher.flush(4);
        await sleep(0);
      }
    };
    const flushing = Promise.all(flushers.map(flushLoop));
    await Promise.all(appliers.map((a, i) => apply(a, i)));
    done = true;
    await flushing;

    const dirty = new Set(await redis.hkeys(`${prefix}c:dirty`));
    for (let g = 0; g < 32; g++) {
      if ((await redis.exists(store.groupKey('pd', g))) === 1) expect(dirty.has(String(g))).toBe(true);
    }
    while (!(await store.isQuiet())) await store.flush(32);
    const snapshots = await store.readSnapshots(refs);
    for (const [i, ref] of refs.entries()) {
      const facts = await store.factCounts(ref);
      expect([entityKey(ref), snapshots[i]]).toEqual([entityKey(ref), [0, facts.like, facts.fav, 0, 0]]);
    }
    expect(store.clampedFields).toBe(0);
  });

  it('keeps the dirty mark of deltas applied after a fold, when the flusher dies before its unmark', async () => {
    const store = open({ groups: 16 });
    const ref = post('7300000000000000077');
    const like = async (u: number): Promise<void> => {
      const r = await store.toggle(ref, 'like', u, true, NOW);
      await store.applyEvents([r.event!]);
    };
    for (let u = 1; u <= 3; u++) await like(u);
    while (!(await store.isQuiet())) await store.flush(16);
    await like(4);

    // A flusher on its own connection runs its pipeline one command at a time; an apply lands
    // after its fold, and the flusher dies right before clearing the mark.
    const conn = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    conn.on('error', () => undefined);
    extra.push(conn);
    const flusher = open({ groups: 16 }, conn);
    const target = conn as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
    const seen: string[] = [];
    (conn as unknown as { pipeline: () => unknown }).pipeline = () => {
      const queue: [string, unknown[]][] = [];
      const pipeline: Record<string, unknown> = new Proxy(
        {},
        {
          get: (_t, prop) =>
            prop === 'exec'
              ? async () => {
                  const replies: [null, unknown][] = [];
                  for (const [name, args] of queue) {
                    seen.push(name);
                    if (name === 'zgCounterUnmark') {
                      await like(5);
                      throw new Error('flusher died');
                    }
                    replies.push([null, await target[name]!.apply(conn, args)]);
                  }
                  return replies;
                }
              : (...args: unknown[]) => {
                  queue.push([String(prop), args]);
                  return pipeline;
                },
        },
      );
      return pipeline;
    };
    await expect(flusher.flush(16)).rejects.toThrow('flusher died');
    expect(seen.filter((name) => name.startsWith('zg'))).toEqual(['zgCounterFold', 'zgCounterUnmark']);

    expect(await store.isQuiet()).toBe(false);
    while (!(await store.isQuiet())) await store.flush(16);
    expect(await store.readSnapshots([ref])).toEqual([[0, 5, 0, 0, 0]]);
  });

  it('keeps the mark of a group whose fold failed, and folds it once it can', async () => {
    const store = open({ groups: 16 });
    const ref = post('7300000000000000079');
    const other = post('7300000000000000080');
    for (const [r, u] of [
      [ref, 1],
      [ref, 2],
      [other, 3],
    ] as const)
      await store.applyEvents([(await store.toggle(r, 'like', u, true, NOW)).event!]);
    const group = counterGroup(ref, 16);
    const pd = store.groupKey('pd', group);
    const field = (await redis.hkeys(pd)).find((f) => f.endsWith(':1'))!;
    // A fold refused part-way: one delta it cannot read stands in for any error of its script.
    await redis.hset(pd, field, 'not a number');
    await expect(store.flush(16)).rejects.toThrow();
    expect(await redis.hexists(`${prefix}c:dirty`, String(group))).toBe(1);
    expect(await store.isQuiet()).toBe(false);
    // Fields past the layout's five are dropped, not an error.
    await redis.hset(pd, field, '2', field.replace(/:1$/, ':7'), '1');
    while (!(await store.isQuiet())) await store.flush(16);
    expect(await store.readSnapshots([ref, other])).toEqual([
      [0, 2, 0, 0, 0],
      [0, 1, 0, 0, 0],
    ]);
  });

  it('re-marks a group whose pending deltas lost their mark, within a sweep of all groups', async () => {
    const store = open({ groups: 300 });
    const ref = post('7300000000000000078');
    await store.applyEvents([(await store.toggle(ref, 'like', 1, true, NOW)).event!]);
    await store.flush(300);
    await store.applyEvents([(await store.toggle(ref, 'like', 2, true, NOW)).event!]);
    // What an applier that died between its script and its second mark, after a flusher had
    // cleared the first, leaves behind.
    await redis.del(`${prefix}c:dirty`);
    // Pending deltas without a mark are not quiet.
    expect(await store.isQuiet()).toBe(false);
    let calls = 0;
    while ((await store.readSnapshots([ref]))[0]?.[1] !== 2 && calls < 10) {
      await store.flush(10);
      calls++;
    }
    // One sweep over every group finds it, the next flush folds it.
    expect(calls).toBeLessThanOrEqual(Math.ceil(300 / 128) + 1);
    expect(await store.readSnapshots([ref])).toEqual([[0, 2, 0, 0, 0]]);
    expect((await store.inspect(ref)).pending).toBe(false);
  });

  it('answers the flags of a page spanning groups and both encodings with one script on one node, per group in cluster mode', async () => {
    const single = open({ groups: 64, sparseMax: 3 });
    const perGroup = open({ groups: 64, sparseMax: 3, singleNode: false });
    const refs = Array.from({ length: 12 }, (_, i) => post(String(7_300_000_000_000_000_500n + BigInt(i))));
    expect(new Set(refs.map((ref) => single.groupOf(ref))).size).toBeGreaterThan(6);
    const viewer = 40_001;
    const expected = refs.map((_, i) => ({ like: i % 2 === 0, fav: i % 3 === 0 }));
    for (const [i, ref] of refs.entries()) {
      // Every third post gets enough other likers to be sharded, so both encodings are read.
      if (i % 3 === 1) for (let u = 1; u <= 6; u++) await single.toggle(ref, 'like', u, true, NOW);
      if (expected[i]!.like) await single.toggle(ref, 'like', viewer, true, NOW);
      if (expected[i]!.fav) await single.toggle(ref, 'fav', viewer, true, NOW);
    }
    const recorder = recordCommands(redis, prefix);
    const one = await single.flags(viewer, [...refs, refs[0]!]);
    recorder.stop();
    expect(one).toEqual([...expected, expected[0]]);
    expect(recorder.seen.filter((args) => /^eval(sha)?$/i.test(args[0] ?? ''))).toHaveLength(1);

    const cluster = recordCommands(redis, prefix);
    expect(await perGroup.flags(viewer, refs)).toEqual(expected);
    cluster.stop();
    const scripts = cluster.seen.filter((args) => /^eval(sha)?$/i.test(args[0] ?? ''));
    expect(scripts).toHaveLength(new Set(refs.map((ref) => single.groupOf(ref))).size);
    for (const args of scripts) {
      const keys = args.slice(3, 3 + Number(args[2]));
      expect(new Set(keys.map(hashTag)).size).toBe(1);
    }
    expect(await single.flags(viewer + 1, refs)).toEqual(refs.map(() => ({ like: false, fav: false })));
  });

  it('reads snapshots of many groups with one script on one node and an HMGET per group in cluster mode, alike', async () => {
    const single = open({ groups: 64 });
    const perGroup = open({ groups: 64, singleNode: false });
    const refs = Array.from({ length: 12 }, (_, i) => post(String(7_300_000_000_000_000_700n + BigInt(i))));
    const groups = new Set(refs.map((ref) => single.groupOf(ref))).size;
    expect(groups).toBeGreaterThanOrEqual(SNAPSHOTS_SCRIPT_GROUPS);
    for (const [i, ref] of refs.entries()) {
      if (i % 4 === 1) continue; // missing
      await single.writeRawSnapshot(
        ref,
        i % 4 === 2 ? Buffer.from('not a snapshot') : encodeSnapshot([i, 2 * i, 3, 0, 4_000_000_000]),
      );
    }
    const asked = [...refs, refs[0]!, refs[1]!];
    const expected = asked.map((ref) => {
      const i = refs.indexOf(ref);
      return i % 4 === 1 || i % 4 === 2 ? null : [i, 2 * i, 3, 0, 4_000_000_000];
    });

    const one = recordCommands(redis, prefix);
    expect(await single.readSnapshots(asked)).toEqual(expected);
    one.stop();
    expect(one.seen.map((args) => args[0]!.toLowerCase())).toEqual(['evalsha']);

    const cluster = recordCommands(redis, prefix);
    expect(await perGroup.readSnapshots(asked)).toEqual(expected);
    cluster.stop();
    expect(cluster.seen.map((args) => args[0]!.toLowerCase())).toEqual(Array(groups).fill('hmget'));

    // More than one script takes: one script per 500, answers still in order.
    const many = Array.from({ length: 1_200 }, (_, i) => refs[i % refs.length]!);
    const chunked = recordCommands(redis, prefix);
    expect(await single.readSnapshots(many)).toEqual(many.map((ref) => expected[refs.indexOf(ref)]));
    chunked.stop();
    expect(chunked.seen.map((args) => args[0]!.toLowerCase())).toEqual(['evalsha', 'evalsha', 'evalsha']);

    const few = recordCommands(redis, prefix);
    expect(await single.readSnapshots([refs[3]!, refs[1]!])).toEqual([expected[3], null]);
    few.stop();
    expect(few.seen.every((args) => args[0]!.toLowerCase() === 'hmget')).toBe(true);
  });

  it('refuses refs that would not survive the space-separated argument of a script', async () => {
    const store = open({ groups: 64 });
    const refs = Array.from({ length: 8 }, (_, i) => post(String(7_300_000_000_000_000_900n + BigInt(i))));
    const bad = post('1 2');
    await expect(store.flags(5, [...refs, bad])).rejects.toThrow(RangeError);
    await expect(store.readSnapshots([...refs, bad])).rejects.toThrow(RangeError);
  });

  it('finds a sharded fact set among the flags of more entities than one EXISTS covers', async () => {
    const store = open({ groups: 64, sparseMax: 3 });
    const refs = Array.from({ length: 300 }, (_, i) => post(String(7_300_000_000_000_002_000n + BigInt(i))));
    const last = refs[299]!;
    for (let u = 1; u <= 4; u++) await store.toggle(last, 'fav', u, true, NOW);
    await store.toggle(refs[0]!, 'like', 2, true, NOW);
    expect(await redis.exists(store.factKey(last, 'fav', true))).toBe(1);
    const flags = await store.flags(2, refs);
    expect(flags[0]).toEqual({ like: true, fav: false });
    expect(flags[299]).toEqual({ like: false, fav: true });
    expect(flags.slice(1, 299).every((f) => !f.like && !f.fav)).toBe(true);
    expect((await store.flags(5, [last]))[0]).toEqual({ like: false, fav: false });
  });

  it('adds views over many groups with one script per 500 entities on one node, per group in cluster mode', async () => {
    const single = open({ groups: 64 });
    const perGroup = open({ groups: 64, singleNode: false });
    const refs = Array.from({ length: 600 }, (_, i) => post(String(7_300_000_000_000_001_000n + BigInt(i))));
    // Half of them have a like and a snapshot; the others have neither, so their snapshots are built.
    for (const ref of refs.slice(0, 300)) {
      await single.toggle(ref, 'like', 9, true, NOW);
      await single.rebuild(ref);
    }
    const scripts = (run: () => Promise<void>) => async () => {
      const recorder = recordCommands(redis, prefix);
      await run();
      recorder.stop();
      return recorder.seen.filter((args) => /^eval(sha)?$/i.test(args[0] ?? ''));
    };
    const one = await scripts(() => single.addViews(refs.map((ref, i) => ({ ref, n: 1 + (i % 3) }))))();
    expect(one).toHaveLength(2);
    const many = await scripts(() => perGroup.addViews(refs.map((ref) => ({ ref, n: 1 }))))();
    expect(many).toHaveLength(new Set(refs.map((ref) => single.groupOf(ref))).size);
    for (const args of many) expect(new Set(args.slice(3, 3 + Number(args[2])).map(hashTag)).size).toBe(1);
    expect(await single.readSnapshots(refs)).toEqual(
      refs.map((_, i) => [2 + (i % 3), i < 300 ? 1 : 0, 0, 0, 0]),
    );
  });

  it('adds the views of records handed again after a call failed part-way only where it had not', async () => {
    for (const singleNode of [true, false]) {
      const store = open({ groups: 64, singleNode });
      const refs = Array.from({ length: 1_200 }, (_, i) =>
        post(String(7_300_000_000_000_003_000n + BigInt(i) + (singleNode ? 0n : 10_000n))),
      );
      // Three records of a partition, each with views of a third of the posts. (Both modes share the
      // key prefix, so the groups: each its own partition.)
      const records = [0, 1, 2].map((k) => ({
        partition: singleNode ? 3 : 4,
        offset: 40n + BigInt(k),
        timestamp: NOW + k,
        views: refs.filter((_, i) => i % 3 === k).map((ref) => ({ ref, n: 1 })),
      }));
      // The first group's view-mark hash is of the wrong type: its call fails before it writes
      // anything (as one that never ran: a timeout, a lost connection), the others apply.
      const broken = store.groupOf(refs[0]!);
      await redis.set(store.groupKey('vm', broken), 'not a hash');
      await expect(store.addLoggedViews(records)).rejects.toThrow(/WRONGTYPE/);
      const partly = (await store.readSnapshots(refs)).map((c) => c?.[0] ?? 0);
      expect(partly.some((n) => n === 1) && partly.some((n) => n === 0)).toBe(true);
      await redis.del(store.groupKey('vm', broken));
      // Handed again as it was, then cut otherwise: each view once.
      const missing = partly.filter((n) => n === 0).length;
      expect(await store.addLoggedViews(records)).toBe(missing);
      expect(await store.addLoggedViews(records.slice(1))).toBe(0);
      const reads = (await store.readSnapshots(refs)).map((c) => c?.[0]);
      expect(
        reads.every((n) => n === 1),
        `singleNode ${singleNode}`,
      ).toBe(true);
      // A later record, and views without a record, add again.
      await store.addLoggedViews([{ ...records[0]!, offset: 43n, views: records[0]!.views.slice(0, 2) }]);
      await store.addViews([{ ref: refs[0]!, n: 1 }]);
      expect((await store.readSnapshots([refs[0]!, refs[3]!, refs[6]!])).map((c) => c?.[0])).toEqual([
        3, 2, 1,
      ]);
    }
  });

  it('adds logged views with one script per group or per 500 entities, reading marks only where another process moved them', async () => {
    for (const singleNode of [true, false]) {
      const store = open({ groups: 64, singleNode });
      const refs = Array.from({ length: 900 }, (_, i) =>
        post(String(7_300_000_000_000_005_000n + BigInt(i) + (singleNode ? 0n : 10_000n))),
      );
      const records = [0, 1, 2, 3].map((k) => ({
        partition: singleNode ? 5 : 6,
        offset: BigInt(k),
        timestamp: NOW,
        views: refs.filter((_, i) => i % 3 === k % 3).map((ref) => ({ ref, n: 1 })),
      }));
      const groups = new Set(refs.map((ref) => store.groupOf(ref))).size;
      const commands = async (run: () => Promise<unknown>): Promise<string[]> => {
        const recorder = recordCommands(redis, prefix);
        await run();
        recorder.stop();
        return recorder.seen.map((args) => args[0]!.toLowerCase());
      };
      const scripts = singleNode ? 2 : groups;
      // (The script loaded first: a client's first call of it goes twice, the second after loading it.)
      await store.addLoggedViews([{ ...records[0]!, partition: 9, views: [{ ref: post('1'), n: 1 }] }]);
      const first = await commands(() => store.addLoggedViews(records.slice(0, 2)));
      expect(first).toEqual(Array.from({ length: scripts }, () => 'evalsha'));
      // Handed again with one more record by the same process: it knows its marks.
      const again = await commands(() => store.addLoggedViews(records.slice(0, 3)));
      expect(again).toEqual(Array.from({ length: scripts }, () => 'evalsha'));
      // Another process (a member the partition moved to): its calls are refused once, it reads the
      // marks (an HMGET per group) and sends what was not added.
      const other = open({ groups: 64, singleNode });
      const moved = await commands(() => other.addLoggedViews(records));
      expect(moved.filter((c) => c === 'hmget').length).toBe(groups);
      expect(moved.filter((c) => c === 'evalsha').length).toBe(2 * scripts);
      expect(await store.readSnapshots(refs)).toEqual(refs.map((_, i) => [i % 3 === 0 ? 2 : 1, 0, 0, 0, 0]));
    }
  });

  it('keeps one range per mark while the caller names the runs it handled, whatever groups its calls touch', async () => {
    const store = open({ groups: 8 });
    const refs = Array.from({ length: 8 }, (_, i) => post(String(7_300_000_000_000_007_000n + BigInt(i))));
    // Forty records of partition 2, each with views of one post; a call per four records.
    const records = Array.from({ length: 40 }, (_, i) => ({
      partition: 2,
      offset: 100n + BigInt(i),
      timestamp: NOW + i,
      views: [{ ref: refs[(i * 5) % 8]!, n: 1 }],
    }));
    for (let i = 0; i < 40; i += 4) {
      await store.addLoggedViews(records.slice(i, i + 4), new Map([[2, [[100n, 100n + BigInt(i + 3)]]]]));
    }
    const groups = [...new Set(refs.map((ref) => store.groupOf(ref)))];
    const marks = await Promise.all(groups.map((group) => redis.hget(store.groupKey('vm', group), '2')));
    for (const mark of marks) expect(mark).toMatch(/^\d+:100-1\d\d$/);
    // Beside the applied hash, not in it: a mark's ranges may outgrow a listpack value (64 bytes),
    // which would turn the whole applied hash into a hashtable for good.
    for (const group of groups) expect(await redis.hlen(store.groupKey('ap', group))).toBe(0);
    // Without the runs (each call naming its own records only) a group's mark has a range per call.
    const alone = new RedisCounterStore(redis, { prefix: `${prefix}alone:`, groups: 8 });
    for (let i = 0; i < 40; i += 4) await alone.addLoggedViews(records.slice(i, i + 4));
    const group = alone.groupOf(refs[0]!);
    expect((await redis.hget(alone.groupKey('vm', group), '2'))!.split(',').length).toBeGreaterThan(1);
    // Either way each view once, handed again in any cut.
    expect(await store.addLoggedViews(records.slice(3, 29))).toBe(0);
    expect(await alone.addLoggedViews(records.slice(3, 29))).toBe(0);
    expect((await store.readSnapshots(refs)).map((c) => c?.[0])).toEqual(refs.map(() => 5));
  });

  it('reads snapshots and flags of a page, and marks events published, in one socket write each when auto-pipelining', async () => {
    const client = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1, enableAutoPipelining: true });
    extra.push(client);
    const store = open({ groups: 64 }, client);
    const refs = Array.from({ length: 20 }, (_, i) => post(String(7_300_000_000_000_000_100n + BigInt(i))));
    expect(new Set(refs.map((ref) => store.groupOf(ref))).size).toBeGreaterThan(10);
    const events: CounterEvent[] = [];
    for (const ref of refs) {
      events.push((await store.toggle(ref, 'like', 5, true, NOW)).event!);
      await store.rebuild(ref);
    }
    await store.flags(5, refs);
    const stream = (client as unknown as { stream: { write: (...args: unknown[]) => boolean } }).stream;
    const writes = vi.spyOn(stream, 'write');

    const [snapshots, flags] = await Promise.all([store.readSnapshots(refs), store.flags(5, refs)]);
    expect(writes).toHaveBeenCalledTimes(1);
    expect(snapshots.every((c) => c?.[1] === 1)).toBe(true);
    expect(flags.every((f) => f.like && !f.fav)).toBe(true);

    writes.mockClear();
    await store.markPublished(events);
    expect(writes).toHaveBeenCalledTimes(1);
    expect(await store.staleUnpublished(NOW + 60_000, 0, 100)).toEqual([]);
  });

  describe('index of groups with unpublished events', () => {
    const unpub = (): string => `${prefix}c:unpub`;

    it('indexes a toggled group by its oldest unpublished event and forgets it once published', async () => {
      const store = open({ groups: 64 });
      const ref = post('7300000000000000201');
      const group = String(store.groupOf(ref));
      const first = await store.toggle(ref, 'like', 1, true, NOW);
      const second = await store.toggle(ref, 'like', 2, true, NOW + 50);
      // An unchanged toggle may add the group too; it never moves the bound forward.
      await store.toggle(ref, 'like', 2, true, NOW + 80);
      expect(await redis.zrange(unpub(), 0, '-1', 'WITHSCORES')).toEqual([group, String(NOW)]);

      await store.markPublished([first.event!]);
      // Nothing stale: the scan only moves the bound up to the oldest event still unpublished.
      expect(await store.staleUnpublished(NOW + 10, 1_000, 10)).toEqual([]);
      expect(await store.staleUnpublished(NOW + 1_020, 1_000, 10)).toEqual([]);
      expect(await redis.zscore(unpub(), group)).toBe(String(NOW + 50));
      const stale = await store.staleUnpublished(NOW + 2_000, 1_000, 10);
      // The record holds the whole event, so it can be published again.
      expect(stale.map((e) => e.event)).toEqual([second.event]);
      await store.dropUnpublished(stale);
      expect(await store.staleUnpublished(NOW + 2_000, 1_000, 10)).toEqual([]);
      expect(await redis.zcard(unpub())).toBe(0);
    });

    it('defers stale records for another attempt, but not one published meanwhile', async () => {
      const store = open({ groups: 64 });
      const [a, b] = [post('7300000000000000211'), post('7300000000000000212')];
      const ra = await store.toggle(a, 'like', 1, true, NOW);
      const rb = await store.toggle(b, 'fav', 2, true, NOW);
      const stale = await store.staleUnpublished(NOW + 2_000, 1_000, 10);
      expect(stale.map((s) => s.event).sort((x, y) => x!.entityId.localeCompare(y!.entityId))).toEqual([
        ra.event,
        rb.event,
      ]);
      await store.markPublished([rb.event!]);
      await store.deferUnpublished(stale.map((s) => ({ ...s, at: NOW + 2_000 })));
      expect(await store.staleUnpublished(NOW + 2_500, 1_000, 10)).toEqual([]);
      expect((await store.staleUnpublished(NOW + 3_500, 1_000, 10)).map((s) => s.event)).toEqual([ra.event]);
    });

    it('defers each stale record to its own time, the group found again by the earliest', async () => {
      const store = open({ groups: 1 });
      const [a, b] = [post('7300000000000000221'), post('7300000000000000222')];
      await store.toggle(a, 'like', 1, true, NOW);
      await store.toggle(b, 'like', 2, true, NOW);
      const stale = await store.staleUnpublished(NOW + 2_000, 1_000, 10);
      await store.deferUnpublished(
        stale.map((s) => ({ ...s, at: NOW + (s.event!.entityId === a.eid ? 2_000 : 30_000) })),
      );
      const at = async (t: number) =>
        (await store.staleUnpublished(t, 1_000, 10)).map((s) => s.event!.entityId);
      expect(await at(NOW + 2_500)).toEqual([]);
      expect(await at(NOW + 3_500)).toEqual([a.eid]);
      await store.dropUnpublished(await store.staleUnpublished(NOW + 3_500, 1_000, 10));
      expect(await at(NOW + 30_500)).toEqual([]);
      expect(await at(NOW + 31_500)).toEqual([b.eid]);
    });

    it('costs one round trip of a constant number of commands when idle, whatever the number of groups', async () => {
      const store = open({ groups: 4096 });
      await store.staleUnpublished(NOW, 1_000, 10); // an instance's first call sweeps every group
      const recorder = recordCommands(redis, prefix);
      expect(await store.staleUnpublished(NOW, 1_000, 10)).toEqual([]);
      expect(await store.staleUnpublished(NOW, 1_000, 10)).toEqual([]);
      recorder.stop();
      const commands = recorder.seen.map((args) => String(args[0]).toLowerCase());
      expect(commands.length).toBeLessThanOrEqual(2 * 20);
      expect(commands.filter((c) => c === 'zrangebyscore')).toHaveLength(2);
    });

    it('finds events whose group is missing from the index: at once on a new instance, else by its rotation', async () => {
      const store = open({ groups: 64 });
      await store.staleUnpublished(NOW, 1_000, 10);
      const ref = post('7300000000000000202');
      await store.toggle(ref, 'fav', 9, true, NOW);
      // What a failed index write (or one lost to the race the rotation covers) leaves behind.
      await redis.del(unpub());
      let calls = 0;
      while ((await store.staleUnpublished(NOW + 5_000, 1_000, 10)).length === 0 && calls < 10) calls++;
      expect(calls).toBeLessThanOrEqual(Math.ceil(64 / 16));
      expect(await redis.zscore(unpub(), String(store.groupOf(ref)))).toBe(String(NOW));

      await redis.del(unpub());
      const fresh = open({ groups: 64 });
      expect((await fresh.staleUnpublished(NOW + 5_000, 1_000, 10)).map((e) => e.ref)).toEqual([ref]);
    });

    it('puts a group back when an event lands between seeing its set empty and removing it', async () => {
      const conn = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
      extra.push(conn);
      const store = open({ groups: 64 }, conn);
      const ref = post('7300000000000000203');
      const group = store.groupOf(ref);
      const first = await store.toggle(ref, 'like', 1, true, NOW);
      await store.markPublished([first.event!]);
      await store.staleUnpublished(NOW, 1_000, 10);
      // A toggle whose index write landed before the removal and whose script lands right after it.
      const zrem = conn.zrem.bind(conn) as (...args: unknown[]) => Promise<number>;
      (conn as unknown as { zrem: (...args: unknown[]) => Promise<number> }).zrem = async (...args) => {
        const removed = await zrem(...args);
        if (args[0] === unpub())
          await redis.zadd(store.groupKey('un', group), NOW + 1_500, `knowpost:${ref.eid}:2`);
        return removed;
      };
      expect(await store.staleUnpublished(NOW + 2_000, 1_000, 10)).toEqual([]);
      expect(await redis.zscore(unpub(), String(group))).toBe(String(NOW + 1_500));
      expect((await store.staleUnpublished(NOW + 3_000, 1_000, 10)).map((e) => e.token)).toEqual([
        `knowpost:${ref.eid}:2`,
      ]);
    });
  });

  it('replays one script per entity and metric, the highest seq of each user deciding', async () => {
    const store = open({ groups: 8, sparseMax: 10 });
    const ref = post('7300000000000000301');
    const events: CounterEvent[] = [];
    let seq = 0;
    for (let u = 0; u < 40; u++) events.push({ ...fakeEvent(ref, u, ++seq) });
    for (let u = 0; u < 40; u += 2) events.push({ ...fakeEvent(ref, u, ++seq), delta: -1 });
    events.push({ ...fakeEvent(ref, 7, ++seq), metric: 'fav', idx: 2 });
    const shuffled = [...events].sort(() => Math.random() - 0.5);
    const recorder = recordCommands(redis, prefix);
    await store.replayFacts(shuffled);
    recorder.stop();
    const scripts = recorder.seen.filter((args) => /^evalsha$/i.test(args[0] ?? '')).length;
    expect(scripts).toBeLessThanOrEqual(2 + 2); // EVAL, not EVALSHA, on a script's first use
    expect(await store.factCounts(ref)).toEqual({ like: 20, fav: 1 });
    expect(await store.flags(1, [ref])).toEqual([{ like: true, fav: false }]);
    expect(await store.flags(2, [ref])).toEqual([{ like: false, fav: false }]);
    expect((await store.inspect(ref)).seq).toBe(seq);
  });

  it('counts folds that would go below zero', async () => {
    const store = open({ groups: 4 });
    const ref = post('77');
    await store.toggle(ref, 'like', 1, true, NOW);
    await store.rebuild(ref);
    await store.writeRawSnapshot(ref, encodeSnapshot([0, 0, 0, 0, 0]));
    await store.applyEvents([(await store.toggle(ref, 'like', 1, false, NOW)).event!]);
    await store.flush(10);
    expect(store.clampedFields).toBe(1);
    expect(await store.readSnapshots([ref])).toEqual([[0, 0, 0, 0, 0]]);
  });

  it('groups entities by standard 32-bit FNV-1a, so other tools can find a group', () => {
    expect(fnv1a32('')).toBe(0x811c9dc5);
    expect(fnv1a32('a')).toBe(0xe40c292c);
    expect(fnv1a32('foobar')).toBe(0xbf9cf968);
    // Non-ASCII text hashes its UTF-8 bytes.
    let h = 0x811c9dc5n;
    for (const byte of Buffer.from('知光')) h = ((h ^ BigInt(byte)) * 0x01000193n) & 0xffffffffn;
    expect(fnv1a32('知光')).toBe(Number(h));
    const ref = post('7300000000000000001');
    expect(counterGroup(ref, 4096)).toBe(fnv1a32(`knowpost:${ref.eid}`) % 4096);
    expect(open({ groups: 4096 }).groupOf(ref)).toBe(counterGroup(ref, 4096));
  });

  it('rejects what would break the key layout', () => {
    expect(() => open({ groups: 0 })).toThrow(RangeError);
    expect(() => open({ sparseMax: MAX_PACKED + 1 })).toThrow(RangeError);
    expect(() => new RedisCounterStore(redis, { prefix: 'a{b}:' })).toThrow(RangeError);
  });

  it('stores a like in a few bytes: intset while sparse, bitmap when dense', async () => {
    const store = open({ groups: 64 });
    const ids = new Set<number>();
    const sparseRefs = Array.from({ length: 20 }, (_, i) =>
      post(String(7_300_000_000_000_000_000n + BigInt(i) * 4_194_304n)),
    );
    const events: CounterEvent[] = [];
    let seq = 0;
    for (const ref of sparseRefs) {
      ids.clear();
      while (ids.size < 100) ids.add(Math.floor(Math.random() * 1_000_000));
      for (const u of ids) events.push(fakeEvent(ref, u, ++seq));
    }
    await store.replayFacts(events);
    let bytes = 0;
    for (const ref of sparseRefs)
      bytes += (await redis.memory('USAGE', store.factKey(ref, 'like', false))) ?? 0;
    const sparsePerLike = bytes / (sparseRefs.length * 100);
    expect(sparsePerLike).toBeLessThanOrEqual(8);

    const dense = post('7300000000000009999');
    const denseEvents: CounterEvent[] = [];
    for (let u = 0; u < 120_000; u++) if (u % 6 !== 5) denseEvents.push(fakeEvent(dense, u, u + 1));
    await store.replayFacts(denseEvents);
    expect(await store.factCounts(dense)).toEqual({ like: 100_000, fav: 0 });
    const denseBytes = (await redis.memory('USAGE', store.factKey(dense, 'like', true), 'SAMPLES', 0)) ?? 0;
    expect(denseBytes / 100_000).toBeLessThanOrEqual(0.25);
  }, 60_000);
});

function fakeEvent(ref: EntityRef, userId: number, seq: number): CounterEvent {
  return {
    eventId: `${entityKey(ref)}:${seq}`,
    entityType: ref.etype,
    entityId: ref.eid,
    metric: 'like',
    idx: 1,
    userId,
    delta: 1,
    ts: NOW,
    seq,
  };
}

/**
 * Records the commands one client sends that name a key under `prefix` (command name first, then
 * its arguments as strings). Unlike MONITOR it sees only this client, so tests running beside this
 * file on the same Redis cannot disturb it.
 */
function recordCommands(client: Redis, prefix: string): { seen: string[][]; stop(): void } {
  const seen: string[][] = [];
  const send = client.sendCommand.bind(client);
  client.sendCommand = (...params: Parameters<Redis['sendCommand']>) => {
    const [command] = params;
    const args = [
      command.name,
      ...command.args.map((a) => (Buffer.isBuffer(a) ? a.toString('latin1') : String(a))),
    ];
    if (args.some((a) => a.startsWith(prefix))) seen.push(args);
    return send(...params);
  };
  return {
    seen,
    // The instance property only shadowed the prototype's method.
    stop: () => void Reflect.deleteProperty(client, 'sendCommand'),
  };
}
