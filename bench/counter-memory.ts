/**
 * Memory per like and per entity of the Redis counter store, measured with MEMORY USAGE on the keys
 * the store writes (so other data in the instance does not blur the numbers).
 *
 *   npx tsx bench/counter-memory.ts        (Redis at ZG_REDIS_URL, default redis://127.0.0.1:6379)
 *
 * (a) 1,000 posts × 100 likers drawn from 1,000,000 user ids: sparse fact sets.   target ≤ 8 B/like
 * (b) one post with 1,000,000 likers among 1,200,000 ids: sharded bitmaps.          target ≤ 0.25 B/like
 * (c) 100,000 posts with snowflake ids, one like each, applied and flushed: snapshot buckets
 *     (target ≤ 30 B/entity), with the seq and applied hashes reported on their own; for a few
 *     group counts, since the bucket size per group decides the encoding (128 groups puts ~780
 *     entities in a bucket, past the default listpack limit of 512, to show that cliff).
 *
 * (d) likes received: 200,000 like events on 5,000 posts of 1,000 authors applied to the user-counter
 *     store, by sequenced ids (`knowpost:<id>#<seq>`, one mark per author and post) and, for
 *     comparison, by plain event ids (one applied id per event, kept for the retention): the bytes
 *     of the store's memory of what it applied, per like.
 *
 * Uses its own key prefix and deletes every key it wrote, also when it fails.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import type { CounterEvent, EntityRef } from '../src/counter/model.js';
import { RedisCounterStore } from '../src/counter/store/redis-counter-store.js';
import type { UserCounterDelta } from '../src/user-counter/model.js';
import { RedisUserCounterStore } from '../src/user-counter/store/redis-user-counter-store.js';
import { sequencedEventId } from '../src/user-counter/store/user-counter-store.js';

const REDIS_URL = process.env.ZG_REDIS_URL ?? 'redis://127.0.0.1:6379';
const NOW = Date.now();

interface Row {
  scenario: string;
  items: number;
  unit: string;
  bytes: number;
  target: number | null;
}

/** Twitter-style snowflake: 41 bits of ms since 2010-11-04, 10 bits of worker, 12 bits of sequence. */
function snowflake(ms: number, worker: number, sequence: number): string {
  return ((BigInt(ms - 1_288_834_974_657) << 22n) | (BigInt(worker) << 12n) | BigInt(sequence)).toString();
}

function likeEvent(ref: EntityRef, userId: number, seq: number): CounterEvent {
  return {
    eventId: `${ref.etype}:${ref.eid}:${seq}`,
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

async function memoryOf(redis: Redis, keys: readonly string[]): Promise<number> {
  let total = 0;
  for (let i = 0; i < keys.length; i += 1_000) {
    const pipeline = redis.pipeline();
    for (const key of keys.slice(i, i + 1_000)) pipeline.memory('USAGE', key, 'SAMPLES', 0);
    for (const [error, bytes] of (await pipeline.exec()) ?? []) {
      if (error) throw error;
      total += Number(bytes ?? 0);
    }
  }
  return total;
}

async function deleteByPrefix(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1_000);
    if (keys.length > 0) await redis.unlink(...keys);
    cursor = next;
  } while (cursor !== '0');
}

function randomUsers(count: number, range: number): Set<number> {
  const users = new Set<number>();
  while (users.size < count) users.add(Math.floor(Math.random() * range));
  return users;
}

async function sparsePosts(redis: Redis, prefix: string): Promise<Row> {
  const store = new RedisCounterStore(redis, { prefix });
  const refs: EntityRef[] = [];
  const events: CounterEvent[] = [];
  for (let p = 0; p < 1_000; p++) {
    const ref: EntityRef = { etype: 'knowpost', eid: snowflake(NOW - p * 60_000, p % 32, 0) };
    refs.push(ref);
    let seq = 0;
    for (const u of randomUsers(100, 1_000_000)) events.push(likeEvent(ref, u, ++seq));
  }
  await store.replayFacts(events);
  const keys = refs.flatMap((ref) => [store.factKey(ref, 'like', false), store.factKey(ref, 'like', true)]);
  return {
    scenario: '(a) 1,000 posts × 100 likers of 1M ids',
    items: events.length,
    unit: 'like',
    bytes: await memoryOf(redis, keys),
    target: 8,
  };
}

async function densePost(redis: Redis, prefix: string): Promise<Row> {
  const store = new RedisCounterStore(redis, { prefix });
  const ref: EntityRef = { etype: 'knowpost', eid: snowflake(NOW, 1, 1) };
  const ids = Array.from({ length: 1_200_000 }, (_, i) => i);
  for (let i = ids.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [ids[i], ids[j]] = [ids[j]!, ids[i]!];
  }
  const likers = ids.slice(0, 1_000_000);
  for (let i = 0; i < likers.length; i += 50_000) {
    await store.replayFacts(likers.slice(i, i + 50_000).map((u, k) => likeEvent(ref, u, i + k + 1)));
  }
  const { like } = await store.factCounts(ref);
  if (like !== likers.length) throw new Error(`dense post holds ${like} likes, expected ${likers.length}`);
  const keys = [store.factKey(ref, 'like', false), store.factKey(ref, 'like', true)];
  return {
    scenario: '(b) 1 post × 1M likers of 1.2M ids',
    items: like,
    unit: 'like',
    bytes: await memoryOf(redis, keys),
    target: 0.25,
  };
}

