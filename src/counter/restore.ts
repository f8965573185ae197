import type { Logger } from 'pino';
import { isDependencyOutage } from '../platform/errors/outage.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import type { KeyValueStore } from '../platform/kv/kv.js';
import { takeLease } from '../platform/kv/lease.js';
import { PeriodicTask } from '../platform/workers/periodic.js';
import { replayAll, type Progress, type ReplayReport } from './maintenance.js';
import type { CounterStore } from './store/counter-store.js';

/** The key-value store key a replay holds while it runs: one replay at a time in a deployment. */
export const REPLAY_LEASE = 'counters:replay';
/**
 * Renewed every third of it: short, so that a replay killed outright (a worker gone with it) is
 * taken over by another worker's restorer within about this long.
 */
const REPLAY_LEASE_MS = 20_000;

export interface RestoreParts {
  store: CounterStore;
  events: EventLog;
  kv: KeyValueStore;
  /** Once the facts are back and sealed: the store is marked as the deployment's. */
  markRestored(): Promise<void>;
  /**
   * The views the log holds, added back before the store is sealed (`replayViews`); what it reports
   * joins the summary.
   */
  addViewsBack(progress: Progress): Promise<object>;
}

export type RestoreOutcome =
  | { outcome: 'restored'; report: ReplayReport & object }
  /** Another replay holds the deployment's lease (or one stopped less than `REPLAY_LEASE_MS` ago). */
  | { outcome: 'busy' }
  /** `onlyIfUnsealed`, and the store was whole once the lease was held. */
  | { outcome: 'sealed' };

/**
 * A whole restore, as `zhiguang counters replay` and the `CounterRestorer` run it: holds the
 * deployment's replay lease (changing nothing while another replay holds it), replays
 * `counter-events` into the emptied store (`replayAll`) with the views added back before it is
 * sealed, then marks the store as the deployment's. A lease lost before the reset stops the replay,
 * changing nothing (another may have started); after it, the replay goes on, as after a signal.
 */
export async function restoreCounters(
  parts: RestoreParts,
  progress: Progress,
  options: { force?: boolean; signal?: AbortSignal; onLeaseLost?: () => void; onlyIfUnsealed?: boolean } = {},
): Promise<RestoreOutcome> {
  const lost = new AbortController();
  // A replay killed outright holds the lease `REPLAY_LEASE_MS` more.
  const lease = await takeLease(parts.kv, REPLAY_LEASE, REPLAY_LEASE_MS, () => {
    options.onLeaseLost?.();
    lost.abort(new Error('the replay lost its claim on the deployment; nothing was changed'));
  });
  if (!lease) return { outcome: 'busy' };
  try {
    // Another process may have restored the store between the look that led here and the lease.
    if (options.onlyIfUnsealed && (await parts.store.unsealedGroups()) === 0) return { outcome: 'sealed' };
    let views: object = {};
    const counters = await replayAll(parts.store, parts.events, progress, {
      force: options.force ?? false,
      signal: options.signal ? AbortSignal.any([options.signal, lost.signal]) : lost.signal,
      refill: async () => void (views = await parts.addViewsBack(progress)),
      holds: () => lease.held(),
    });
    // Marked as the deployment's only while the claim holds: a store wiped meanwhile (the claim's
    // key with it, on Redis) must not be marked as whole.
    if (!(await lease.held()))
      throw new Error('the replay lost its claim on the deployment before marking the store restored');
    await parts.markRestored();
    return { outcome: 'restored', report: { ...counters, ...views } };
  } finally {
    await lease.release().catch(() => undefined);
  }
}

/** The wait after a first failed attempt (a replay reads the whole log), doubling with each further one. */
const FIRST_BACKOFF_MS = 10_000;
/** The longest wait between two attempts after failed ones. */
const MAX_BACKOFF_MS = 10 * 60_000;

/**
 * Heals a counter store that refuses toggles because its facts are not whole (`unsealedGroups`):
 * Redis came back without the deployment's data (restarted without persistence, failed over to an
 * empty replica; per group on a Redis Cluster), or a replay stopped half-way. Every `intervalMs`
 * a worker process looks at the store's seals and, finding a group unsealed, runs the replay itself
 * (`restoreCounters`) rather than leave likes and favourites refused until someone runs it. Several
 * processes may look: the lease lets one replay at a time, a replay under way (also one run by
 * hand) is waited for, and the seals are read again once the lease is held. A replay that refuses
 * (the log lost its earliest records, or the store holds changes the log does not: another
 * deployment's log) or fails is tried again after a back-off that doubles from 10 s up to ten minutes, and said
 * at error level at most once a minute; the start of a restore is said once until it succeeds. A
 * stop of the worker ends the replay at its next step: before the reset changing nothing, after it
 * leaving the store unsealed for another worker's restorer (a stop should not wait out a replay).
 */
