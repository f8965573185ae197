import { NotFoundError } from '../platform/errors/errors.js';
import type { UserCounts } from './model.js';
import type { UserCountSource } from './source.js';
import type { UserCounterStore } from './store/user-counter-store.js';
import type { UserCounterMetrics } from './user-counter.metrics.js';

/** Rebuild attempts before answering with the database's counts unwritten (a user busy with deltas). */
const MAX_REBUILD_ATTEMPTS = 5;

export type RebuildMode = 'missing' | 'overwrite';
export type RebuildReason = 'read' | 'drift' | 'admin';

export interface RebuildResult {
  counts: UserCounts;
  written: boolean;
}

/**
 * Users' counts as everyone sees them. Reads parse snapshots; a missing or malformed one is rebuilt
 * from the database (all fields at once, never zeros while a rebuild runs: readers wait for it), one
 * rebuild per user at a time in this process.
 *
 * A rebuild is exact also against deltas applied by other processes meanwhile:
 * 1. read the user's version (and snapshot);
 * 2. read the truth from the database, with the events it counts whose deltas may still be on
 *    their way;
 * 3. write the counts only if the version is unchanged (and, for a missing snapshot, only if it is
 *    still missing), recording those events as applied in the same atomic step.
 * A delta applied between 1 and 3 raises the version, so the write is refused and the rebuild starts
 * over: it is never lost under a snapshot computed without it. A delta that arrives after 3 is either
 * counted in the written counts (then it is recorded as applied and skipped) or not (then it is
 * applied on top). The one bound is the source's: see `UserCountPart`.
 */
export class UserCounterService {
  private readonly rebuilding = new Map<number, Promise<UserCounts | null>>();

  constructor(
    private readonly store: UserCounterStore,
    private readonly source: UserCountSource,
    private readonly metrics: UserCounterMetrics,
    private readonly now: () => number = Date.now,
  ) {}

  /** One user's counts; 404 when there is no such user. */
  async counts(userId: number): Promise<UserCounts> {
    const [counts] = await this.countsMany([userId]);
    if (!counts) throw new NotFoundError('No such user');
    return counts;
  }

  /** Counts of many users with one store round trip when all snapshots exist; null for unknown users. */
  async countsMany(userIds: readonly number[]): Promise<(UserCounts | null)[]> {
    const found = await this.store.read(userIds);
    return Promise.all(
      found.map((counts, i) => (counts ? Promise.resolve(counts) : this.rebuildMissing(userIds[i]!))),
    );
  }

  private rebuildMissing(userId: number): Promise<UserCounts | null> {
    let pending = this.rebuilding.get(userId);
    if (!pending) {
      pending = this.rebuild(userId, 'missing', 'read')
        .then((r) => r?.counts ?? null)
        .finally(() => this.rebuilding.delete(userId));
      this.rebuilding.set(userId, pending);
    }
    return pending;
  }

  /**
   * Rebuilds a user's snapshot from the database: `missing` leaves a readable snapshot alone (and
   * returns it), `overwrite` replaces it. `written` is false when the counts come from a snapshot
   * already there, or when deltas kept arriving or the source's counts were provisional and the
   * truth was answered unwritten. Null when there is no such user.
   */
  async rebuild(userId: number, mode: RebuildMode, reason: RebuildReason): Promise<RebuildResult | null> {
    let truth: UserCounts | null = null;
    for (let attempt = 0; attempt < MAX_REBUILD_ATTEMPTS; attempt++) {
      const before = await this.store.inspect(userId);
      if (mode === 'missing' && before.counts) return { counts: before.counts, written: false };
      const source = await this.source.compute(userId, this.now());
      if (!source) return null;
      truth = source.counts;
      // Written, counts read while the facts are restored would stay wrong once they are.
      if (source.provisional) return { counts: truth, written: false };
      const result = await this.store.write(
        userId,
        source.counts,
        {
          ifVersion: before.version,
          ifAbsent: mode === 'missing',
          markApplied: source.unapplied.map((e) => e.eventId),
        },
        this.now(),
      );
      if (result.outcome === 'present') return { counts: result.counts, written: false };
      if (result.outcome === 'written') {
        this.metrics.rebuilds.inc({ reason });
        return { counts: source.counts, written: true };
      }
      this.metrics.rebuildConflicts.inc();
    }
    // Deltas kept arriving between every read and write: answer with the truth, leave the store be.
    return truth && { counts: truth, written: false };
  }
}