async function snapshots(redis: Redis, prefix: string, groups: number): Promise<Row[]> {
  const store = new RedisCounterStore(redis, { prefix, groups });
  const start = NOW - 365 * 86_400_000;
  const refs: EntityRef[] = Array.from({ length: 100_000 }, (_, i) => ({
    etype: 'knowpost',
    eid: snowflake(
      start + Math.floor(i * 315_000 + Math.random() * 300_000),
      Math.floor(Math.random() * 32),
      Math.floor(Math.random() * 4),
    ),
  }));
  const events: CounterEvent[] = [];
  for (let i = 0; i < refs.length; i += 1_000) {
    const results = await Promise.all(
      refs.slice(i, i + 1_000).map((ref, k) => store.toggle(ref, 'like', i + k, true, NOW)),
    );
    for (const r of results) if (r.event) events.push(r.event);
  }
  await store.markPublished(events);
  for (let i = 0; i < events.length; i += 5_000) await store.applyEvents(events.slice(i, i + 5_000));
  while (!(await store.isQuiet())) await store.flush(groups);
  const all = Array.from({ length: groups }, (_, g) => g);
  const encoding = await redis.object('ENCODING', store.groupKey('s', 0));
  const label = `(c) 100k posts, ${groups} groups`;
  return [
    {
      scenario: `${label}: snapshots (${String(encoding)})`,
      items: refs.length,
      unit: 'entity',
      bytes: await memoryOf(
        redis,
        all.map((g) => store.groupKey('s', g)),
      ),
      target: 30,
    },
    {
      scenario: `${label}: seq hashes`,
      items: refs.length,
      unit: 'entity',
      bytes: await memoryOf(
        redis,
        all.map((g) => store.groupKey('seq', g)),
      ),
      target: null,
    },
    {
      scenario: `${label}: applied hashes`,
      items: refs.length,
      unit: 'entity',
      bytes: await memoryOf(
        redis,
        all.map((g) => store.groupKey('ap', g)),
      ),
      target: null,
    },
  ];
}

async function likesReceived(redis: Redis, prefix: string, sequenced: boolean): Promise<Row> {
  const store = new RedisUserCounterStore(redis, { prefix });
  const authors = 1_000;
  const deltas: UserCounterDelta[] = [];
  for (let post = 0; post < authors * 5; post++) {
    const source = `knowpost:${snowflake(NOW - post * 60_000, 1, post % 4096)}`;
    for (let seq = 1; seq <= 40; seq++) {
      deltas.push({
        eventId: sequenced ? sequencedEventId(source, seq) : `${source}:${seq}`,
        userId: 1 + (post % authors),
        field: 'likesReceived',
        delta: 1,
      });
    }
  }
  for (let i = 0; i < deltas.length; i += 5_000) await store.apply(deltas.slice(i, i + 5_000), NOW);
  const groups = Array.from({ length: store.groups }, (_, g) => g);
  return {
    scenario: `(d) likes received, ${sequenced ? 'sequenced ids (marks)' : 'plain ids (applied set)'}`,
    items: deltas.length,
    unit: 'like',
    bytes: await memoryOf(redis, [
      ...groups.map((g) => store.groupKey('ap', g)),
      ...groups.map((g) => store.groupKey('sm', g)),
    ]),
    target: null,
  };
}

function print(rows: readonly Row[]): void {
  const lines = rows.map((r) => {
    const per = r.bytes / r.items;
    const verdict = r.target === null ? '' : per <= r.target ? `≤ ${r.target} ok` : `> ${r.target} MISSED`;
    return [
      r.scenario.padEnd(52),
      String(r.items).padStart(9),
      r.unit.padEnd(7),
      String(r.bytes).padStart(11),
      per.toFixed(3).padStart(9),
      verdict,
    ];
  });
  console.log(
    [
      'scenario'.padEnd(52),
      'items'.padStart(9),
      'unit'.padEnd(7),
      'bytes'.padStart(11),
      'B/unit'.padStart(9),
      'target',
    ].join('  '),
  );
  for (const line of lines) console.log(line.join('  '));
}

async function main(): Promise<void> {
  const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
  const prefix = `zgbench:mem:${randomBytes(3).toString('hex')}:`;
  const started = Date.now();
  const rows: Row[] = [];
  const config = await redis.config('GET', 'hash-max-listpack-*');
  const version = /redis_version:(\S+)/.exec(await redis.info('server'))?.[1] ?? '?';
  try {
    rows.push(await sparsePosts(redis, `${prefix}a:`));
    await deleteByPrefix(redis, `${prefix}a:`);
    rows.push(await densePost(redis, `${prefix}b:`));
    await deleteByPrefix(redis, `${prefix}b:`);
    for (const sequenced of [true, false]) {
      rows.push(await likesReceived(redis, `${prefix}d:`, sequenced));
      await deleteByPrefix(redis, `${prefix}d:`);
    }
    for (const groups of [4096, 1024, 256, 128]) {
      rows.push(...(await snapshots(redis, `${prefix}c${groups}:`, groups)));
      await deleteByPrefix(redis, `${prefix}c${groups}:`);
    }
    console.log(`Redis ${version}, ${config.join(' ')}; ${((Date.now() - started) / 1000).toFixed(1)} s\n`);
    print(rows);
  } finally {
    await deleteByPrefix(redis, prefix);
    await redis.quit();
  }
}

await main();
