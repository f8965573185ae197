import type { Counts, EntityRef } from '../counter/model.js';
import type { Flags } from '../counter/store/counter-store.js';
import { LruCache } from '../platform/cache/lru.js';
import { SingleFlight } from '../platform/cache/single-flight.js';
import { feedResponseBytes, type FeedEntry, type FeedPage } from './read-answers.js';
import type { PostCache } from './post-cache.js';
import type { PostReadRepository } from './post-read.repository.js';
import { isListed, type PostView } from './post-read.model.js';

/** Live counts and the viewer's flags, laid over cached posts on every request. */
export interface PostInteractions {
  /** Each post's counts, in order; one round trip (missing snapshots are rebuilt from facts). */
  counts(refs: readonly EntityRef[]): Promise<Counts[]>;
  /** Whether the user liked and favourited each post, in order; one round trip. */
  flags(userId: number, refs: readonly EntityRef[]): Promise<Flags[]>;
}

export const refOf = (id: string): EntityRef => ({ etype: 'knowpost', eid: id });

export const NO_FLAGS: Flags = { like: false, fav: false };

export interface AnonymousPagesOptions {
  /** How long a written page lives; also the most its counts may lag. */
  ttlMs: number;
  maxEntries: number;
  /** Counts read when a page is written: not through a cache, so they are no older than the page. */
  counts: PostInteractions['counts'];
  now?: () => number;
}

/**
 * The public feed and the author's own list. A page costs the same number of round trips whatever
 * its size: the page of ids, one batched load of posts, one of authors, one read of counts and one of
 * flags (when signed in); the first three are mostly served from the caches.
 *
 * Anonymous pages are the same for every caller, so with `anonymous` set, their written answer
 * (the JSON bytes) is kept for a fraction of a second, one writer per page at a time. Any local
 * invalidation of the post cache (a post changed anywhere, or the bus lost messages) makes every kept
 * page invalid at once, and a page written across such an invalidation is not kept.
 */
export class FeedService {
  private readonly anonymousPages: LruCache<{ bytes: Buffer; generation: number }> | null;
  private readonly pageWrites = new SingleFlight<Buffer>();
  private readonly cachedCounts: PostInteractions['counts'] = (refs) => this.interactions.counts(refs);

  constructor(
    private readonly cache: PostCache,
    private readonly repo: PostReadRepository,
    private readonly interactions: PostInteractions,
    private readonly anonymous?: AnonymousPagesOptions,
  ) {
    this.anonymousPages =
      anonymous && anonymous.ttlMs > 0
        ? new LruCache({
            ttlMs: anonymous.ttlMs,
            maxEntries: anonymous.maxEntries,
            ...(anonymous.now ? { now: anonymous.now } : {}),
          })
        : null;
  }

  /** The public feed's answer for a caller who sent no token, as `feedResponseBytes` writes it. */
  async anonymousFeedBytes(page: number, size: number): Promise<Buffer> {
    const pages = this.anonymousPages;
    const counts = this.anonymous?.counts;
    if (!pages || !counts) return feedResponseBytes(await this.feed(page, size, null));
    const key = `${page}:${size}`;
    const kept = pages.get(key);
    if (kept && kept.generation === this.cache.localGeneration) return kept.bytes;
    const generation = this.cache.localGeneration;
    // A write started before an invalidation is not joined by callers that come after it.
    const written = await this.pageWrites.do(`${key}:${generation}`, async () => {
      const bytes = feedResponseBytes(await this.feed(page, size, null, counts));
      if (generation === this.cache.localGeneration) pages.set(key, { bytes, generation });
      return bytes;
    });
    if (!written) throw new Error('feed page write produced nothing');
    return written;
  }

  /** Published public posts, newest first; `liked`/`faved` filled for a signed-in viewer. */
  async feed(
    page: number,
    size: number,
    viewerId: number | null,
    counts: PostInteractions['counts'] = this.cachedCounts,
  ): Promise<FeedPage> {
    const { ids, hasMore } = await this.cache.feedPage(page, size);
    const posts = await this.cache.postsById(ids);
    // Checked again on every hit: a page may be a moment older than a post's latest state.
    const shown = ids.flatMap((id) => {
      const post = posts.get(id);
      return post && isListed(post) ? [post] : [];
    });
    return { entries: await this.entries(shown, viewerId, counts), page, size, hasMore };
  }

  /** The caller's published posts of any visibility, top ones first, then newest. */
  async mine(page: number, size: number, userId: number): Promise<FeedPage> {
    const { ids, hasMore } = await this.repo.authorPage(userId, page, size);
    const posts = await this.cache.postsById(ids);
    const shown = ids.flatMap((id) => {
      const post = posts.get(id);
      return post && post.authorId === userId && post.status === 'published' ? [post] : [];
    });
    return { entries: await this.entries(shown, userId, this.cachedCounts), page, size, hasMore };
  }

  private async entries(
    posts: readonly PostView[],
    viewerId: number | null,
    readCounts: PostInteractions['counts'],
  ): Promise<FeedEntry[]> {
    if (posts.length === 0) return [];
    const refs = posts.map((p) => refOf(p.id));
    const [authors, counts, flags] = await Promise.all([
      this.cache.authors(posts.map((p) => p.authorId)),
      readCounts(refs),
      viewerId === null ? Promise.resolve([]) : this.interactions.flags(viewerId, refs),
    ]);
    return posts.map((post, i) => ({
      post,
      author: authors.get(post.authorId),
      counts: counts[i],
      flags: flags[i] ?? NO_FLAGS,
    }));
  }
}
