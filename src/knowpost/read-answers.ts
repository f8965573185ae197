import type { Counts } from '../counter/model.js';
import type { Flags } from '../counter/store/counter-store.js';
import type { KnowPostDetailResponse } from './detail.schema.js';
import type { FeedItemResponse, FeedPageResponse } from './feed.schema.js';
import type { PostView } from './post-read.model.js';
import type { AuthorRow } from './post-read.repository.js';

/**
 * The answers of the read side (feed pages and post details), first as what the request gathered
 * (posts, their authors, counts and flags), then written out two ways: as the contract's JSON model
 * (`feedResponse`, `detailResponse`) and as the same JSON in UTF-8 bytes (`…Bytes`), which is what
 * the routes send.
 *
 * Why bytes: a feed page of 20 is about 15 KB, nearly all of it the posts' own fields (a presigned
 * URL alone is some 430 bytes) and their authors'; with a Chinese nickname in it the whole answer
 * is a two-byte string, which a generic serializer escapes, measures and re-encodes to UTF-8 on
 * every request. Cached posts and authors stay the same objects until they are reloaded, so their
 * part of an answer is encoded once per object (held weakly: it goes when the object leaves the
 * caches), and only counts, flags and `isTop` are written per request.
 */

/** One post of a page with what the request laid over it. */
export interface FeedEntry {
  post: PostView;
  author: AuthorRow | undefined;
  counts: Counts | undefined;
  flags: Flags;
}

/** A feed page before it is written out. */
export interface FeedPage {
  entries: FeedEntry[];
  page: number;
  size: number;
  hasMore: boolean;
}

/** A post's detail before it is written out (same parts as a feed entry). */
export type Detail = FeedEntry;

export function feedResponse(p: FeedPage): FeedPageResponse {
  return { items: p.entries.map(feedItem), page: p.page, size: p.size, hasMore: p.hasMore };
}

function feedItem({ post, author, counts, flags }: FeedEntry): FeedItemResponse {
  return {
    id: post.id,
    title: post.title,
    description: post.description,
    coverImage: post.images[0] ?? null,
    tags: post.tags,
    authorAvatar: author?.avatar ?? null,
    authorNickname: author?.nickname ?? null,
    tagJson: author?.tagsJson ?? null,
    likeCount: counts?.[1] ?? 0,
    favoriteCount: counts?.[2] ?? 0,
    liked: flags.like,
    faved: flags.fav,
    isTop: post.isTop,
  };
}

export function detailResponse({ post, author, counts, flags }: Detail): KnowPostDetailResponse {
  return {
    id: post.id,
    title: post.title,
    description: post.description,
    contentUrl: post.contentUrl,
    images: post.images,
    tags: post.tags,
    authorId: String(post.authorId),
    authorAvatar: author?.avatar ?? null,
    authorNickname: author?.nickname ?? null,
    authorTagJson: author?.tagsJson ?? null,
    likeCount: counts?.[1] ?? 0,
    favoriteCount: counts?.[2] ?? 0,
    liked: flags.like,
    faved: flags.fav,
    isTop: post.isTop,
    visible: post.visible,
    type: post.type,
    publishTime: post.publishTime === null ? null : new Date(post.publishTime).toISOString(),
  };
}

const j = JSON.stringify;

/** The part of `value`'s answers encoded once per object. */
function encodedOnce<T extends object>(
  cache: WeakMap<T, Buffer>,
  value: T,
  encode: (v: T) => string,
): Buffer {
  let bytes = cache.get(value);
  if (!bytes) {
    bytes = Buffer.from(encode(value));
    cache.set(value, bytes);
  }
  return bytes;
}

/** Counts, flags and `isTop`: numbers and booleans only, so one byte per character. */
function live({ post, counts, flags }: FeedEntry): string {
  return `${liveCounts(counts)}${flagsJson(flags)}${liveTop(post)}`;
}

const liveCounts = (counts: Counts | undefined): string =>
  `"likeCount":${counts?.[1] ?? 0},"favoriteCount":${counts?.[2] ?? 0},`;
const flagsJson = (flags: Flags): string => `"liked":${flags.like},"faved":${flags.fav}`;
const liveTop = (post: PostView): string => `,"isTop":${post.isTop}`;

const feedPosts = new WeakMap<PostView, Buffer>();
const feedAuthors = new WeakMap<AuthorRow, Buffer>();
const FEED_NO_AUTHOR = Buffer.from('"authorAvatar":null,"authorNickname":null,"tagJson":null,');
const FEED_OPEN = Buffer.from('{"items":[');
const COMMA = Buffer.from(',');

