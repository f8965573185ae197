/**
 * RelationService against controllable stand-ins: a big account's first-page cache under an
 * invalidation that arrives while the page loads, and the order of the checks of a change.
 */
import pino from 'pino';
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { LocalInvalidationBus } from '../platform/cache/local-invalidation-bus.js';
import { AppError } from '../platform/errors/errors.js';
import type { RateLimitDecision, RateLimiter } from '../platform/ratelimit/ratelimit.js';
import type { UserRow } from '../profile/users.repository.js';
import { MemoryListCache } from './list-cache/memory-list-cache.js';
import type { ListEntry, ListKind, ListPosition, RelationEvent } from './model.js';
import { RelationMetrics } from './relation.metrics.js';
import type { RelationRepository } from './relation.repository.js';
import { FIRST_PAGE_SCOPE, RelationService, type UserDirectory } from './relation.service.js';

const OWNER = 1;

function userRow(id: number): UserRow {
  return {
    id,
    phone: null,
    email: null,
    password_hash: null,
    nickname: `u${id}`,
    avatar: 'https://example.test/a.png',
    bio: null,
    zg_id: `z${id}`,
    gender: 'UNKNOWN',
    birthday: null,
    school: null,
    tags_json: '[]',
  } as unknown as UserRow;
}

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

interface Setup {
  service: RelationService;
  bus: LocalInvalidationBus;
  /** The owner's followers, newest first, as the database has them. */
  followers: ListEntry[];
  /** When set, the next followers-page read waits for it (after reading). */
  hold?: Promise<void> | undefined;
  pageReads: number;
  limiterCalls: number;
  lookups: number;
  allowed: boolean;
  known: Set<number>;
  lists: MemoryListCache;
}

/** `followerCount` is what the user counters say; at or above 100 the owner is a big account. */
function setup(followerCount = 1_000): Setup {
  const s: Setup = {
    service: undefined as unknown as RelationService,
    bus: new LocalInvalidationBus(),
    followers: [
      { userId: 3, createdAt: 2 },
      { userId: 2, createdAt: 1 },
    ],
    pageReads: 0,
    limiterCalls: 0,
    lookups: 0,
    allowed: true,
    known: new Set([OWNER, 2, 3, 4]),
    lists: new MemoryListCache({ ttlMs: 60_000, maxEntries: 10, maxLists: 10 }),
  };
  const repo = {
    async page(_owner: number, _kind: ListKind, _position: ListPosition, limit: number) {
      s.pageReads++;
      const entries = s.followers.slice(0, limit);
      const hold = s.hold;
      s.hold = undefined;
      if (hold) await hold;
      return { entries, more: s.followers.length > limit };
    },
    async head(_owner: number, _kind: ListKind, limit: number) {
      const entries = s.followers.slice(0, limit);
      const hold = s.hold;
      s.hold = undefined;
      if (hold) await hold;
      return entries;
    },
    async follow(from: number, to: number, now: number): Promise<RelationEvent | null> {
      return { eventId: `e${now}`, type: 'follow', fromUserId: from, toUserId: to, ts: now };
    },
  } as unknown as RelationRepository;
  const users: UserDirectory = {
    async findById(id) {
      s.lookups++;
      return s.known.has(id) ? userRow(id) : undefined;
    },
    async findByIds(ids) {
      return ids.filter((id) => s.known.has(id)).map(userRow);
    },
  };
  const limiter: RateLimiter = {
    async hit(): Promise<RateLimitDecision> {
      s.limiterCalls++;
      return { allowed: s.allowed, remaining: 0, retryAfterMs: 1_000 };
    },
    async reset() {},
  };
  s.service = new RelationService({
    repo,
    users,
    limiter,
    lists: s.lists,
    counts: {
      async countsMany(ids) {
        return ids.map(() => ({ followers: followerCount, followings: 0 }) as never);
      },
    },
    bus: s.bus,
    metrics: new RelationMetrics(new Registry()),
    limits: {
      changesPerMinute: 10,
      bigAccountFollowers: 100,
      firstPageTtlMs: 60_000,
      listCacheMaxEntries: 10,
    },
    log: pino({ level: 'silent' }),
  });
  return s;
}

const ids = async (s: Setup) =>
  (await s.service.list(OWNER, 'followers', { offset: 0 }, 10)).items.map((p) => p.id);

