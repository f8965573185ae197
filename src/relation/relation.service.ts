import type { Logger } from 'pino';
import type { InvalidationBus } from '../platform/cache/invalidation-bus.js';
import { LruCache, roughBytes } from '../platform/cache/lru.js';
import { SingleFlight } from '../platform/cache/single-flight.js';
import { BadRequestError, NotFoundError } from '../platform/errors/errors.js';
import { enforceLimit, type RateLimiter } from '../platform/ratelimit/ratelimit.js';
import type { UserRow } from '../profile/users.repository.js';
import type { UserCounts } from '../user-counter/model.js';
import type { ListCache, ListPage, ListRef } from './list-cache/list-cache.js';
import { listKey } from './list-cache/list-cache.js';
import {
  encodeCursor,
  slicePage,
  type ListEntry,
  type ListKind,
  type ListPosition,
  type RelationEvent,
} from './model.js';
import { toPublicProfile, type PublicProfile } from './public-profile.js';
import type { RelationMetrics } from './relation.metrics.js';
import type { RelationRepository } from './relation.repository.js';

/** Largest page a list request may ask for; also the size of a big account's cached first page. */
export const MAX_PAGE = 100;

/** Invalidation-bus scope of big accounts' first followers pages; keys are user ids. */
export const FIRST_PAGE_SCOPE = 'relation-first-page';
/** Most bytes (about) of big accounts' first pages one process keeps. */
const FIRST_PAGES_MAX_BYTES = 64 * 1024 * 1024;

export interface RelationLimits {
  /** Follows plus unfollows one user may make per minute. */
  changesPerMinute: number;
  /** Users with at least this many followers keep their first followers page in process. */
  bigAccountFollowers: number;
  firstPageTtlMs: number;
  /** Longest list the list cache holds (the cache's own `maxEntries`). */
  listCacheMaxEntries: number;
}

/** Where the service learns how many followers and followings users have (the user counters). */
export interface UserCountsReader {
  countsMany(userIds: readonly number[]): Promise<(UserCounts | null)[]>;
}

/** The part of the users table the service needs. */
export interface UserDirectory {
  findById(id: number): Promise<UserRow | undefined>;
  findByIds(ids: readonly number[]): Promise<UserRow[]>;
}

export interface RelationServiceDeps {
  repo: RelationRepository;
  users: UserDirectory;
  limiter: RateLimiter;
  lists: ListCache;
  counts: UserCountsReader;
  bus: InvalidationBus;
  metrics: RelationMetrics;
  limits: RelationLimits;
  log: Logger;
  /** Told after a change committed (the outbox relay publishes sooner when it runs in this process). */
  onCommitted?: () => void;
  now?: () => number;
}

export interface RelationStatus {
  following: boolean;
  followedBy: boolean;
  mutual: boolean;
}

export interface ListResult {
  items: PublicProfile[];
  /** Cursor of the last item when more follow, else null. */
  nextCursor: string | null;
}

interface FirstPage {
  entries: ListEntry[];
  /** Profiles by user id (public fields only: the page is shared by every caller). */
  profiles: Map<number, PublicProfile>;
  more: boolean;
}

/**
 * Follow, unfollow, status and lists.
 *
 * Writes: a change commits the `following` row with its outbox event (nothing when the state does
 * not change); afterwards, the caller's process updates the cached lists it can (so the caller sees
 * their own change at once) and announces the change to every process's first-page cache. The
 * relation-proj consumer then does the same from the event, which is what makes it certain.
 *
 * Reads: status reads the truth. Lists come from a complete cached list when there is one, from the
 * database otherwise (and the database result fills the cache); lists longer than the cache holds
 * page in the database through its indexes. Big accounts' first followers page is also kept in
 * process for a short time.
 */
export class RelationService {
  private readonly repo: RelationRepository;
  private readonly users: UserDirectory;
  private readonly lists: ListCache;
  private readonly metrics: RelationMetrics;
  private readonly limits: RelationLimits;
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly fills = new SingleFlight<{ entries: ListEntry[]; cached: boolean }>();
  private readonly firstPages: LruCache<FirstPage>;
  /**
   * Invalidation generation of each user whose first page is being loaded (entries exist only while
   * a load is in flight). An invalidation bumps it; a load caches its page only if the generation it
   * read before reading the database is still current.
   */
  private readonly firstPageLoads = new Map<string, { generation: number; loads: number }>();
  private readonly firstPageFlights = new SingleFlight<FirstPage>();
  private readonly unsubscribe: () => void;
  /**
   * Users known to exist (accounts are never deleted, so a found user stays found): a follow of a
   * known user skips the lookup. Only hits are kept; an unknown id is looked up every time.
   */
  private readonly knownUsers: LruCache<true>;

