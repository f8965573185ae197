/**
 * The read side of posts against the real stores of both profiles: what a feed page, the author's
 * list and a detail read cost in round trips (the same whatever the page size), and invalidation
 * reaching the in-process caches of every process.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import type { KyselyPlugin, PluginTransformQueryArgs, PluginTransformResultArgs } from 'kysely';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createMysqlDatabase,
  deleteByPrefix,
  services,
  testKafkaLog,
  uniqueName,
} from '../../test/rig/resources.js';
import { CounterMetrics } from '../counter/counter.metrics.js';
import { CounterService } from '../counter/counter.service.js';
import type { EntityRef } from '../counter/model.js';
import type { CounterStore } from '../counter/store/counter-store.js';
import { RedisCounterStore } from '../counter/store/redis-counter-store.js';
import { SqliteCounterStore } from '../counter/store/sqlite-counter-store.js';
import {
  createLocalInvalidationBus,
  createNoSharedCache,
  createRedisInvalidationBus,
  createRedisSharedCache,
} from '../platform/cache/create.js';
import type { InvalidationBus } from '../platform/cache/invalidation-bus.js';
import { LocalInvalidationHub } from '../platform/cache/local-invalidation-bus.js';
import type { SharedCache } from '../platform/cache/shared-cache.js';
import { migrate, openMysql, openSqlite, type Db } from '../platform/db/database.js';
import { NotFoundError } from '../platform/errors/errors.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import { SqliteEventLog } from '../platform/eventlog/sqlite-eventlog.js';
import { DetailService } from './detail.service.js';
import { FeedService } from './feed.service.js';
import { detailResponse, detailResponseBytes, feedResponse, feedResponseBytes } from './read-answers.js';
import { PostCache, postCacheInvalidator, subscribePostCache } from './post-cache.js';
import { POST_CACHE_GROUP, PostCacheConsumer } from './post-cache-consumer.js';
import { postChangedEvent, postEventMessage, POST_TOPIC } from './post-events.js';
import { PostUrlSigner } from './post-read.model.js';
import { PostReadRepository } from './post-read.repository.js';

type Profile = 'embedded' | 'cluster';
type Counts = Record<string, number>;

class CountingPlugin implements KyselyPlugin {
  constructor(private readonly counts: Counts) {}

  transformQuery(args: PluginTransformQueryArgs) {
    this.counts.db = (this.counts.db ?? 0) + 1;
    return args.node;
  }

  async transformResult(args: PluginTransformResultArgs) {
    return args.result;
  }
}

/** The same object, counting each method call under `name.method`. */
function counting<T extends object>(target: T, counts: Counts, name: string): T {
  return new Proxy(target, {
    get(t, prop, receiver) {
      const value: unknown = Reflect.get(t, prop, receiver);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        const key = `${name}.${String(prop)}`;
        counts[key] = (counts[key] ?? 0) + 1;
        return (value as (...a: unknown[]) => unknown).apply(t, args);
      };
    },
  });
}

interface Backend {
  db: Db;
  store: CounterStore;
  /** A shared tier of its own (cold), or the one of `prefix`. */
  shared(prefix?: string): SharedCache;
  /** A bus for one more process of the deployment. */
  bus(): Promise<InvalidationBus>;
  /** The deployment's event log (SQLite table / Kafka), with `post-events`. */
  events: EventLog;
  remembers: boolean;
  cleanup(): Promise<void>;
}

