import type { Logger } from 'pino';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import type { KeyValueStore } from '../platform/kv/kv.js';
import { takeLease } from '../platform/kv/lease.js';
import { PeriodicTask } from '../platform/workers/periodic.js';
import { replayAll, type Progress, type ReplayReport } from './maintenance.js';
import type { CounterStore } from './store/counter-store.js';

/** The key-value store key a replay holds while it runs: one replay at a time in a deployment. */
export const REPLAY_LEASE = 'counters:replay';
const REPLAY_LEASE_MS = 60_000;

export interface RestoreParts {
  store: CounterStore;
  events: EventLog;
  kv: KeyValueStore;
  /** Once the facts are back: the store is marked as the deployment's and sealed (toggles taken). */
  seal(): Promise<void>;
  /** Then the views the log holds are added back (`replayViews`); what it reports joins the summary. */
  addViewsBack(progress: Progress): Promise<object>;
}

/**
 * A whole restore, as `zhiguang counters replay` and the `CounterRestorer` run it: holds the
 * deployment's replay lease (null, changing nothing, while another replay holds it), replays
 * `counter-events` into the emptied store (`replayAll`), seals it and adds the views back.
 */
export async function restoreCounters(
  parts: RestoreParts,
  progress: Progress,
  options: { force?: boolean; signal?: AbortSignal; onLeaseLost?: () => void } = {},
): Promise<(ReplayReport & object) | null> {
  // A replay killed outright holds the lease a minute more.
  const lease = await takeLease(parts.kv, REPLAY_LEASE, REPLAY_LEASE_MS, options.onLeaseLost);
  if (!lease) return null;
  try {
    const counters = await replayAll(parts.store, parts.events, progress, {
      force: options.force ?? false,
      ...(options.signal ? { signal: options.signal } : {}),
    });
    await parts.seal();
    return { ...counters, ...(await parts.addViewsBack(progress)) };
  } finally {
    await lease.release().catch(() => undefined);
  }
}

/**
 * Heals a counter store that refuses toggles because its facts are not whole (`unsealedGroups`):
 * Redis came back without the deployment's data (restarted without persistence, failed over to an
 * empty replica; per group on a Redis Cluster), or a replay stopped half-way. Every `intervalMs`
 * a worker process checks the store's seals and, finding a group unsealed, runs the replay itself
 * (`restoreCounters`) rather than leave likes and favourites refused until someone runs it. Several
 * processes may check: the lease lets one replay at a time, and a replay under way (also one run by
 * hand) is waited for. A replay refused (the log lost its earliest records, or the store holds
 * changes the log does not: another deployment's log) or failed is tried again at the next check,
 * and said at error level at most once a minute.
 */
export class CounterRestorer {
  private readonly task: PeriodicTask;
  private lastTold = 0;

  constructor(
    private readonly parts: RestoreParts,
    private readonly log: Pick<Logger, 'warn' | 'error'>,
    intervalMs: number,
    private readonly now: () => number = Date.now,
  ) {
    this.task = new PeriodicTask(
      'counter-restore',
      intervalMs,
      () => this.runOnce(),
      (_name, err) => this.tell(err),
    );
  }

  start(): void {
    this.task.start();
  }

  async stop(): Promise<void> {
    await this.task.stop();
  }

  /** One check, and the replay if the store needs one; resolves to what it did. */
  async runOnce(): Promise<'sealed' | 'busy' | 'restored'> {
    const unsealed = await this.parts.store.unsealedGroups();
    if (unsealed === 0) return 'sealed';
    const started = this.now();
    let announced = false;
    const report = await restoreCounters(this.parts, () => {
      // Said once the lease is held, not by every process that finds the store unsealed.
      if (announced) return;
      announced = true;
      this.log.warn(
        { unsealedGroups: unsealed },
        'the counter store refuses likes and favourites until its facts are whole again: replaying counter-events to restore them',
      );
    });
    if (report === null) return 'busy';
    this.log.warn(
      { ...report, seconds: (this.now() - started) / 1000 },
      'counter store restored from the event log: likes and favourites are taken again',
    );
    return 'restored';
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
