/**
 * The user counters end to end inside one process, on both profiles: post transitions written to the
 * database and published as `post-events` through the real event log (SQLite table / Kafka), the
 * `user-counters` consumer, rebuilds from the database on read, and the reconciler. Failures that
 * would break exactness are injected: a consumer dying between apply and commit, malformed records,
 * deltas landing while a rebuild reads the database, and events still on their way during a rebuild.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import type { Insertable } from 'kysely';
import { Registry } from 'prom-client';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  createMysqlDatabase,
  deleteByPrefix,
  publishedPostRow,
  services,
  testKafkaLog,
  uniqueName,
  userRow,
} from '../../test/rig/resources.js';
import { postEvent, POST_TOPIC, withCrossing, type PostTransition } from '../knowpost/post-events.js';
import { migrate, openMysql, openSqlite, type Db } from '../platform/db/database.js';
import type { KnowpostsTable } from '../platform/db/schema.js';
import type { DeliveredRecord, EventLog } from '../platform/eventlog/eventlog.js';
import { SqliteEventLog } from '../platform/eventlog/sqlite-eventlog.js';
import { postEventsFeed, USER_COUNTER_GROUP, UserCounterConsumer } from './consumer.js';
import { ZERO_USER_COUNTS, type UserCounterDelta, type UserCounts } from './model.js';
import { PostCountPart, UNAPPLIED_MAX } from './post-count.part.js';
import { verifyOutcome } from './admin.js';
import { UserCounterReconciler } from './reconciler.js';
import { DbUserCountSource, type UserCountSource } from './source.js';
import { RedisUserCounterStore } from './store/redis-user-counter-store.js';
import { SqliteUserCounterStore } from './store/sqlite-user-counter-store.js';
import { DEFAULT_RETENTION_MS, type UserCounterStore } from './store/user-counter-store.js';
import { UserCounterMetrics } from './user-counter.metrics.js';
import { UserCounterService } from './user-counter.service.js';

type Profile = 'embedded' | 'cluster';

interface Rig {
  db: Db;
  events: EventLog;
  store: UserCounterStore;
  source: UserCountSource;
  registry: Registry;
  metrics: UserCounterMetrics;
  service: UserCounterService;
  reconciler: UserCounterReconciler;
  errors: unknown[];
  malformed: DeliveredRecord[];
  /** A consumer over `store` (default: the rig's); stopped with the rig. */
  consumer(store?: UserCounterStore): UserCounterConsumer;
  cleanup(): Promise<void>;
}

async function openRig(profile: Profile): Promise<Rig> {
  const closers: (() => Promise<void>)[] = [];
  let db: Db;
  let events: EventLog;
  let store: UserCounterStore;
  if (profile === 'embedded') {
    const dir = mkdtempSync(join(tmpdir(), 'zg-users-'));
    db = openSqlite(join(dir, 'zhiguang.db'));
    await migrate(db);
    const log = new SqliteEventLog(db, { idlePollMs: 10, retryBackoffMs: { min: 20, max: 200 } });
    events = log;
    store = new SqliteUserCounterStore(db);
    const sqlite = db;
    closers.push(async () => {
      await log.close();
      await sqlite.close();
      rmSync(dir, { recursive: true, force: true });
    });
  } else {
    const database = await createMysqlDatabase();
    db = await openMysql(database.url, 4);
    await migrate(db);
    const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    const prefix = `${uniqueName('uc')}:`;
    store = new RedisUserCounterStore(redis, { prefix, groups: 16 });
    const kafka = testKafkaLog('zg-user-counters', `${uniqueName('k')}.`);
    events = kafka;
    await kafka.ensureTopics([POST_TOPIC]);
    const mysql = db;
    closers.push(async () => {
      await kafka.deleteGroups([USER_COUNTER_GROUP]).catch(() => undefined);
      await kafka.deleteTopics([POST_TOPIC]).catch(() => undefined);
      await kafka.close();
      await deleteByPrefix(redis, prefix);
      await redis.quit();
      await mysql.close();
      await database.drop();
    });
  }
  const registry = new Registry();
  const metrics = new UserCounterMetrics(registry);
  const source = new DbUserCountSource(db, [new PostCountPart(db)], DEFAULT_RETENTION_MS);
  const service = new UserCounterService(store, source, metrics);
  const reconciler = new UserCounterReconciler(store, source, service, metrics);
  const errors: unknown[] = [];
  const malformed: DeliveredRecord[] = [];
  const consumers: UserCounterConsumer[] = [];
  return {
    db,
    events,
    store,
    source,
    registry,
    metrics,
    service,
    reconciler,
    errors,
    malformed,
    consumer(s = store) {
      const c = new UserCounterConsumer(events, s, [postEventsFeed], metrics, {
        maxBatch: 20,
        maxWaitMs: 20,
        onMalformed: (record) => malformed.push(record),
        onError: (err) => errors.push(err),
      });
      consumers.push(c);
      return c;
    },
    async cleanup() {
      await Promise.allSettled(consumers.map((c) => c.stop()));
      for (const close of closers) await close();
    },
  };
}