describe("a big account's first followers page", () => {
  it('is kept in process and dropped by an invalidation', async () => {
    const s = setup();
    expect(await ids(s)).toEqual([3, 2]);
    s.followers.unshift({ userId: 4, createdAt: 3 });
    expect(await ids(s)).toEqual([3, 2]);
    expect(s.pageReads).toBe(1);
    await s.bus.publish(FIRST_PAGE_SCOPE, [String(OWNER)]);
    expect(await ids(s)).toEqual([4, 3, 2]);
    s.service.close();
  });

  it('is not kept when an invalidation arrives while it loads', async () => {
    const s = setup();
    const gate = deferred();
    s.hold = gate.promise;
    const loading = ids(s);
    // The load has read the database; a change lands and is announced before the load finishes.
    await new Promise((r) => setTimeout(r, 5));
    expect(s.pageReads).toBe(1);
    s.followers.unshift({ userId: 4, createdAt: 3 });
    await s.bus.publish(FIRST_PAGE_SCOPE, [String(OWNER)]);
    gate.resolve();
    // The load still answers with what it read ...
    expect(await loading).toEqual([3, 2]);
    // ... but did not keep it: the next read sees the change.
    expect(await ids(s)).toEqual([4, 3, 2]);
    expect(s.pageReads).toBe(2);
    // And the page loaded without interference is kept again.
    expect(await ids(s)).toEqual([4, 3, 2]);
    expect(s.pageReads).toBe(2);
    s.service.close();
  });

  it('is dropped when this process may have missed invalidations, also while it loads', async () => {
    const s = setup();
    s.known.add(5).add(6);
    const missedWhileAway = () => s.bus['subscribers'].gap();
    expect(await ids(s)).toEqual([3, 2]);
    s.followers.unshift({ userId: 4, createdAt: 3 });
    missedWhileAway();
    expect(await ids(s)).toEqual([4, 3, 2]);
    expect(s.pageReads).toBe(2);

    const gate = deferred();
    s.hold = gate.promise;
    s.followers.unshift({ userId: 5, createdAt: 4 });
    missedWhileAway();
    const loading = ids(s);
    await new Promise((r) => setTimeout(r, 5));
    s.followers.unshift({ userId: 6, createdAt: 5 });
    missedWhileAway();
    gate.resolve();
    expect(await loading).toEqual([5, 4, 3, 2]);
    s.hold = undefined;
    expect(await ids(s)).toEqual([6, 5, 4, 3, 2]);
    expect(s.pageReads).toBe(4);
    s.service.close();
  });

  it('is loaded once for callers that miss it together, but anew for one after an invalidation', async () => {
    const s = setup();
    s.known.add(4);
    const gate = deferred();
    s.hold = gate.promise;
    const first = ids(s);
    await new Promise((r) => setTimeout(r, 5));
    const second = ids(s);
    await new Promise((r) => setTimeout(r, 5));
    expect(s.pageReads).toBe(1);
    // A follow lands and is announced: a caller after it (its author, say) must see it.
    s.followers.unshift({ userId: 4, createdAt: 3 });
    await s.bus.publish(FIRST_PAGE_SCOPE, [String(OWNER)]);
    s.hold = undefined;
    const third = ids(s);
    gate.resolve();
    expect(await first).toEqual([3, 2]);
    expect(await second).toEqual([3, 2]);
    expect(await third).toEqual([4, 3, 2]);
    expect(s.pageReads).toBe(2);
    s.service.close();
  });

  it('hands a failed load to its callers only, not to later ones', async () => {
    const s = setup();
    const page = s.service['deps'].repo.page.bind(s.service['deps'].repo);
    let failNext = true;
    s.service['deps'].repo.page = async (...args: Parameters<typeof page>) => {
      if (failNext) {
        failNext = false;
        await new Promise((r) => setTimeout(r, 5));
        throw new Error('database down');
      }
      return page(...args);
    };
    const [a, b] = await Promise.allSettled([ids(s), ids(s)]);
    expect([a.status, b.status]).toEqual(['rejected', 'rejected']);
    expect(await ids(s)).toEqual([3, 2]);
    s.service.close();
  });

  it('is kept when the invalidation during the load concerns another user', async () => {
    const s = setup();
    const gate = deferred();
    s.hold = gate.promise;
    const loading = ids(s);
    await new Promise((r) => setTimeout(r, 5));
    await s.bus.publish(FIRST_PAGE_SCOPE, ['999']);
    gate.resolve();
    expect(await loading).toEqual([3, 2]);
    expect(await ids(s)).toEqual([3, 2]);
    expect(s.pageReads).toBe(1);
    s.service.close();
  });
});

