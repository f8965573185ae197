import type { InvalidationBus } from '../platform/cache/invalidation-bus.js';
import { LruCache, roughBytes } from '../platform/cache/lru.js';
import type { SharedCache } from '../platform/cache/shared-cache.js';
import { SingleFlight } from '../platform/cache/single-flight.js';
import { TieredCache } from '../platform/cache/tiered-cache.js';
import { MAX_PAGE_SIZE } from './feed.schema.js';
import type { PostChangeListener } from './post-events.js';
import type { AuthorRow, IdPage, PostReadRepository } from './post-read.repository.js';
import { isListed, type PostUrlSigner, type PostView } from './post-read.model.js';

/** Bus scope of post changes; its keys are post ids. */
export const POST_INVALIDATION_SCOPE = 'knowpost';

const FEED_GUARD = 'feed';
/** Most bytes (about) of posts one process keeps, whatever `localMaxEntries` allows. */
const LOCAL_POSTS_MAX_BYTES = 128 * 1024 * 1024;
/**
 * Feed pages are cut from blocks of this many ids at fixed offsets, and the blocks are what both
 * tiers keep: whatever pages and sizes callers ask for, the feed's depth makes at most
 * `FEED_DEPTH / FEED_BLOCK` keys, not one per page and size (which anyone could use to push the
 * pages everyone reads out of the in-process tier).
 */
const FEED_BLOCK = MAX_PAGE_SIZE;
const FEED_BLOCK_PREFIX = 'feed:block:';
const postKey = (id: string) => `post:${id}`;

export interface PostCacheOptions {
  repo: PostReadRepository;
  signer: PostUrlSigner;
  shared: SharedCache;
  /** In-process tier: posts, feed pages and authors live this long in each process. */
  localTtlMs: number;
  localMaxEntries: number;
  /** About how many bytes of posts this process keeps at most (default 128 MiB). */
  localMaxBytes?: number;
  /** Shared tier (cluster): posts and feed pages live this long in Redis. */
  sharedTtlMs: number;
  /**
   * How much longer than `localTtlMs` authors read lately are still shown when the database cannot
   * be read (default 0: never); posts and pages are not (they are bounded by the shared tier).
   */
  staleIfErrorMs?: number;
  onError?: (err: unknown) => void;
  now?: () => number;
}

/**
 * Shared-tier values carry the version of their shape: a process that reads another version's value
 * (a rolling deploy) treats it as a miss and loads from the database. 2: bodies and images may be
 * stored copies (`body/`, `pictures/`), which a version-1 process would not sign.
 */
const FORMAT = 2;

function encode(value: PostView | IdPage): string {
  return JSON.stringify({ v: FORMAT, d: value });
}

function decoded(text: string): Record<string, unknown> | null {
  try {
    const wrapped = JSON.parse(text) as { v?: unknown; d?: unknown };
    return wrapped.v === FORMAT && typeof wrapped.d === 'object' && wrapped.d !== null
      ? (wrapped.d as Record<string, unknown>)
      : null;
  } catch {
    return null;
  }
}

function decodePost(text: string): PostView | null {
  const v = decoded(text);
  return v && typeof v.id === 'string' && typeof v.authorId === 'number' && Array.isArray(v.images)
    ? (v as unknown as PostView)
    : null;
}

function decodePage(text: string): IdPage | null {
  const v = decoded(text);
  return v && Array.isArray(v.ids) && typeof v.hasMore === 'boolean'
    ? { ids: v.ids as string[], hasMore: v.hasMore }
    : null;
}

/**
 * The caches of the read side, each read through to the database:
 *  - posts by id (two tiers), holding only published public posts: nothing a viewer may
 *    not see is ever stored where another viewer's request could read it, and nothing per viewer;
 *    other posts are loaded for each request;
 *  - the public feed as blocks of ids at fixed offsets (two tiers), from which pages are cut, all
 *    under one guard, so a change to any post drops every block at once;
 *  - authors' public fields (in process only, short-lived: profile edits show within `localTtlMs`;
 *    while the database cannot be read, those read within `staleIfErrorMs` more are shown).
 * Readers still check each post's visibility on every hit (`mayRead`, `isListed`).
 */