async function openBackend(profile: Profile): Promise<Backend> {
  if (profile === 'embedded') {
    const dir = mkdtempSync(join(tmpdir(), 'zg-feed-'));
    const db = openSqlite(join(dir, 'zhiguang.db'));
    await migrate(db);
    const hub = new LocalInvalidationHub();
    const buses: InvalidationBus[] = [];
    const events = new SqliteEventLog(db, { idlePollMs: 10, retryBackoffMs: { min: 20, max: 200 } });
    return {
      db,
      store: new SqliteCounterStore(db),
      shared: () => createNoSharedCache(),
      bus: async () => {
        const bus = createLocalInvalidationBus(hub);
        buses.push(bus);
        return bus;
      },
      events,
      remembers: false,
      cleanup: async () => {
        for (const bus of buses) await bus.close();
        await events.close();
        await db.close();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  }
  const database = await createMysqlDatabase();
  const db = await openMysql(database.url, 4);
  await migrate(db);
  const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
  const keyPrefix = `${uniqueName('feed')}:`;
  const buses: InvalidationBus[] = [];
  const events = testKafkaLog('zg-feed', `${uniqueName('k')}.`);
  await events.ensureTopics([POST_TOPIC]);
  return {
    db,
    store: new RedisCounterStore(redis, { prefix: keyPrefix, groups: 16 }),
    shared: (prefix = `${keyPrefix}${uniqueName('s')}:`) => createRedisSharedCache(redis, prefix),
    bus: async () => {
      const bus = await createRedisInvalidationBus({
        publisher: redis,
        subscriber: new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 }),
        prefix: keyPrefix,
      });
      buses.push(bus);
      return bus;
    },
    events,
    remembers: true,
    cleanup: async () => {
      for (const bus of buses) await bus.close();
      await events.deleteGroups([POST_CACHE_GROUP]).catch(() => undefined);
      await events.deleteTopics([POST_TOPIC]).catch(() => undefined);
      await events.close();
      await deleteByPrefix(redis, keyPrefix);
      await redis.quit();
      await db.close();
      await database.drop();
    },
  };
}

const BASE = 7_300_000_000_000_000_000n;
const postId = (n: number) => String(BASE + BigInt(n));
const ref = (id: string): EntityRef => ({ etype: 'knowpost', eid: id });
const POSTS = 60;