describe('checks of a change', () => {
  const status = async (p: Promise<unknown>) => {
    try {
      await p;
      return 200;
    } catch (err) {
      return err instanceof AppError ? err.status : 500;
    }
  };

  it('answers 400 for yourself before anything else, then 429, then 404', async () => {
    const s = setup();
    s.allowed = false;
    expect(await status(s.service.follow(OWNER, OWNER))).toBe(400);
    expect(s.limiterCalls + s.lookups).toBe(0);
    expect(await status(s.service.follow(OWNER, 12345))).toBe(429);
    expect(await status(s.service.follow(OWNER, 2))).toBe(429);
    s.allowed = true;
    expect(await status(s.service.follow(OWNER, 12345))).toBe(404);
    expect(await status(s.service.follow(OWNER, 2))).toBe(200);
    s.service.close();
  });

  it('runs the rate limit and the user lookup side by side', async () => {
    const s = setup();
    let inFlight = 0;
    let most = 0;
    const track = async <T>(work: () => Promise<T>): Promise<T> => {
      most = Math.max(most, ++inFlight);
      await new Promise((r) => setTimeout(r, 5));
      inFlight--;
      return work();
    };
    const hit = s.service['deps'].limiter.hit.bind(s.service['deps'].limiter);
    const findById = s.service['deps'].users.findById.bind(s.service['deps'].users);
    s.service['deps'].limiter.hit = (...args) => track(() => hit(...args));
    s.service['deps'].users.findById = (id) => track(() => findById(id));
    expect(await s.service.follow(OWNER, 2)).toBe(true);
    expect(most).toBe(2);
    s.service.close();
  });

  it('answers without waiting for the first-page announcement to reach other processes', async () => {
    const s = setup();
    s.bus.publish = () => new Promise<void>(() => {});
    expect(await s.service.follow(OWNER, 2)).toBe(true);
    s.service.close();
  });
});

describe('a followers list read through the list cache', () => {
  it('shows a change made while the fill it joined was loading', async () => {
    const s = setup(2);
    const gate = deferred();
    s.hold = gate.promise;
    const first = ids(s);
    // The fill has read the database; then a change commits and reaches the cache (as from another
    // process), and a read of the changed list joins the fill still in flight.
    await new Promise((resolve) => setImmediate(resolve));
    s.followers.unshift({ userId: 4, createdAt: 3 });
    await s.lists.apply([{ owner: OWNER, kind: 'followers', userId: 4, createdAt: 3 }]);
    const joined = ids(s);
    gate.resolve();
    expect(await joined).toEqual([4, 3, 2]);
    await first;
    expect(await ids(s)).toEqual([4, 3, 2]);
    s.service.close();
  });
});

describe('cached lists after a change', () => {
  it('are dropped, not written, so an update that lands late cannot put back a state the pair left', async () => {
    const s = setup();
    s.service['deps'].repo.unfollow = async (from: number, to: number, now: number) => ({
      eventId: `u${now}`,
      type: 'unfollow' as const,
      fromUserId: from,
      toUserId: to,
      ts: now,
    });
    const following = { owner: OWNER, kind: 'following' as const };
    await s.lists.fill(following, async () => []);
    // The follow's cache update is held back (a stalled process, a slow Redis) ...
    const gate = deferred();
    const own = { apply: s.lists.apply.bind(s.lists), invalidate: s.lists.invalidate.bind(s.lists) };
    let first = true;
    const held = async (work: () => Promise<void>) => {
      if (first) {
        first = false;
        await gate.promise;
      }
      await work();
    };
    s.lists.apply = (changes) => held(() => own.apply(changes));
    s.lists.invalidate = (lists) => held(() => own.invalidate(lists));
    const follow = s.service.follow(OWNER, 2);
    await new Promise((r) => setTimeout(r, 5));
    // ... past the unfollow after it and a reader that cached the list as the table has it.
    expect(await s.service.unfollow(OWNER, 2)).toBe(true);
    await s.lists.fill(following, async () => []);
    expect(await s.lists.all(following)).toEqual([]);
    gate.resolve();
    expect(await follow).toBe(true);
    expect((await s.lists.all(following)) ?? []).toEqual([]);
    s.service.close();
  });
});