export class PostCache {
  private readonly posts: TieredCache<PostView>;
  private readonly pages: TieredCache<IdPage>;
  private readonly authorCache: LruCache<AuthorRow>;
  /** The same rows kept longer, shown only when the database cannot be read. */
  private readonly authorsKept: LruCache<AuthorRow>;
  private readonly authorFlights = new SingleFlight<AuthorRow>();
  private readonly repo: PostReadRepository;
  private readonly signer: PostUrlSigner;
  private generation = 0;

  constructor(options: PostCacheOptions) {
    this.repo = options.repo;
    this.signer = options.signer;
    const onSharedError = options.onError ?? (() => {});
    const local = {
      ttlMs: options.localTtlMs,
      maxEntries: options.localMaxEntries,
      ...(options.now ? { now: options.now } : {}),
    };
    this.posts = new TieredCache<PostView>({
      // A post may hold 20 image URLs of a kilobyte and more: bounded in bytes as well.
      local: { ...local, maxWeight: options.localMaxBytes ?? LOCAL_POSTS_MAX_BYTES, weigh: roughBytes },
      shared: options.shared,
      sharedTtlMs: options.sharedTtlMs,
      encode,
      decode: decodePost,
      cacheable: isListed,
      onSharedError,
    });
    this.pages = new TieredCache<IdPage>({
      local: { ...local, maxEntries: Math.min(options.localMaxEntries, 1_000) },
      shared: options.shared,
      sharedTtlMs: options.sharedTtlMs,
      encode,
      decode: decodePage,
      guardOf: () => FEED_GUARD,
      onSharedError,
    });
    this.authorCache = new LruCache<AuthorRow>(local);
    const staleMs = options.staleIfErrorMs ?? 0;
    this.authorsKept = new LruCache<AuthorRow>({
      ...local,
      ttlMs: staleMs > 0 && local.ttlMs > 0 ? local.ttlMs + staleMs : 0,
    });
  }

  /** The posts with these ids that exist, in any state (callers decide who may see what). */
  async postsById(ids: readonly string[]): Promise<Map<string, PostView>> {
    const found = await this.posts.getMany(ids.map(postKey), async (keys) => {
      const rows = await this.repo.loadPosts(keys.map((k) => k.slice('post:'.length)));
      const signed = await Promise.all(rows.map((row) => this.signer.sign(row)));
      return new Map(signed.map((p) => [postKey(p.id), p]));
    });
    const byId = new Map<string, PostView>();
    await Promise.all(
      [...found.values()].map(async (p) => {
        byId.set(p.id, await this.signer.refresh(p));
      }),
    );
    return byId;
  }

  async post(id: string): Promise<PostView | undefined> {
    return (await this.postsById([id])).get(id);
  }

  /**
   * One page of the public feed: ids, newest first (`size` at most `FEED_BLOCK`). Cut from the one or
   * two blocks it spans; when any is not cached, all of them are read with one query.
   */
  async feedPage(page: number, size: number, take = size): Promise<IdPage> {
    if (!Number.isSafeInteger(size) || size < 1 || size > FEED_BLOCK)
      throw new RangeError(`feed page size out of range: ${size}`);
    if (!Number.isSafeInteger(take) || take < 1 || take > size)
      throw new RangeError(`feed page cut out of range: ${take}`);
    const start = (page - 1) * size;
    const first = Math.floor(start / FEED_BLOCK);
    const last = Math.floor((start + take - 1) / FEED_BLOCK);
    const keys: string[] = [];
    for (let b = first; b <= last; b++) keys.push(`${FEED_BLOCK_PREFIX}${b}`);
    // Blocks not cached are read together with the page's others, and the page is cut from that one
    // read: two blocks cached at different moments may disagree at their edge. (A page whose missing
    // block another request is loading joins that load and mixes it with its cached block; the
    // feed's guard drops both at the next change.)
    let read: Map<string, IdPage> | undefined;
    const cached = await this.pages.getMany(keys, async () => {
      const ids = await this.repo.feedIds(first * FEED_BLOCK, keys.length * FEED_BLOCK + 1);
      read = new Map(
        keys.map((key, i) => {
          const from = i * FEED_BLOCK;
          return [key, { ids: ids.slice(from, from + FEED_BLOCK), hasMore: ids.length > from + FEED_BLOCK }];
        }),
      );
      return read;
    });
    const found = read ?? cached;
    // The blocks' ids in a row, from the first block's start; a block not full is the feed's end.
    const ids: string[] = [];
    let more = false;
    for (const key of keys) {
      const block = found.get(key) ?? { ids: [], hasMore: false };
      ids.push(...block.ids);
      more = block.hasMore;
      if (block.ids.length < FEED_BLOCK) break;
    }
    const from = start - first * FEED_BLOCK;
    return {
      ids: ids.slice(from, from + take),
      hasMore: ids.length > from + take || (ids.length === from + take && more),
    };
  }

