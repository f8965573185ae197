import { recheckUnsettled } from '../platform/workers/recheck.js';
import { USER_FIELDS, type UserCounts, type UserField } from './model.js';
import type { UserCountSource } from './source.js';
import type { UserCounterStore } from './store/user-counter-store.js';
import type { UserCounterMetrics } from './user-counter.metrics.js';
import type { UserCounterService } from './user-counter.service.js';
import { trimOldest } from '../platform/cache/trim.js';

export type Progress = (message: string) => void;

/**
 * What one check found: `ok` (the snapshot is the truth, less deltas still on their way), `missing`
 * (no snapshot; a read rebuilds it), `drift` (left alone, or with `fix` a rebuild that could not be
 * written), `healed` (drift, overwritten with the truth), `busy` (not known: deltas kept arriving
 * while it looked, or the fields moved by events whose deltas the database cannot tell are off by
 * no more than those events on their way can make them, and nothing else differs; checked again
 * later; also while the counter store restores its facts) or `unknown` (no such user).
 */
export type CheckOutcome = 'ok' | 'missing' | 'drift' | 'healed' | 'busy' | 'unknown';

export interface UserReconcilerOptions {
  /** Recently moved users remembered, and how many of them and of random users a round checks. */
  recentCapacity: number;
  sampleRecent: number;
  sampleRandom: number;
  /** `verifyAll`: the pause before users found busy are checked again (twice at most). */
  recheckMs: number;
  /** `verifyAll`: users found busy kept to be checked again; those past it are reported busy at once. */
  recheckMaxUsers?: number;
}

const DEFAULT_OPTIONS: UserReconcilerOptions = {
  recentCapacity: 10_000,
  sampleRecent: 200,
  sampleRandom: 100,
  recheckMs: 2_500,
};

/** Tries per user before calling it busy. */
const CHECK_ATTEMPTS = 3;
/** `verifyAll`: rounds of checking busy users again, and how many users it keeps for them. */
const RECHECK_ROUNDS = 2;
const RECHECK_MAX_USERS = 10_000;
/** Ids listed in a report (drifted, busy). */
const LISTED = 1_000;

/**
 * Compares user snapshots with the database and heals drift. A snapshot may lag the database by the
 * deltas still on their way; the source says which events its counts include that may not be
 * applied yet, the store says which of those are, so the comparison is exact: snapshot = truth minus
 * the deltas of included events not yet applied. Where the source knows such an event but not its
 * delta (likes and favourites received), the fields it moves cannot be judged while it is on its
 * way: off by no more than those events can move them (and nothing else differing), the user is
 * `busy`; further off, it is drift. The check is valid only if no delta was
 * applied while it looked (the user's version is read before and after). Healing is an overwriting
 * rebuild, which is exact against concurrent deltas (see `UserCounterService`).
 */
export class UserCounterReconciler {
  /** Users moved recently, oldest first, each with the number of the touch that last brought it. */
  private readonly recent = new Map<number, number>();
  private touches = 0;
  private readonly options: UserReconcilerOptions;

  constructor(
    private readonly store: UserCounterStore,
    private readonly source: UserCountSource,
    private readonly service: UserCounterService,
    private readonly metrics: UserCounterMetrics,
    options: Partial<UserReconcilerOptions> = {},
    private readonly now: () => number = Date.now,
  ) {
    this.options = { ...DEFAULT_OPTIONS, ...options };
  }

  async check(userId: number, fix: boolean): Promise<CheckOutcome> {
    for (let attempt = 0; attempt < CHECK_ATTEMPTS; attempt++) {
      const before = await this.store.inspect(userId);
      if (!before.counts) return 'missing';
      const truth = await this.source.compute(userId, this.now());
      if (!truth) return 'unknown';
      // The truth itself is not known while the facts are restored.
      if (truth.provisional) return 'busy';
      const ids = [...new Set(truth.unapplied.map((e) => e.eventId))];
      const after = await this.store.inspect(userId, ids);
      if (after.version !== before.version || !after.counts) continue;
      const applied = new Set(ids.filter((_, i) => after.applied[i]));
      // What the snapshot holds while the events not yet applied are on their way: their sum taken
      // off, clamped once (an entry and its exit in transit cancel out). Fields moved by an event of
      // unknown delta cannot be known.
      const expected: UserCounts = { ...truth.counts };
      const pending = new Map<UserField, number>();
      const unknown = new Set<UserField>();
      const spans = new Map<string, number>();
      for (const e of truth.unapplied) {
        if (applied.has(e.eventId)) continue;
        if (e.delta === null) {
          unknown.add(e.field);
          spans.set(e.eventId, e.span ?? Number.POSITIVE_INFINITY);
        } else pending.set(e.field, (pending.get(e.field) ?? 0) + e.delta);
      }
      for (const [field, delta] of pending) expected[field] = Math.max(0, expected[field] - delta);
      const counts = after.counts;
      const differ = USER_FIELDS.filter((f) => !unknown.has(f) && counts[f] !== expected[f]);
      if (differ.length === 0) {
        // Fields moved by events of unknown delta: each of those events stands for at most `span`
        // events of one each, so the snapshot may be that far off the truth while they are on their
        // way, and not further.
        const off = [...unknown].reduce((sum, f) => sum + Math.abs(counts[f] - expected[f]), 0);
        if (off === 0) return 'ok';
        if (off <= [...spans.values()].reduce((sum, n) => sum + n, 0)) return 'busy';
      }
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
      this.recent.set(id, ++this.touches);
    }
    trimOldest(this.recent, this.options.recentCapacity);
  }

