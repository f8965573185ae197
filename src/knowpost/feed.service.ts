import type { Counts, EntityRef } from '../counter/model.js';
import type { Flags } from '../counter/store/counter-store.js';
import { AnonymousAnswers, type AnonymousAnswersOptions } from './anonymous-answers.js';
import { FEED_DEPTH } from './feed.schema.js';
import {
  feedResponseBytes,
  feedTemplate,
  fillFeedTemplate,
  type FeedEntry,
  type FeedPage,
  type FeedTemplate,
} from './read-answers.js';
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

/**
 * An anonymous feed page as kept: what it was written from, the written answer, and the same
 * answer with gaps for a signed-in viewer's flags.
 */
interface KeptPage {
  page: FeedPage;
  bytes: Buffer;
  template: FeedTemplate;
}

/** The bytes a kept page holds: its answer and its template (the posts are the post cache's). */
function keptPageBytes(kept: KeptPage): number {
  let bytes = kept.bytes.length;
  for (const gap of kept.template.gaps) bytes += gap.length;
  return bytes;
}

/** Where anonymous pages are kept, and the counts they are written with. */
interface KeptPages {
  answers: AnonymousAnswers<KeptPage>;
  counts: PostInteractions['counts'];
}

/**
 * The public feed and the author's own list. A page costs the same number of round trips whatever
 * its size: the page of ids, one batched load of posts, one of authors, one read of counts and one of
 * flags (when signed in); the first three are mostly served from the caches.
 *
 * Anonymous pages are the same for every caller, so with `anonymous` set, each page is kept for a
 * fraction of a second (see `AnonymousAnswers`) with its written answer. A signed-in viewer's page
 * of the public feed is the same page with the viewer's flags laid over it: it is written from the
 * kept page, so only the flags are read per request.
 */
export class FeedService {
  private readonly anonymousPages: KeptPages | null;
  private readonly cachedCounts: PostInteractions['counts'] = (refs) => this.interactions.counts(refs);

  constructor(
    private readonly cache: PostCache,
    private readonly repo: PostReadRepository,
    private readonly interactions: PostInteractions,
    anonymous?: AnonymousAnswersOptions,
    /** The public feed pages through this many of its newest posts (see `FEED_DEPTH`). */
    readonly depth = FEED_DEPTH,
  ) {
    this.anonymousPages =
      anonymous && anonymous.ttlMs > 0
        ? {
            answers: new AnonymousAnswers(() => cache.localGeneration, anonymous, keptPageBytes),
            counts: anonymous.counts,
          }
        : null;
  }

  /** The public feed's answer for a caller who sent no token, as `feedResponseBytes` writes it. */
  async anonymousFeedBytes(page: number, size: number): Promise<Buffer> {
    const pages = this.anonymousPages;
    if (!pages) return feedResponseBytes(await this.feed(page, size, null));
    return (await this.keptPage(pages, page, size)).bytes;
  }

  /**
   * The public feed's answer for a signed-in viewer: `liked`/`faved` filled. With a kept page, only
   * the flags are read. Without one, the flags of the page's ids are read while the page is written
   * (its posts and counts), so a cold page waits on one round trip of each kind, side by side.
   */
  async viewerFeedBytes(page: number, size: number, viewerId: number): Promise<Buffer> {
    const pages = this.anonymousPages;
    if (!pages) return feedResponseBytes(await this.feed(page, size, viewerId));
    const hot = pages.answers.peek(`${page}:${size}`);
    if (hot) return this.withFlags(hot, viewerId, new Map());
    const { ids } = await this.cache.feedPage(page, size, this.reach(page, size));
    const [kept, flags] = await Promise.all([
      this.keptPage(pages, page, size),
      ids.length > 0 ? this.interactions.flags(viewerId, ids.map(refOf)) : Promise.resolve([]),
    ]);
    return this.withFlags(kept, viewerId, new Map(ids.map((id, i) => [id, flags[i] ?? NO_FLAGS])));
  }

  /** `kept` with the viewer's flags: those in `known`, the rest (if any) read now. */
  private async withFlags(kept: KeptPage, viewerId: number, known: Map<string, Flags>): Promise<Buffer> {
    const { entries } = kept.page;
    if (entries.length === 0) return kept.bytes;
    // The page may have been written from a newer list of ids than the one whose flags were read.
    const missing = entries.filter((e) => !known.has(e.post.id));
    if (missing.length > 0) {
      const read = await this.interactions.flags(
        viewerId,
        missing.map((e) => refOf(e.post.id)),
      );
      missing.forEach((e, i) => known.set(e.post.id, read[i] ?? NO_FLAGS));
    }
    return fillFeedTemplate(kept.template, (i) => known.get(entries[i]!.post.id) ?? NO_FLAGS);
  }

  /** The kept anonymous page, written now when there is none. */
  private keptPage(pages: KeptPages, page: number, size: number): Promise<KeptPage> {
    return pages.answers.get(`${page}:${size}`, async () => {
      const written = await this.feed(page, size, null, pages.counts);
      const template = feedTemplate(written);
      return { page: written, bytes: fillFeedTemplate(template, () => NO_FLAGS), template };
    });
  }

  /** Published public posts, newest first; `liked`/`faved` filled for a signed-in viewer. */
  async feed(
    page: number,
    size: number,
    viewerId: number | null,
    counts: PostInteractions['counts'] = this.cachedCounts,
  ): Promise<FeedPage> {
    const { ids, hasMore } = await this.cache.feedPage(page, size, this.reach(page, size));
    const posts = await this.cache.postsById(ids);
    // Checked again on every hit: a page may be a moment older than a post's latest state.
    const shown = ids.flatMap((id) => {
      const post = posts.get(id);
      return post && isListed(post) ? [post] : [];
    });
    return {
      entries: await this.entries(shown, viewerId, counts),
      page,
      size,
      hasMore: hasMore && page * size < this.depth,
    };
  }

  /** How much of a page lies within the depth: a page reaching past it is cut there (the route answers pages starting past it). */
  private reach(page: number, size: number): number {
    return Math.max(1, Math.min(size, this.depth - (page - 1) * size));
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
