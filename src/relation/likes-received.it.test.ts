/**
 * Likes and favourites received, on both profiles' stores: counter events of a post move its
 * author's snapshot once, whatever is delivered twice; events behind a skipped seq wait until it
 * comes, or until the author is rebuilt from the facts when it does not come in time, and the late
 * event is not counted again; rebuilds while events are in flight are exact.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  createMysqlDatabase,
  deleteByPrefix,
  publishedPostRow,
  services,
  uniqueName,
  userRow,
} from '../../test/rig/resources.js';
import type { CounterEvent, FactMetric } from '../counter/model.js';
import type { CounterStore } from '../counter/store/counter-store.js';
import { RedisCounterStore } from '../counter/store/redis-counter-store.js';
import { SqliteCounterStore } from '../counter/store/sqlite-counter-store.js';
import { migrate, openMysql, openSqlite, type Db } from '../platform/db/database.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import { ZERO_USER_COUNTS } from '../user-counter/model.js';
import { UserCounterReconciler, type UserReconcilerOptions } from '../user-counter/reconciler.js';
import { DbUserCountSource } from '../user-counter/source.js';
import { RedisUserCounterStore } from '../user-counter/store/redis-user-counter-store.js';
import { SqliteUserCounterStore } from '../user-counter/store/sqlite-user-counter-store.js';
import { DEFAULT_RETENTION_MS, type UserCounterStore } from '../user-counter/store/user-counter-store.js';
import { UserCounterMetrics } from '../user-counter/user-counter.metrics.js';
import { UserCounterService } from '../user-counter/user-counter.service.js';
import {
  LikesReceivedConsumer,
  LikesReceivedPart,
  LikesReceivedRepository,
  type LikesReceivedConsumerDeps,
} from './likes-received.js';
import { RelationMetrics } from './relation.metrics.js';

type Dialect = 'sqlite' | 'mariadb';

interface Rig {
  db: Db;
  counters: CounterStore;
  store: UserCounterStore;
  service: UserCounterService;
  /** The user-counter reconciler over the likes-received part, and one with other options. */
  reconciler: UserCounterReconciler;
  reconcilerWith(options: Partial<UserReconcilerOptions>): UserCounterReconciler;
  sut: LikesReceivedConsumer;
  gaps: number[];
  /** Rebuilds still to fail on a gap (each failing one throws out of `apply`), or to be refused. */
  failing: { gaps: number; refused: number };
  /** How many applied ids and how many marks the user-counter store holds. */
  records(): Promise<{ applied: number; marks: number }>;
  /** Moves the consumer's clock on. */
  clock: { skewMs: number };
  /** What the consumer reported through `onError` (expected empty at the end unless taken). */
  errors: unknown[];
  cleanup(): Promise<void>;
}

