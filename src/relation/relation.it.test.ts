/**
 * The relation module inside one process, on both dialects (SQLite with the in-process list cache
 * and user-counter tables; MariaDB with Redis): follow/unfollow with the outbox, the relation-proj
 * projection under redelivery and reordering, user-counter rebuilds racing with events in flight,
 * list reads and their caches, and the reconciler. The outbox is drained by the real relay into a
 * recording log, so tests decide when, how often and in which order the consumer sees events.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import pino from 'pino';
import { Registry } from 'prom-client';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  createMysqlDatabase,
  deleteByPrefix,
  services,
  uniqueName,
  userRow,
} from '../../test/rig/resources.js';
import { LocalInvalidationBus } from '../platform/cache/local-invalidation-bus.js';
import { migrate, openMysql, openSqlite, type Db } from '../platform/db/database.js';
import { AppError } from '../platform/errors/errors.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import { MysqlOutboxStore } from '../platform/outbox/mysql-outbox-store.js';
import { OutboxWriter, type OutboxStore } from '../platform/outbox/outbox.js';
import { OutboxRelay } from '../platform/outbox/relay.js';
import { SqliteOutboxStore } from '../platform/outbox/sqlite-outbox-store.js';
import { createRedisRateLimiter, createSqliteRateLimiter } from '../platform/ratelimit/create.js';
import type { RateLimiter } from '../platform/ratelimit/ratelimit.js';
import { UsersRepository } from '../profile/users.repository.js';
import { DbUserCountSource } from '../user-counter/source.js';
import { RedisUserCounterStore } from '../user-counter/store/redis-user-counter-store.js';
import { SqliteUserCounterStore } from '../user-counter/store/sqlite-user-counter-store.js';
import { DEFAULT_RETENTION_MS, type UserCounterStore } from '../user-counter/store/user-counter-store.js';
import { UserCounterMetrics } from '../user-counter/user-counter.metrics.js';
import { UserCounterService } from '../user-counter/user-counter.service.js';
import type { ListCache } from './list-cache/list-cache.js';
import { MemoryListCache } from './list-cache/memory-list-cache.js';
import { RedisListCache } from './list-cache/redis-list-cache.js';
import { parseRelationEvent, RELATION_TOPIC, type ListEntry, type RelationEvent } from './model.js';
import { RelationProjector } from './projector.js';
import { rebuildRelations, verifyRelations } from './maintenance.js';
import { hasDrift, RelationReconciler } from './reconciler.js';
import { RelationCountPart } from './relation-count.part.js';
import { RelationMetrics } from './relation.metrics.js';
import { RelationRepository } from './relation.repository.js';
import { RelationService, type RelationLimits } from './relation.service.js';

type Dialect = 'sqlite' | 'mariadb';

interface Rig {
  db: Db;
  repo: RelationRepository;
  users: UsersRepository;
  store: UserCounterStore;
  counters: UserCounterService;
  lists: ListCache;
  bus: LocalInvalidationBus;
  limiter: RateLimiter;
  metrics: RelationMetrics;
  projector: RelationProjector;
  reconciler: RelationReconciler;
  service(limits?: Partial<RelationLimits>): RelationService;
  /** Publishes every outbox row through the real relay; returns the relation events, in order. */
  drain(): Promise<RelationEvent[]>;
  newUser(): Promise<number>;
  newUsers(count: number): Promise<number[]>;
  cleanup(): Promise<void>;
}

const silent = pino({ level: 'silent' });
/** `relations verify` with a short wait before its second check. */
const quick = { settleMs: 10 };

async function openRig(dialect: Dialect): Promise<Rig> {
  const closers: (() => Promise<void>)[] = [];
  let db: Db;
  let store: UserCounterStore;
  let lists: ListCache;
  let limiter: RateLimiter;
  let outboxStore: OutboxStore;
  if (dialect === 'sqlite') {
    const dir = mkdtempSync(join(tmpdir(), 'zg-rel-'));
    db = openSqlite(join(dir, 'zhiguang.db'));
    await migrate(db);
    store = new SqliteUserCounterStore(db);
    lists = new MemoryListCache({ ttlMs: 60_000, maxEntries: 50, maxLists: 1_000 });
    limiter = createSqliteRateLimiter(db);
    outboxStore = new SqliteOutboxStore(db);
    const sqlite = db;
    closers.push(async () => {
      await sqlite.close();
      rmSync(dir, { recursive: true, force: true });
    });
  } else {
    const database = await createMysqlDatabase();
    db = await openMysql(database.url, 6);
    await migrate(db);
    const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1, enableAutoPipelining: true });
    const prefix = `${uniqueName('rel')}:`;
    store = new RedisUserCounterStore(redis, { prefix, groups: 16 });
    lists = new RedisListCache(redis, { prefix, ttlMs: 60_000, maxEntries: 50 });
    limiter = createRedisRateLimiter(redis, prefix);
    outboxStore = new MysqlOutboxStore(db);
    const mysql = db;
    closers.push(async () => {
      await deleteByPrefix(redis, prefix);
      await redis.quit();
      await mysql.close();
      await database.drop();
    });
  }
  const repo = new RelationRepository(db, new OutboxWriter());
  const users = new UsersRepository(db);
  const userMetrics = new UserCounterMetrics(new Registry());
  const source = new DbUserCountSource(db, [new RelationCountPart(repo)], DEFAULT_RETENTION_MS);
  const counters = new UserCounterService(store, source, userMetrics);
  const bus = new LocalInvalidationBus();
  const metrics = new RelationMetrics(new Registry());
  const errors: unknown[] = [];
  const projector = new RelationProjector({
    events: undefined as unknown as EventLog,
    repo,
    counters: store,
    lists,
    bus,
    metrics,
    onError: (err) => errors.push(err),
  });
  const reconciler = new RelationReconciler({
    repo,
    counters: store,
    lists,
    bus,
    rebuildCounters: (userId) => counters.rebuild(userId, 'overwrite', 'drift'),
    metrics,
    maxCompare: 1_000,
    settleMs: 10,
    sampleSize: 50,
  });
  const published: RelationEvent[] = [];
  const recorder: EventLog = {
    ensureTopics: async () => undefined,
    publish: async (topic, records) => {
      for (const r of records) if (topic === RELATION_TOPIC) published.push(parseRelationEvent(r.value)!);
    },
    subscribe: () => Promise.reject(new Error('not used')),
    endOffsets: () => Promise.reject(new Error('not used')),
    committedOffsets: () => Promise.reject(new Error('not used')),
    groupMembers: () => Promise.reject(new Error('not used')),
    holdsEveryRecord: () => Promise.reject(new Error('not used')),
    readRange: () => Promise.reject(new Error('not used')),
    ping: async () => true,
    close: async () => undefined,
  };
  const relay = new OutboxRelay({ store: outboxStore, events: recorder, batchSize: 500 });
  let nextPhone = 0;
  async function newUser(): Promise<number> {
    const user = await users.insert(
      userRow({
        phone: `1${String(Date.now() % 1e6).padStart(6, '0')}${String(nextPhone++).padStart(4, '0')}`,
      }),
    );
    return user.id;
  }
  return {
    db,
    repo,
    users,
    store,
    counters,
    lists,
    bus,
    limiter,
    metrics,
    projector,
    reconciler,
    service: (limits = {}) =>
      new RelationService({
        repo,
        users,
        limiter,
        lists,
        counts: counters,
        bus,
        metrics,
        limits: {
          changesPerMinute: 1_000,
          bigAccountFollowers: 1_000_000,
          firstPageTtlMs: 60_000,
          listCacheMaxEntries: 50,
          ...limits,
        },
        log: silent,
      }),
    async drain() {
      while ((await relay.runOnce()) > 0);
      return published.splice(0);
    },
    newUser,
    async newUsers(count) {
      const ids: number[] = [];
      for (let i = 0; i < count; i++) ids.push(await newUser());
      return ids;
    },
    async cleanup() {
      if (errors.length > 0) throw new AggregateError(errors, 'the projector reported errors');
      for (const close of closers) await close();
    },
  };
}

