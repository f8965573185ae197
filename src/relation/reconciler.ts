import { setTimeout as sleep } from 'node:timers/promises';
import type { InvalidationBus } from '../platform/cache/invalidation-bus.js';
import type { UserCounts } from '../user-counter/model.js';
import type { UserCounterStore } from '../user-counter/store/user-counter-store.js';
import type { ListCache, ListRef } from './list-cache/list-cache.js';
import type { ListEntry, ListKind } from './model.js';
import type { RelationMetrics } from './relation.metrics.js';
import type { Pair, RelationRepository } from './relation.repository.js';
import { FIRST_PAGE_SCOPE } from './relation.service.js';
import { trimOldest } from '../platform/cache/trim.js';

/** What one check of one user found; empty lists mean "in order". */
export interface RelationDrift {
  userId: number;
  /** Pairs (followers of the user) whose `follower` row does not mirror `following`. */
  projection: Pair[];
  /** Counter fields that differ from the truth, net of deltas still on their way. */
  counters: { field: 'followings' | 'followers'; expected: number; actual: number }[];
  /** Cached lists whose content differs from the table they are filled from. */
  caches: ListKind[];
}

export interface RelationReconcilerDeps {
  repo: RelationRepository;
  counters: UserCounterStore;
  lists: ListCache;
  bus: InvalidationBus;
  /** Rewrites a user's counter snapshot from the database (the user-counter rebuild, exact). */
  rebuildCounters: (userId: number) => Promise<{ written: boolean } | null>;
  metrics: RelationMetrics;
  /** Longest list compared entry by entry; longer ones are compared by size. */
  maxCompare: number;
  /** Wait before a drift is checked again and only then healed (lets in-flight work land). */
  settleMs: number;
  /** Users per periodic round: recently touched ones first, then random ones. */
  sampleSize: number;
  /** Age past which an unapplied mark is taken for an event lost (default a day). */
  orphanAfterMs?: number;
  now?: () => number;
}

/**
 * A change's deltas reach the counters within seconds, or within the hours of an outage; a mark a
 * day old is of an event the log lost (a consumer group that lagged past the topic's retention, a
 * topic made again), which nothing will ever apply.
 */
export const ORPHAN_AFTER_MS = 24 * 3_600_000;
/** Orphaned marks settled per round, and per round of the admin commands. */
const ORPHANS_PER_ROUND = 100;
const SETTLE_ALL_ROUND = 1_000;

/** Pairs healed per transaction. */
const HEAL_SLICE = 5_000;
/** Reads of a user's truth and counters until no follow or unfollow landed between them (see `check`). */
const COUNTER_READ_ATTEMPTS = 3;
const pairKey = (p: Pair) => `${p.fromUserId}:${p.toUserId}`;
const sameEntries = (a: readonly ListEntry[], b: readonly ListEntry[]) =>
  a.length === b.length && a.every((e, i) => e.userId === b[i]!.userId && e.createdAt === b[i]!.createdAt);

const sameRelationCounts = (a: UserCounts | null, b: UserCounts | null): boolean =>
  a?.followings === b?.followings && a?.followers === b?.followers;

export function hasDrift(d: RelationDrift): boolean {
  return d.projection.length > 0 || d.counters.length > 0 || d.caches.length > 0;
}

/**
 * Compares, per user, what the relation pipeline derived with the truth: the `follower` projection
 * with `following`, the `followings`/`followers` counters with the tables, and cached lists with the
 * tables they are filled from. Changes still in flight (their unapplied marks are present) are not
 * drift. The periodic round checks a drifted user again after `settleMs` and heals only what is
 * still wrong: pairs are re-synced from the truth, counters rebuilt (exact against deltas in flight),
 * cached lists dropped.
 */
export class RelationReconciler {
  private readonly recent = new Set<number>();

  constructor(private readonly deps: RelationReconcilerDeps) {}

  /** Users touched by recent events, checked first by the next round. */
  touched(userIds: readonly number[]): void {
    for (const id of userIds) {
      this.recent.delete(id);
      this.recent.add(id);
    }
    trimOldest(this.recent, 10_000);
  }