  /**
   * The periodic run: recently moved users and a random run of users, drift healed. Users left busy
   * or drifted (not healed) are remembered as moved, so the next run checks them first.
   */
  async runOnce(): Promise<RoundReport> {
    const recent = [...this.recent.keys()].slice(-this.options.sampleRecent);
    const touchedBefore = this.touches;
    const random = await this.source.sampleUserIds(this.options.sampleRandom);
    const users = [...new Set([...recent, ...random])];
    const round: RoundReport = { checked: users.length, drifted: 0, healed: 0, busy: 0 };
    const again: number[] = [];
    for (const userId of users) {
      const outcome = await this.check(userId, true);
      // Checked: taken off unless it moved again meanwhile, so the next round checks whom it brings
      // (and this one again only if it is found busy or drifted below). One not reached stays.
      if ((this.recent.get(userId) ?? Infinity) <= touchedBefore) this.recent.delete(userId);
      if (outcome === 'drift' || outcome === 'healed') round.drifted++;
      if (outcome === 'healed') round.healed++;
      if (outcome === 'busy') round.busy++;
      if (outcome === 'drift' || outcome === 'busy') again.push(userId);
    }
    this.touched(again);
    return round;
  }

  /**
   * `zhiguang users verify [--fix]`: every user, page by page; users found busy are checked again
   * after a pause (twice at most), and only those still busy then are reported so. With `fix` those
   * are rewritten from the database anyway (exact, whatever they held: see `UserCounterService`), so
   * a user an event lost on its way keeps busy can be verified by the next run.
   */
  async verifyAll(fix: boolean, progress: Progress, pageSize = 500): Promise<UserVerifyReport> {
    const report: UserVerifyReport = {
      checked: 0,
      ok: 0,
      missing: 0,
      busy: 0,
      busyUsers: [],
      driftedUsers: 0,
      drifted: [],
      fixed: 0,
      notFixed: 0,
      busyRewritten: 0,
    };
    const busy: number[] = [];
    const count = (userId: number, outcome: CheckOutcome) => {
      if (outcome === 'ok') report.ok++;
      else if (outcome === 'missing') report.missing++;
      else if (outcome === 'drift' || outcome === 'healed') {
        report.driftedUsers++;
        if (report.drifted.length < LISTED) report.drifted.push(userId);
        if (outcome === 'healed') report.fixed++;
        else if (fix) report.notFixed++;
      }
    };
    const tally = () =>
      `verified ${report.checked} users: ${report.driftedUsers} drifted, ${report.missing} without a snapshot, ${report.busy + busy.length} busy`;
    let after = 0;
    progress('verifying users');
    for (;;) {
      const page = await this.source.userIdsAfter(after, pageSize);
      if (page.length === 0) break;
      for (const userId of page) {
        const outcome = await this.check(userId, fix);
        report.checked++;
        if (outcome !== 'busy') count(userId, outcome);
        else if (busy.length < (this.options.recheckMaxUsers ?? RECHECK_MAX_USERS)) busy.push(userId);
        else await this.stillBusy(report, userId, fix);
      }
      after = page[page.length - 1]!;
      progress(tally());
    }
    const rechecking = busy.length > 0;
    const unsettled = await recheckUnsettled(
      busy.splice(0),
      { rounds: RECHECK_ROUNDS, pauseMs: this.options.recheckMs },
      async (userId) => {
        const outcome = await this.check(userId, fix);
        if (outcome === 'busy') return false;
        count(userId, outcome);
        return true;
      },
      (n) => progress(`checking ${n} busy users again`),
    );
    for (const userId of unsettled) await this.stillBusy(report, userId, fix);
    if (rechecking) progress(tally());
    return report;
  }

  /** A user still busy: reported so, and with `fix` rewritten from the database all the same. */
  private async stillBusy(report: UserVerifyReport, userId: number, fix: boolean): Promise<void> {
    listBusy(report, userId);
    if (fix && (await this.service.rebuild(userId, 'overwrite', 'admin'))?.written) report.busyRewritten++;
  }
}

function listBusy(report: UserVerifyReport, userId: number): void {
  report.busy++;
  if (report.busyUsers.length < LISTED) report.busyUsers.push(userId);
}

export interface RoundReport {
  checked: number;
  /** Users whose counts differed, and how many of those were healed. */
  drifted: number;
  healed: number;
  /** Users not known to be right or wrong (see `CheckOutcome`), checked first next time. */
  busy: number;
}

export interface UserVerifyReport {
  checked: number;
  ok: number;
  /** Users without a snapshot (rebuilt when first read; not drift). */
  missing: number;
  /**
   * Users that could not be verified: still busy after being checked again (the first 1000 ids
   * listed). Run the command again.
   */
  busy: number;
  busyUsers: number[];
  /** Users whose counts differed (the first 1000 ids are listed). */
  driftedUsers: number;
  drifted: number[];
  /** With --fix: drifted users healed, and those whose rebuild could not be written (deltas kept landing). */
  fixed: number;
  notFixed: number;
  /** With --fix: busy users rewritten from the database all the same (not verified; the next run can). */
  busyRewritten: number;
}
