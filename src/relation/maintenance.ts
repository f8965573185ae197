import type { InvalidationBus } from '../platform/cache/invalidation-bus.js';
import type { ListCache } from './list-cache/list-cache.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { hasDrift, ORPHAN_AFTER_MS, type RelationDrift, type RelationReconciler } from './reconciler.js';
import type { Pair, RelationRepository } from './relation.repository.js';
import { FIRST_PAGE_SCOPE } from './relation.service.js';

export type Progress = (message: string) => void;

/** Longer than a follow takes from its commit to the projection and counters (p99 well under 1 s). */
export const VERIFY_SETTLE_MS = 2_000;

export interface VerifyOptions {
  now?: () => number;
  pageSize?: number;
  /** Wait before users that look drifted are checked again. */
  settleMs?: number;
}

export interface RelationVerifyReport {
  checked: number;
  /** Users with any drift (at most the first 1000 ids are listed). */
  driftedUsers: number;
  drifted: number[];
  /** Follower rows that did not mirror `following`. */
  projectionPairs: number;
  /** Users whose followings/followers counters differed from the tables. */
  counterUsers: number;
  /** Cached lists that differed from their tables. */
  cacheLists: number;
  /** Drifted users healed (with --fix), and those whose counters kept changing while rebuilt. */
  fixed: number;
  notFixed: number;
  /** Changes whose counter deltas are still on their way, and the age of the oldest (ms). */
  inFlight: number;
  oldestInFlightMs: number | null;
  /**
   * Changes whose events the log lost (marks over a day old, counted in no counter): found, and
   * settled with --fix (`RelationReconciler.settleOrphans`).
   */
  lostEvents: number;
  lostEventsSettled: number;
}

/**
 * `zhiguang relations verify [--fix]`: every user, page by page; a page's users that look drifted
 * are checked again after `settleMs`, and only what both checks found is reported (and healed).
 */
export async function verifyRelations(
  repo: RelationRepository,
  reconciler: RelationReconciler,
  fix: boolean,
  progress: Progress,
  { now = Date.now, pageSize = 500, settleMs = VERIFY_SETTLE_MS }: VerifyOptions = {},
): Promise<RelationVerifyReport> {
  const report: RelationVerifyReport = {
    checked: 0,
    driftedUsers: 0,
    drifted: [],
    projectionPairs: 0,
    counterUsers: 0,
    cacheLists: 0,
    fixed: 0,
    notFixed: 0,
    inFlight: 0,
    oldestInFlightMs: null,
    lostEvents: 0,
    lostEventsSettled: 0,
  };
  let after = 0;
  for (;;) {
    const page = await repo.userIdsAfter(after, pageSize);
    if (page.length === 0) break;
    const suspects: RelationDrift[] = [];
    for (const userId of page) {
      const drift = await reconciler.check(userId);
      report.checked++;
      if (hasDrift(drift)) suspects.push(drift);
    }
    // What a follow committing during a check looks like passes: only drift found twice counts.
    if (suspects.length > 0) await sleep(settleMs);
    for (const first of suspects) {
      const drift = await reconciler.recheck(first);
      if (!hasDrift(drift)) continue;
      report.driftedUsers++;
      if (report.drifted.length < 1000) report.drifted.push(drift.userId);
      report.projectionPairs += drift.projection.length;
      if (drift.counters.length > 0) report.counterUsers++;
      report.cacheLists += drift.caches.length;
      reconciler.count(drift);
      if (fix) {
        if (await reconciler.heal(drift)) report.fixed++;
        else report.notFixed++;
      }
    }
    after = page[page.length - 1]!;
    progress(`relations verify: ${report.checked} users checked, ${report.driftedUsers} drifted`);
  }
  const inFlight = await repo.unappliedSummary(now(), now() - ORPHAN_AFTER_MS);
  report.lostEvents = inFlight.orphaned;
  if (inFlight.orphaned > 0)
    progress(`relations verify: ${inFlight.orphaned} changes whose events were lost (over a day unapplied)`);
  if (fix && inFlight.orphaned > 0) {
    report.lostEventsSettled = await reconciler.settleAllOrphans((settled) =>
      progress(`relations verify: ${settled} changes with lost events settled`),
    );
    if (report.lostEventsSettled < report.lostEvents) report.notFixed++;
  }
  const left = fix ? await repo.unappliedSummary(now(), now() - ORPHAN_AFTER_MS) : inFlight;
  report.inFlight = left.count;
  report.oldestInFlightMs = left.oldestAgeMs;
  return report;
}