async function tableRows(db: Db, table: 'following' | 'follower') {
  const rows = await db.kysely
    .selectFrom(table)
    .select(['from_user_id', 'to_user_id', 'created_at'])
    .execute();
  return rows.map((r) => `${Number(r.from_user_id)}>${Number(r.to_user_id)}@${Number(r.created_at)}`).sort();
}

async function expectError(promise: Promise<unknown>, status: number, code: string) {
  const err = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(AppError);
  expect((err as AppError).status).toBe(status);
  expect((err as AppError).code).toBe(code);
}

describe.each<Dialect>(['sqlite', 'mariadb'])('relations on %s', (dialect) => {
  let rig: Rig;
  let sut: RelationService;

  beforeEach(async () => {
    rig = await openRig(dialect);
    sut = rig.service();
  });
  afterEach(async () => {
    sut?.close();
    await rig?.cleanup();
  });

  /** A reconciler of the rig's parts over `repo` (a rig repository with some calls watched). */
  const reconcilerOn = (repo: RelationRepository, options: { maxCompare: number }) =>
    new RelationReconciler({
      repo,
      counters: rig.store,
      lists: rig.lists,
      bus: rig.bus,
      rebuildCounters: (userId) => rig.counters.rebuild(userId, 'overwrite', 'drift'),
      metrics: rig.metrics,
      maxCompare: options.maxCompare,
      settleMs: 10,
      sampleSize: 0,
    });

  it('changes state once: a repeated follow or unfollow is false and writes no event', async () => {
    const [a, b] = [await rig.newUser(), await rig.newUser()];
    expect(await sut.follow(a, b)).toBe(true);
    expect(await sut.follow(a, b)).toBe(false);
    expect(await sut.unfollow(a, b)).toBe(true);
    expect(await sut.unfollow(a, b)).toBe(false);
    expect(await sut.follow(a, b)).toBe(true);
    const events = await rig.drain();
    expect(events.map((e) => e.type)).toEqual(['follow', 'unfollow', 'follow']);
    expect(new Set(events.map((e) => e.eventId)).size).toBe(3);
    expect(events.every((e) => e.fromUserId === a && e.toUserId === b)).toBe(true);
  });

  it('lets exactly one of many concurrent identical follows change the state', async () => {
    const [a, b] = [await rig.newUser(), await rig.newUser()];
    const results = await Promise.all(Array.from({ length: 12 }, () => sut.follow(a, b)));
    expect(results.filter(Boolean)).toHaveLength(1);
    const unfollows = await Promise.all(Array.from({ length: 12 }, () => sut.unfollow(a, b)));
    expect(unfollows.filter(Boolean)).toHaveLength(1);
    expect((await rig.drain()).map((e) => e.type)).toEqual(['follow', 'unfollow']);
  });

  it('commits changes requested together in one transaction, each answered as if it ran alone', async () => {
    const users = await Promise.all(Array.from({ length: 8 }, () => rig.newUser()));
    const [a, b, c, d, e, f, g, h] = users as [
      number,
      number,
      number,
      number,
      number,
      number,
      number,
      number,
    ];
    await rig.repo.follow(a, b, 1);
    await rig.repo.follow(c, d, 2);
    await rig.drain();
    let transactions = 0;
    const counting: Db = {
      ...rig.db,
      kysely: new Proxy(rig.db.kysely, {
        get(target, prop) {
          const value: unknown = Reflect.get(target, prop);
          if (prop === 'transaction') transactions += 1;
          return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(target) : value;
        },
      }),
    };
    const repo = new RelationRepository(counting, new OutboxWriter());
    const results = await Promise.all([
      repo.follow(e, f, 10), // alone: the batch behind it gathers the rest
      repo.follow(a, b, 11), // already following
      repo.unfollow(c, d, 12), // a real unfollow
      repo.unfollow(g, h, 13), // nothing to undo
      repo.follow(g, h, 14), // a real follow
      repo.follow(g, h, 15), // the same pair again: next batch, already following
      repo.unfollow(a, b, 16),
    ]);
    expect(results.map((r) => (r === null ? null : r.type))).toEqual([
      'follow',
      null,
      'unfollow',
      null,
      'follow',
      null,
      'unfollow',
    ]);
    // [e→f] alone; then [a→b, c→d, g→h unfollow]; [g→h follow, a→b unfollow]; [g→h follow]: a
    // pair's second change waits for the next batch.
    expect(transactions).toBe(4);
    const events = await rig.drain();
    expect(events.map((ev) => [ev.type, ev.fromUserId, ev.toUserId, ev.ts])).toEqual([
      ['follow', e, f, 10],
      ['unfollow', c, d, 12],
      ['follow', g, h, 14],
      ['unfollow', a, b, 16],
    ]);
    const rows = await rig.db.kysely
      .selectFrom('following')
      .select(['from_user_id', 'to_user_id', 'created_at'])
      .where('from_user_id', 'in', users)
      .orderBy('created_at')
      .execute();
    expect(rows.map((r) => [Number(r.from_user_id), Number(r.to_user_id), Number(r.created_at)])).toEqual([
      [e, f, 10],
      [g, h, 14],
    ]);
    const marks = await rig.db.kysely.selectFrom('relation_unapplied').select('event_id').execute();
    expect(marks.map((m) => m.event_id)).toEqual(expect.arrayContaining(events.map((ev) => ev.eventId)));
  });

  it('keeps every answer true to the table when processes change the same pairs at once', async () => {
    const users = await Promise.all(Array.from({ length: 6 }, () => rig.newUser()));
    const pairs = users.flatMap((x) => users.filter((y) => y !== x).map((y) => [x, y] as const));
    const processes = [0, 1, 2].map(() => new RelationRepository(rig.db, new OutboxWriter()));
    const answered = new Map<string, number>();
    for (let round = 0; round < 6; round++) {
      const results = await Promise.all(
        processes.flatMap((repo) =>
          pairs.map(async ([x, y]) => {
            const event =
              Math.random() < 0.5 ? await repo.follow(x, y, round) : await repo.unfollow(x, y, round);
            if (event) answered.set(`${x}:${y}`, (answered.get(`${x}:${y}`) ?? 0) + 1);
            return event;
          }),
        ),
      );
      expect(results.length).toBe(3 * pairs.length);
    }
    const events = await rig.drain();
    const byPair = new Map<string, string[]>();
    for (const ev of events) {
      const key = `${ev.fromUserId}:${ev.toUserId}`;
      byPair.set(key, [...(byPair.get(key) ?? []), ev.type]);
    }
    const rows = await rig.db.kysely
      .selectFrom('following')
      .select(['from_user_id', 'to_user_id'])
      .where('from_user_id', 'in', users)
      .execute();
    const present = new Set(rows.map((r) => `${Number(r.from_user_id)}:${Number(r.to_user_id)}`));
    for (const [x, y] of pairs) {
      const key = `${x}:${y}`;
      const types = byPair.get(key) ?? [];
      // Every change answered true has its event, and the events of a pair alternate from "not
      // following" to the state the table ends in.
      expect(types.length, key).toBe(answered.get(key) ?? 0);
      types.forEach((t, i) => expect(t, `${key} #${i}`).toBe(i % 2 === 0 ? 'follow' : 'unfollow'));
      expect(present.has(key), key).toBe(types.length % 2 === 1);
    }
  });

  // SQLite has one writer and no gap locks; the deadlock this guards against is InnoDB's.
  it.runIf(dialect === 'mariadb')(
    'forgets applied marks while follows write new ones, without deadlocking either',
    async () => {
      const users = await Promise.all(Array.from({ length: 12 }, () => rig.newUser()));
      const pairs = users.flatMap((x) => users.filter((y) => y !== x).map((y) => [x, y] as const));
      const processes = [0, 1, 2].map(() => new RelationRepository(rig.db, new OutboxWriter()));
      let writing = true;
      const forgotten: string[] = [];
      // Plays the projection: marks of committed changes, each batch also naming marks already gone
      // (a redelivered batch), deleted while the changes keep coming.
      const projection = (async () => {
        while (writing) {
          const marks = await rig.db.kysely
            .selectFrom('relation_unapplied')
            .select('event_id')
            .where('from_user_id', 'in', users)
            .execute();
          const ids = marks.map((m) => String(m.event_id));
          await rig.repo.markApplied([...ids, ...forgotten.slice(-50)]);
          forgotten.push(...ids);
          await new Promise((resolve) => setImmediate(resolve));
        }
      })();
      try {
        for (let round = 0; round < 8; round++) {
          await Promise.all(
            processes.flatMap((repo) =>
              pairs.map(([x, y]) =>
                Math.random() < 0.5 ? repo.follow(x, y, round) : repo.unfollow(x, y, round),
              ),
            ),
          );
        }
      } finally {
        writing = false;
        await projection;
      }
      expect(forgotten.length).toBeGreaterThan(0);
      await rig.drain();
    },
  );

  it('rejects following yourself, unknown users and too many changes', async () => {
    const [a, b] = [await rig.newUser(), await rig.newUser()];
    await expectError(sut.follow(a, a), 400, 'BAD_REQUEST');
    await expectError(sut.follow(a, 987_654_321), 404, 'NOT_FOUND');
    await expectError(sut.unfollow(a, 987_654_321), 404, 'NOT_FOUND');
    await expectError(sut.status(a, 987_654_321), 404, 'NOT_FOUND');
    await expectError(sut.list(987_654_321, 'followers', { offset: 0 }, 10), 404, 'NOT_FOUND');
    const limited = rig.service({ changesPerMinute: 3 });
    try {
      expect(await limited.follow(b, a)).toBe(true);
      expect(await limited.unfollow(b, a)).toBe(true);
      expect(await limited.follow(b, a)).toBe(true);
      await expectError(limited.unfollow(b, a), 429, 'RATE_LIMITED');
    } finally {
      limited.close();
    }
    expect(await rig.drain()).toHaveLength(3);
  });

  it('projects follower rows and counters exactly, also when batches are delivered twice or reordered', async () => {
    const [a, b, c] = [await rig.newUser(), await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    await sut.follow(c, b);
    await sut.follow(b, a);
    await sut.unfollow(a, b);
    await sut.follow(a, b);
    await sut.unfollow(c, b);
    const events = await rig.drain();
    await rig.projector.apply(events);
    await rig.projector.apply(events); // redelivered
    await rig.projector.apply([...events].reverse()); // and out of order
    expect(await tableRows(rig.db, 'follower')).toEqual(await tableRows(rig.db, 'following'));
    const [ca, cb, cc] = await rig.counters.countsMany([a, b, c]);
    expect(ca).toMatchObject({ followings: 1, followers: 1 });
    expect(cb).toMatchObject({ followings: 1, followers: 1 });
    expect(cc).toMatchObject({ followings: 0, followers: 0 });
    expect(await rig.repo.unappliedFor(a)).toEqual([]);
    expect(await sut.status(a, b)).toEqual({ following: true, followedBy: true, mutual: true });
    expect(await sut.status(c, b)).toEqual({ following: false, followedBy: false, mutual: false });
  });

  it('keeps the projection equal to the truth when a late event arrives after newer changes', async () => {
    const [a, b] = [await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    const first = await rig.drain();
    await rig.projector.apply(first);
    await sleep(5); // so the second follow has another time than the first
    await sut.unfollow(a, b);
    await sut.follow(a, b);
    const later = await rig.drain();
    // Only the last event of the pair is seen (the unfollow is still on its way): the mirror
    // takes the current row, with the second follow's time.
    await rig.projector.apply(later.slice(1));
    expect(await tableRows(rig.db, 'follower')).toEqual(await tableRows(rig.db, 'following'));
    // The first follow delivered again after the newer changes changes nothing.
    await rig.projector.apply(first);
    await rig.projector.apply(later.slice(0, 1));
    expect(await tableRows(rig.db, 'follower')).toEqual(await tableRows(rig.db, 'following'));
    expect((await rig.counters.countsMany([a, b]))[1]).toMatchObject({ followers: 1 });
  });

  it('syncs the projection again when its transaction was chosen as a deadlock victim', async () => {
    const [a, b] = [await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    let victims = 0;
    const kysely = new Proxy(rig.db.kysely, {
      get(target, name) {
        if (name === 'transaction' && victims < 2) {
          victims++;
          const deadlock = Object.assign(new Error('Deadlock found when trying to get lock'), {
            code: 'ER_LOCK_DEADLOCK',
            errno: 1213,
          });
          return () => ({ execute: () => Promise.reject(deadlock) });
        }
        const value = Reflect.get(target, name, target) as unknown;
        return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
      },
    });
    const repo = new RelationRepository({ ...rig.db, kysely }, new OutboxWriter());
    const synced = await repo.syncPairs([{ fromUserId: a, toUserId: b }]);
    expect(victims).toBe(2);
    expect(synced).toMatchObject([{ fromUserId: a, toUserId: b, changed: true }]);
    expect(await tableRows(rig.db, 'follower')).toEqual(await tableRows(rig.db, 'following'));
  });

  it('never puts back a follower row from a truth read before an unfollow whose own sync ran first', async () => {
    const [a, b] = [await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    const pair = { fromUserId: a, toUserId: b };
    // A rebuild's sync that has read the pair as followed, and is held there.
    const slow = new RelationRepository(rig.db, new OutboxWriter());
    let held: () => void = () => {};
    const reading = new Promise<void>((resolve) => {
      slow.afterTruthRead = async () => {
        slow.afterTruthRead = undefined;
        resolve();
        await new Promise<void>((release) => (held = release));
      };
    });
    const rebuild = slow.syncPairs([pair]);
    await reading;
    // Meanwhile the unfollow commits and its event's sync runs (each may have to wait for the rebuild).
    const settled = (p: Promise<unknown>) => Promise.race([p, new Promise((r) => setTimeout(r, 300))]);
    const unfollow = rig.db.kysely
      .deleteFrom('following')
      .where('from_user_id', '=', a)
      .where('to_user_id', '=', b)
      .execute();
    await settled(unfollow);
    const projector = unfollow.then(() =>
      new RelationRepository(rig.db, new OutboxWriter()).syncPairs([pair]),
    );
    await settled(projector);
    held();
    await Promise.all([rebuild, unfollow, projector]);
    expect(await tableRows(rig.db, 'following')).toEqual([]);
    expect(await tableRows(rig.db, 'follower')).toEqual([]);
  });

  it('rebuilds counters exactly while events are still on their way', async () => {
    const [a, b, c] = [await rig.newUser(), await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    await rig.projector.apply(await rig.drain());
    await sut.follow(c, b); // committed, not consumed yet
    await rig.store.remove([b]); // the snapshot is lost: the next read rebuilds it from the tables
    expect((await rig.counters.countsMany([b]))[0]).toMatchObject({ followers: 2 });
    await rig.projector.apply(await rig.drain()); // the in-flight event is recorded as applied
    expect((await rig.counters.countsMany([b]))[0]).toMatchObject({ followers: 2 });
    expect((await rig.counters.countsMany([c]))[0]).toMatchObject({ followings: 1 });
  });

  it('keeps counts exact while reads rebuild snapshots concurrently with the consumer', async () => {
    for (let round = 0; round < 3; round++) {
      const owner = await rig.newUser();
      const fans: number[] = [];
      for (let i = 0; i < 7; i++) {
        const fan = await rig.newUser();
        fans.push(fan);
        await sut.follow(fan, owner);
        if (i % 2 === 0) await rig.projector.apply(await rig.drain());
      }
      const reads = Promise.all(Array.from({ length: 5 }, () => rig.counters.countsMany([owner])));
      await rig.projector.apply(await rig.drain());
      await reads;
      expect((await rig.counters.countsMany([owner]))[0]).toMatchObject({ followers: 7 });
      await sut.unfollow(fans[2]!, owner);
      await rig.projector.apply(await rig.drain());
      expect((await rig.counters.countsMany([owner]))[0]).toMatchObject({ followers: 6 });
    }
  });

  it('pages lists newest first by offset and by exclusive cursor, without private fields', async () => {
    const owner = await rig.newUser();
    const fans: number[] = [];
    for (let i = 0; i < 7; i++) {
      const fan = await rig.newUser();
      fans.push(fan);
      await sut.follow(fan, owner);
    }
    await rig.projector.apply(await rig.drain());
    const newestFirst = [...fans].reverse();

    const first = await sut.list(owner, 'followers', { offset: 0 }, 3);
    expect(first.items.map((p) => p.id)).toEqual(newestFirst.slice(0, 3));
    expect(first.nextCursor).not.toBeNull();
    for (const p of first.items) {
      expect(p).not.toHaveProperty('phone');
      expect(p).not.toHaveProperty('email');
    }
    const seen = [...first.items.map((p) => p.id)];
    let cursor = first.nextCursor;
    while (cursor) {
      const [createdAt, userId] = cursor.split('.').map(Number) as [number, number];
      const page = await sut.list(owner, 'followers', { after: { createdAt, userId } }, 3);
      seen.push(...page.items.map((p) => p.id));
      cursor = page.nextCursor;
    }
    expect(seen).toEqual(newestFirst);
    expect((await sut.list(owner, 'followers', { offset: 6 }, 3)).items.map((p) => p.id)).toEqual([
      newestFirst[6],
    ]);
    const mine = await sut.list(fans[0]!, 'following', { offset: 0 }, 20);
    expect(mine.items.map((p) => p.id)).toEqual([owner]);
    expect(mine.nextCursor).toBeNull();
  });

  it('lists followers as the truth says while changes are still on their way to the projection', async () => {
    const owner = await rig.newUser();
    const fans: number[] = [];
    for (let i = 0; i < 8; i++) {
      fans.push(await rig.newUser());
      await sut.follow(fans[i]!, owner);
    }
    await rig.projector.apply(await rig.drain());
    // Not projected yet: three leave, one leaves and comes back, five new ones arrive.
    for (const fan of fans.slice(0, 3)) await sut.unfollow(fan, owner);
    await sut.unfollow(fans[5]!, owner);
    await sut.follow(fans[5]!, owner);
    for (let i = 0; i < 5; i++) {
      const fan = await rig.newUser();
      fans.push(fan);
      await sut.follow(fan, owner);
    }
    // Four newer follows are projected first, so pending entries also sort below projected ones.
    const earlier = await rig.drain();
    for (let i = 0; i < 4; i++) {
      const fan = await rig.newUser();
      fans.push(fan);
      await sut.follow(fan, owner);
    }
    const later = await rig.drain();
    await rig.projector.apply(later);
    expect(earlier).toHaveLength(10);
    const truth = (
      await rig.db.kysely
        .selectFrom('following')
        .select(['from_user_id', 'created_at'])
        .where('to_user_id', '=', owner)
        .execute()
    )
      .map((r) => ({ userId: Number(r.from_user_id), createdAt: Number(r.created_at) }))
      .sort((x, y) => y.createdAt - x.createdAt || y.userId - x.userId);
    expect(truth).toHaveLength(14);
    for (const limit of [1, 2, 3, 5, 20]) {
      for (let offset = 0; offset <= truth.length + 3; offset++) {
        const page = await rig.repo.page(owner, 'followers', { offset }, limit);
        expect(page.entries, `offset ${offset}, limit ${limit}`).toEqual(truth.slice(offset, offset + limit));
        expect(page.more, `offset ${offset}, limit ${limit}`).toBe(offset + limit < truth.length);
      }
      const walked: ListEntry[] = [];
      let page = await rig.repo.page(owner, 'followers', { offset: 0 }, limit);
      walked.push(...page.entries);
      while (page.more) {
        page = await rig.repo.page(owner, 'followers', { after: walked[walked.length - 1]! }, limit);
        walked.push(...page.entries);
      }
      expect(walked, `cursor walk, limit ${limit}`).toEqual(truth);
    }
    // The service fills the list cache from the same read, and the consumer's repeat changes nothing.
    const ids = truth.map((e) => e.userId);
    expect((await sut.list(owner, 'followers', { offset: 0 }, 20)).items.map((p) => p.id)).toEqual(ids);
    await rig.projector.apply(earlier);
    expect(await rig.drain()).toEqual([]);
    expect((await rig.lists.all({ owner, kind: 'followers' }))?.map((e) => e.userId)).toEqual(ids);
    expect(await rig.repo.page(owner, 'followers', { offset: 0 }, 20)).toEqual({
      entries: truth,
      more: false,
    });
  });

  it("shows a new follower their own follow in the followed user's list before the consumer runs", async () => {
    const big = rig.service({ bigAccountFollowers: 2, listCacheMaxEntries: 1 });
    try {
      const [owner, star, x, y] = (await rig.newUsers(4)) as [number, number, number, number];
      await sut.follow(x, owner);
      await rig.projector.apply(await rig.drain());
      // Nobody has cached the list: the caller's read fills it, and must include the caller.
      await sut.follow(y, owner);
      expect((await sut.list(owner, 'followers', { offset: 0 }, 10)).items.map((p) => p.id)).toEqual([y, x]);
      expect((await rig.lists.all({ owner, kind: 'followers' }))?.map((e) => e.userId)).toEqual([y, x]);
      // A big account's first page (read from the database, kept in process) likewise.
      await big.follow(x, star);
      await big.follow(y, star);
      await rig.projector.apply(await rig.drain());
      const newcomer = await rig.newUser();
      await big.follow(newcomer, star);
      expect((await big.list(star, 'followers', { offset: 0 }, 10)).items.map((p) => p.id)).toEqual([
        newcomer,
        y,
        x,
      ]);
      await rig.projector.apply(await rig.drain());
    } finally {
      big.close();
    }
  });

  it('serves lists from complete caches and keeps them complete through changes', async () => {
    const [owner, x, y, z] = (await rig.newUsers(4)) as [number, number, number, number];
    await sut.follow(x, owner);
    await rig.projector.apply(await rig.drain());
    // A change to a list nobody cached must not create a one-entry cache.
    await sut.follow(owner, y);
    await rig.projector.apply(await rig.drain());
    await sut.follow(owner, z);
    expect(await rig.lists.all({ owner, kind: 'following' })).toBeNull();
    const following = await sut.list(owner, 'following', { offset: 0 }, 10);
    expect(following.items.map((p) => p.id)).toEqual([z, y]);
    expect((await rig.lists.all({ owner, kind: 'following' }))?.map((e: ListEntry) => e.userId)).toEqual([
      z,
      y,
    ]);
    // The caller's own change shows at once (the lists are dropped after the commit and read
    // again, complete) ...
    await sut.unfollow(owner, y);
    expect(await rig.lists.all({ owner, kind: 'following' })).toBeNull();
    expect((await sut.list(owner, 'following', { offset: 0 }, 10)).items.map((p) => p.id)).toEqual([z]);
    expect((await rig.lists.all({ owner, kind: 'following' }))?.map((e: ListEntry) => e.userId)).toEqual([z]);
    // ... and the consumer's repeat of it changes nothing more.
    await rig.projector.apply(await rig.drain());
    expect((await sut.list(owner, 'following', { offset: 0 }, 10)).items.map((p) => p.id)).toEqual([z]);
    expect((await sut.list(owner, 'followers', { offset: 0 }, 10)).items.map((p) => p.id)).toEqual([x]);
    const hits = (await rig.metrics.cacheReads.get()).values.find(
      (v) => v.labels.cache === 'list' && v.labels.result === 'hit',
    );
    expect(hits?.value ?? 0).toBeGreaterThanOrEqual(1);
  });

  it("keeps a big account's first followers page in process and drops it on a change", async () => {
    const big = rig.service({ bigAccountFollowers: 2, listCacheMaxEntries: 1 });
    try {
      const owner = await rig.newUser();
      const [f1, f2, f3] = [await rig.newUser(), await rig.newUser(), await rig.newUser()];
      await big.follow(f1, owner);
      await big.follow(f2, owner);
      await rig.projector.apply(await rig.drain());
      expect((await big.list(owner, 'followers', { offset: 0 }, 10)).items.map((p) => p.id)).toEqual([
        f2,
        f1,
      ]);
      // Written behind the service's back: the cached page does not see it ...
      await rig.db.kysely
        .insertInto('follower')
        .values({ to_user_id: owner, from_user_id: f3, created_at: Date.now() + 1_000 })
        .execute();
      expect((await big.list(owner, 'followers', { offset: 0 }, 10)).items.map((p) => p.id)).toEqual([
        f2,
        f1,
      ]);
      // ... until a change of the account is announced.
      await rig.db.kysely.deleteFrom('follower').where('from_user_id', '=', f3).execute();
      await big.follow(f3, owner);
      await rig.projector.apply(await rig.drain());
      const page = await big.list(owner, 'followers', { offset: 0 }, 2);
      expect(page.items.map((p) => p.id)).toEqual([f3, f2]);
      expect(page.nextCursor).not.toBeNull();
      const firstPageHits = (await rig.metrics.cacheReads.get()).values.find(
        (v) => v.labels.cache === 'first-page' && v.labels.result === 'hit',
      );
      expect(firstPageHits?.value).toBeGreaterThanOrEqual(1);
    } finally {
      big.close();
    }
  });

  it('fails a batch whose followed users other processes could not be told of, so it comes again', async () => {
    const [a, b] = [await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    const events = await rig.drain();
    let down = true;
    const told: string[][] = [];
    const projector = new RelationProjector({
      events: undefined as unknown as EventLog,
      repo: rig.repo,
      counters: rig.store,
      lists: rig.lists,
      bus: Object.assign(Object.create(rig.bus) as typeof rig.bus, {
        publish: async (_scope: string, keys: string[]) => {
          if (down) throw new Error('bus down');
          told.push(keys);
        },
      }),
      metrics: rig.metrics,
      onError: () => undefined,
    });
    await expect(projector.apply(events)).rejects.toThrow('bus down');
    down = false;
    await projector.apply(events);
    expect(told).toEqual([[String(b)]]);
    expect((await rig.counters.countsMany([b]))[0]).toMatchObject({ followers: 1 });
  });

  it('finds and heals drift of the projection, the counters and the caches', async () => {
    const [a, b, c] = [await rig.newUser(), await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    await sut.follow(c, b);
    await rig.projector.apply(await rig.drain());
    await sut.list(b, 'followers', { offset: 0 }, 10); // cached
    expect(hasDrift(await rig.reconciler.check(b))).toBe(false);

    await rig.db.kysely.deleteFrom('follower').where('from_user_id', '=', a).execute();
    await rig.db.kysely
      .insertInto('follower')
      .values({ to_user_id: b, from_user_id: 999_999, created_at: 1 })
      .execute();
    await rig.store.write(
      b,
      { followings: 0, followers: 7, posts: 0, likesReceived: 0, favsReceived: 0 },
      {},
      Date.now(),
    );
    await rig.lists.apply([{ owner: b, kind: 'followers', userId: 424_242, createdAt: 5 }]);

    const drift = await rig.reconciler.check(b);
    expect(drift.projection.map((p) => p.fromUserId).sort((x, y) => x - y)).toEqual([a, 999_999]);
    expect(drift.counters).toEqual([{ field: 'followers', expected: 2, actual: 7 }]);
    expect(drift.caches).toEqual(['followers']);

    rig.reconciler.touched([b]);
    const round = await rig.reconciler.runOnce();
    expect(round.healed).toBeGreaterThanOrEqual(1);
    expect(hasDrift(await rig.reconciler.check(b))).toBe(false);
    expect(await tableRows(rig.db, 'follower')).toEqual(await tableRows(rig.db, 'following'));
    expect((await rig.counters.countsMany([b]))[0]).toMatchObject({ followers: 2 });
    expect((await sut.list(b, 'followers', { offset: 0 }, 10)).items.map((p) => p.id)).toEqual([c, a]);
  });

  it('verifies every user and heals with --fix; rebuild re-derives projection, counters and caches', async () => {
    const [a, b, c] = [await rig.newUser(), await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    await sut.follow(b, c);
    await sut.follow(c, a);
    await rig.projector.apply(await rig.drain());
    await sut.list(a, 'following', { offset: 0 }, 10);
    const progress: string[] = [];
    const clean = await verifyRelations(rig.repo, rig.reconciler, false, (m) => progress.push(m), quick);
    expect(clean).toMatchObject({ checked: 3, driftedUsers: 0, inFlight: 0 });
    expect(progress.length).toBeGreaterThan(0);

    await rig.db.kysely.deleteFrom('follower').where('to_user_id', '=', c).execute();
    await rig.store.write(
      a,
      { followings: 5, followers: 1, posts: 0, likesReceived: 0, favsReceived: 0 },
      {},
      Date.now(),
    );
    await rig.lists.apply([{ owner: a, kind: 'following', userId: 777, createdAt: 1 }]);
    const found = await verifyRelations(rig.repo, rig.reconciler, false, () => undefined, quick);
    expect(found).toMatchObject({
      driftedUsers: 2,
      projectionPairs: 1,
      counterUsers: 1,
      cacheLists: 1,
      fixed: 0,
    });
    expect(found.drifted.sort((x, y) => x - y)).toEqual([a, c].sort((x, y) => x - y));
    const fixed = await verifyRelations(rig.repo, rig.reconciler, true, () => undefined, quick);
    expect([fixed.driftedUsers, fixed.fixed]).toEqual([2, 2]);
    expect(
      (await verifyRelations(rig.repo, rig.reconciler, false, () => undefined, quick)).driftedUsers,
    ).toBe(0);

    // Lose the whole projection and every snapshot; rebuild brings them back from `following`.
    await rig.db.kysely.deleteFrom('follower').execute();
    await rig.db.kysely
      .insertInto('follower')
      .values({ to_user_id: a, from_user_id: 31_337, created_at: 9 })
      .execute();
    await rig.store.write(
      b,
      { followings: 9, followers: 9, posts: 0, likesReceived: 0, favsReceived: 0 },
      {},
      Date.now(),
    );
    const report = await rebuildRelations(
      {
        repo: rig.repo,
        lists: rig.lists,
        bus: rig.bus,
        rebuildCounters: (userId) => rig.counters.rebuild(userId, 'overwrite', 'admin'),
      },
      () => undefined,
    );
    expect(report).toMatchObject({
      following: 3,
      follower: 4,
      projectionChanged: 4,
      users: 3,
      countersRewritten: 3,
      countersBusy: 0,
      firstPagesNotAnnounced: 0,
    });
    expect(await tableRows(rig.db, 'follower')).toEqual(await tableRows(rig.db, 'following'));
    // What it could not do, it says: counters that kept changing, announcements that failed.
    const partial = await rebuildRelations(
      {
        repo: rig.repo,
        lists: rig.lists,
        bus: Object.assign(Object.create(rig.bus) as typeof rig.bus, {
          publish: async () => {
            throw new Error('bus down');
          },
        }),
        rebuildCounters: async (userId) =>
          userId === b ? { written: false } : rig.counters.rebuild(userId, 'overwrite', 'admin'),
      },
      () => undefined,
    );
    expect(partial).toMatchObject({ users: 3, countersRewritten: 2, countersBusy: 1, busyUsers: [b] });
    expect(partial.firstPagesNotAnnounced).toBeGreaterThan(0);
    expect((await rig.counters.countsMany([b]))[0]).toMatchObject({ followings: 1, followers: 1 });
    expect(await rig.lists.all({ owner: a, kind: 'following' })).toBeNull();
    expect(
      (await verifyRelations(rig.repo, rig.reconciler, false, () => undefined, quick)).driftedUsers,
    ).toBe(0);
  });

  it('verify reports only drift found twice, and a heal other processes were not told of as not fixed', async () => {
    const [a, b] = [await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    await rig.projector.apply(await rig.drain());
    // What a follow committing while `a` is walked looks like: drift in the first check only.
    const check = rig.reconciler.check.bind(rig.reconciler);
    let first = true;
    const reconciler = Object.assign(Object.create(rig.reconciler) as RelationReconciler, {
      check: async (userId: number) => {
        const drift = await check(userId);
        if (userId !== a || !first) return drift;
        first = false;
        return { ...drift, caches: ['following' as const] };
      },
    });
    const passing = await verifyRelations(rig.repo, reconciler, true, () => undefined, quick);
    expect(passing).toMatchObject({ checked: 2, driftedUsers: 0, cacheLists: 0, fixed: 0 });

    // A drifted list dropped here, but the other processes' first pages could not be dropped.
    await sut.list(b, 'followers', { offset: 0 }, 10);
    await rig.lists.apply([{ owner: b, kind: 'followers', userId: 777, createdAt: 1 }]);
    let busDown = true;
    const announced: string[][] = [];
    const unannounced = new RelationReconciler({
      repo: rig.repo,
      counters: rig.store,
      lists: rig.lists,
      rebuildCounters: (userId) => rig.counters.rebuild(userId, 'overwrite', 'drift'),
      metrics: rig.metrics,
      maxCompare: 1_000,
      settleMs: 10,
      sampleSize: 0,
      bus: Object.assign(Object.create(rig.bus) as typeof rig.bus, {
        publish: async (_scope: string, keys: string[]) => {
          if (busDown) throw new Error('bus down');
          announced.push(keys);
        },
      }),
    });
    const report = await verifyRelations(rig.repo, unannounced, true, () => undefined, quick);
    expect(report).toMatchObject({ driftedUsers: 1, cacheLists: 1, fixed: 0, notFixed: 1 });
    expect(await rig.lists.all({ owner: b, kind: 'followers' })).toBeNull();
    // No check finds it any more (the list is right): the next round tells the other processes.
    busDown = false;
    await unannounced.runOnce();
    expect(announced).toEqual([[String(b)]]);
  });

  it('finds every disagreement of a follower list and its mirror reading a page of each table at a time', async () => {
    const star = await rig.newUser();
    const row = (from: number, createdAt: number) => ({
      to_user_id: star,
      from_user_id: from,
      created_at: createdAt,
    });
    const truth = [1, 2, 3, 4, 5, 6, 7].map((i) => row(1_000_000 + i, i));
    await rig.db.kysely.insertInto('following').values(truth).execute();
    // Mirror: two rows missing, one with another time, and a dozen extra rows above all of the truth.
    const extra = Array.from({ length: 12 }, (_, i) => row(2_000_000 + i, 1));
    await rig.db.kysely
      .insertInto('follower')
      .values([...truth.slice(2, 6), row(truth[6]!.from_user_id, 99), ...extra])
      .execute();
    let largest = 0;
    const observed = rig.db.kysely.withPlugin({
      transformQuery: (args) => args.node,
      transformResult: async (args) => {
        largest = Math.max(largest, args.result.rows.length);
        return args.result;
      },
    });
    const repo = new RelationRepository({ ...rig.db, kysely: observed }, new OutboxWriter());
    const diff = await repo.followerDiff(star, 3);
    const expected = [truth[0]!, truth[1]!, truth[6]!, ...extra].map((r) => r.from_user_id);
    expect(diff.map((p) => p.fromUserId).sort((x, y) => x - y)).toEqual(expected);
    expect(diff.every((p) => p.toUserId === star)).toBe(true);
    expect(largest).toBeLessThanOrEqual(3);
    await rig.db.kysely.deleteFrom('following').where('to_user_id', '=', star).execute();
    await rig.db.kysely.deleteFrom('follower').where('to_user_id', '=', star).execute();
  });

  it('walks a long follower list only when its size differs by more than the changes in flight explain', async () => {
    const star = await rig.newUser();
    const fans = await rig.newUsers(6);
    for (const fan of fans.slice(0, 3)) await sut.follow(fan, star);
    await rig.projector.apply(await rig.drain());
    let walks = 0;
    const repo: typeof rig.repo = Object.create(rig.repo) as typeof rig.repo;
    repo.followerDiff = (...args) => {
      walks++;
      return rig.repo.followerDiff(...args);
    };
    const reconciler = reconcilerOn(repo, { maxCompare: 2 });
    await sut.follow(fans[3]!, star); // committed; the projection not yet told
    expect(hasDrift(await reconciler.check(star))).toBe(false);
    expect(walks).toBe(0);
    // Two stale rows: the mirror is one above the truth, which a follow in flight cannot explain
    // (it would leave the mirror below): walked, and found.
    await rig.db.kysely
      .insertInto('follower')
      .values(fans.slice(4).map((fan) => ({ to_user_id: star, from_user_id: fan, created_at: 1 })))
      .execute();
    const drift = await reconciler.check(star);
    expect(walks).toBe(1);
    expect(drift.projection).toEqual(
      expect.arrayContaining(fans.slice(4).map((fan) => ({ fromUserId: fan, toUserId: star }))),
    );
    expect(drift.projection).toHaveLength(2);
    // A missing row: below what the follow in flight explains.
    await reconciler.heal(drift);
    await rig.db.kysely.deleteFrom('follower').where('from_user_id', '=', fans[0]!).execute();
    expect((await reconciler.check(star)).projection).toEqual([{ fromUserId: fans[0]!, toUserId: star }]);
    expect(walks).toBe(2);
  });

  it('does not walk a long follower list for a follow landing while its sizes are read', async () => {
    const star = await rig.newUser();
    const fans = await rig.newUsers(4);
    for (const fan of fans.slice(0, 3)) await sut.follow(fan, star);
    await rig.projector.apply(await rig.drain());
    let walks = 0;
    let landed = false;
    const repo: typeof rig.repo = Object.create(rig.repo) as typeof rig.repo;
    repo.followerDiff = (...args) => {
      walks++;
      return rig.repo.followerDiff(...args);
    };
    // Right after the check read the changes in flight, another fan follows (not yet projected).
    repo.unappliedFor = async (userId) => {
      const unapplied = await rig.repo.unappliedFor(userId);
      if (!landed) {
        landed = true;
        await sut.follow(fans[3]!, star);
      }
      return unapplied;
    };
    const reconciler = reconcilerOn(repo, { maxCompare: 2 });
    expect(hasDrift(await reconciler.check(star))).toBe(false);
    expect(landed).toBe(true);
    expect(walks).toBe(0);
  });

  it('does not call a change committed and applied while a check reads drift', async () => {
    const [a, b, c] = [await rig.newUser(), await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    await rig.projector.apply(await rig.drain());
    expect((await rig.counters.counts(b)).followers).toBe(1); // a snapshot to compare
    // Right after the check read the truth, c follows b and the change is applied.
    let landed = false;
    const repo = Object.assign(Object.create(rig.repo) as typeof rig.repo, {
      countSource: async (userId: number) => {
        const source = await rig.repo.countSource(userId);
        if (!landed) {
          landed = true;
          await sut.follow(c, b);
          await rig.projector.apply(await rig.drain());
        }
        return source;
      },
    });
    const reconciler = reconcilerOn(repo, { maxCompare: 1_000 });
    expect((await reconciler.check(b)).counters).toEqual([]);
    expect(landed).toBe(true);
  });

  it('settles a change whose event the log lost: counted, projected, and no longer in flight', async () => {
    const [a, b, c, d] = (await rig.newUsers(4)) as [number, number, number, number];
    await sut.follow(a, b);
    await sut.follow(c, b);
    await rig.projector.apply(await rig.drain());
    await rig.counters.countsMany([b, d]); // snapshots
    await sut.follow(d, b);
    const lost = await rig.drain(); // published, and never consumed: the log no longer holds it
    await rig.db.kysely
      .updateTable('relation_unapplied')
      .set({ created_at: Date.now() - 25 * 3_600_000 })
      .execute();
    expect((await rig.counters.countsMany([b]))[0]).toMatchObject({ followers: 2 });
    // Looked in flight for ever: no drift found, the counter one short.
    expect(hasDrift(await rig.reconciler.check(b))).toBe(false);
    const found = await verifyRelations(rig.repo, rig.reconciler, false, () => undefined, quick);
    expect(found).toMatchObject({ driftedUsers: 0, inFlight: 1, lostEvents: 1, lostEventsSettled: 0 });

    // Counters that keep changing while rebuilt leave the mark for the next round.
    const busy = new RelationReconciler({
      repo: rig.repo,
      counters: rig.store,
      lists: rig.lists,
      bus: rig.bus,
      rebuildCounters: async () => ({ written: false }),
      metrics: rig.metrics,
      maxCompare: 1_000,
      settleMs: 10,
      sampleSize: 0,
    });
    expect(await busy.settleOrphans()).toEqual({ found: 1, settled: 0 });
    expect((await rig.repo.unappliedSummary(Date.now(), Date.now())).count).toBe(1);

    const round = await rig.reconciler.runOnce();
    expect(round).toMatchObject({ drifted: 0, healed: 0, lostEvents: 1, lostEventsSettled: 1 });
    expect((await rig.counters.countsMany([b, d])).map((u) => [u?.followers, u?.followings])).toEqual([
      [3, 0],
      [0, 1],
    ]);
    expect(await tableRows(rig.db, 'follower')).toEqual(await tableRows(rig.db, 'following'));
    expect(await rig.repo.unappliedSummary(Date.now(), Date.now())).toMatchObject({ count: 0, orphaned: 0 });
    // The event turning up after all is not counted twice.
    await rig.projector.apply(lost);
    expect((await rig.counters.countsMany([b]))[0]).toMatchObject({ followers: 3 });
    expect(await verifyRelations(rig.repo, rig.reconciler, false, () => undefined, quick)).toMatchObject({
      driftedUsers: 0,
      inFlight: 0,
      lostEvents: 0,
    });
  });

  it('does not call changes still in flight drift', async () => {
    const [a, b] = [await rig.newUser(), await rig.newUser()];
    await sut.follow(a, b);
    await rig.projector.apply(await rig.drain());
    await sut.list(b, 'followers', { offset: 0 }, 10);
    await sut.unfollow(a, b); // committed; projection, counters and caches not yet told
    await rig.lists.invalidate([{ owner: b, kind: 'followers' }]);
    expect(hasDrift(await rig.reconciler.check(b))).toBe(false);
    expect(hasDrift(await rig.reconciler.check(a))).toBe(false);
    await rig.projector.apply(await rig.drain());
    expect(hasDrift(await rig.reconciler.check(b))).toBe(false);
  });
});
