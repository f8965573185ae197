import { Type } from 'typebox';

export const UserCounterQuery = Type.Object(
  { userId: Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER }) },
  { additionalProperties: false },
);

const Count = Type.Integer({ minimum: 0 });

/** api.md "Relations": `likedPosts` and `favedPosts` are the likes and favourites the user's posts received. */
export const UserCounterResponse = Type.Object(
  {
    followings: Count,
    followers: Count,
    posts: Count,
    likedPosts: Count,
    favedPosts: Count,
  },
  { additionalProperties: false },
);
