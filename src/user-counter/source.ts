import type { Db } from '../platform/db/database.js';
import { USER_FIELDS, ZERO_USER_COUNTS, type UserCounts, type UserField } from './model.js';
import { sampleUserIds, userIdsAfter } from '../profile/users.repository.js';

/**
 * An event counted in the source's counts whose delta may not have reached the counter store yet
 * (still in the outbox, in the event log, or in a consumer's batch). A rebuild writes the counts and
 * records these events as applied in one atomic step, so their deltas are skipped when they arrive.
 * An event that moves several fields is listed once per field, with the same id.
 */
export interface UnappliedEvent {
  eventId: string;
  field: UserField;
  /**
   * What the event moves `field` by, or null when the source cannot tell (a sequenced id standing
   * for every event of its source up to its seq, of which the database keeps no deltas). While such
   * an event is not applied, `field` cannot be compared exactly (see `span`).
   */
  delta: number | null;
  /**
   * With a null delta: how many events, of one each, it stands for at most, over all the fields it
   * is listed for (so the counts may be that far off while it is on its way, and no further).
   */
  span?: number;
}

/** One user's counts according to the database. */
export interface SourceCounts {
  counts: UserCounts;
  unapplied: UnappliedEvent[];
  /**
   * Set when a part could not read its truth whole (the counter store's facts are being restored
   * after a loss; see `Inspection.sealed`): the counts are the best known, to be answered but
   * neither written nor compared.
   */
  provisional?: true;
}

/**
 * One slice of the truth: some of the fields, read from the database in one consistent read
 * (counts and unapplied events from the same instant). Posts give `posts`; relations add
 * `followings` and `followers`; likes and favourites received will add theirs.
 *
 * `unapplied` must list every event counted in `counts` whose delta may still be on its way. A part
 * that knows exactly (a table of unapplied events written with the change) lists just those; one
 * that does not lists at least the events of changes made since `since` (the caller passes the
 * counter store's retention, the same bound as its memory of applied events).
 */
export interface UserCountPart {
  readonly fields: readonly UserField[];
  read(
    userId: number,
    since: number,
  ): Promise<{ counts: Partial<UserCounts>; unapplied: UnappliedEvent[]; provisional?: true }>;
}

/** Where rebuilds and the reconciler read the truth. */
export interface UserCountSource {
  /** The user's counts by the database, or null when there is no such user. */
  compute(userId: number, now: number): Promise<SourceCounts | null>;
  /** Up to `limit` user ids above `after`, ascending (the reconciler's pages). */
  userIdsAfter(after: number, limit: number): Promise<number[]>;
  /** Up to `limit` user ids from a random starting point (the periodic reconciler's sample). */
  sampleUserIds(limit: number): Promise<number[]>;
}

/** The sum of its parts (see app.ts for the parts a server uses); a field no part covers is zero. */
export class DbUserCountSource implements UserCountSource {
  constructor(
    private readonly db: Db,
    private readonly parts: readonly UserCountPart[],
    /** How far back parts without an exact list report their events (see `UserCountPart`). */
    private readonly windowMs: number,
  ) {
    const covered = parts.flatMap((p) => p.fields);
    const twice = USER_FIELDS.filter((f) => covered.filter((c) => c === f).length > 1);
    if (twice.length > 0) throw new Error(`user count fields covered twice: ${twice.join(', ')}`);
  }

  async compute(userId: number, now: number): Promise<SourceCounts | null> {
    const user = await this.db.kysely
      .selectFrom('users')
      .select('id')
      .where('id', '=', userId)
      .executeTakeFirst();
    if (!user) return null;
    const counts: UserCounts = { ...ZERO_USER_COUNTS };
    const unapplied: UnappliedEvent[] = [];
    let provisional = false;
    for (const part of this.parts) {
      const slice = await part.read(userId, now - this.windowMs);
      for (const field of part.fields) counts[field] = slice.counts[field] ?? 0;
      unapplied.push(...slice.unapplied.filter((e) => part.fields.includes(e.field)));
      provisional ||= slice.provisional === true;
    }
    return provisional ? { counts, unapplied, provisional } : { counts, unapplied };
  }

  userIdsAfter(after: number, limit: number): Promise<number[]> {
    return userIdsAfter(this.db, after, limit);
  }

  sampleUserIds(limit: number): Promise<number[]> {
    return sampleUserIds(this.db, limit);
  }
}
