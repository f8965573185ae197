import { sameCounts, type UserCounts, type UserField } from './model.js';
import type { UserCountSource } from './source.js';
import type { UserCounterStore } from './store/user-counter-store.js';
import type { UserCounterMetrics } from './user-counter.metrics.js';
import type { UserCounterService } from './user-counter.service.js';

export type Progress = (message: string) => void;

/**
 * What one check found: `ok` (the snapshot is the truth, less deltas still on their way), `missing`
 * (no snapshot; a read rebuilds it), `drift` (left alone), `healed` (drift, overwritten with the
 * truth), `busy` (deltas kept arriving while it looked; checked again next time) or `unknown` (no
 * such user).
 */
export type CheckOutcome = 'ok' | 'missing' | 'drift' | 'healed' | 'busy' | 'unknown';

/** Tries per user before calling it busy. */
const CHECK_ATTEMPTS = 3;

/**
 * Compares user snapshots with the database and heals drift. A snapshot may lag the database by the
 * deltas still on their way; the source says which events its counts include that may not be
 * applied yet, the store says which of those are, so the comparison is exact: snapshot = truth minus
 * the deltas of included events not yet applied. The check is valid only if no delta was applied
 * while it looked (the user's version is read before and after). Healing is an overwriting rebuild,
 * which is exact against concurrent deltas (see `UserCounterService`).
 */
export class UserCounterReconciler {
  private readonly recent = new Map<number, true>();

  constructor(
    private readonly store: UserCounterStore,
    private readonly source: UserCountSource,
    private readonly service: UserCounterService,
    private readonly metrics: UserCounterMetrics,
    private readonly options = { recentCapacity: 10_000, sampleRecent: 200, sampleRandom: 100 },
    private readonly now: () => number = Date.now,
  ) {}

  async check(userId: number, fix: boolean): Promise<CheckOutcome> {
    for (let attempt = 0; attempt < CHECK_ATTEMPTS; attempt++) {
      const before = await this.store.inspect(userId);
      if (!before.counts) return 'missing';
      const truth = await this.source.compute(userId, this.now());
      if (!truth) return 'unknown';
      const after = await this.store.inspect(
        userId,
        truth.unapplied.map((e) => e.eventId),
      );
      if (after.version !== before.version || !after.counts) continue;
      // What the snapshot holds while the events not yet applied are on their way: their sum taken
      // off, clamped once (an entry and its exit in transit cancel out).
      const expected: UserCounts = { ...truth.counts };
      const pending = new Map<UserField, number>();
      truth.unapplied.forEach((e, i) => {
        if (!after.applied[i]) pending.set(e.field, (pending.get(e.field) ?? 0) + e.delta);
      });
      for (const [field, delta] of pending) expected[field] = Math.max(0, expected[field] - delta);
      if (sameCounts(after.counts, expected)) return 'ok';
      this.metrics.driftFound.inc();
      if (!fix || !(await this.service.rebuild(userId, 'overwrite', 'drift'))?.written) return 'drift';
      this.metrics.driftHealed.inc();
      return 'healed';
    }
    return 'busy';
  }

  /** Remembers users a batch moved, so the periodic run checks them first. */
  touched(userIds: readonly number[]): void {
    for (const id of userIds) {
      this.recent.delete(id);
      this.recent.set(id, true);
    }
    while (this.recent.size > this.options.recentCapacity) {
      const oldest = this.recent.keys().next().value;
      if (oldest === undefined) break;
      this.recent.delete(oldest);
    }
  }

  /** The periodic run: recently moved users and a random run of users, drift healed. */
  async runOnce(): Promise<{ checked: number; drifted: number }> {
    const recent = [...this.recent.keys()].slice(-this.options.sampleRecent);
    const random = await this.source.sampleUserIds(this.options.sampleRandom);
    const users = [...new Set([...recent, ...random])];
    let drifted = 0;
    for (const userId of users) {
      const outcome = await this.check(userId, true);
      if (outcome === 'drift' || outcome === 'healed') drifted++;
    }
    return { checked: users.length, drifted };
  }

  /** `zhiguang users verify [--fix]`: every user, page by page. */
  async verifyAll(fix: boolean, progress: Progress, pageSize = 500): Promise<UserVerifyReport> {
    const report: UserVerifyReport = {
      checked: 0,
      ok: 0,
      missing: 0,
      busy: 0,
      driftedUsers: 0,
      drifted: [],
      fixed: 0,
    };
    let after = 0;
    progress('verifying users');
    for (;;) {
      const page = await this.source.userIdsAfter(after, pageSize);
      if (page.length === 0) break;
      for (const userId of page) {
        const outcome = await this.check(userId, fix);
        report.checked++;
        if (outcome === 'ok') report.ok++;
        else if (outcome === 'missing') report.missing++;
        else if (outcome === 'busy') report.busy++;
        else if (outcome === 'drift' || outcome === 'healed') {
          report.driftedUsers++;
          if (report.drifted.length < 1000) report.drifted.push(userId);
          if (outcome === 'healed') report.fixed++;
        }
      }
      after = page[page.length - 1]!;
      progress(
        `verified ${report.checked} users: ${report.driftedUsers} drifted, ${report.missing} without a snapshot`,
      );
    }
    return report;
  }
}

export interface UserVerifyReport {
  checked: number;
  ok: number;
  /** Users without a snapshot (rebuilt when first read; not drift). */
  missing: number;
  busy: number;
  /** Users whose counts differed (the first 1000 ids are listed). */
  driftedUsers: number;
  drifted: number[];
  fixed: number;
}