/** `feedResponse(p)` as JSON in UTF-8: the page's template filled with its own flags. */
export function feedResponseBytes(p: FeedPage): Buffer {
  return fillFeedTemplate(feedTemplate(p), (i) => p.entries[i]!.flags);
}

/** The four ways a feed item's flags are written. */
const FLAG_BYTES = [false, true].map((like) =>
  [false, true].map((fav) => Buffer.from(flagsJson({ like, fav }), 'latin1')),
);

/**
 * A feed page written once with a gap where each item's `liked` and `faved` go, for answers that
 * differ only there (one per signed-in viewer of a page). `gaps` holds what is written between
 * them: one more part than the page has items.
 */
export interface FeedTemplate {
  gaps: Buffer[];
}

export function feedTemplate(p: FeedPage): FeedTemplate {
  const gaps: Buffer[] = [];
  let parts: Buffer[] = [FEED_OPEN];
  p.entries.forEach((e, i) => {
    if (i > 0) parts.push(COMMA);
    parts.push(
      encodedOnce(
        feedPosts,
        e.post,
        (post) =>
          `{"id":${j(post.id)},"title":${j(post.title)},"description":${j(post.description)},` +
          `"coverImage":${j(post.images[0] ?? null)},"tags":${j(post.tags)},`,
      ),
      e.author
        ? encodedOnce(
            feedAuthors,
            e.author,
            (a) =>
              `"authorAvatar":${j(a.avatar)},"authorNickname":${j(a.nickname)},"tagJson":${j(a.tagsJson)},`,
          )
        : FEED_NO_AUTHOR,
      Buffer.from(liveCounts(e.counts), 'latin1'),
    );
    gaps.push(Buffer.concat(parts));
    parts = [Buffer.from(`${liveTop(e.post)}}`, 'latin1')];
  });
  parts.push(Buffer.from(`],"page":${p.page},"size":${p.size},"hasMore":${p.hasMore}}`, 'latin1'));
  gaps.push(Buffer.concat(parts));
  return { gaps };
}

/** The page of `template` with the i-th item's flags from `flagsAt(i)`. */
export function fillFeedTemplate(template: FeedTemplate, flagsAt: (i: number) => Flags): Buffer {
  const { gaps } = template;
  const parts = new Array<Buffer>(2 * gaps.length - 1);
  let length = 0;
  for (let i = 0; i < gaps.length; i++) {
    const gap = gaps[i]!;
    parts[2 * i] = gap;
    length += gap.length;
    if (i === gaps.length - 1) break;
    const flags = flagsAt(i);
    const filled = FLAG_BYTES[flags.like ? 1 : 0]![flags.fav ? 1 : 0]!;
    parts[2 * i + 1] = filled;
    length += filled.length;
  }
  return Buffer.concat(parts, length);
}

const detailHeads = new WeakMap<PostView, Buffer>();
const detailTails = new WeakMap<PostView, Buffer>();
const detailAuthors = new WeakMap<AuthorRow, Buffer>();
const DETAIL_NO_AUTHOR = Buffer.from('"authorAvatar":null,"authorNickname":null,"authorTagJson":null,');

/** `detailResponse(d)` as JSON in UTF-8. */
export function detailResponseBytes(d: Detail): Buffer {
  return Buffer.concat([
    encodedOnce(
      detailHeads,
      d.post,
      (post) =>
        `{"id":${j(post.id)},"title":${j(post.title)},"description":${j(post.description)},` +
        `"contentUrl":${j(post.contentUrl)},"images":${j(post.images)},"tags":${j(post.tags)},` +
        `"authorId":${j(String(post.authorId))},`,
    ),
    d.author
      ? encodedOnce(
          detailAuthors,
          d.author,
          (a) =>
            `"authorAvatar":${j(a.avatar)},"authorNickname":${j(a.nickname)},"authorTagJson":${j(a.tagsJson)},`,
        )
      : DETAIL_NO_AUTHOR,
    Buffer.from(live(d), 'latin1'),
    encodedOnce(
      detailTails,
      d.post,
      (post) =>
        `,"visible":${j(post.visible)},"type":${j(post.type)},` +
        `"publishTime":${j(post.publishTime === null ? null : new Date(post.publishTime).toISOString())}}`,
    ),
  ]);
}
