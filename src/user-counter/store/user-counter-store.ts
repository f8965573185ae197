import type { UserCounterDelta, UserCounts } from '../model.js';

/**
 * Every user's five counts (`followings, followers, posts, likesReceived, favsReceived`), kept as a
 * 20-byte snapshot per user, plus what makes deltas safe to apply more than once. Embedded: SQLite
 * tables. Cluster: Redis hashes of many users each, spread over hash-tag groups (one group is one
 * cluster slot), so each group's snapshots, versions and applied ids change together atomically.
 *
 * Three things per user:
 * - the **snapshot**, or none: a missing (or malformed) snapshot means "not known here", never zeros;
 *   the service then rebuilds it from the database (the source of truth);
 * - a **version**, raised by every delta that is applied to the user, whether or not a snapshot
 *   exists, and by every write. Rebuilds write conditionally on it, so neither a delta applied nor
 *   another rebuild written while a rebuild was reading the database is overwritten (lost);
 * - the **applied ids**: which events have moved the user, as (user, eventId) pairs, kept for
 *   `retentionMs` after they were recorded and trimmed by age as new ones arrive;
 * - the **marks** of sequenced sources: an event id `<source>#<seq>` (see `sequencedEventId`) names
 *   the seq-th event of a source that numbers its events 1, 2, 3… and delivers them in that order
 *   (a post's likes, hundreds a second on a hot post). For those only the highest seq applied per
 *   (user, source) is kept, forever and in constant space: an event at or below the mark counts as
 *   applied. A consumer that hands one over out of order must heal the user (rebuild), since a lower
 *   seq arriving after a higher one is skipped.
 *
 * Semantics every adapter guarantees (proved by `user-counter-store.contract.ts`):
 * - `read` is one round trip for any number of users, in order; null for a missing or malformed
 *   snapshot.
 * - `apply` is idempotent by event: a (user, eventId) pair that is already recorded (for a sequenced
 *   id: at or below the user's mark of its source) skips all of that event's deltas for that user; deltas repeated within one batch (same event, user and field) count
 *   once. Each applied delta raises the user's version and records the pair, atomically with the
 *   change (per group on Redis, per batch on SQLite). A delta for a user without a snapshot changes
 *   no counts (the rebuild reads the database, which already holds the change) but is still recorded
 *   and still raises the version. Fields saturate at 0 and 2^32 - 1: never below zero.
 * - `write` sets a user's counts, optionally only if no snapshot exists (`ifAbsent`) and/or only if
 *   the user's version is still `ifVersion`; in the same atomic step it raises the version and
 *   records `markApplied` as applied (a sequenced id raises its source's mark to its seq, never
 *   lowers it), so events whose effect the written counts already include are skipped when they
 *   arrive.
 * - `inspect` reads one user's snapshot, version and whether the given events are recorded, as of one
 *   instant.
 *
 * The bound: a (user, event) pair of an unsequenced id is remembered for `retentionMs` (default
 * 7 days) after it was recorded. An event delivered again later than that — only possible when no consumer ran for that
 * long after one applied it and died before committing — would count again; the reconciler
 * (`zhiguang users verify --fix`) heals such drift.
 */
export interface UserCounterStore {
  read(userIds: readonly number[]): Promise<(UserCounts | null)[]>;
  apply(deltas: readonly UserCounterDelta[], now: number): Promise<ApplyResult>;
  write(userId: number, counts: UserCounts, options: WriteOptions, now: number): Promise<WriteResult>;
  inspect(userId: number, eventIds?: readonly string[]): Promise<UserInspection>;
  /** Forgets snapshots (the next read rebuilds them); versions and applied ids stay. */
  remove(userIds: readonly number[]): Promise<void>;
  /**
   * Forgets every snapshot, as `remove` does (once, when what a field counts changed); whether
   * there was any to forget.
   */
  removeAll(): Promise<boolean>;
  /** Overwrites (or with null deletes) a snapshot's raw bytes; for tests and repair tools only. */
  writeRawSnapshot(userId: number, bytes: Buffer | null): Promise<void>;
}

export interface ApplyResult {
  /** Deltas that moved a user (or would have, had it a snapshot). */
  applied: number;
  /** Deltas of events already recorded for their user, and repeats within the batch. */
  skipped: number;
}

export interface WriteOptions {
  /** Write only when the user has no readable snapshot. */
  ifAbsent?: boolean;
  /** Write only when the user's version is still this. */
  ifVersion?: number;
  /** Event ids whose effect `counts` already includes: recorded as applied for this user. */
  markApplied?: readonly string[];
}

export type WriteResult =
  | { outcome: 'written' }
  /** `ifAbsent` and a snapshot exists: here it is. */
  | { outcome: 'present'; counts: UserCounts }
  /** `ifVersion` and the version moved on: nothing written. */
  | { outcome: 'conflict'; version: number };

export interface UserInspection {
  counts: UserCounts | null;
  version: number;
  /** For each of the given event ids, whether it is recorded as applied for the user. */
  applied: boolean[];
}

export const DEFAULT_RETENTION_MS = 7 * 24 * 3_600_000;

export function checkUserId(userId: number): void {
  if (!Number.isSafeInteger(userId) || userId <= 0) throw new RangeError(`invalid user id: ${userId}`);
}

/** The event id of the `seq`-th event (1, 2, 3…) of a source that delivers its events in order. */
export function sequencedEventId(source: string, seq: number): string {
  if (source === '' || source.includes('#')) throw new RangeError(`invalid source: ${source}`);
  if (!Number.isSafeInteger(seq) || seq < 1 || seq >= 1e15) throw new RangeError(`invalid seq: ${seq}`);
  return `${source}#${seq}`;
}

/** Source and seq of a sequenced event id; null for any other id. */
export function parseSequencedEventId(eventId: string): { source: string; seq: number } | null {
  // At most 15 digits, so every seq is a safe integer; the Redis scripts read ids the same way.
  const match = /^([^#]+)#([1-9][0-9]{0,14})$/.exec(eventId);
  return match ? { source: match[1]!, seq: Number(match[2]) } : null;
}
