import { setImmediate as nextTurn } from 'node:timers/promises';
import type { EventLog } from '../eventlog/eventlog.js';
import { backoffMs } from '../workers/backoff.js';
import type { OutboxRow, OutboxStore } from './outbox.js';

export interface OutboxRelayOptions {
  store: OutboxStore;
  events: EventLog;
  /** Most rows claimed and published per round. */
  batchSize?: number;
  /** Wait between rounds when the outbox was drained. */
  pollIntervalMs?: number;
  /** First and longest wait after a failed round; the rows stay and are retried. */
  retryBackoffMs?: { min: number; max: number };
  onError?: (err: unknown) => void;
  /** Called after each round that published something, with the age of its oldest row. */
  onPublished?: (count: number, oldestAgeMs: number) => void;
  now?: () => number;
}

export interface OutboxRelayStats {
  published: number;
  failedRounds: number;
  lastPublishedAt: number | null;
}

interface RoundResult {
  published: number;
  /** The claim was full, so more rows are probably waiting. */
  full: boolean;
  error?: Error;
}

/**
 * Moves committed outbox rows to the event log: claim the oldest rows, publish them per topic in id
 * order, delete what the log acknowledged. At-least-once: a crash or failure after publishing but
 * before deleting publishes those rows again.
 */
export class OutboxRelay {
  readonly stats: OutboxRelayStats = { published: 0, failedRounds: 0, lastPublishedAt: null };
  private readonly batchSize: number;
  private readonly pollIntervalMs: number;
  private readonly backoff: { min: number; max: number };
  private readonly now: () => number;
  private running = false;
  private loop: Promise<void> | undefined;
  private wakeUp: (() => void) | undefined;
  private nudged = false;

  constructor(private readonly options: OutboxRelayOptions) {
    this.batchSize = Math.max(1, options.batchSize ?? 200);
    this.pollIntervalMs = options.pollIntervalMs ?? 200;
    this.backoff = options.retryBackoffMs ?? { min: 500, max: 30_000 };
    this.now = options.now ?? Date.now;
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    this.loop = this.run();
  }

  /** Stops polling and waits for the round in flight (its publish and delete) to finish. */
  async stop(): Promise<void> {
    this.running = false;
    this.wake();
    await this.loop;
    this.loop = undefined;
  }

  /** Starts the next round now instead of after the poll interval (e.g. right after a commit). */
  notify(): void {
    this.nudged = true;
    this.wake();
  }

  /** One claim-publish-delete round; rejects when publishing failed (the rows stay). */
  async runOnce(): Promise<number> {
    const result = await this.round();
    if (result.error !== undefined) throw result.error;
    return result.published;
  }

  private async run(): Promise<void> {
    let failures = 0;
    while (this.running) {
      let result: RoundResult;
      try {
        result = await this.round();
      } catch (err) {
        result = {
          published: 0,
          full: false,
          error: err instanceof Error ? err : new Error('outbox round failed', { cause: err }),
        };
      }
      if (result.error !== undefined) {
        this.stats.failedRounds++;
        this.report(result.error);
        const wait = backoffMs(this.backoff, failures);
        failures++;
        await this.sleep(wait, false);
        continue;
      }
      failures = 0;
      if (!result.full) await this.sleep(this.pollIntervalMs, true);
      // More rows wait: claimed at once, after a turn of the event loop (the embedded store and log
      // answer synchronously, and a backlog worked off without turns would hold requests off).
      else await nextTurn();
    }
  }

  private async round(): Promise<RoundResult> {
    let error: Error | undefined;
    let published = 0;
    let oldest = Infinity;
    const claim = await this.options.store.claim(this.batchSize, async (rows) => {
      const done: number[] = [];
      for (const [topic, group] of byTopic(rows)) {
        try {
          await this.options.events.publish(
            topic,
            group.map((r) => ({ key: r.key, value: r.payload })),
          );
        } catch (err) {
          // Later topics wait too: while the log is down every publish would only add to the stall.
          error = err instanceof Error ? err : new Error('publish failed', { cause: err });
          break;
        }
        for (const r of group) {
          done.push(r.id);
          oldest = Math.min(oldest, r.createdAt);
        }
      }
      published = done.length;
      return done;
    });
    // Counted once the rows are gone (a failed delete publishes them again), and aged by those published.
    if (published > 0) {
      this.stats.published += published;
      this.stats.lastPublishedAt = this.now();
      try {
        this.options.onPublished?.(published, Math.max(0, this.now() - oldest));
      } catch {
        // Metrics must not fail a round.
      }
    }
    return error === undefined ? { published, full: claim.full } : { published, full: false, error };
  }

  private report(err: unknown): void {
    try {
      this.options.onError?.(err);
    } catch {
      // A failing error reporter must not stop the relay.
    }
  }

  private wake(): void {
    const w = this.wakeUp;
    this.wakeUp = undefined;
    w?.();
  }

  /** `notify` shortens poll waits but not back-offs, so a failing log is not hammered. */
  private sleep(ms: number, nudgeable: boolean): Promise<void> {
    if (!this.running) return Promise.resolve();
    if (nudgeable && this.nudged) {
      this.nudged = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const finish = (): void => {
        clearTimeout(timer);
        if (this.wakeUp === onWake) this.wakeUp = undefined;
        resolve();
      };
      const onWake = (): void => {
        if (!nudgeable && this.running) {
          this.wakeUp = onWake;
          return;
        }
        this.nudged = false;
        finish();
      };
      const timer = setTimeout(finish, ms);
      this.wakeUp = onWake;
    });
  }
}

function byTopic(rows: OutboxRow[]): Map<string, OutboxRow[]> {
  const groups = new Map<string, OutboxRow[]>();
  for (const row of rows) {
    const group = groups.get(row.topic);
    if (group) group.push(row);
    else groups.set(row.topic, [row]);
  }
  return groups;
}
