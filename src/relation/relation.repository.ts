import { sql, type ExpressionBuilder, type Kysely, type Transaction } from 'kysely';
import type { Db } from '../platform/db/database.js';
import type { Database } from '../platform/db/schema.js';
import { sampleUserIds, userIdsAfter } from '../profile/users.repository.js';
import type { OutboxWriter } from '../platform/outbox/outbox.js';
import { GroupCommit } from '../platform/db/group-commit.js';
import { UnavailableError } from '../platform/errors/errors.js';
import {
  relationEvent,
  relationEventMessage,
  type ListEntry,
  type ListKind,
  type ListPosition,
  type RelationEvent,
  type RelationEventType,
} from './model.js';

/** A pair of users: `from` follows (or followed) `to`. */
export interface Pair {
  fromUserId: number;
  toUserId: number;
}

/** What the projection did for one pair: it now mirrors `following` (`createdAt` null = absent). */
export interface PairSync extends Pair {
  createdAt: number | null;
  changed: boolean;
}

// Far below both dialects' limits on bound parameters per statement.
const CHUNK = 400;
/** Most changes in flight for one user that a followers read merges from the truth. */
const MAX_OVERLAY = 1_000;
/** Most follow/unfollow changes committed in one transaction (five parameters a row at most). */
const MAX_BATCH = 200;
/** Tries of one batch that lost a race for one of its pairs or a deadlock. */
const MAX_ATTEMPTS = 5;

/** A requested change of one pair. */
interface RelationChange extends Pair {
  type: RelationEventType;
  ts: number;
}

/** A batch's writes did not find the rows its read found: another process changed one of the pairs. */
class PairsMoved extends Error {
  constructor() {
    super('a pair changed between the batch read and its write');
  }
}

/** MariaDB/MySQL picked the transaction as a deadlock victim and rolled it back. */
function isDeadlock(err: unknown): boolean {
  const e = err as { code?: unknown; errno?: unknown };
  return e.code === 'ER_LOCK_DEADLOCK' || e.errno === 1213;
}

/** Columns of one list: the table, the owner column and the other user's column. */
const LISTS = {
  following: { table: 'following', owner: 'from_user_id', other: 'to_user_id' },
  followers: { table: 'follower', owner: 'to_user_id', other: 'from_user_id' },
} as const;

type Q = Kysely<Database> | Transaction<Database>;

const pairKey = (p: Pair) => `${p.fromUserId}:${p.toUserId}`;

/**
 * The `following` table (the truth, written here together with the outbox row of the change) and
 * its `follower` projection. The SQL is the same on both dialects: `orIgnore` is `INSERT OR IGNORE`
 * on SQLite and `INSERT IGNORE` on MySQL, and both report the rows really inserted or deleted, which
 * is what tells a real change from a repeated request.
 */
export class RelationRepository {
  private readonly changes: GroupCommit<RelationChange, RelationEvent | null>;

  /** `onCommit` is told how many follow/unfollow requests each transaction carried. */
  /** Tests only: awaited inside a sync's transaction once it read the truth. */
  afterTruthRead: (() => Promise<void>) | undefined;

  /**
   * `maxWaitMs` (the database's statement deadline): a change that waited longer than that for its
   * transaction to start answers 503 without running, rather than wait on behind a slow database.
   */
  constructor(
    private readonly db: Db,
    private readonly outbox: OutboxWriter,
    onCommit?: (changes: number) => void,
    maxWaitMs = 0,
  ) {
    this.changes = new GroupCommit<RelationChange, RelationEvent | null>((batch) => this.commit(batch), {
      maxBatch: MAX_BATCH,
      key: pairKey,
      ...(onCommit ? { onBatch: (size: number) => onCommit(size) } : {}),
      maxWaitMs,
      expired: () =>
        new UnavailableError('The database did not take this change in time; nothing was changed, try again'),
      refuseWhileBusy: () =>
        db.outOfReach?.()
          ? new UnavailableError('The database is out of reach; nothing was changed, try again')
          : undefined,
    });
  }

  /**
   * Inserts the `following` row and, only when it was not there, the outbox row of the change, in
   * one transaction (shared with the changes submitted meanwhile: see `commit`). Of concurrent
   * identical follows exactly one sees an inserted row.
   */
  follow(fromUserId: number, toUserId: number, now: number): Promise<RelationEvent | null> {
    return this.changes.submit({ type: 'follow', fromUserId, toUserId, ts: now });
  }