  constructor(private readonly deps: RelationServiceDeps) {
    this.repo = deps.repo;
    this.users = deps.users;
    this.lists = deps.lists;
    this.metrics = deps.metrics;
    this.limits = deps.limits;
    this.log = deps.log;
    this.now = deps.now ?? Date.now;
    this.firstPages = new LruCache<FirstPage>({
      maxEntries: 10_000,
      // A page of 100 profiles with their bios and tags is a few hundred kilobytes.
      maxWeight: FIRST_PAGES_MAX_BYTES,
      weigh: (page) => roughBytes(page.entries) + roughBytes(page.profiles),
      ttlMs: deps.limits.firstPageTtlMs,
      now: this.now,
    });
    this.knownUsers = new LruCache<true>({ maxEntries: 100_000, ttlMs: 3_600_000, now: this.now });
    const stopChanges = deps.bus.subscribe(FIRST_PAGE_SCOPE, (keys) => {
      for (const key of keys) {
        this.firstPages.delete(key);
        this.firstPageFlights.forget(key);
        const inFlight = this.firstPageLoads.get(key);
        if (inFlight) inFlight.generation += 1;
      }
    });
    // Back on the bus after a disconnection: any page may have changed meanwhile.
    const stopGaps = deps.bus.onGap(() => {
      this.firstPages.clear();
      for (const [key, inFlight] of this.firstPageLoads) {
        inFlight.generation += 1;
        this.firstPageFlights.forget(key);
      }
    });
    this.unsubscribe = () => {
      stopChanges();
      stopGaps();
    };
  }

  close(): void {
    this.unsubscribe();
  }

  async follow(me: number, toUserId: number): Promise<boolean> {
    await this.checkChange(me, toUserId, 'follow');
    const event = await this.repo.follow(me, toUserId, this.now());
    this.metrics.changes.inc({ action: 'follow', changed: String(event !== null) });
    if (event) await this.afterChange(event);
    return event !== null;
  }

  async unfollow(me: number, toUserId: number): Promise<boolean> {
    await this.checkChange(me, toUserId, 'unfollow');
    const event = await this.repo.unfollow(me, toUserId, this.now());
    this.metrics.changes.inc({ action: 'unfollow', changed: String(event !== null) });
    if (event) await this.afterChange(event);
    return event !== null;
  }

  async status(me: number, other: number): Promise<RelationStatus> {
    if (other !== me && !(await this.users.findById(other))) throw new NotFoundError('No such user');
    if (other === me) return { following: false, followedBy: false, mutual: false };
    const { following, followedBy } = await this.repo.between(me, other);
    return { following, followedBy, mutual: following && followedBy };
  }

