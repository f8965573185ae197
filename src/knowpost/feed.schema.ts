import { Type, type Static } from 'typebox';
import { Nullable } from '../platform/http/schemas.js';

export const MAX_PAGE_SIZE = 50;
export const DEFAULT_PAGE_SIZE = 20;
/**
 * How deep the public feed pages: through its newest 10,000 posts. A page is an OFFSET, which costs
 * the database a scan of every row it skips, and the feed is public.
 */
export const FEED_DEPTH = 10_000;

/** `size` outside 1–50 is clamped rather than refused (the contract); `page` is 1-based. */
export const PageQuery = Type.Object({
  page: Type.Optional(Type.Integer({ minimum: 1, maximum: 100_000, default: 1 })),
  size: Type.Optional(Type.Integer({ default: DEFAULT_PAGE_SIZE, description: 'clamped to 1–50' })),
});

export const FeedItemResponse = Type.Object({
  id: Type.String(),
  title: Nullable(Type.String()),
  description: Nullable(Type.String()),
  coverImage: Nullable(Type.String()),
  tags: Type.Array(Type.String()),
  authorAvatar: Nullable(Type.String()),
  authorNickname: Nullable(Type.String()),
  /** The author's tags, a JSON array as a string. */
  tagJson: Nullable(Type.String()),
  likeCount: Type.Integer(),
  favoriteCount: Type.Integer(),
  liked: Type.Boolean(),
  faved: Type.Boolean(),
  isTop: Type.Boolean(),
});
export type FeedItemResponse = Static<typeof FeedItemResponse>;

export const FeedPageResponse = Type.Object({
  items: Type.Array(FeedItemResponse),
  page: Type.Integer(),
  size: Type.Integer(),
  hasMore: Type.Boolean(),
});
export type FeedPageResponse = Static<typeof FeedPageResponse>;

export function clampSize(size: number | undefined): number {
  if (size === undefined) return DEFAULT_PAGE_SIZE;
  return Math.min(MAX_PAGE_SIZE, Math.max(1, size));
}