  /** Deletes the `following` row and, only when one was deleted, appends the outbox row. */
  unfollow(fromUserId: number, toUserId: number, now: number): Promise<RelationEvent | null> {
    return this.changes.submit({ type: 'unfollow', fromUserId, toUserId, ts: now });
  }

  /**
   * Commits a batch of changes of distinct pairs in one transaction (group commit: the changes
   * requested while the previous batch was committing). A lone change is one statement that says
   * by its row count whether it changed anything. A batch reads the pairs' rows first and writes
   * only the real changes, with multi-row statements; the row counts of those writes must then
   * match what was read, or another process changed one of the pairs in between: the transaction
   * rolls back and the batch is tried again on fresh reads. So is a batch chosen as a deadlock
   * victim.
   */
  private async commit(changes: RelationChange[]): Promise<(RelationEvent | null)[]> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.db.kysely
          .transaction()
          .execute((trx) =>
            changes.length === 1 ? this.commitOne(trx, changes[0]!) : this.commitMany(trx, changes),
          );
      } catch (err) {
        if (attempt >= MAX_ATTEMPTS || !(err instanceof PairsMoved || isDeadlock(err))) throw err;
      }
    }
  }

  private async commitOne(trx: Transaction<Database>, c: RelationChange): Promise<(RelationEvent | null)[]> {
    const changed =
      c.type === 'follow'
        ? (
            await trx
              .insertInto('following')
              .orIgnore()
              .values({ from_user_id: c.fromUserId, to_user_id: c.toUserId, created_at: c.ts })
              .executeTakeFirst()
          ).numInsertedOrUpdatedRows
        : (
            await trx
              .deleteFrom('following')
              .where('from_user_id', '=', c.fromUserId)
              .where('to_user_id', '=', c.toUserId)
              .executeTakeFirst()
          ).numDeletedRows;
    if (Number(changed ?? 0n) !== 1) return [null];
    const event = relationEvent(c.type, c.fromUserId, c.toUserId, c.ts);
    await this.record(trx, [event]);
    return [event];
  }

  private async commitMany(
    trx: Transaction<Database>,
    changes: RelationChange[],
  ): Promise<(RelationEvent | null)[]> {
    const present = new Set(
      (
        await trx
          .selectFrom('following')
          .select(['from_user_id', 'to_user_id'])
          .where((eb) =>
            eb(
              eb.refTuple('from_user_id', 'to_user_id'),
              'in',
              changes.map((c) => eb.tuple(c.fromUserId, c.toUserId)),
            ),
          )
          .execute()
      ).map((r) => pairKey(toPair(r))),
    );
    const follows = changes.filter((c) => c.type === 'follow' && !present.has(pairKey(c)));
    const unfollows = changes.filter((c) => c.type === 'unfollow' && present.has(pairKey(c)));
    if (follows.length > 0) {
      const inserted = await trx
        .insertInto('following')
        .orIgnore()
        .values(
          // In key order: two batches holding the same pairs then lock them in the same order, and
          // cannot deadlock on each other (one waits).
          follows
            .map((c) => ({ from_user_id: c.fromUserId, to_user_id: c.toUserId, created_at: c.ts }))
            .sort((a, b) => a.from_user_id - b.from_user_id || a.to_user_id - b.to_user_id),
        )
        .executeTakeFirst();
      if (Number(inserted.numInsertedOrUpdatedRows ?? 0n) !== follows.length) throw new PairsMoved();
    }
    if (unfollows.length > 0) {
      const deleted = await trx
        .deleteFrom('following')
        .where((eb) =>
          eb(
            eb.refTuple('from_user_id', 'to_user_id'),
            'in',
            unfollows.map((c) => eb.tuple(c.fromUserId, c.toUserId)),
          ),
        )
        .executeTakeFirst();
      if (Number(deleted.numDeletedRows) !== unfollows.length) throw new PairsMoved();
    }
    const changed = new Set([...follows, ...unfollows]);
    const events = changes.map((c) =>
      changed.has(c) ? relationEvent(c.type, c.fromUserId, c.toUserId, c.ts) : null,
    );
    await this.record(
      trx,
      events.filter((e): e is RelationEvent => e !== null),
    );
    return events;
  }

  /** The events of changes, in the changes' transaction: their outbox rows and unapplied marks. */
  private async record(trx: Transaction<Database>, events: RelationEvent[]): Promise<void> {
    if (events.length > 0) {
      await trx
        .insertInto('relation_unapplied')
        .values(
          events.map((event) => ({
            event_id: event.eventId,
            from_user_id: event.fromUserId,
            to_user_id: event.toUserId,
            delta: event.type === 'follow' ? 1 : -1,
            created_at: event.ts,
          })),
        )
        .execute();
      await this.outbox.append(trx, events.map(relationEventMessage));
    }
  }

  /** Forgets the unapplied marks of events whose counter deltas are now in the user-counter store. */
  async markApplied(eventIds: readonly string[]): Promise<void> {
    const sorted = [...eventIds].sort();
    for (let i = 0; i < sorted.length; i += CHUNK) {
      const chunk = sorted.slice(i, i + CHUNK);
      const remove = (db: Kysely<Database> | Transaction<Database>) =>
        db.deleteFrom('relation_unapplied').where('event_id', 'in', chunk).execute();
      if (this.db.dialect !== 'mysql') await remove(this.db.kysely);
      // Under InnoDB's default isolation (repeatable read) this delete also locks gaps of the
      // table's indexes, and under load it deadlocked with the follows inserting new marks (the
      // whole projection batch was then delivered again). Read committed takes no gap locks, so
      // the delete locks only the rows it removes, which no follow holds.
      else await this.db.kysely.transaction().setIsolationLevel('read committed').execute(remove);
    }
  }

  /**
   * What a user's `followings` and `followers` are by the truth, and which changes counted in them
   * have deltas that may not have reached the user-counter store yet, as of one instant (one read
   * transaction), so a counter rebuild can write the counts and mark those events applied together.
   * With `mirror`, also the size of the user's `follower` projection as of that instant.
   */
  async countSource(
    userId: number,
    options: { mirror?: boolean } = {},
  ): Promise<{
    followings: number;
    followers: number;
    unapplied: { eventId: string; field: 'followings' | 'followers'; delta: number }[];
    mirrored?: number;
  }> {
    return this.db.kysely.transaction().execute(async (trx) => {
      const [followings, followers, pending, mirrored] = [
        await countWhere(trx, 'following', 'from_user_id', userId),
        await countWhere(trx, 'following', 'to_user_id', userId),
        await unappliedOf(trx, userId),
        options.mirror ? await countWhere(trx, 'follower', 'to_user_id', userId) : undefined,
      ];
      const unapplied: { eventId: string; field: 'followings' | 'followers'; delta: number }[] = [];
      for (const p of pending) {
        if (p.fromUserId === userId)
          unapplied.push({ eventId: p.eventId, field: 'followings', delta: p.delta });
        if (p.toUserId === userId) unapplied.push({ eventId: p.eventId, field: 'followers', delta: p.delta });
      }
      return mirrored === undefined
        ? { followings, followers, unapplied }
        : { followings, followers, unapplied, mirrored };
    });
  }

  /** Changes involving `userId` whose counter deltas are not applied yet (in flight). */
  async unappliedFor(userId: number): Promise<(Pair & { eventId: string; delta: number })[]> {
    return unappliedOf(this.db.kysely, userId);
  }

  /** Both directions between two users, read from the truth in one query. */
  async between(me: number, other: number): Promise<{ following: boolean; followedBy: boolean }> {
    const rows = await this.db.kysely
      .selectFrom('following')
      .select(['from_user_id', 'to_user_id'])
      .where((eb) =>
        eb.or([
          eb.and([eb('from_user_id', '=', me), eb('to_user_id', '=', other)]),
          eb.and([eb('from_user_id', '=', other), eb('to_user_id', '=', me)]),
        ]),
      )
      .execute();
    return {
      following: rows.some((r) => Number(r.from_user_id) === me),
      followedBy: rows.some((r) => Number(r.from_user_id) === other),
    };
  }

  /**
   * One page of a list, newest first, and whether more follow. A following list is read from the
   * truth, one indexed query. A followers list is read from the `follower` projection, which the
   * consumer brings up to date a moment after each change: the pairs of changes it may not have
   * projected yet (their unapplied marks, deleted only after the projection) are read from the truth
   * instead and merged in, so the page is the truth's even then. The marks are read first: a mark
   * already gone means its pair was projected before the projection is read.
   */
  async page(
    owner: number,
    kind: ListKind,
    position: ListPosition,
    limit: number,
  ): Promise<{ entries: ListEntry[]; more: boolean }> {
    if (kind === 'following') return this.tablePage(owner, kind, position, limit, []);
    const marks = await this.db.kysely
      .selectFrom('relation_unapplied')
      .select('from_user_id')
      .where('to_user_id', '=', owner)
      .limit(MAX_OVERLAY + 1)
      .execute();
    // So many changes in flight for one user that the projection is read as it is (it catches up
    // within about a second); merging would cost more than the staleness is worth.
    if (marks.length === 0 || marks.length > MAX_OVERLAY) {
      return this.tablePage(owner, kind, position, limit, []);
    }
    const pending = [...new Set(marks.map((r) => Number(r.from_user_id)))];
    const truth = (
      await this.db.kysely
        .selectFrom('following')
        .select(['from_user_id as user_id', 'created_at'])
        .where('to_user_id', '=', owner)
        .where('from_user_id', 'in', pending)
        .execute()
    )
      .map(toEntry)
      .sort(newestFirst);

    if ('after' in position) {
      const { after } = position;
      const rest = await this.tablePage(owner, kind, position, limit, pending);
      const merged = [...rest.entries, ...truth.filter((e) => newestFirst(after, e) < 0)].sort(newestFirst);
      return {
        entries: merged.slice(0, limit),
        more: merged.length > limit || rest.more,
      };
    }
    return this.mergedOffsetPage(owner, position.offset, limit, pending, truth);
  }

  /**
   * A followers page by offset, over the projection without the pending pairs (P) merged with the
   * pending pairs' truth (T, k entries). A row of P at index i sits at i + (entries of T before it)
   * in the merge, so P's rows that can land in [offset, offset + limit] lie in P[offset - k, offset +
   * limit]: that window is read, and the merge is exact from its first row on (everything of T
   * before that row sits below `offset`).
   */
  private async mergedOffsetPage(
    owner: number,
    offset: number,
    limit: number,
    pending: number[],
    truth: ListEntry[],
  ): Promise<{ entries: ListEntry[]; more: boolean }> {
    const start = Math.max(0, offset - truth.length);
    const rows = await this.tableRows(
      owner,
      'followers',
      { offset: start },
      offset + limit + 1 - start,
      pending,
    );
    const first = rows[0];
    // Past the end of P: the whole list, at most |P| + k entries, ends at or before `offset`.
    if (!first && start > 0) return { entries: [], more: false };
    const included = start === 0 || !first ? truth : truth.filter((e) => newestFirst(e, first) > 0);
    const before = truth.length - included.length;
    // Entries of T past the window's last row may sort wrongly against rows of P not read, but only
    // past that row, which sits at offset + limit or later unless the window holds the rest of P.
    const merged = [...rows, ...included].sort(newestFirst);
    // merged[j] is entry `start + before + j` of the whole list.
    const from = offset - (start + before);
    const page = merged.slice(from, from + limit + 1);
    return { entries: page.slice(0, limit), more: page.length > limit };
  }

  /** One page of a list's table, leaving out the given users; one indexed query. */
  private async tablePage(
    owner: number,
    kind: ListKind,
    position: ListPosition,
    limit: number,
    without: number[],
  ): Promise<{ entries: ListEntry[]; more: boolean }> {
    const rows = await this.tableRows(owner, kind, position, limit + 1, without);
    return { entries: rows.slice(0, limit), more: rows.length > limit };
  }

  private async tableRows(
    owner: number,
    kind: ListKind,
    position: ListPosition,
    count: number,
    without: number[],
  ): Promise<ListEntry[]> {
    const { table, owner: ownerCol, other } = LISTS[kind];
    let query = this.db.kysely
      .selectFrom(table)
      .select([`${other} as user_id`, 'created_at'])
      .where(ownerCol, '=', owner);
    if (without.length > 0) query = query.where(other, 'not in', without);
    if ('after' in position) {
      const { createdAt, userId } = position.after;
      query = query.where((eb: ExpressionBuilder<Database, typeof table>) =>
        eb.or([
          eb('created_at', '<', createdAt),
          eb.and([eb('created_at', '=', createdAt), eb(other, '<', userId)]),
        ]),
      );
    }
    query = query.orderBy('created_at', 'desc').orderBy(other, 'desc').limit(count);
    if ('offset' in position && position.offset > 0) query = query.offset(position.offset);
    return (await query.execute()).map(toEntry);
  }

  /** The first `max` entries of a list (the whole list when it has at most `max`). */
  async head(owner: number, kind: ListKind, max: number): Promise<ListEntry[]> {
    return (await this.page(owner, kind, { offset: 0 }, max)).entries;
  }

  /** Sizes of one kind of list for many owners, in one query; owners without entries count 0. */
  async counts(owners: readonly number[], kind: ListKind): Promise<Map<number, number>> {
    const { table, owner: ownerCol } = LISTS[kind];
    const found = new Map<number, number>(owners.map((o) => [o, 0]));
    for (let i = 0; i < owners.length; i += CHUNK) {
      const chunk = owners.slice(i, i + CHUNK);
      const rows = await this.db.kysely
        .selectFrom(table)
        .select([`${ownerCol} as owner`, (eb) => eb.fn.countAll<number | string>().as('n')])
        .where(ownerCol, 'in', chunk)
        .groupBy(ownerCol)
        .execute();
      for (const r of rows) found.set(Number(r.owner), Number(r.n));
    }
    return found;
  }

  /**
   * The followers of `owner` on which `following` and its `follower` mirror disagree (missing,
   * extra or with another `created_at`): a merge of both, walked in follower-id order with at most
   * `pageSize` rows of each table a round, so any list size, and any size of extra mirror rows,
   * costs bounded memory per round.
   */
  async followerDiff(owner: number, pageSize = 5_000): Promise<Pair[]> {
    const diffs: Pair[] = [];
    const side = (table: 'following' | 'follower', after: number) =>
      this.db.kysely
        .selectFrom(table)
        .select(['from_user_id', 'created_at'])
        .where('to_user_id', '=', owner)
        .where('from_user_id', '>', after)
        .orderBy('from_user_id')
        .limit(pageSize)
        .execute();
    // A full page was cut at its last id; both sides are known whole up to the lower such cut.
    const cut = (rows: { from_user_id: number | string }[]) =>
      rows.length === pageSize ? Number(rows[rows.length - 1]!.from_user_id) : Infinity;
    let after = 0;
    for (;;) {
      const [truth, mirror] = [await side('following', after), await side('follower', after)];
      const upper = Math.min(cut(truth), cut(mirror));
      const known = (rows: { from_user_id: number | string; created_at: number | string }[]) =>
        new Map(
          rows
            .map((r) => [Number(r.from_user_id), Number(r.created_at)] as const)
            .filter(([id]) => id <= upper),
        );
      const want = known(truth);
      const have = known(mirror);
      for (const id of new Set([...want.keys(), ...have.keys()])) {
        if (want.get(id) !== have.get(id)) diffs.push({ fromUserId: id, toUserId: owner });
      }
      if (upper === Infinity) return diffs;
      after = upper;
    }
  }

  /**
   * Makes the projection mirror `following` for each pair, whatever it held before: a pair present
   * in `following` gets its `follower` row with the same `created_at`, an absent pair loses it. The
   * outcome depends only on the truth at the time of the call, so a redelivered, repeated or
   * reordered event can never leave the projection behind the last change of its pair.
   * One transaction; reads and writes are batched. A transaction chosen as a deadlock victim (the
   * projector, a rebuild and the reconciler write the same rows in different orders) is tried again.
   */
  async syncPairs(pairs: readonly Pair[]): Promise<PairSync[]> {
    const unique = [...new Map(pairs.map((p) => [pairKey(p), p])).values()];
    if (unique.length === 0) return [];
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.db.kysely.transaction().execute(async (trx) => {
          const results: PairSync[] = [];
          for (let i = 0; i < unique.length; i += CHUNK) {
            results.push(...(await this.syncChunk(trx, unique.slice(i, i + CHUNK))));
          }
          return results;
        });
      } catch (err) {
        if (attempt >= MAX_ATTEMPTS || !isDeadlock(err)) throw err;
      }
    }
  }

  private async syncChunk(trx: Q, pairs: Pair[]): Promise<PairSync[]> {
    const truthQuery = trx
      .selectFrom('following')
      .select(['from_user_id', 'to_user_id', 'created_at'])
      .where((eb) =>
        eb(
          eb.refTuple('from_user_id', 'to_user_id'),
          'in',
          pairs.map((p) => eb.tuple(p.fromUserId, p.toUserId)),
        ),
      );
    // On MariaDB a plain read is the transaction's snapshot: an unfollow that commits after it, and
    // whose own sync runs before this one commits, would find its follower row put back from a
    // truth already gone. A locking read sees the latest rows and holds them (and the gaps where
    // absent pairs go) until this commits, so such a change waits for it, and its sync comes after.
    // SQLite runs one write transaction at a time.
    const truthRows = await (
      this.db.dialect === 'mysql' ? truthQuery.modifyEnd(sql`lock in share mode`) : truthQuery
    ).execute();
    await this.afterTruthRead?.();
    const mirrorRows = await trx
      .selectFrom('follower')
      .select(['from_user_id', 'to_user_id', 'created_at'])
      .where((eb) =>
        eb(
          eb.refTuple('to_user_id', 'from_user_id'),
          'in',
          pairs.map((p) => eb.tuple(p.toUserId, p.fromUserId)),
        ),
      )
      .execute();
    const truth = new Map(truthRows.map((r) => [pairKey(toPair(r)), Number(r.created_at)]));
    const mirror = new Map(mirrorRows.map((r) => [pairKey(toPair(r)), Number(r.created_at)]));

    const insert: { to_user_id: number; from_user_id: number; created_at: number }[] = [];
    const update: PairSync[] = [];
    const remove: Pair[] = [];
    const results: PairSync[] = [];
    for (const p of pairs) {
      const want = truth.get(pairKey(p));
      const have = mirror.get(pairKey(p));
      const sync: PairSync = {
        fromUserId: p.fromUserId,
        toUserId: p.toUserId,
        createdAt: want ?? null,
        changed: want !== have,
      };
      results.push(sync);
      if (want !== undefined && have === undefined)
        insert.push({ to_user_id: p.toUserId, from_user_id: p.fromUserId, created_at: want });
      else if (want !== undefined && have !== want) update.push(sync);
      else if (want === undefined && have !== undefined) remove.push(p);
    }
    if (insert.length > 0) await trx.insertInto('follower').orIgnore().values(insert).execute();
    for (const u of update) {
      await trx
        .updateTable('follower')
        .set({ created_at: u.createdAt! })
        .where('to_user_id', '=', u.toUserId)
        .where('from_user_id', '=', u.fromUserId)
        .execute();
    }
    if (remove.length > 0) {
      await trx
        .deleteFrom('follower')
        .where((eb) =>
          eb(
            eb.refTuple('to_user_id', 'from_user_id'),
            'in',
            remove.map((p) => eb.tuple(p.toUserId, p.fromUserId)),
          ),
        )
        .execute();
    }
    return results;
  }

  /**
   * One page of the truth in primary-key order, after `after` (exclusive); for jobs that walk every
   * follow (projection verify and rebuild).
   */
  async followingPage(after: Pair | null, limit: number): Promise<(Pair & { createdAt: number })[]> {
    let query = this.db.kysely.selectFrom('following').select(['from_user_id', 'to_user_id', 'created_at']);
    if (after) {
      query = query.where((eb) =>
        eb.or([
          eb('from_user_id', '>', after.fromUserId),
          eb.and([eb('from_user_id', '=', after.fromUserId), eb('to_user_id', '>', after.toUserId)]),
        ]),
      );
    }
    const rows = await query.orderBy('from_user_id').orderBy('to_user_id').limit(limit).execute();
    return rows.map((r) => ({ ...toPair(r), createdAt: Number(r.created_at) }));
  }

  /** One page of the projection in primary-key order (followed user, then follower). */
  async followerPage(after: Pair | null, limit: number): Promise<(Pair & { createdAt: number })[]> {
    let query = this.db.kysely.selectFrom('follower').select(['from_user_id', 'to_user_id', 'created_at']);
    if (after) {
      query = query.where((eb) =>
        eb.or([
          eb('to_user_id', '>', after.toUserId),
          eb.and([eb('to_user_id', '=', after.toUserId), eb('from_user_id', '>', after.fromUserId)]),
        ]),
      );
    }
    const rows = await query.orderBy('to_user_id').orderBy('from_user_id').limit(limit).execute();
    return rows.map((r) => ({ ...toPair(r), createdAt: Number(r.created_at) }));
  }

  /** User ids in ascending order after `afterId`, for jobs that visit every user. */
  userIdsAfter(afterId: number, limit: number): Promise<number[]> {
    return userIdsAfter(this.db, afterId, limit);
  }

  /** Up to `limit` user ids picked at random. */
  sampleUserIds(limit: number): Promise<number[]> {
    return sampleUserIds(this.db, limit);
  }

  /**
   * Unapplied marks written before `before`, oldest first: past the bound a change takes through
   * the pipeline, they are of events the log no longer holds (see `RelationReconciler.settleOrphans`).
   */
  async unappliedBefore(
    before: number,
    limit: number,
  ): Promise<(Pair & { eventId: string; delta: number; createdAt: number })[]> {
    const rows = await this.db.kysely
      .selectFrom('relation_unapplied')
      .select(['event_id', 'from_user_id', 'to_user_id', 'delta', 'created_at'])
      .where('created_at', '<', before)
      .orderBy('created_at')
      .limit(limit)
      .execute();
    return rows.map((r) => ({
      ...toPair(r),
      eventId: r.event_id,
      delta: Number(r.delta),
      createdAt: Number(r.created_at),
    }));
  }

  /**
   * Changes whose counter deltas are not applied yet, the age of the oldest (ms), or null, and how
   * many were made before `orphanedBefore`.
   */
  async unappliedSummary(
    now: number,
    orphanedBefore: number,
  ): Promise<{ count: number; oldestAgeMs: number | null; orphaned: number }> {
    const row = await this.db.kysely
      .selectFrom('relation_unapplied')
      .select((eb) => [
        eb.fn.countAll<number | string>().as('n'),
        eb.fn.min<number | string>('created_at').as('oldest'),
        eb.fn
          .sum<number | string | null>(
            eb.case().when('created_at', '<', orphanedBefore).then(1).else(0).end(),
          )
          .as('orphaned'),
      ])
      .executeTakeFirst();
    const oldest = row?.oldest === null || row?.oldest === undefined ? null : Number(row.oldest);
    return {
      count: Number(row?.n ?? 0),
      oldestAgeMs: oldest === null ? null : Math.max(0, now - oldest),
      orphaned: Number(row?.orphaned ?? 0),
    };
  }
}

