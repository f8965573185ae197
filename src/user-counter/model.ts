import type { Counts } from '../counter/model.js';

/**
 * The user snapshot's vocabulary. Five unsigned 32-bit big-endian fields, in this order (design.md,
 * "The counter pipeline"); the codec is the one posts use (`counter/snapshot.ts`).
 */
export const USER_FIELDS = ['followings', 'followers', 'posts', 'likesReceived', 'favsReceived'] as const;
export type UserField = (typeof USER_FIELDS)[number];
export type UserCounts = Record<UserField, number>;

export const USER_FIELD_INDEX: Record<UserField, number> = {
  followings: 0,
  followers: 1,
  posts: 2,
  likesReceived: 3,
  favsReceived: 4,
};

export const ZERO_USER_COUNTS: Readonly<UserCounts> = Object.freeze({
  followings: 0,
  followers: 0,
  posts: 0,
  likesReceived: 0,
  favsReceived: 0,
});

/** Largest value a snapshot field holds; deltas saturate here and at zero. */
export const FIELD_MAX = 0xffffffff;

/**
 * One change of one user's count, caused by the event `eventId`. An event may move several users
 * (a follow: the follower's `followings` and the followee's `followers`); each of its deltas names
 * the event, so stores can recognise a redelivery per user.
 */
export interface UserCounterDelta {
  eventId: string;
  userId: number;
  field: UserField;
  delta: number;
}

export function isUserField(value: unknown): value is UserField {
  return typeof value === 'string' && (USER_FIELDS as readonly string[]).includes(value);
}

export function isUserId(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value > 0;
}

export function toLayout(counts: UserCounts): Counts {
  return [counts.followings, counts.followers, counts.posts, counts.likesReceived, counts.favsReceived];
}

export function fromLayout(counts: Counts): UserCounts {
  return {
    followings: counts[0],
    followers: counts[1],
    posts: counts[2],
    likesReceived: counts[3],
    favsReceived: counts[4],
  };
}

export function sameCounts(a: UserCounts, b: UserCounts): boolean {
  return USER_FIELDS.every((f) => a[f] === b[f]);
}