  async check(userId: number): Promise<RelationDrift> {
    const { repo } = this.deps;
    const unapplied = await repo.unappliedFor(userId);
    const inFlight = new Set(unapplied.map(pairKey));
    const drift: RelationDrift = { userId, projection: [], counters: [], caches: [] };

    // The counters before the truth is read: see the counters below.
    let before = (await this.deps.counters.inspect(userId, [])).counts;
    let source = await repo.countSource(userId, { mirror: true });

    // Projection: the followers of the user by the truth and by the mirror. Long lists are walked
    // only when their sizes differ by more than the follows and unfollows of the user still on their
    // way can explain: a busy account always has some (`relations verify` walks every list). The
    // sizes and the changes in flight are read as of one instant (a follow landing between separate
    // reads would send a busy account's list to be walked every round).
    const mirrored = source.mirrored ?? 0;
    // A follow in flight is in the truth and not yet in the mirror, an unfollow the other way round.
    const toUser = source.unapplied.filter((u) => u.field === 'followers');
    const follows = toUser.filter((u) => u.delta > 0).length;
    const unfollows = toUser.length - follows;
    if (
      source.followers <= this.deps.maxCompare ||
      mirrored < source.followers - follows ||
      mirrored > source.followers + unfollows
    ) {
      for (const pair of await repo.followerDiff(userId)) {
        if (!inFlight.has(pairKey(pair))) drift.projection.push(pair);
      }
    }

    // Counters: the truth minus the deltas of changes not applied yet, as of one instant: a follow
    // or unfollow committed and applied between reading the truth and reading the counters would
    // look like drift, so the two counters must not have moved across the two reads (likes and
    // posts received may). A user whose counters keep moving is compared anyway after a few tries
    // (`confirm` then wants the same difference twice).
    let inspection = await this.deps.counters.inspect(
      userId,
      source.unapplied.map((u) => u.eventId),
    );
    for (
      let attempt = 1;
      !sameRelationCounts(before, inspection.counts) && attempt < COUNTER_READ_ATTEMPTS;
      attempt++
    ) {
      before = inspection.counts;
      source = await repo.countSource(userId);
      inspection = await this.deps.counters.inspect(
        userId,
        source.unapplied.map((u) => u.eventId),
      );
    }
    if (inspection.counts) {
      const expected = { followings: source.followings, followers: source.followers };
      source.unapplied.forEach((u, i) => {
        if (!inspection.applied[i]) expected[u.field] -= u.delta;
      });
      for (const field of ['followings', 'followers'] as const) {
        if (inspection.counts[field] !== expected[field]) {
          drift.counters.push({ field, expected: expected[field], actual: inspection.counts[field] });
        }
      }
    }

    // Caches: a cached list must equal its table, apart from pairs in flight.
    for (const kind of ['following', 'followers'] as const) {
      const cached = await this.deps.lists.all({ owner: userId, kind });
      if (cached === null) continue;
      const table = await repo.head(userId, kind, this.deps.maxCompare + 1);
      const settled = (entries: readonly ListEntry[]) =>
        entries.filter((e) => {
          const pair =
            kind === 'following'
              ? { fromUserId: userId, toUserId: e.userId }
              : { fromUserId: e.userId, toUserId: userId };
          return !inFlight.has(pairKey(pair));
        });
      if (!sameEntries(settled(cached), settled(table))) drift.caches.push(kind);
    }
    return drift;
  }

  /**
   * Checks a user again and keeps what both checks found: a follow that committed while the first
   * check walked the tables shows up once, as drift it is not.
   */
  async recheck(first: RelationDrift): Promise<RelationDrift> {
    return confirm(first, await this.check(first.userId));
  }

  /**
   * Heals what `check` found (idempotent; each step derives from the truth, not from `drift`'s
   * numbers); false when the user's counters could not be rewritten (changes kept landing while they
   * were rebuilt) or other processes could not be told to drop their first followers page: the next
   * round, or a read, tries again.
   */
  async heal(drift: RelationDrift): Promise<boolean> {
    const { repo, metrics } = this.deps;
    let complete = true;
    if (drift.projection.length > 0) {
      // One transaction per slice: a big account restored from an old backup may differ by millions.
      for (let i = 0; i < drift.projection.length; i += HEAL_SLICE) {
        await repo.syncPairs(drift.projection.slice(i, i + HEAL_SLICE));
      }
      metrics.driftHealed.inc({ kind: 'projection' }, drift.projection.length);
    }
    if (drift.counters.length > 0) {
      const rebuilt = await this.deps.rebuildCounters(drift.userId);
      // Null: the user is gone, and so are their counters.
      if (rebuilt && !rebuilt.written) complete = false;
      else metrics.driftHealed.inc({ kind: 'counters' });
    }
    // A healed projection changes the followers list too: drop it with the drifted ones.
    const lists: ListRef[] = drift.caches.map((kind) => ({ owner: drift.userId, kind }));
    if (drift.projection.length > 0 && !drift.caches.includes('followers'))
      lists.push({ owner: drift.userId, kind: 'followers' });
    if (lists.length > 0) {
      await this.deps.lists.invalidate(lists);
      // Other processes not told keep their first page of the user's followers: not healed yet, and
      // no later check would find it (the lists are right now), so each round tells them again first.
      if (!(await this.announce([drift.userId]))) complete = false;
      if (drift.caches.length > 0) metrics.driftHealed.inc({ kind: 'cache' }, drift.caches.length);
    }
    return complete;
  }