async function openRig(dialect: Dialect): Promise<Rig> {
  let db: Db;
  let counters: CounterStore;
  let store: UserCounterStore;
  let close: () => Promise<void>;
  let records: () => Promise<{ applied: number; marks: number }>;
  if (dialect === 'sqlite') {
    const dir = mkdtempSync(join(tmpdir(), 'zg-likes-'));
    db = openSqlite(join(dir, 'zhiguang.db'));
    await migrate(db);
    counters = new SqliteCounterStore(db);
    store = new SqliteUserCounterStore(db);
    const sqlite = db;
    const rows = async (table: 'user_counter_applied' | 'user_counter_marks') =>
      Number(
        (
          await sqlite.kysely
            .selectFrom(table)
            .select((eb) => eb.fn.countAll<number>().as('n'))
            .executeTakeFirstOrThrow()
        ).n,
      );
    records = async () => ({
      applied: await rows('user_counter_applied'),
      marks: await rows('user_counter_marks'),
    });
    close = async () => {
      await sqlite.close();
      rmSync(dir, { recursive: true, force: true });
    };
  } else {
    const database = await createMysqlDatabase();
    db = await openMysql(database.url, 4);
    await migrate(db);
    const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1, enableAutoPipelining: true });
    const prefix = `${uniqueName('likes')}:`;
    const sealed = new RedisCounterStore(redis, { prefix, groups: 16, requireSeal: true });
    await sealed.seal(); // as at a deployment's first start
    counters = sealed;
    store = new RedisUserCounterStore(redis, { prefix, groups: 16 });
    const mysql = db;
    records = async () => {
      let applied = 0;
      let marks = 0;
      for (let g = 0; g < 16; g++) {
        applied += await redis.zcard(`${prefix}uc:ap:{u${g}}`);
        marks += await redis.hlen(`${prefix}uc:sm:{u${g}}`);
      }
      return { applied, marks };
    };
    close = async () => {
      await deleteByPrefix(redis, prefix);
      await redis.quit();
      await mysql.close();
      await database.drop();
    };
  }
  const repo = new LikesReceivedRepository(db);
  const source = new DbUserCountSource(db, [new LikesReceivedPart(repo, counters)], DEFAULT_RETENTION_MS);
  const metrics = new UserCounterMetrics(new Registry());
  const service = new UserCounterService(store, source, metrics);
  const reconciler = new UserCounterReconciler(store, source, service, metrics, { recheckMs: 200 });
  const gaps: number[] = [];
  const failing = { gaps: 0, refused: 0 };
  const errors: unknown[] = [];
  const clock = { skewMs: 0 };
  const sut = new LikesReceivedConsumer({
    events: undefined as unknown as EventLog,
    repo,
    store,
    metrics: new RelationMetrics(new Registry()),
    onGap: async (author) => {
      if (failing.gaps > 0) {
        failing.gaps--;
        throw new Error('injected: rebuild failed');
      }
      if (failing.refused > 0) {
        failing.refused--;
        return { written: false }; // as after too many version conflicts
      }
      gaps.push(author);
      return service.rebuild(author, 'overwrite', 'drift');
    },
    onError: (err) => errors.push(err),
    now: () => Date.now() + clock.skewMs,
  });
  return {
    db,
    counters,
    store,
    service,
    reconciler,
    reconcilerWith: (options) => new UserCounterReconciler(store, source, service, metrics, options),
    sut,
    gaps,
    failing,
    records,
    clock,
    errors,
    cleanup: async () => {
      await close();
      expect(errors).toEqual([]);
    },
  };
}

let nextPost = BigInt(Date.now()) * 1_000_000n;
let nextUser = 1;