describe.each<Profile>(['embedded', 'cluster'])('reading posts against real stores (%s)', (profile) => {
  let backend: Backend;
  let authors: number[];
  let viewer: number;

  /** One API process: its own in-process caches, everything counted into `counts`. */
  function apiProcess(
    counts: Counts,
    shared: SharedCache = backend.shared(),
    localTtlMs = 60_000,
    anonymous?: { ttlMs: number; now: () => number },
  ) {
    const db: Db = { ...backend.db, kysely: backend.db.kysely.withPlugin(new CountingPlugin(counts)) };
    const repo = new PostReadRepository(db);
    const store = counting(backend.store, counts, 'store');
    const cache = new PostCache({
      repo,
      signer: new PostUrlSigner({ presignGet: async (key) => `https://files.test/${key}?sig` }, 3600),
      shared: counting(shared, counts, 'shared'),
      localTtlMs,
      localMaxEntries: 1000,
      sharedTtlMs: 60_000,
    });
    const counters = new CounterService(
      store,
      { visible: async (refs) => refs.map(() => true) },
      null,
      new CounterMetrics(new Registry()),
    );
    const interactions = {
      counts: (refs: readonly EntityRef[]) => counters.snapshots(refs),
      flags: (userId: number, refs: readonly EntityRef[]) => store.flags(userId, refs),
    };
    const views: string[] = [];
    const answers = anonymous && {
      ...anonymous,
      maxEntries: 100,
      maxBytes: 16 * 1024 * 1024,
      counts: (refs: readonly EntityRef[]) => interactions.counts(refs),
    };
    return {
      cache,
      views,
      feeds: new FeedService(cache, repo, interactions, answers),
      details: new DetailService(cache, interactions, { record: (id) => views.push(id) }, answers),
    };
  }

  beforeAll(async () => {
    backend = await openBackend(profile);
    const user = (i: number) => ({
      phone: `1390000000${i}`,
      email: null,
      password_hash: null,
      nickname: `author${i}`,
      avatar: `https://a.test/${i}.png`,
      bio: null,
      zg_id: `zg_author_${i}`,
      gender: 'UNKNOWN',
      birthday: null,
      school: null,
      tags_json: `["t${i}"]`,
      created_at: 1,
      updated_at: 1,
    });
    await backend.db.kysely.insertInto('users').values([0, 1, 2, 3].map(user)).execute();
    const ids = (await backend.db.kysely.selectFrom('users').select('id').orderBy('id').execute()).map((r) =>
      Number(r.id),
    );
    authors = ids.slice(0, 3);
    viewer = ids[3]!;
    await backend.db.kysely
      .insertInto('knowposts')
      .values(
        Array.from({ length: POSTS }, (_, n) => ({
          id: postId(n),
          author_id: authors[n % 3]!,
          status: 'published',
          visible: 'public',
          created_at: 1,
          updated_at: 1,
          publish_time: 10_000 + n,
          title: `post ${n}`,
          img_urls_json: JSON.stringify([`posts/${postId(n)}/images/20250101/0000000${n % 10}.png`]),
          content_key: `posts/${postId(n)}/content.md`,
        })),
      )
      .execute();
    // Likes by the viewer on every third post, and snapshots for all (a post's first read rebuilds
    // its snapshot from facts once; measured below is every read after that).
    for (let n = 0; n < POSTS; n += 3)
      await backend.store.toggle(ref(postId(n)), 'like', viewer, true, Date.now());
    for (let n = 0; n < POSTS; n++) await backend.store.rebuild(ref(postId(n)));
  });
  afterAll(async () => backend?.cleanup());

  it('costs the same round trips for a feed page of 5 and of 50, cold and warm', async () => {
    const measure = async (size: number) => {
      const cold: Counts = {};
      const sharedTier = backend.shared();
      const first = apiProcess(cold, sharedTier);
      const raw = await first.feeds.feed(1, size, viewer);
      const page = feedResponse(raw);
      // The bytes the route sends say the same as the JSON model.
      expect(JSON.parse(feedResponseBytes(raw).toString('utf8'))).toEqual(page);
      expect(page.items).toHaveLength(size);
      expect(page.items[0]).toMatchObject({
        id: postId(POSTS - 1),
        title: `post ${POSTS - 1}`,
        coverImage: expect.stringMatching(/^https:\/\/files\.test\/posts\//),
        authorNickname: expect.stringMatching(/^author/),
        tagJson: expect.stringMatching(/^\["t/),
        likeCount: 0,
        liked: false,
      });
      const liked = page.items.find((i) => i.id === postId(POSTS - 3));
      expect(liked).toMatchObject({ liked: true, likeCount: 1 });

      // The same process again: everything but counts and flags comes from its memory.
      const again: Counts = {};
      const p = apiProcess(again, sharedTier);
      await p.feeds.feed(1, size, viewer);
      for (const k of Object.keys(again)) delete again[k];
      await p.feeds.feed(1, size, viewer);
      // Another process sharing the deployment's shared tier, its own memory cold.
      const neighbour: Counts = {};
      await apiProcess(neighbour, sharedTier).feeds.feed(1, size, viewer);
      const anonymous: Counts = {};
      await apiProcess(anonymous, sharedTier).feeds.feed(1, size, null);
      return { cold, again, neighbour, anonymous };
    };
    const small = await measure(5);
    const large = await measure(50);
    expect(large).toEqual(small);
    // Page of ids, posts, authors; the shared tier read and filled for the page and for the posts.
    expect(small.cold).toEqual({
      db: 3,
      'shared.get': 2,
      'shared.fill': 2,
      'store.readSnapshots': 1,
      'store.flags': 1,
    });
    expect(small.again).toEqual({ 'store.readSnapshots': 1, 'store.flags': 1 });
    expect(small.neighbour).toEqual(
      backend.remembers ? { db: 1, 'shared.get': 2, 'store.readSnapshots': 1, 'store.flags': 1 } : small.cold,
    );
    const { 'store.flags': _flags, ...withoutFlags } = small.neighbour;
    expect(small.anonymous).toEqual(withoutFlags);
  });

  it('costs the same round trips for a page of mine of 5 and of 20', async () => {
    const author = authors[0]!;
    const measure = async (size: number) => {
      const cold: Counts = {};
      const p = apiProcess(cold);
      const page = feedResponse(await p.feeds.mine(1, size, author));
      expect(page.items).toHaveLength(size);
      const warm: Counts = {};
      const q = apiProcess(warm);
      await q.feeds.mine(1, size, author);
      for (const k of Object.keys(warm)) delete warm[k];
      await q.feeds.mine(1, size, author);
      return { cold, warm };
    };
    const small = await measure(5);
    const large = await measure(POSTS / 3);
    expect(large).toEqual(small);
    expect(small.cold).toEqual({
      db: 3,
      'shared.get': 1,
      'shared.fill': 1,
      'store.readSnapshots': 1,
      'store.flags': 1,
    });
    // The page of ids is the author's own, read each time; posts and authors come from memory.
    expect(small.warm).toEqual({ db: 1, 'store.readSnapshots': 1, 'store.flags': 1 });
  });

  it('pages the public feed only as deep as told, the last page saying there is no more', async () => {
    const p = apiProcess({});
    const interactions = {
      counts: async (refs: readonly EntityRef[]) =>
        refs.map(() => [0, 0, 0, 0, 0] as [number, number, number, number, number]),
      flags: async () => [],
    };
    const shallow = new FeedService(p.cache, new PostReadRepository(backend.db), interactions, undefined, 4);
    expect((await p.feeds.feed(2, 2, null)).hasMore).toBe(true);
    expect((await shallow.feed(1, 2, null)).hasMore).toBe(true);
    const last = await shallow.feed(2, 2, null);
    expect(last.entries).toHaveLength(2);
    expect(last.hasMore).toBe(false);
    expect((await shallow.feed(1, 3, null)).hasMore).toBe(true);
    const cut = await shallow.feed(2, 3, null);
    expect(cut.hasMore).toBe(false);
    // Posts 4 to 6 reach past the depth: only the 4th is shown.
    expect(cut.entries).toHaveLength(1);
  });

  it('keeps an anonymous page’s answer for its ttl and drops it on any post change', async () => {
    let now = 1_000;
    const counts: Counts = {};
    const p = apiProcess(counts, backend.shared(), 60_000, { ttlMs: 200, now: () => now });
    const clear = () => {
      for (const k of Object.keys(counts)) delete counts[k];
    };
    const first = await p.feeds.anonymousFeedBytes(1, 10);
    expect(JSON.parse(first.toString('utf8'))).toEqual(feedResponse(await p.feeds.feed(1, 10, null)));
    expect(JSON.parse(first.toString('utf8'))).toMatchObject({ page: 1, size: 10, hasMore: true });
    clear();
    // Within the ttl: the same bytes, no round trip at all; another page or size is its own.
    now += 199;
    expect(await p.feeds.anonymousFeedBytes(1, 10)).toBe(first);
    expect(counts).toEqual({});
    expect(await p.feeds.anonymousFeedBytes(1, 5)).not.toBe(first);
    clear();
    // Past it: written again, with counts read live.
    now += 1;
    const second = await p.feeds.anonymousFeedBytes(1, 10);
    expect(second).not.toBe(first);
    expect(counts).toEqual({ 'store.readSnapshots': 1 });
    // A post change anywhere drops it at once.
    p.cache.invalidateLocal([postId(1)]);
    clear();
    const third = await p.feeds.anonymousFeedBytes(1, 10);
    expect(third).not.toBe(second);
    expect(counts['store.readSnapshots']).toBe(1);
    // Concurrent callers share one write.
    now += 200;
    clear();
    const [x, y] = await Promise.all([p.feeds.anonymousFeedBytes(1, 10), p.feeds.anonymousFeedBytes(1, 10)]);
    expect(x).toBe(y);
    expect(counts['store.readSnapshots']).toBe(1);
    // A signed-in viewer's page is the kept page with the viewer's flags: one read of flags.
    clear();
    const mine = await p.feeds.viewerFeedBytes(1, 10, viewer);
    expect(counts).toEqual({ 'store.flags': 1 });
    const live = feedResponse(await p.feeds.feed(1, 10, viewer));
    expect(JSON.parse(mine.toString('utf8'))).toEqual(live);
    expect(live.items.filter((item) => item.liked).length).toBeGreaterThan(0);
    expect(JSON.parse((await p.feeds.anonymousFeedBytes(1, 10)).toString('utf8'))).toEqual({
      ...live,
      items: live.items.map((item) => ({ ...item, liked: false, faved: false })),
    });
    // A write that spans a change is served to its callers but not kept, nor joined by later ones.
    now += 200;
    const spanning = p.feeds.anonymousFeedBytes(1, 10);
    p.cache.invalidateLocal([postId(2)]);
    const after = p.feeds.anonymousFeedBytes(1, 10);
    expect(await after).not.toBe(await spanning);
    expect(await p.feeds.anonymousFeedBytes(1, 10)).toBe(await after);
  });

  it('reads a cold signed-in page’s flags while its counts are read, and answers as the live feed', async () => {
    let now = 1_000;
    const counts: Counts = {};
    const p = apiProcess(counts, backend.shared(), 60_000, { ttlMs: 200, now: () => now });
    await p.feeds.feed(1, 10, null); // posts and the page of ids in the caches
    // Counts that answer only once the flags were asked for: read one after the other, the page
    // would never be written.
    let flagsAsked!: () => void;
    const asked = new Promise<void>((resolve) => (flagsAsked = resolve));
    const interactions = {
      counts: async (refs: readonly EntityRef[]) => {
        await asked;
        return backend.store.readSnapshots(refs).then((all) => all.map((c) => c ?? [0, 0, 0, 0, 0]));
      },
      flags: (userId: number, refs: readonly EntityRef[]) => {
        flagsAsked();
        return backend.store.flags(userId, refs);
      },
    };
    const feeds = new FeedService(p.cache, new PostReadRepository(backend.db), interactions, {
      ttlMs: 200,
      maxEntries: 100,
      maxBytes: 16 * 1024 * 1024,
      now: () => now,
      counts: interactions.counts,
    });
    const timeout = new Promise<never>((_, fail) =>
      setTimeout(() => fail(new Error('the flags waited for the counts')), 5_000),
    );
    const cold = await Promise.race([feeds.viewerFeedBytes(1, 10, viewer), timeout]);
    const live = feedResponse(await p.feeds.feed(1, 10, viewer));
    expect(JSON.parse(cold.toString('utf8'))).toEqual(live);
    expect(live.items.filter((item) => item.liked).length).toBeGreaterThan(0);
    // Warm: the kept page and the viewer's flags again.
    now += 100;
    expect(JSON.parse((await feeds.viewerFeedBytes(1, 10, viewer)).toString('utf8'))).toEqual(live);
  });

  it('reads a detail in a fixed number of round trips and records its view', async () => {
    const counts: Counts = {};
    const p = apiProcess(counts);
    const id = postId(3);
    const raw = await p.details.detail(id, viewer);
    const detail = detailResponse(raw);
    // The bytes the route sends say the same as the JSON model.
    expect(JSON.parse(detailResponseBytes(raw).toString('utf8'))).toEqual(detail);
    expect(detail).toMatchObject({
      id,
      authorId: String(authors[0]),
      contentUrl: `https://files.test/posts/${id}/content.md?sig`,
      liked: true,
      likeCount: 1,
    });
    expect(counts).toEqual({
      db: 2,
      'shared.get': 1,
      'shared.fill': 1,
      'store.readSnapshots': 1,
      'store.flags': 1,
    });
    for (const k of Object.keys(counts)) delete counts[k];
    await p.details.detail(id, null);
    expect(counts).toEqual({ 'store.readSnapshots': 1 });
    expect(p.views).toEqual([id, id]);
    await expect(p.details.detail(postId(999), null)).rejects.toBeInstanceOf(NotFoundError);
    expect(p.views).toEqual([id, id]);
  });

  it('reads no counts or flags for a draft its author opens, and makes no snapshot for it', async () => {
    const id = postId(900);
    await backend.db.kysely
      .insertInto('knowposts')
      .values({
        id,
        author_id: authors[0]!,
        status: 'draft',
        visible: 'public',
        created_at: 1,
        updated_at: 1,
        publish_time: null,
        title: 'a draft',
        img_urls_json: '[]',
        content_key: null,
      })
      .execute();
    const counts: Counts = {};
    const p = apiProcess(counts);
    expect(detailResponse(await p.details.detail(id, authors[0]!))).toMatchObject({
      id,
      likeCount: 0,
      liked: false,
    });
    expect(Object.keys(counts).filter((k) => k.startsWith('store.'))).toEqual([]);
    expect(await backend.store.readSnapshots([ref(id)])).toEqual([null]);
  });

  it('keeps an anonymous detail answer for its ttl, never a post that only its author may read', async () => {
    let now = 1_000;
    const counts: Counts = {};
    const p = apiProcess(counts, backend.shared(), 60_000, { ttlMs: 200, now: () => now });
    const clear = () => {
      for (const k of Object.keys(counts)) delete counts[k];
    };
    const id = postId(6);
    const first = await p.details.anonymousDetailBytes(id);
    expect(JSON.parse(first.toString('utf8'))).toEqual(detailResponse(await p.details.detail(id, null)));
    expect(JSON.parse(first.toString('utf8'))).toMatchObject({ id, liked: false, likeCount: 1 });
    clear();
    // Within the ttl: the same bytes and no round trip, but every read is a view.
    p.views.length = 0;
    now += 199;
    expect(await p.details.anonymousDetailBytes(id)).toBe(first);
    expect(counts).toEqual({});
    expect(p.views).toEqual([id]);
    // Past it: written again with counts read live; a post change anywhere drops it at once.
    now += 1;
    const second = await p.details.anonymousDetailBytes(id);
    expect(second).not.toBe(first);
    expect(counts).toEqual({ 'store.readSnapshots': 1 });
    p.cache.invalidateLocal([postId(7)]);
    expect(await p.details.anonymousDetailBytes(id)).not.toBe(second);
    // Concurrent callers share one write and each records a view.
    now += 200;
    clear();
    p.views.length = 0;
    const [x, y] = await Promise.all([
      p.details.anonymousDetailBytes(id),
      p.details.anonymousDetailBytes(id),
    ]);
    expect(x).toBe(y);
    expect(counts['store.readSnapshots']).toBe(1);
    expect(p.views).toEqual([id, id]);
    // A post only its author may read: the author's reads leave nothing an anonymous caller gets.
    const hidden = postId(8);
    await backend.db.kysely
      .updateTable('knowposts')
      .set({ visible: 'private' })
      .where('id', '=', hidden)
      .execute();
    p.cache.invalidateLocal([hidden]);
    await p.cache.invalidateShared([hidden]);
    p.views.length = 0;
    expect(detailResponse(await p.details.detail(hidden, authors[2]!))).toMatchObject({ id: hidden });
    for (let i = 0; i < 2; i++)
      await expect(p.details.anonymousDetailBytes(hidden)).rejects.toBeInstanceOf(NotFoundError);
    await expect(p.details.anonymousDetailBytes(postId(999))).rejects.toBeInstanceOf(NotFoundError);
    // The author's own read of a post only they may see is not a view.
    expect(p.views).toEqual([]);
    await backend.db.kysely
      .updateTable('knowposts')
      .set({ visible: 'public' })
      .where('id', '=', hidden)
      .execute();
    p.cache.invalidateLocal([hidden]);
    await p.cache.invalidateShared([hidden]);
  });

  it('drops a changed post from the caches of every process at once', async () => {
    const sharedTier = backend.shared();
    const [busA, busB] = [await backend.bus(), await backend.bus()];
    const a = apiProcess({}, sharedTier);
    const b = apiProcess({}, sharedTier);
    subscribePostCache(a.cache, busA);
    subscribePostCache(b.cache, busB);
    const announce = postCacheInvalidator(a.cache, busA, (err) => {
      throw err;
    });
    const id = postId(10);
    const author = authors[1]!;
    for (const p of [a, b]) {
      expect((await p.details.detail(id, null)).post.visible).toBe('public');
      expect(feedResponse(await p.feeds.feed(1, 50, null)).items.map((i) => i.id)).toContain(id);
    }
    await backend.db.kysely
      .updateTable('knowposts')
      .set({ visible: 'private' })
      .where('id', '=', id)
      .execute();
    await announce({ id, authorId: author, kind: 'visibility', draft: false, unlisted: false });

    // The announcing process at once; the other as soon as the message arrives.
    await expect(a.details.detail(id, null)).rejects.toBeInstanceOf(NotFoundError);
    const deadline = Date.now() + 1_000;
    for (;;) {
      const hidden = await b.details.detail(id, null).then(
        () => false,
        (err: unknown) => err instanceof NotFoundError,
      );
      if (hidden) break;
      if (Date.now() > deadline) throw new Error('the other process still serves the private post');
      await new Promise((r) => setTimeout(r, 10));
    }
    for (const p of [a, b]) {
      expect(feedResponse(await p.feeds.feed(1, 50, null)).items.map((i) => i.id)).not.toContain(id);
      expect((await p.details.detail(id, author)).post.visible).toBe('private');
    }
    // A third process, cold, must not find the old post in the shared tier either.
    await expect(apiProcess({}, sharedTier).details.detail(id, null)).rejects.toBeInstanceOf(NotFoundError);
  });
  it('drops a post made private from every cache through post-events when the request could not', async () => {
    const sharedTier = backend.shared();
    const [busA, busW] = [await backend.bus(), await backend.bus()];
    const a = apiProcess({}, sharedTier);
    subscribePostCache(a.cache, busA);
    const id = postId(20);
    const author = authors[2]!;
    expect((await a.details.detail(id, null)).post.visible).toBe('public');
    expect(feedResponse(await a.feeds.feed(1, 50, null)).items.map((i) => i.id)).toContain(id);

    // A worker process whose shared tier fails twice before it answers.
    const worker = apiProcess({}, sharedTier);
    let refused = 0;
    const flaky = {
      invalidateShared: async (ids: readonly string[]) => {
        if (refused < 2) {
          refused += 1;
          throw new Error('redis unavailable');
        }
        await worker.cache.invalidateShared(ids);
      },
    };
    const errors: unknown[] = [];
    const consumer = new PostCacheConsumer(backend.events, flaky, busW, {
      onError: (err) => errors.push(err),
    });
    await consumer.start();
    try {
      // The change commits with its event, but the request's own invalidation never happens.
      await backend.db.kysely
        .updateTable('knowposts')
        .set({ visible: 'private' })
        .where('id', '=', id)
        .execute();
      expect((await a.details.detail(id, null)).post.visible).toBe('public');
      if (backend.remembers)
        expect((await apiProcess({}, sharedTier).details.detail(id, null)).post.visible).toBe('public');
      const message = postEventMessage(postChangedEvent(id, author, Date.now(), 'c1'));
      await backend.events.publish(message.topic, [{ key: message.key, value: message.payload }]);

      const deadline = Date.now() + 15_000;
      const hidden = (p: ReturnType<typeof apiProcess>) =>
        p.details.detail(id, null).then(
          () => false,
          (err: unknown) => err instanceof NotFoundError,
        );
      while (!(await hidden(a))) {
        if (Date.now() > deadline) throw new Error('the private post is still served');
        await new Promise((r) => setTimeout(r, 20));
      }
      expect(refused).toBe(2);
      expect(errors.length).toBeGreaterThanOrEqual(2);
      expect(feedResponse(await a.feeds.feed(1, 50, null)).items.map((i) => i.id)).not.toContain(id);
      // Nor does a cold process find it in the shared tier.
      expect(await hidden(apiProcess({}, sharedTier))).toBe(true);
    } finally {
      await consumer.stop();
    }
  });
});