  /**
   * Settles the changes whose events were lost (marks older than `orphanAfterMs`, at most `limit`):
   * the pair's projection is synced from the truth, both users' counters rebuilt (exact: the
   * rebuild counts the change and records its event applied, so the event arriving after all
   * would be skipped), their lists dropped, and the mark deleted. Until then such a change looked
   * in flight for ever: counted in no counter, and hidden from every check. A mark whose users'
   * counters kept changing while rebuilt stays for the next round.
   */
  async settleOrphans(limit = ORPHANS_PER_ROUND): Promise<{ found: number; settled: number }> {
    const { repo, metrics } = this.deps;
    const now = (this.deps.now ?? Date.now)();
    const orphans = await repo.unappliedBefore(now - (this.deps.orphanAfterMs ?? ORPHAN_AFTER_MS), limit);
    let settled = 0;
    for (const mark of orphans) {
      metrics.driftFound.inc({ kind: 'lost-event' });
      await repo.syncPairs([mark]);
      let rewritten = true;
      for (const userId of [mark.fromUserId, mark.toUserId]) {
        const rebuilt = await this.deps.rebuildCounters(userId);
        if (rebuilt && !rebuilt.written) rewritten = false;
      }
      await this.deps.lists.invalidate([
        { owner: mark.fromUserId, kind: 'following' },
        { owner: mark.toUserId, kind: 'followers' },
      ]);
      const announced = await this.announce([mark.toUserId]);
      if (!rewritten) continue;
      await repo.markApplied([mark.eventId]);
      metrics.driftHealed.inc({ kind: 'lost-event' });
      if (announced) settled++;
    }
    return { found: orphans.length, settled };
  }

  /**
   * `settleOrphans` in rounds until none is left, or a round settles none (counters that kept
   * changing: run again); how many were settled.
   */
  async settleAllOrphans(progress?: (settled: number) => void): Promise<number> {
    let settled = 0;
    for (;;) {
      const round = await this.settleOrphans(SETTLE_ALL_ROUND);
      settled += round.settled;
      progress?.(settled);
      if (round.found < SETTLE_ALL_ROUND || round.settled === 0) return settled;
    }
  }

  /** Users whose healed lists other processes could not be told of yet. */
  private readonly unannounced = new Set<number>();

  /** Tells other processes to drop these users' first followers pages (a few tries); whether it did. */
  private async announce(userIds: readonly number[]): Promise<boolean> {
    for (let attempt = 0; attempt < 3; attempt++) {
      if (attempt > 0) await sleep(200 * attempt);
      try {
        await this.deps.bus.publish(FIRST_PAGE_SCOPE, userIds.map(String));
        for (const id of userIds) this.unannounced.delete(id);
        return true;
      } catch {
        // Tried again, then left for the next round.
      }
    }
    for (const id of userIds) this.unannounced.add(id);
    return false;
  }

  /**
   * One periodic round: check the sample, check the drifted users again after `settleMs`, heal
   * what both checks found. Resolves with what it did.
   */
  async runOnce(): Promise<{
    checked: number;
    drifted: number;
    healed: number;
    lostEvents: number;
    lostEventsSettled: number;
  }> {
    if (this.unannounced.size > 0) await this.announce([...this.unannounced]);
    const orphans = await this.settleOrphans();
    const lost = { lostEvents: orphans.found, lostEventsSettled: orphans.settled };
    const sample = [...this.recent].slice(-this.deps.sampleSize).reverse();
    for (const id of sample) this.recent.delete(id);
    if (sample.length < this.deps.sampleSize) {
      const random = await this.deps.repo.sampleUserIds(this.deps.sampleSize - sample.length);
      for (const id of random) if (!sample.includes(id)) sample.push(id);
    }
    const suspects: RelationDrift[] = [];
    for (const userId of sample) {
      const drift = await this.check(userId);
      if (hasDrift(drift)) suspects.push(drift);
    }
    let drifted = 0;
    let healed = 0;
    if (suspects.length === 0) return { checked: sample.length, drifted, healed, ...lost };
    await sleep(this.deps.settleMs);
    for (const first of suspects) {
      const confirmed = await this.recheck(first);
      if (!hasDrift(confirmed)) continue;
      this.count(confirmed);
      drifted++;
      // A user whose counters kept changing is tried again at a later round.
      if (await this.heal(confirmed)) healed++;
    }
    return { checked: sample.length, drifted, healed, ...lost };
  }

  count(drift: RelationDrift): void {
    const { metrics } = this.deps;
    if (drift.projection.length > 0) metrics.driftFound.inc({ kind: 'projection' }, drift.projection.length);
    if (drift.counters.length > 0) metrics.driftFound.inc({ kind: 'counters' });
    if (drift.caches.length > 0) metrics.driftFound.inc({ kind: 'cache' }, drift.caches.length);
  }
}

/** What two checks of one user agree on. */
function confirm(first: RelationDrift, second: RelationDrift): RelationDrift {
  const pairs = new Set(first.projection.map(pairKey));
  return {
    userId: second.userId,
    projection: second.projection.filter((p) => pairs.has(pairKey(p))),
    // The same field off by the same amount: a change landing during a check is off by another.
    counters: second.counters.filter((c) =>
      first.counters.some((f) => f.field === c.field && f.expected - f.actual === c.expected - c.actual),
    ),
    caches: second.caches.filter((k) => first.caches.includes(k)),
  };
}