describe.each<Dialect>(['sqlite', 'mariadb'])('likes received on %s', (dialect) => {
  let rig: Rig;

  beforeEach(async () => {
    rig = await openRig(dialect);
  });
  afterEach(async () => rig?.cleanup());

  const newUser = async () => {
    const id = nextUser++;
    await rig.db.kysely.insertInto('users').values(userRow({ id })).execute();
    return id;
  };
  const newPost = async (authorId: number) => {
    const id = String(++nextPost);
    await rig.db.kysely.insertInto('knowposts').values(publishedPostRow(id, authorId)).execute();
    return id;
  };
  const toggle = async (postId: string, metric: FactMetric, userId: number, on: boolean) => {
    const result = await rig.counters.toggle(
      { etype: 'knowpost', eid: postId },
      metric,
      userId,
      on,
      Date.now(),
    );
    return result.event!;
  };
  const received = async (userId: number) => {
    const [counts] = await rig.service.countsMany([userId]);
    return { likes: counts!.likesReceived, favs: counts!.favsReceived };
  };

  it('raises marks in one statement per chunk and never lowers them', async () => {
    const repo = new LikesReceivedRepository(rig.db);
    const posts = Array.from({ length: 450 }, () => String(++nextPost));
    await repo.raiseMarks(new Map(posts.map((p, i) => [p, i + 10])));
    await repo.raiseMarks(new Map(posts.map((p, i) => [p, i % 2 === 0 ? i + 20 : 1])));
    const marks = await repo.marks(posts);
    expect(posts.map((p) => marks.get(p))).toEqual(posts.map((_, i) => (i % 2 === 0 ? i + 20 : i + 10)));
  });

  it('moves the author once per change, whatever is delivered twice', async () => {
    const author = await newUser();
    const [p1, p2] = [await newPost(author), await newPost(author)];
    expect(await received(author)).toEqual({ likes: 0, favs: 0 });
    const events: CounterEvent[] = [
      await toggle(p1, 'like', 101, true),
      await toggle(p1, 'like', 102, true),
      await toggle(p2, 'like', 101, true),
      await toggle(p1, 'fav', 101, true),
    ];
    await rig.sut.apply(events);
    await rig.sut.apply(events);
    await rig.sut.apply(events.slice(1, 3));
    expect(await received(author)).toEqual({ likes: 3, favs: 1 });
    const unlike = await toggle(p1, 'like', 102, false);
    await rig.sut.apply([unlike, ...events]);
    expect(await received(author)).toEqual({ likes: 2, favs: 1 });
    expect(rig.gaps).toEqual([]);
  });

  it('keeps one mark per post, not an id per like, and needs no database mark to skip a redelivery', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author); // a snapshot exists
    const events: CounterEvent[] = [];
    for (let u = 1; u <= 30; u++) events.push(await toggle(post, 'like', 1_000 + u, true));
    events.push(await toggle(post, 'like', 1_001, false));
    await rig.sut.apply(events);
    expect(await received(author)).toEqual({ likes: 29, favs: 0 });
    expect(await rig.records()).toEqual({ applied: 0, marks: 1 });
    // As if the consumer died after the store applied the batch but before the database mark moved.
    await rig.db.kysely.deleteFrom('likes_received_marks').execute();
    await rig.sut.apply(events);
    expect(await received(author)).toEqual({ likes: 29, favs: 0 });
    expect(rig.gaps).toEqual([]);
  });

  const parkedRows = async () =>
    (
      await rig.db.kysely
        .selectFrom('likes_received_parked')
        .select(['post_id', 'seq'])
        .orderBy('post_id')
        .orderBy('seq')
        .execute()
    ).map((r) => `${String(r.post_id)}#${Number(r.seq)}`);

  const holeRows = async () =>
    (
      await rig.db.kysely
        .selectFrom('likes_received_holes')
        .select(['post_id', 'tries'])
        .orderBy('post_id')
        .execute()
    ).map((r) => `${String(r.post_id)} tries ${Number(r.tries)}`);

  it('sets events aside behind a skipped seq and applies them in order when it comes, with no rebuild', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author); // a snapshot exists
    const e1 = await toggle(post, 'like', 1, true);
    const e2 = await toggle(post, 'like', 2, true);
    const e3 = await toggle(post, 'fav', 3, true);
    const e4 = await toggle(post, 'like', 4, true);
    await rig.sut.apply([e1, e3]);
    expect(await received(author)).toEqual({ likes: 1, favs: 0 });
    expect(await parkedRows()).toEqual([`${post}#3`]);
    await rig.sut.apply([e4, e3]); // e3 delivered again, e4 behind it
    expect(await received(author)).toEqual({ likes: 1, favs: 0 });
    expect(await parkedRows()).toEqual([`${post}#3`, `${post}#4`]);
    // While they wait, the author is busy (not drift) for the reconciler.
    expect(await rig.reconciler.check(author, false)).toBe('busy');
    await rig.sut.apply([e2]);
    expect(await received(author)).toEqual({ likes: 3, favs: 1 });
    expect(await parkedRows()).toEqual([]);
    expect(await holeRows()).toEqual([]);
    await rig.sut.apply([e1, e2, e3, e4]);
    expect(await received(author)).toEqual({ likes: 3, favs: 1 });
    expect(rig.gaps).toEqual([]);
    expect(await rig.reconciler.check(author, false)).toBe('ok');
  });

  it('does not hold up the other posts of a batch while one waits', async () => {
    const author = await newUser();
    const [p1, p2] = [await newPost(author), await newPost(author)];
    await received(author);
    await toggle(p1, 'like', 1, true); // not delivered yet
    const late = await toggle(p1, 'like', 2, true);
    const other = await toggle(p2, 'like', 1, true);
    await rig.sut.apply([late, other]);
    expect(await received(author)).toEqual({ likes: 1, favs: 0 });
    expect(await parkedRows()).toEqual([`${p1}#2`]);
  });

  it('rebuilds the author from the facts when the skipped seq does not come in time, and skips it later', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author);
    const e1 = await toggle(post, 'like', 1, true);
    const e2 = await toggle(post, 'like', 2, true); // let go by its publisher, say
    const e3 = await toggle(post, 'like', 3, true);
    await rig.sut.apply([e1, e3]);
    expect(await rig.sut.sweep()).toBe(0); // not overdue yet
    expect(rig.gaps).toEqual([]);
    rig.clock.skewMs = 10_001;
    expect(await rig.sut.sweep()).toBe(1);
    expect(rig.gaps).toEqual([author]);
    expect(await received(author)).toEqual({ likes: 3, favs: 0 });
    expect(await parkedRows()).toEqual([]);
    await rig.sut.apply([e2, e3]); // the late one, and a redelivery
    expect(await received(author)).toEqual({ likes: 3, favs: 0 });
    expect(await rig.sut.sweep()).toBe(0);
    expect(rig.gaps).toEqual([author]);
  });

  /**
   * A post of a new author with a snapshot, whose first like was applied, second like lost on its
   * way (never delivered) and third like delivered, so it waits behind the lost one.
   */
  const behindALostLike = async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author);
    const first = await toggle(post, 'like', 1, true);
    await toggle(post, 'like', 2, true); // never delivered
    await rig.sut.apply([first, await toggle(post, 'like', 3, true)]);
    return { author, post, first };
  };

  it('keeps the events waiting when the rebuild fails or is refused, and tries again ever later', async () => {
    const { author, post } = await behindALostLike();
    expect(await holeRows()).toEqual([`${post} tries 0`]);
    rig.clock.skewMs = 10_001;
    rig.failing.gaps = 1;
    rig.failing.refused = 1;
    expect(await rig.sut.sweep()).toBe(1); // fails: reported, nothing thrown
    expect(rig.errors.splice(0)).toMatchObject([{ message: expect.stringMatching(/injected/) }]);
    expect(await holeRows()).toEqual([`${post} tries 1`]);
    // A batch with the post meanwhile is not held up, and tries no rebuild before it is due again
    // (20 s later): its event waits behind the hole too.
    const e4 = await toggle(post, 'fav', 4, true);
    await rig.sut.apply([e4]);
    expect(await rig.sut.sweep()).toBe(0);
    expect(await parkedRows()).toEqual([`${post}#3`, `${post}#4`]);
    expect(await received(author)).toEqual({ likes: 1, favs: 0 });
    rig.clock.skewMs += 20_000;
    expect(await rig.sut.sweep()).toBe(1); // refused
    expect(await holeRows()).toEqual([`${post} tries 2`]);
    rig.clock.skewMs += 38_000;
    expect(await rig.sut.sweep()).toBe(0);
    expect(rig.gaps).toEqual([]);
    rig.clock.skewMs += 2_001;
    expect(await rig.sut.sweep()).toBe(1);
    expect(rig.gaps).toEqual([author]);
    expect(await received(author)).toEqual({ likes: 3, favs: 1 });
    expect(await parkedRows()).toEqual([]);
    expect(await holeRows()).toEqual([]);
  });

  /** Another consumer of the rig's database and store (another worker, say). */
  const consumer = (deps: Pick<LikesReceivedConsumerDeps, 'onGap'> & Partial<LikesReceivedConsumerDeps>) =>
    new LikesReceivedConsumer({
      events: undefined as unknown as EventLog,
      repo: new LikesReceivedRepository(rig.db),
      store: rig.store,
      metrics: new RelationMetrics(new Registry()),
      onError: (err) => rig.errors.push(err),
      ...deps,
    });

  it('gives each new gap a wait of its own: events that keep coming a batch late cause no rebuild', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author);
    const e: CounterEvent[] = [];
    for (let u = 1; u <= 7; u++) e.push(await toggle(post, 'like', u, true));
    await rig.sut.apply([e[0]!, e[2]!]);
    rig.clock.skewMs += 11_000;
    await rig.sut.apply([e[1]!, e[3]!, e[5]!]); // 2 fills the first gap; 6 waits for 5
    expect(await holeRows()).toEqual([`${post} tries 0`]);
    rig.clock.skewMs += 9_000;
    expect(await rig.sut.sweep()).toBe(0); // the wait runs from the new gap
    rig.clock.skewMs += 2_000;
    await rig.sut.apply([e[4]!, e[6]!]);
    expect(rig.gaps).toEqual([]);
    expect(await received(author)).toEqual({ likes: 7, favs: 0 });
    expect(await holeRows()).toEqual([]);
    expect(await parkedRows()).toEqual([]);
  });

  it('does not read a long wait again for every batch that only adds to it', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author);
    const reads: string[][] = [];
    const repo = new LikesReceivedRepository(rig.db);
    const parked = repo.parked.bind(repo);
    repo.parked = async (postIds) => {
      reads.push([...postIds]);
      return parked(postIds);
    };
    const sut = consumer({ repo, onGap: () => rig.service.rebuild(author, 'overwrite', 'drift') });
    const e: CounterEvent[] = [];
    for (let u = 1; u <= 6; u++) e.push(await toggle(post, 'like', u, true));
    await sut.apply([e[0]!, e[2]!]); // 3 waits for 2
    reads.length = 0;
    await sut.apply([e[3]!]);
    await sut.apply([e[4]!, e[2]!]);
    expect(reads).toEqual([[], []]);
    expect(await parkedRows()).toEqual([`${post}#3`, `${post}#4`, `${post}#5`]);
    await sut.apply([e[1]!, e[5]!]); // the next seq: what waited is read and applied
    expect(reads.at(-1)).toEqual([post]);
    expect(await received(author)).toEqual({ likes: 6, favs: 0 });
    expect(await parkedRows()).toEqual([]);
  });

  it('keeps a hole and its wait when a batch brings only repeats of what was applied', async () => {
    const { post, first: e1 } = await behindALostLike();
    rig.clock.skewMs = 10_001;
    rig.failing.refused = 1;
    await rig.sut.sweep();
    expect(await holeRows()).toEqual([`${post} tries 1`]);
    await rig.sut.apply([e1]); // a repeat (a republished event, a redelivered batch)
    expect(await holeRows()).toEqual([`${post} tries 1`]);
    expect(await parkedRows()).toEqual([`${post}#3`]);
    expect(await rig.sut.sweep()).toBe(0);
  });

  it('reports a post whose author was refused a rebuild four times, once', async () => {
    const { post } = await behindALostLike();
    rig.failing.refused = 5;
    for (const wait of [10_001, 20_001, 40_001, 80_001, 160_001]) {
      rig.clock.skewMs += wait;
      expect(await rig.sut.sweep()).toBe(1);
    }
    expect(await holeRows()).toEqual([`${post} tries 5`]);
    expect(rig.errors.splice(0)).toMatchObject([
      { message: expect.stringMatching(new RegExp(`post ${post} has waited .* through 4 refused`)) },
    ]);
  });

  it("lets one worker's sweep take a due post, not every worker's", async () => {
    const { post } = await behindALostLike();
    let rebuilds = 0;
    const worker = () =>
      consumer({
        onGap: async () => {
          rebuilds++;
          return { written: false };
        },
        now: () => Date.now() + 10_001,
      });
    const swept = await Promise.all([worker().sweep(), worker().sweep(), worker().sweep()]);
    expect(swept.sort()).toEqual([0, 0, 1]);
    expect(rebuilds).toBe(1);
    expect(await holeRows()).toEqual([`${post} tries 1`]);
  });

  it('finds events set aside with no hole recorded (another consumer closed it meanwhile)', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author);
    await rig.sut.apply([await toggle(post, 'like', 1, true)]);
    await toggle(post, 'like', 2, true); // never delivered
    const e3 = await toggle(post, 'like', 3, true);
    await new LikesReceivedRepository(rig.db).park([{ postId: post, seq: e3.seq, metric: 'like', delta: 1 }]);
    expect(await rig.sut.sweep()).toBe(1);
    expect(await holeRows()).toEqual([`${post} tries 0`]);
    rig.clock.skewMs = 10_001;
    expect(await rig.sut.sweep()).toBe(1);
    expect(rig.gaps).toEqual([author]);
    expect(await received(author)).toEqual({ likes: 3, favs: 0 });
    expect(await holeRows()).toEqual([]);
  });

  it('counts the late event that comes after a refused rebuild, and what waited behind it', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author);
    await rig.sut.apply([await toggle(post, 'like', 1, true)]);
    const e2 = await toggle(post, 'like', 2, true);
    const e3 = await toggle(post, 'like', 3, true);
    await rig.sut.apply([e3]);
    rig.clock.skewMs = 10_001;
    rig.failing.refused = 1;
    await rig.sut.sweep();
    await rig.sut.apply([e2]);
    expect(rig.gaps).toEqual([]);
    expect(await received(author)).toEqual({ likes: 3, favs: 0 });
    expect(await parkedRows()).toEqual([]);
  });

  it('counts exactly, with no rebuild, events reordered and repeated across many batches', async () => {
    const author = await newUser();
    const posts = [await newPost(author), await newPost(author), await newPost(author)];
    await received(author);
    let seed = 7;
    const random = () => (seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31;
    const events: CounterEvent[] = [];
    for (let i = 0; i < 300; i++) {
      const post = posts[Math.floor(random() * posts.length)]!;
      const result = await rig.counters.toggle(
        { etype: 'knowpost', eid: post },
        random() < 0.7 ? 'like' : 'fav',
        1 + Math.floor(random() * 20),
        random() < 0.6,
        Date.now(),
      );
      if (result.event) events.push(result.event);
    }
    // Out of order within windows of up to 8 events, some delivered twice, in batches of 1–25.
    const delivered: CounterEvent[] = [];
    for (let i = 0; i < events.length; i += 8) {
      const window = events.slice(i, i + 8).sort(() => random() - 0.5);
      for (const e of window) delivered.push(...(random() < 0.1 ? [e, e] : [e]));
    }
    for (let i = 0; i < delivered.length;) {
      const size = 1 + Math.floor(random() * 25);
      await rig.sut.apply(delivered.slice(i, i + size));
      i += size;
    }
    let likes = 0;
    let favs = 0;
    for (const post of posts) {
      const { facts } = await rig.counters.inspect({ etype: 'knowpost', eid: post });
      likes += facts.like;
      favs += facts.fav;
    }
    expect(await received(author)).toEqual({ likes, favs });
    expect(rig.gaps).toEqual([]);
    expect(await parkedRows()).toEqual([]);
    expect(await rig.reconciler.check(author, false)).toBe('ok');
  });

  it('forgets events set aside for a post it does not know', async () => {
    const post = String(++nextPost);
    await new LikesReceivedRepository(rig.db).park([{ postId: post, seq: 2, metric: 'like', delta: 1 }]);
    expect(await parkedRows()).toEqual([`${post}#2`]);
    expect(await rig.sut.sweep()).toBe(1);
    expect(await holeRows()).toEqual([]);
    expect(await parkedRows()).toEqual([]);
    expect(rig.gaps).toEqual([]);
  });

  it('rebuilds exactly while events are in flight', async () => {
    const author = await newUser();
    const post = await newPost(author);
    const early = [await toggle(post, 'like', 1, true), await toggle(post, 'fav', 1, true)];
    await rig.sut.apply(early);
    const inFlight = [await toggle(post, 'like', 2, true), await toggle(post, 'like', 3, true)];
    await rig.store.remove([author]);
    expect(await received(author)).toEqual({ likes: 3, favs: 1 }); // rebuilt from the facts
    await rig.sut.apply(inFlight);
    expect(await received(author)).toEqual({ likes: 3, favs: 1 });
    await rig.sut.apply([await toggle(post, 'like', 3, false)]);
    expect(await received(author)).toEqual({ likes: 2, favs: 1 });
  });

  // The embedded store keeps facts and their log in one transaction: they are never lost apart.
  it.skipIf(dialect === 'sqlite')(
    'answers but keeps nor heals no counts read while the facts are restored, and counts them exactly once they are',
    async () => {
      const author = await newUser();
      const post = await newPost(author);
      const events = [
        await toggle(post, 'like', 1, true),
        await toggle(post, 'like', 2, true),
        await toggle(post, 'fav', 1, true),
      ];
      await rig.sut.apply(events);
      expect(await received(author)).toEqual({ likes: 2, favs: 1 });
      // A replay starts: the facts may be short from now on, so nothing is judged by them.
      await rig.counters.unseal();
      await rig.counters.reset();
      expect(await rig.reconciler.check(author, true)).toBe('busy');
      expect(await received(author)).toEqual({ likes: 2, favs: 1 }); // the snapshot was left alone
      // Redis lost the author's snapshot too: the best known is answered, and not kept.
      await rig.store.remove([author]);
      expect(await received(author)).toEqual({ likes: 0, favs: 0 });
      expect(await rig.store.read([author])).toEqual([null]);
      // The replay brings the facts back and seals: the next read counts them.
      await rig.counters.replayFacts(events);
      await rig.counters.seal();
      expect(await received(author)).toEqual({ likes: 2, favs: 1 });
      expect(await rig.reconciler.check(author, true)).toBe('ok');
    },
  );

  it("inspects an author's posts a bounded number at a time", async () => {
    const author = await newUser();
    const posts: string[] = [];
    for (let i = 0; i < 150; i++) posts.push(await newPost(author));
    await rig.sut.apply([await toggle(posts[149]!, 'like', 1, true)]);
    let inFlight = 0;
    let most = 0;
    const counting = Object.create(rig.counters) as CounterStore;
    counting.inspect = async (ref) => {
      most = Math.max(most, ++inFlight);
      try {
        return await rig.counters.inspect(ref);
      } finally {
        inFlight--;
      }
    };
    const part = new LikesReceivedPart(new LikesReceivedRepository(rig.db), counting);
    expect((await part.read(author)).counts).toEqual({ likesReceived: 1, favsReceived: 0 });
    expect(most).toBeGreaterThan(1);
    expect(most).toBeLessThanOrEqual(64);
  });

  it('has the user-counter reconciler answer busy, not drift, while a like is in flight, and ok once applied', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author); // a snapshot exists
    const like = await toggle(post, 'like', 1, true);
    expect(await rig.reconciler.check(author, false)).toBe('busy');
    expect(await rig.reconciler.check(author, true)).toBe('busy');
    expect(await received(author)).toEqual({ likes: 0, favs: 0 }); // nothing rewritten
    await rig.sut.apply([like]);
    expect(await rig.reconciler.check(author, false)).toBe('ok');
    // The store took it; the database mark did not move yet (a consumer that died in between).
    await rig.db.kysely.deleteFrom('likes_received_marks').execute();
    expect(await rig.reconciler.check(author, false)).toBe('ok');
    expect(await received(author)).toEqual({ likes: 1, favs: 0 });
  });

  it('still finds and heals drift with nothing in flight, and in other fields while a like is', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author);
    await rig.sut.apply([await toggle(post, 'like', 1, true)]);
    await rig.store.write(author, { ...ZERO_USER_COUNTS, likesReceived: 5 }, {}, Date.now());
    expect(await rig.reconciler.check(author, false)).toBe('drift');
    expect(await rig.reconciler.check(author, true)).toBe('healed');
    expect(await received(author)).toEqual({ likes: 1, favs: 0 });
    expect(await rig.reconciler.check(author, false)).toBe('ok');

    // A favourite in flight leaves likes and favourites uncompared, not the other fields.
    const fav = await toggle(post, 'fav', 2, true);
    await rig.store.write(author, { ...ZERO_USER_COUNTS, likesReceived: 1, followers: 3 }, {}, Date.now());
    expect(await rig.reconciler.check(author, false)).toBe('drift');
    expect(await rig.reconciler.check(author, true)).toBe('healed');
    const [healed] = await rig.store.read([author]);
    expect(healed).toEqual({ ...ZERO_USER_COUNTS, likesReceived: 1, favsReceived: 1 });
    await rig.sut.apply([fav]); // counted by the rebuild already
    expect(await received(author)).toEqual({ likes: 1, favs: 1 });
    expect(await rig.reconciler.check(author, false)).toBe('ok');
  });

  it('calls it drift when likes received are further off than the events on their way can explain', async () => {
    const author = await newUser();
    const post = await newPost(author);
    await received(author);
    const like = await toggle(post, 'like', 1, true);
    // One like on its way moves the count by one at most: five off is drift, in flight or not.
    await rig.store.write(author, { ...ZERO_USER_COUNTS, likesReceived: 5 }, {}, Date.now());
    expect(await rig.reconciler.check(author, false)).toBe('drift');
    expect(await rig.reconciler.check(author, true)).toBe('healed');
    expect(await received(author)).toEqual({ likes: 1, favs: 0 });
    await rig.sut.apply([like]); // counted by the rebuild already
    expect(await received(author)).toEqual({ likes: 1, favs: 0 });
    expect(await rig.reconciler.check(author, false)).toBe('ok');
    // Two more on their way: up to two off is not known, three is drift.
    await toggle(post, 'like', 2, true);
    await toggle(post, 'like', 3, true);
    expect(await rig.reconciler.check(author, false)).toBe('busy');
    await rig.store.write(author, { ...ZERO_USER_COUNTS, likesReceived: 5 }, {}, Date.now());
    expect(await rig.reconciler.check(author, false)).toBe('busy');
    await rig.store.write(author, { ...ZERO_USER_COUNTS, likesReceived: 6 }, {}, Date.now());
    expect(await rig.reconciler.check(author, false)).toBe('drift');
  });

  it('verify checks busy users again after a pause and reports only those still busy', async () => {
    const [a, b] = [await newUser(), await newUser()];
    const [pa, pb] = [await newPost(a), await newPost(b)];
    for (const u of [a, b]) await received(u);
    const likeA = await toggle(pa, 'like', 1, true);
    await toggle(pb, 'like', 1, true); // stays in flight
    let landed: Promise<void> | undefined;
    const progress: string[] = [];
    const report = await rig.reconciler.verifyAll(false, (message) => {
      progress.push(message);
      if (message.startsWith('checking') && !landed) landed = rig.sut.apply([likeA]);
    });
    await landed;
    expect(report).toMatchObject({ checked: 2, ok: 1, busy: 1, busyUsers: [b], driftedUsers: 0 });
    expect(progress).toContain('checking 2 busy users again');
    expect(progress.at(-1)).toMatch(/verified 2 users: 0 drifted, 0 without a snapshot, 1 busy/);
  });

  it('verify --fix rewrites users still busy, those past what it keeps to check again too', async () => {
    const [a, b] = [await newUser(), await newUser()];
    const [pa, pb] = [await newPost(a), await newPost(b)];
    for (const u of [a, b]) await received(u);
    // Both with a like in flight, and a snapshot off by no more than that: busy.
    await toggle(pa, 'like', 1, true);
    await toggle(pb, 'like', 1, true);
    // One kept to be checked again, the other past that.
    const report = await rig
      .reconcilerWith({ recheckMs: 10, recheckMaxUsers: 1 })
      .verifyAll(true, () => undefined);
    expect(report).toMatchObject({ checked: 2, busy: 2, busyRewritten: 2 });
    expect(await received(a)).toEqual({ likes: 1, favs: 0 });
    expect(await received(b)).toEqual({ likes: 1, favs: 0 });
  });

  it('skips events of posts it does not know', async () => {
    const author = await newUser();
    await received(author);
    await rig.sut.apply([await toggle('999999999', 'like', 5, true)]);
    expect(await received(author)).toEqual({ likes: 0, favs: 0 });
  });
});