async function unappliedOf(q: Q, userId: number): Promise<(Pair & { eventId: string; delta: number })[]> {
  const rows = await q
    .selectFrom('relation_unapplied')
    .select(['event_id', 'from_user_id', 'to_user_id', 'delta'])
    .where((eb) => eb.or([eb('from_user_id', '=', userId), eb('to_user_id', '=', userId)]))
    .execute();
  return rows.map((r) => ({ ...toPair(r), eventId: r.event_id, delta: Number(r.delta) }));
}

async function countWhere(
  q: Q,
  table: 'following' | 'follower',
  column: 'from_user_id' | 'to_user_id',
  userId: number,
): Promise<number> {
  const row = await q
    .selectFrom(table)
    .select((eb) => eb.fn.countAll<number | string>().as('n'))
    .where(column, '=', userId)
    .executeTakeFirst();
  return Number(row?.n ?? 0);
}

/** List order: newest first, ties by the higher user id first (negative when `a` comes first). */
function newestFirst(a: ListEntry, b: ListEntry): number {
  return b.createdAt - a.createdAt || b.userId - a.userId;
}

function toEntry(row: { user_id: number | string; created_at: number | string }): ListEntry {
  return { userId: Number(row.user_id), createdAt: Number(row.created_at) };
}

function toPair(row: { from_user_id: number | string; to_user_id: number | string }): Pair {
  return { fromUserId: Number(row.from_user_id), toUserId: Number(row.to_user_id) };
}