export class CounterRestorer {
  private readonly task: PeriodicTask;
  private lastTold = Number.NEGATIVE_INFINITY;
  private failures = 0;
  private nextAttemptAt = Number.NEGATIVE_INFINITY;
  private announced = false;
  private toldBusy = false;

  constructor(
    private readonly parts: RestoreParts,
    private readonly log: Pick<Logger, 'warn' | 'error'>,
    intervalMs: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.task = new PeriodicTask(
      'counter-restore',
      intervalMs,
      (signal) => this.runOnce(signal),
      (_name, err) => this.tell(err),
    );
  }

  start(): void {
    this.task.start();
  }

  async stop(): Promise<void> {
    await this.task.stop();
  }

  /** One look, and the replay if the store needs one; resolves to what it did. */
  async runOnce(
    signal?: AbortSignal,
  ): Promise<'sealed' | 'busy' | 'restored' | 'waiting' | 'unreachable' | 'stopped'> {
    let unsealed: number;
    try {
      unsealed = await this.parts.store.unsealedGroups();
    } catch (err) {
      // The store out of reach is told where it is used; nothing to restore can be known meanwhile.
      if (isDependencyOutage(err)) return 'unreachable';
      throw err;
    }
    if (unsealed === 0) {
      this.settled();
      return 'sealed';
    }
    if (this.now() < this.nextAttemptAt) return 'waiting';
    const started = this.now();
    let outcome: RestoreOutcome;
    try {
      outcome = await restoreCounters(
        this.parts,
        () => {
          // A stop of the worker ends the replay at its next step, also past the reset (the store
          // stays unsealed, and another worker's restorer replays it again).
          signal?.throwIfAborted();
          // Said once the lease is held, and once until the store is whole.
          if (this.announced) return;
          this.announced = true;
          this.log.warn(
            { unsealedGroups: unsealed },
            'the counter store refuses likes and favourites until its facts are whole again: replaying counter-events to restore them',
          );
        },
        { onlyIfUnsealed: true, ...(signal ? { signal } : {}) },
      );
    } catch (err) {
      if (signal?.aborted) {
        // Begun (said so above) and cut short by the worker's stop: the store stays refused.
        if (this.announced)
          this.log.warn(
            {},
            'the counter store restore stopped with this process: likes and favourites stay refused until another worker (or the next start) restores the store',
          );
        return 'stopped';
      }
      this.failures++;
      this.nextAttemptAt =
        this.now() + Math.min(MAX_BACKOFF_MS, FIRST_BACKOFF_MS * 2 ** Math.min(this.failures - 1, 20));
      throw err;
    }
    if (outcome.outcome === 'busy') {
      // Said once until the store is whole: the replay under way may be one that ended without
      // letting its claim go, which lapses within 20 s.
      if (!this.toldBusy) {
        this.toldBusy = true;
        this.log.warn(
          { unsealedGroups: unsealed },
          "the counter store refuses likes and favourites until its facts are whole again; another replay holds the deployment's claim (one under way, or one that ended without letting it go, whose claim lapses within 20 s): waiting for it",
        );
      }
      return 'busy';
    }
    this.settled();
    if (outcome.outcome === 'sealed') return 'sealed';
    this.log.warn(
      { ...outcome.report, seconds: (this.now() - started) / 1000 },
      'counter store restored from the event log: likes and favourites are taken again',
    );
    return 'restored';
  }

  private settled(): void {
    this.failures = 0;
    this.nextAttemptAt = Number.NEGATIVE_INFINITY;
    this.announced = false;
    this.toldBusy = false;
  }

  private tell(err: unknown): void {
    if (this.now() - this.lastTold < 60_000) return;
    this.lastTold = this.now();
    this.log.error(
      { err },
      'the counter store could not be restored from the event log; trying again (likes and favourites are refused meanwhile)',
    );
  }
}