/** Forwards everything to `target` except the given methods. */
function intercept<T extends object>(target: T, overrides: { [K in keyof T]?: T[K] }): T {
  return new Proxy(target, {
    get(t, prop, receiver) {
      if (Object.prototype.hasOwnProperty.call(overrides, prop)) return overrides[prop as keyof T];
      const value: unknown = Reflect.get(t, prop, receiver);
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(t) : value;
    },
  });
}

async function until(done: () => boolean | Promise<boolean>, ms: number, what = ''): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${ms} ms ${what}`);
    await sleep(20);
  }
}

async function metricValue(registry: Registry, name: string, labels: Record<string, string> = {}) {
  const metric = registry.getSingleMetric(name);
  if (!metric) throw new Error(`no metric ${name}`);
  const { values } = await metric.get();
  return values
    .filter((v) => Object.entries(labels).every(([k, l]) => v.labels[k] === l))
    .reduce((sum, v) => sum + v.value, 0);
}

const posts = (n: number): UserCounts => ({ ...ZERO_USER_COUNTS, posts: n });
let nextPost = 7_500_000_000_000_000_000n + BigInt(Date.now() % 1_000_000) * 1_000n;
const newPostId = () => String(nextPost++);

describe.each<Profile>(['embedded', 'cluster'])('user counters (%s profile)', (profile) => {
  let rig: Rig;

  beforeEach(async () => {
    rig = await openRig(profile);
  });
  afterEach(async () => {
    await rig.cleanup();
  });

  async function newUser(): Promise<number> {
    const result = await rig.db.kysely.insertInto('users').values(userRow()).executeTakeFirstOrThrow();
    return Number(result.insertId);
  }

  /** What the post service does: the row changes and the event is written, then relayed. */
  async function transition(
    type: PostTransition,
    authorId: number,
    postId: string,
    options: { publish?: boolean } = {},
  ): Promise<void> {
    const now = Date.now();
    if (type === 'published') {
      await insertPosts(authorId, [
        {
          id: postId,
          content_key: `posts/${postId}/content.md`,
          public_epoch: 1,
          public_crossings: JSON.stringify([[1, 1, now]]),
        },
      ]);
    } else {
      // As a delete of a public post records it.
      const { public_crossings: kept } = await rig.db.kysely
        .selectFrom('knowposts')
        .select('public_crossings')
        .where('id', '=', postId)
        .executeTakeFirstOrThrow();
      await rig.db.kysely
        .updateTable('knowposts')
        .set({ status: 'deleted', updated_at: now, public_crossings: withCrossing(kept, [1, -1, now]) })
        .where('id', '=', postId)
        .execute();
    }
    if (options.publish !== false) await publishEvents([{ type, authorId, postId }]);
  }

  /** Inserts the author's posts, published and public now unless `posts` say otherwise. */
  async function insertPosts(
    authorId: number,
    posts: (Partial<Insertable<KnowpostsTable>> & { id: string })[],
  ): Promise<void> {
    const now = Date.now();
    await rig.db.kysely
      .insertInto('knowposts')
      .values(
        posts.map((post) =>
          publishedPostRow(post.id, authorId, {
            created_at: now,
            updated_at: now,
            publish_time: now,
            ...post,
          }),
        ),
      )
      .execute();
  }

  async function publishEvents(list: { type: PostTransition; authorId: number; postId: string }[]) {
    await rig.events.publish(
      POST_TOPIC,
      list.map((e) => ({
        key: String(e.authorId),
        value: JSON.stringify(postEvent(e.type, e.postId, e.authorId, Date.now(), 1)),
      })),
    );
  }

  const read = async (users: number[]) => rig.store.read(users);

  it('counts published and unpublished posts exactly, and skips malformed records', async () => {
    const authors = [await newUser(), await newUser(), await newUser()];
    // The authors' counts were read once (snapshots at zero), so every delta lands on a snapshot.
    for (const a of authors) expect(await rig.service.counts(a)).toEqual(posts(0));
    const consumer = rig.consumer();
    await consumer.start();
    const expected = new Map(authors.map((a) => [a, 0]));
    const live: { author: number; id: string }[] = [];
    for (let i = 0; i < 24; i++) {
      const author = authors[i % 3]!;
      const id = newPostId();
      await transition('published', author, id);
      live.push({ author, id });
      expected.set(author, expected.get(author)! + 1);
      if (i % 4 === 3) {
        const gone = live.shift()!;
        await transition('unpublished', gone.author, gone.id);
        expected.set(gone.author, expected.get(gone.author)! - 1);
      }
      if (i === 10) {
        await rig.events.publish(POST_TOPIC, [
          { key: String(author), value: 'not json' },
          { key: String(author), value: JSON.stringify({ eventId: 'x', type: 'published', postId: '1' }) },
          { key: String(author), value: JSON.stringify(postEvent('published', '5', 0, 0, 1)) },
        ]);
      }
    }
    const want = authors.map((a) => posts(expected.get(a)!));
    const applied = () => metricValue(rig.registry, 'zg_user_counter_deltas_total', { outcome: 'applied' });
    // Counts can match while a publish and its unpublish are both still on their way: wait for all 30.
    await until(async () => (await applied()) >= 30 && rig.malformed.length >= 3, 15_000, 'every delta');
    expect(await read(authors)).toEqual(want);
    expect(rig.malformed.map((r) => r.value.slice(0, 8))).toEqual(['not json', '{"eventI', '{"eventI']);
    expect(await metricValue(rig.registry, 'zg_user_counter_deltas_total', { outcome: 'malformed' })).toBe(3);
    expect(await applied()).toBe(30);
    // The database agrees, user by user.
    const report = await rig.reconciler.verifyAll(false, () => undefined);
    expect(report).toMatchObject({ checked: 3, ok: 3, drifted: [], missing: 0 });
  });

  it('does not count a batch twice when its consumer applied it and died before committing', async () => {
    const authors = [await newUser(), await newUser()];
    for (const a of authors) await rig.service.counts(a);
    let crashBudget = 3;
    let crashes = 0;
    const deliveries = new Map<string, number>();
    const dying = intercept(rig.store, {
      apply: async (deltas: readonly UserCounterDelta[], now: number) => {
        for (const d of deltas) deliveries.set(d.eventId, (deliveries.get(d.eventId) ?? 0) + 1);
        const result = await rig.store.apply(deltas, now);
        if (crashBudget > 0) {
          crashBudget--;
          crashes++;
          throw new Error('injected: consumer died after applying, before committing');
        }
        return result;
      },
    });
    const first = rig.consumer(dying);
    await first.start();
    const ids: string[][] = [[], []];
    for (let i = 0; i < 40; i++) {
      const id = newPostId();
      ids[i % 2]!.push(id);
      await transition('published', authors[i % 2]!, id);
    }
    await until(() => crashes >= 3, 15_000, `(crashes: ${crashes})`);
    // The member leaves with batches uncommitted; a new one (another "process") takes over.
    await first.stop();
    for (const id of ids[0]!.slice(0, 5)) await transition('unpublished', authors[0]!, id);
    const second = rig.consumer(dying);
    await second.start();
    await until(
      async () => JSON.stringify(await read(authors)) === JSON.stringify([posts(15), posts(20)]),
      20_000,
      `(counts: ${JSON.stringify(await read(authors))})`,
    );
    await sleep(300);
    expect(await read(authors)).toEqual([posts(15), posts(20)]);
    expect([...deliveries.values()].some((n) => n > 1)).toBe(true);
    expect(
      await metricValue(rig.registry, 'zg_user_counter_deltas_total', { outcome: 'duplicate' }),
    ).toBeGreaterThan(0);
    expect(rig.errors.some((e) => String(e).includes('injected'))).toBe(true);
  });

  it('rebuilds a missing snapshot from the database and does not count events still on their way again', async () => {
    const author = await newUser();
    const ids = [newPostId(), newPostId(), newPostId(), newPostId()];
    // Four posts published, one deleted; none of the events has been consumed yet.
    for (const id of ids) await transition('published', author, id);
    await transition('unpublished', author, ids[0]!);
    expect(await rig.store.read([author])).toEqual([null]);

    // Concurrent readers share one rebuild, which answers the database's count, never zeros.
    const answers = await Promise.all(Array.from({ length: 5 }, () => rig.service.counts(author)));
    expect(answers).toEqual(Array.from({ length: 5 }, () => posts(3)));
    expect(await metricValue(rig.registry, 'zg_user_counter_rebuilds_total', { reason: 'read' })).toBe(1);

    const consumer = rig.consumer();
    await consumer.start();
    const another = newPostId();
    await transition('published', author, another);
    await until(async () => (await read([author]))[0]?.posts === 4, 15_000, 'the new post');
    await sleep(300);
    expect(await rig.service.counts(author)).toEqual(posts(4));
    expect(await metricValue(rig.registry, 'zg_user_counter_deltas_total', { outcome: 'duplicate' })).toBe(5);
  });

  it('checks and rebuilds while an entry and its exit are on their way, counting neither again', async () => {
    const author = await newUser();
    // The snapshot is read (zero) before the post is published and made private.
    expect(await rig.service.counts(author)).toEqual(posts(0));
    const id = newPostId();
    const t = Date.now();
    await insertPosts(author, [
      {
        id,
        visible: 'private',
        updated_at: t,
        public_epoch: 1,
        public_crossings: JSON.stringify([
          [1, 1, t],
          [1, -1, t],
        ]),
      },
    ]);
    // Neither event has arrived: the snapshot is right, and the check must say so.
    expect(await rig.reconciler.check(author, false)).toBe('ok');
    expect(await metricValue(rig.registry, 'zg_user_counter_drift_found_total')).toBe(0);

    // Rebuilt meanwhile, then the events arrive: both are skipped.
    await rig.store.remove([author]);
    expect(await rig.service.counts(author)).toEqual(posts(0));
    await rig.events.publish(
      POST_TOPIC,
      (['published', 'unpublished'] as const).map((type) => ({
        key: String(author),
        value: JSON.stringify(postEvent(type, id, author, t, 1)),
      })),
    );
    await rig.consumer().start();
    await until(
      async () =>
        (await metricValue(rig.registry, 'zg_user_counter_deltas_total', { outcome: 'duplicate' })) === 2,
      15_000,
      'both events skipped',
    );
    expect(await rig.service.counts(author)).toEqual(posts(0));
    expect(await rig.reconciler.check(author, false)).toBe('ok');
  });

  it('never loses a delta applied while a rebuild reads the database', async () => {
    const author = await newUser();
    await transition('published', author, newPostId(), { publish: false });
    const late = newPostId();
    let injected = false;
    // The rebuild reads the database; before it writes, the late post is published and its delta applied.
    const racing = intercept(rig.source, {
      compute: async (userId: number, now: number) => {
        const truth = await rig.source.compute(userId, now);
        if (!injected) {
          injected = true;
          await transition('published', author, late, { publish: false });
          await rig.store.apply(
            [
              {
                eventId: postEvent('published', late, author, 0, 1).eventId,
                userId,
                field: 'posts',
                delta: 1,
              },
            ],
            now,
          );
        }
        return truth;
      },
    });
    const service = new UserCounterService(rig.store, racing, rig.metrics);
    expect(await service.counts(author)).toEqual(posts(2));
    expect(await rig.store.read([author])).toEqual([posts(2)]);
    expect(await metricValue(rig.registry, 'zg_user_counter_rebuild_conflicts_total')).toBe(1);
  });

  it('counts public posts and lists as possibly unapplied the entries and exits of the window', async () => {
    const author = await newUser();
    const now = Date.now();
    const old = now - DEFAULT_RETENTION_MS - 60_000;
    const enter = (epoch: number, at: number) => [epoch, 1, at];
    const exit = (epoch: number, at: number) => [epoch, -1, at];
    // status, visible, last update, entries into the author's public posts, crossings kept
    const rows: [string, string, string, number, number, number[][]][] = [
      ['published long ago', 'published', 'public', old, 1, [enter(1, old)]],
      ['published and deleted long ago', 'deleted', 'public', old, 1, [enter(1, old), exit(1, old)]],
      ['published long ago, deleted now', 'deleted', 'public', now, 1, [enter(1, old), exit(1, now)]],
      ['published long ago, edited now', 'published', 'public', now, 1, [enter(1, old)]],
      ['published now', 'published', 'public', now, 1, [enter(1, now)]],
      [
        'public for the third time now',
        'published',
        'public',
        now,
        3,
        [enter(1, old), exit(1, old), enter(2, old), exit(2, now - 5), enter(3, now)],
      ],
      ['published private now, never public', 'published', 'private', now, 0, []],
      [
        'made private now, after two entries',
        'published',
        'private',
        now,
        2,
        [enter(2, now - 9), exit(2, now)],
      ],
      ['a draft deleted now', 'deleted', 'public', now, 0, []],
      // Published public by the earlier release (no entry kept), deleted now: its exit is numbered 0.
      ['published by the earlier release, deleted now', 'deleted', 'public', now, 0, [exit(0, now)]],
    ];
    const ids = rows.map(() => newPostId());
    await insertPosts(
      author,
      rows.map(([, status, visible, updatedAt, epochs, crossings], i) => ({
        id: ids[i]!,
        status,
        visible,
        created_at: old,
        updated_at: updatedAt,
        publish_time: status === 'draft' ? null : old,
        public_epoch: epochs,
        public_crossings: JSON.stringify(crossings),
      })),
    );
    const truth = await rig.source.compute(author, now);
    expect(truth?.counts).toEqual(posts(4));
    const event = (type: PostTransition, row: number, epoch: number) => [
      postEvent(type, ids[row]!, author, 0, epoch).eventId,
      type === 'published' ? 1 : -1,
    ];
    expect(truth?.unapplied.map((e) => [e.eventId, e.delta]).sort()).toEqual(
      [
        event('unpublished', 2, 1),
        event('published', 4, 1),
        event('unpublished', 5, 2),
        event('published', 5, 3),
        event('published', 7, 2),
        event('unpublished', 7, 2),
        event('unpublished', 9, 0),
      ].sort(),
    );
    expect(event('published', 5, 3)[0]).toBe(`knowpost:${ids[5]}:entered:3`);
    expect(event('unpublished', 5, 2)[0]).toBe(`knowpost:${ids[5]}:left:2`);
    expect(await rig.source.compute(author + 1_000_000, now)).toBeNull();
  });

  it('lists only the latest events of a user flipping posts all week, reading their posts page by page', async () => {
    const author = await newUser();
    const now = Date.now();
    // 300 posts changed a second apart, 40 crossings each: 12,000 events, the latest 10,000 of
    // them those of the 250 posts changed last.
    const ids = Array.from({ length: 300 }, () => newPostId());
    const changedAt = (i: number) => now - (300 - i) * 1_000;
    await insertPosts(
      author,
      ids.map((id, i) => ({
        id,
        visible: 'private',
        updated_at: changedAt(i),
        public_epoch: 20,
        public_crossings: JSON.stringify(
          Array.from({ length: 40 }, (_, j) => [
            Math.floor(j / 2) + 1,
            j % 2 === 0 ? 1 : -1,
            changedAt(i) - 39 + j,
          ]),
        ),
      })),
    );
    const truth = await rig.source.compute(author, now);
    expect(truth?.unapplied).toHaveLength(UNAPPLIED_MAX);
    expect(new Set(truth?.unapplied.map((e) => e.eventId))).toHaveProperty('size', UNAPPLIED_MAX);
    const listed = new Set(truth?.unapplied.map((e) => e.eventId.split(':')[1]));
    expect([...listed].sort()).toEqual(ids.slice(50).sort());
  });

  it('lists the latest events also when posts edited since hold older ones', async () => {
    const author = await newUser();
    const now = Date.now();
    const crossings = (at: number) =>
      JSON.stringify(
        Array.from({ length: 40 }, (_, j) => [Math.floor(j / 2) + 1, j % 2 === 0 ? 1 : -1, at + j]),
      );
    // 400 posts edited a minute ago, whose crossings are days old (16,000 events), and 50 made
    // private an hour ago: their 2,000 are among the latest 10,000, though read last.
    const edited = Array.from({ length: 400 }, () => newPostId());
    const flipped = Array.from({ length: 50 }, () => newPostId());
    await insertPosts(author, [
      ...edited.map((id) => ({
        id,
        visible: 'private',
        updated_at: now - 60_000,
        public_epoch: 20,
        public_crossings: crossings(now - 5 * 86_400_000),
      })),
      ...flipped.map((id) => ({
        id,
        visible: 'private',
        updated_at: now - 3_600_000,
        public_epoch: 20,
        public_crossings: crossings(now - 3_600_000 - 40),
      })),
    ]);
    const truth = await rig.source.compute(author, now);
    expect(truth?.unapplied).toHaveLength(UNAPPLIED_MAX);
    const listed = new Set(truth?.unapplied.map((e) => e.eventId.split(':')[1]));
    for (const id of flipped) expect(listed.has(id)).toBe(true);
  });

  it('reads on past a first page of exactly as many events as it lists when older ones are among them', async () => {
    const author = await newUser();
    const now = Date.now();
    const old = now - 5 * 86_400_000;
    // 200 posts made private a minute ago (their last crossing then), each with 49 crossings days
    // old: exactly 10,000 events on the first page. 50 more made private an hour ago.
    const first = Array.from({ length: 200 }, () => newPostId());
    const flipped = Array.from({ length: 50 }, () => newPostId());
    const crossings = (earlier: number, n: number, last: number) =>
      JSON.stringify([
        ...Array.from({ length: n }, (_, j) => [j + 1, j % 2 === 0 ? 1 : -1, earlier + j]),
        [n + 1, -1, last],
      ]);
    await insertPosts(author, [
      ...first.map((id) => ({
        id,
        visible: 'private',
        updated_at: now - 60_000,
        public_epoch: 30,
        public_crossings: crossings(old, 49, now - 60_000),
      })),
      ...flipped.map((id) => ({
        id,
        visible: 'private',
        updated_at: now - 3_600_000,
        public_epoch: 30,
        public_crossings: crossings(now - 3_700_000, 39, now - 3_600_000),
      })),
    ]);
    expect(UNAPPLIED_MAX).toBe(200 * 50);
    const truth = await rig.source.compute(author, now);
    const listed = new Set(truth?.unapplied.map((e) => e.eventId.split(':')[1]));
    for (const id of flipped) expect(listed.has(id)).toBe(true);
  });

  it('reports drift only where there is some, heals it, and unknown users are 404', async () => {
    const [a, b, c] = [await newUser(), await newUser(), await newUser()];
    for (const u of [a, b]) await transition('published', u, newPostId(), { publish: false });
    for (const u of [a, b, c]) await rig.service.counts(u);
    // b's next post is still on its way (not drift); a's snapshot is wrong (drift); c has none.
    await transition('published', b, newPostId(), { publish: false });
    await rig.store.write(a, posts(7), {}, Date.now());
    await rig.store.remove([c]);
    const progress: string[] = [];
    const report = await rig.reconciler.verifyAll(false, (m) => progress.push(m), 2);
    expect(report).toMatchObject({ checked: 3, ok: 1, missing: 1, drifted: [a], fixed: 0 });
    expect(progress.at(-1)).toMatch(/verified 3 users: 1 drifted, 1 without a snapshot/);
    expect(await rig.store.read([a])).toEqual([posts(7)]);

    const fixed = await rig.reconciler.verifyAll(true, () => undefined);
    expect(fixed).toMatchObject({ drifted: [a], fixed: 1 });
    expect(await rig.store.read([a, b])).toEqual([posts(1), posts(1)]);
    expect((await rig.reconciler.verifyAll(false, () => undefined)).drifted).toEqual([]);
    expect(await metricValue(rig.registry, 'zg_user_counter_drift_healed_total')).toBe(1);

    await expect(rig.service.counts(a + 1_000_000)).rejects.toMatchObject({ status: 404, code: 'NOT_FOUND' });
    expect(await rig.store.read([a + 1_000_000])).toEqual([null]);
  });

  it('checks a recently moved user once per move, and again only while busy or drifted', async () => {
    const [a, b] = [await newUser(), await newUser()];
    for (const u of [a, b]) await rig.service.counts(u);
    const sut = new UserCounterReconciler(rig.store, rig.source, rig.service, rig.metrics, {
      sampleRandom: 0,
    });
    sut.touched([a, b]);
    expect(await sut.runOnce()).toMatchObject({ checked: 2, drifted: 0, busy: 0 });
    expect(await sut.runOnce()).toMatchObject({ checked: 0 });
    sut.touched([a]);
    expect(await sut.runOnce()).toMatchObject({ checked: 1 });
    expect(await sut.runOnce()).toMatchObject({ checked: 0 });
    // A round that fails half-way keeps the users it did not check.
    let failing = true;
    const flaky = Object.create(rig.source) as typeof rig.source;
    flaky.compute = (userId, now) =>
      failing && userId === b ? Promise.reject(new Error('injected')) : rig.source.compute(userId, now);
    const interrupted = new UserCounterReconciler(rig.store, flaky, rig.service, rig.metrics, {
      sampleRandom: 0,
    });
    interrupted.touched([a, b]);
    await expect(interrupted.runOnce()).rejects.toThrow('injected');
    failing = false;
    expect(await interrupted.runOnce()).toMatchObject({ checked: 1 });
    expect(await interrupted.runOnce()).toMatchObject({ checked: 0 });
  });

  it('reports drift whose rebuild could not be written as not healed, and verify as incomplete', async () => {
    const a = await newUser();
    await transition('published', a, newPostId(), { publish: false });
    await rig.service.counts(a);
    await rig.store.write(a, posts(7), {}, Date.now());
    // As when deltas keep landing between every read and write of the rebuild.
    const refused = intercept(rig.service, {
      rebuild: () => Promise.resolve({ counts: posts(1), written: false }),
    });
    const sut = new UserCounterReconciler(rig.store, rig.source, refused, rig.metrics);
    const report = await sut.verifyAll(true, () => undefined);
    expect(report).toMatchObject({ driftedUsers: 1, drifted: [a], fixed: 0, notFixed: 1, busy: 0 });
    expect(verifyOutcome(report)).toBe(1);
    sut.touched([a]);
    expect(await sut.runOnce()).toMatchObject({ drifted: 1, healed: 0 });
    expect(await rig.store.read([a])).toEqual([posts(7)]);

    const healed = await rig.reconciler.verifyAll(true, () => undefined);
    expect(healed).toMatchObject({ driftedUsers: 1, fixed: 1, notFixed: 0 });
    expect(verifyOutcome(healed)).toBe('drift');
    expect(await rig.store.read([a])).toEqual([posts(1)]);
  });
});
