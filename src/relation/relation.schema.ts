import { Type } from 'typebox';
import { Nullable } from '../platform/http/schemas.js';
import { MAX_PAGE } from './relation.service.js';

const UserId = Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER });

export const TargetQuery = Type.Object({ toUserId: UserId }, { additionalProperties: false });

/**
 * Offsets beyond this page through the cursor instead: the database walks every skipped entry, and
 * a list past the cache's length is read from it, so a deep offset costs a walk of that many.
 */
export const MAX_OFFSET = 100_000;
export const DEFAULT_LIST_LIMIT = 20;

export const ListQuery = Type.Object(
  {
    userId: UserId,
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: MAX_PAGE, default: DEFAULT_LIST_LIMIT })),
    offset: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 2_147_483_647,
        default: 0,
        description: `at most ${MAX_OFFSET} (ignored with a cursor); page further with cursor (X-Next-Cursor)`,
      }),
    ),
    cursor: Type.Optional(
      Type.String({
        maxLength: 40,
        description: 'X-Next-Cursor of the previous page; the page starts after it and offset is ignored',
      }),
    ),
  },
  { additionalProperties: false },
);

export const ChangedResponse = Type.Boolean({ description: 'true when the state changed' });

export const StatusResponse = Type.Object({
  following: Type.Boolean(),
  followedBy: Type.Boolean(),
  mutual: Type.Boolean(),
});

/** `ProfileResponse` without phone and e-mail. */
export const PublicProfileResponse = Type.Object({
  id: Type.Integer(),
  nickname: Type.String(),
  avatar: Type.String(),
  bio: Nullable(Type.String()),
  zgId: Type.String(),
  gender: Type.String(),
  birthday: Nullable(Type.String()),
  school: Nullable(Type.String()),
  tagJson: Type.String(),
});

export const ListResponse = Type.Array(PublicProfileResponse, {
  // Documented with the answer (the serializer leaves it alone).
  headers: {
    'X-Next-Cursor': {
      type: 'string',
      description: 'The cursor of the next page, sent only when more items follow',
    },
  },
});