export interface RelationRebuildReport {
  /** Follow rows walked in `following` and rows walked in `follower`. */
  following: number;
  follower: number;
  /** Pairs whose `follower` row had to change. */
  projectionChanged: number;
  /** Users whose counters were rewritten from the tables, and lists dropped from the cache. */
  users: number;
  countersRewritten: number;
  /**
   * Users whose counters kept changing while they were rebuilt, so were not rewritten (the first
   * 1000 ids listed): run the command again, or `users verify --fix`.
   */
  countersBusy: number;
  busyUsers: number[];
  listsDropped: number;
  /** Batches of users whose cached first followers page other processes were not told to drop. */
  firstPagesNotAnnounced: number;
}

/**
 * `zhiguang relations rebuild`: makes the `follower` projection mirror `following` (walking both
 * tables, so rows of either side are visited), rewrites every user's counters from the tables and
 * drops every cached list. Safe while the service runs: each step derives from the truth as it is
 * when the step runs, and the consumer's own work stays idempotent.
 */
export async function rebuildRelations(
  deps: {
    repo: RelationRepository;
    lists: ListCache;
    bus: InvalidationBus;
    rebuildCounters: (userId: number) => Promise<{ written: boolean } | null>;
  },
  progress: Progress,
  pageSize = 1000,
): Promise<RelationRebuildReport> {
  const report: RelationRebuildReport = {
    following: 0,
    follower: 0,
    projectionChanged: 0,
    users: 0,
    countersRewritten: 0,
    countersBusy: 0,
    busyUsers: [],
    listsDropped: 0,
    firstPagesNotAnnounced: 0,
  };
  const walk = async (
    read: (after: Pair | null, limit: number) => Promise<Pair[]>,
    field: 'following' | 'follower',
  ) => {
    let after: Pair | null = null;
    for (;;) {
      const page = await read(after, pageSize);
      if (page.length === 0) return;
      const synced = await deps.repo.syncPairs(page);
      report[field] += page.length;
      report.projectionChanged += synced.filter((s) => s.changed).length;
      after = page[page.length - 1]!;
      progress(
        `relations rebuild: ${field} ${report[field]} rows, ${report.projectionChanged} pairs changed`,
      );
    }
  };
  await walk((after, limit) => deps.repo.followingPage(after, limit), 'following');
  await walk((after, limit) => deps.repo.followerPage(after, limit), 'follower');

  let afterId = 0;
  for (;;) {
    const users = await deps.repo.userIdsAfter(afterId, pageSize);
    if (users.length === 0) break;
    await deps.lists.invalidate(
      users.flatMap((owner) => [
        { owner, kind: 'following' as const },
        { owner, kind: 'followers' as const },
      ]),
    );
    report.listsDropped += users.length * 2;
    await deps.bus.publish(FIRST_PAGE_SCOPE, users.map(String)).catch(() => {
      report.firstPagesNotAnnounced++;
    });
    for (const userId of users) {
      const rebuilt = await deps.rebuildCounters(userId);
      if (rebuilt?.written) report.countersRewritten++;
      else if (rebuilt) {
        report.countersBusy++;
        if (report.busyUsers.length < 1000) report.busyUsers.push(userId);
      }
      report.users++;
    }
    afterId = users[users.length - 1]!;
    progress(`relations rebuild: ${report.users} users, ${report.countersRewritten} counters rewritten`);
  }
  return report;
}