  /** Public fields of these users; one query for those not cached in this process. */
  async authors(ids: readonly number[]): Promise<Map<number, AuthorRow>> {
    const found = new Map<number, AuthorRow>();
    const missing: string[] = [];
    for (const id of new Set(ids)) {
      const hit = this.authorCache.get(String(id));
      if (hit) found.set(id, hit);
      else missing.push(String(id));
    }
    if (missing.length > 0) {
      const loaded = await this.authorFlights.many(missing, async (keys) => {
        let rows: AuthorRow[];
        try {
          rows = await this.repo.loadAuthors(keys.map(Number));
        } catch (err) {
          // The database is out of reach: authors read lately are shown as they were then.
          const kept = keys.map((key) => this.authorsKept.get(key));
          if (kept.some((row) => row === undefined)) throw err;
          return new Map(kept.map((row) => [String(row!.id), row!]));
        }
        for (const row of rows) {
          this.authorCache.set(String(row.id), row);
          this.authorsKept.set(String(row.id), row);
        }
        return new Map(rows.map((r) => [String(r.id), r]));
      });
      for (const [id, row] of loaded) found.set(Number(id), row);
    }
    return found;
  }

  /** Drops what this process holds for the posts, and every feed page, at once. */
  invalidateLocal(ids: readonly string[]): void {
    this.posts.invalidateLocal(ids.map(postKey));
    this.pages.invalidateLocal([FEED_GUARD]);
    this.generation += 1;
  }

  /** Drops everything this process holds (after it may have missed announcements). */
  clearLocal(): void {
    this.posts.clearLocal();
    this.pages.clearLocal();
    this.authorCache.clear();
    this.authorsKept.clear();
    this.generation += 1;
  }

  /**
   * Changes with every local invalidation: whatever was made from this cache's contents under an
   * older value may show a post as it no longer is.
   */
  get localGeneration(): number {
    return this.generation;
  }

  /** The same in the shared tier, for every process (one round trip). */
  async invalidateShared(ids: readonly string[]): Promise<void> {
    // Both settle before this does, even when one fails: a caller goes on to announce the change.
    const [posts, pages] = await Promise.allSettled([
      this.posts.invalidateShared(ids.map(postKey)),
      this.pages.invalidateShared([FEED_GUARD]),
    ]);
    for (const r of [posts, pages]) if (r.status === 'rejected') throw r.reason;
  }
}

/**
 * The listener the write side calls after each committed change: drops the post and the feed pages
 * from the shared tier, then announces the change on the bus, whose subscribers in every process
 * (this one synchronously) drop their in-process copies (see `subscribePostCache`). A change to a
 * post that was not published and public before it nor is after it (a draft created, edited or
 * deleted; a private post edited or pinned) changes nothing any cache holds.
 */
export function postCacheInvalidator(
  cache: PostCache,
  bus: InvalidationBus,
  onError: (err: unknown) => void,
): PostChangeListener {
  return async (change) => {
    // Only published public posts are cached or listed: a change to another one, which it was
    // before and still is after, need not drop every feed page. Except a change of who may see a
    // published post: every process's entity directory (see `app.ts`) hears of it on the bus.
    if (change.draft || (change.unlisted && change.kind !== 'visibility')) return;
    // This process first and synchronously, so its next read cannot be served the old post.
    cache.invalidateLocal([change.id]);
    // The shared tier before the announcement: a process that drops its copy on hearing it must not
    // read the old post back from there. The announcement goes out even if the drop failed.
    await cache.invalidateShared([change.id]).catch(onError);
    await bus.publish(POST_INVALIDATION_SCOPE, [change.id]).catch(onError);
  };
}

/**
 * Keeps this process's post caches in step with changes announced by any process, and empties them
 * when the bus may have lost announcements (a reconnect).
 */
export function subscribePostCache(cache: PostCache, bus: InvalidationBus): () => void {
  const stopChanges = bus.subscribe(POST_INVALIDATION_SCOPE, (ids) => cache.invalidateLocal(ids));
  const stopGaps = bus.onGap(() => cache.clearLocal());
  return () => {
    stopChanges();
    stopGaps();
  };
}