  async list(owner: number, kind: ListKind, position: ListPosition, limit: number): Promise<ListResult> {
    if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_PAGE) {
      throw new BadRequestError(`querystring.limit must be from 1 to ${MAX_PAGE}`);
    }
    if (!(await this.userExists(owner))) throw new NotFoundError('No such user');
    const size = await this.listSize(owner, kind);
    const isFirstPage = 'offset' in position && position.offset === 0;
    if (kind === 'followers' && isFirstPage && size !== null && size >= this.limits.bigAccountFollowers) {
      return this.bigAccountFirstPage(owner, limit);
    }
    const page = await this.entries({ owner, kind }, position, limit, size);
    return { items: await this.profiles(page.entries), nextCursor: cursorAfter(page) };
  }

  /**
   * Rejects a change that must not happen, in this order: yourself, too many changes, an unknown
   * user. The rate limit and the user lookup run side by side; both are awaited before deciding, so
   * the answer does not depend on which finishes first (a change to an unknown user still counts
   * against the limit, as it did when they ran one after the other).
   */
  private async checkChange(me: number, toUserId: number, action: string): Promise<void> {
    if (toUserId === me) throw new BadRequestError(`querystring.toUserId: you cannot ${action} yourself`);
    const [limited, target] = await Promise.allSettled([
      enforceLimit(
        this.deps.limiter,
        `relation:change:${me}`,
        this.limits.changesPerMinute,
        60_000,
        'follow changes',
      ),
      this.userExists(toUserId),
    ]);
    if (limited.status === 'rejected') throw limited.reason;
    if (target.status === 'rejected') throw target.reason;
    if (!target.value) throw new NotFoundError('No such user');
  }

  private async userExists(id: number): Promise<boolean> {
    const key = String(id);
    if (this.knownUsers.get(key)) return true;
    const found = (await this.users.findById(id)) !== undefined;
    if (found) this.knownUsers.set(key, true);
    return found;
  }

  /**
   * The caller's own view, at once: the cached lists of both users are dropped, and every process
   * forgets the followed user's first page. Best effort: the consumer brings the lists up to date
   * from the event.
   *
   * Dropped rather than given the change: a write of this change could land late (a stalled
   * process, a slow Redis) after a newer change of the same pair and after the consumer, and put
   * back a state nothing corrects; a late drop costs a refill at most. Only the drop is awaited: it
   * is what lets the caller's next request, on any process, read their own change (from the
   * database; the consumer may run later). The first-page announcement reaches this process's cache
   * synchronously inside `publish`; other processes can never be waited for (the bus delivers to
   * them after `publish` returns), so its round trip to the bus is not awaited.
   */
  private async afterChange(event: RelationEvent): Promise<void> {
    this.deps.onCommitted?.();
    const lists: ListRef[] = [
      { owner: event.fromUserId, kind: 'following' },
      { owner: event.toUserId, kind: 'followers' },
    ];
    for (const list of lists) this.fills.forget(listKey(list));
    const announce = async () => this.deps.bus.publish(FIRST_PAGE_SCOPE, [String(event.toUserId)]);
    announce().catch((err: unknown) => {
      this.log.warn({ err }, 'first-page invalidation not announced; the consumer will');
    });
    try {
      await this.lists.invalidate(lists);
    } catch (err) {
      this.log.warn({ err }, 'list caches not dropped after a relation change; the consumer updates them');
    }
  }

  /** How long a list is by the user counters; null when they cannot say (then the cache decides). */
  private async listSize(owner: number, kind: ListKind): Promise<number | null> {
    try {
      const [counts] = await this.deps.counts.countsMany([owner]);
      if (!counts) return null;
      return kind === 'following' ? counts.followings : counts.followers;
    } catch (err) {
      this.log.warn({ err }, 'user counters unavailable; listing without them');
      return null;
    }
  }

  private async entries(
    list: ListRef,
    position: ListPosition,
    limit: number,
    size: number | null,
  ): Promise<ListPage> {
    const max = this.limits.listCacheMaxEntries;
    if (size !== null && size > max) {
      this.metrics.cacheReads.inc({ cache: 'list', result: 'bypass' });
      return this.repo.page(list.owner, list.kind, position, limit);
    }
    try {
      const hit = await this.lists.page(list, position, limit);
      if (hit) {
        this.metrics.cacheReads.inc({ cache: 'list', result: 'hit' });
        return hit;
      }
      this.metrics.cacheReads.inc({ cache: 'list', result: 'miss' });
      const filled = await this.fills.do(listKey(list), () =>
        this.lists.fill(list, () => this.repo.head(list.owner, list.kind, max + 1)),
      );
      // A fill not kept was too long, or a change came while it loaded, perhaps the caller's own on
      // another process, which a request that joined the fill late must see: read the database.
      if (filled?.cached) return slicePage(filled.entries, position, limit);
    } catch (err) {
      this.metrics.cacheReads.inc({ cache: 'list', result: 'error' });
      this.log.warn({ err }, 'list cache unavailable; reading the database');
    }
    return this.repo.page(list.owner, list.kind, position, limit);
  }

  private async bigAccountFirstPage(owner: number, limit: number): Promise<ListResult> {
    const key = String(owner);
    let page = this.firstPages.get(key);
    if (page) this.metrics.cacheReads.inc({ cache: 'first-page', result: 'hit' });
    else {
      this.metrics.cacheReads.inc({ cache: 'first-page', result: 'miss' });
      const loads = this.firstPageLoads.get(key) ?? { generation: 0, loads: 0 };
      this.firstPageLoads.set(key, loads);
      loads.loads += 1;
      try {
        // Callers that miss together share one load; an invalidation detaches it (see the bus
        // handlers), so a caller after a change (its author, say) never gets a page read before it.
        page = (await this.firstPageFlights.do(key, async () => {
          const generation = loads.generation;
          // Read straight from the database: a big account's list is longer than the list cache holds.
          const loaded = await this.repo.page(owner, 'followers', { offset: 0 }, MAX_PAGE);
          const profiles = new Map((await this.profiles(loaded.entries)).map((p) => [p.id, p]));
          const read = { entries: loaded.entries, profiles, more: loaded.more };
          // An invalidation during the load may postdate what was read: serve it, but do not keep it.
          if (loads.generation === generation) this.firstPages.set(key, read);
          return read;
        }))!;
      } finally {
        loads.loads -= 1;
        if (loads.loads === 0) this.firstPageLoads.delete(key);
      }
    }
    const entries = page.entries.slice(0, limit);
    const more = page.entries.length > limit || page.more;
    const items = entries.flatMap((e) => {
      const p = page.profiles.get(e.userId);
      return p ? [p] : [];
    });
    return { items, nextCursor: cursorAfter({ entries, more }) };
  }

  /** Public profiles of the entries' users, in entry order, in one query. */
  private async profiles(entries: readonly ListEntry[]): Promise<PublicProfile[]> {
    if (entries.length === 0) return [];
    const rows = await this.users.findByIds(entries.map((e) => e.userId));
    const byId = new Map(rows.map((r) => [Number(r.id), r]));
    return entries.flatMap((e) => {
      const row = byId.get(e.userId);
      return row ? [toPublicProfile(row)] : [];
    });
  }
}

function cursorAfter(page: ListPage): string | null {
  const last = page.entries[page.entries.length - 1];
  return page.more && last ? encodeCursor(last) : null;
}
