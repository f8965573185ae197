import { Type, type Static } from 'typebox';
import { Nullable } from '../platform/http/schemas.js';

export const DetailParams = Type.Object({ id: Type.String({ pattern: '^[1-9][0-9]{0,18}$' }) });

export const KnowPostDetailResponse = Type.Object({
  id: Type.String(),
  title: Nullable(Type.String()),
  description: Nullable(Type.String()),
  /** Presigned GET of the body; the client fetches it. Null while a draft has no body. */
  contentUrl: Nullable(Type.String()),
  images: Type.Array(Type.String()),
  tags: Type.Array(Type.String()),
  authorId: Type.String(),
  authorAvatar: Nullable(Type.String()),
  authorNickname: Nullable(Type.String()),
  authorTagJson: Nullable(Type.String()),
  likeCount: Type.Integer(),
  favoriteCount: Type.Integer(),
  liked: Type.Boolean(),
  faved: Type.Boolean(),
  isTop: Type.Boolean(),
  visible: Type.String(),
  type: Type.String(),
  /** ISO-8601; null for a draft. */
  publishTime: Nullable(Type.String()),
});
export type KnowPostDetailResponse = Static<typeof KnowPostDetailResponse>;
