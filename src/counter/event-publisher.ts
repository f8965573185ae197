import { finishedWithin } from '../platform/workers/deadline.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import { COUNTER_TOPIC, type CounterEvent } from './model.js';
import type { CounterStore } from './store/counter-store.js';

/** A counter event as an event-log record: keyed by entity, so one entity's events keep their order. */
export function counterRecord(e: CounterEvent): { key: string; value: string } {
  return { key: `${e.entityType}:${e.entityId}`, value: JSON.stringify(e) };
}

export interface PublisherHooks {
  onPublished?: (count: number) => void;
  /** A batch the log refused; it is tried again. */
  onFailed?: (count: number, err: unknown) => void;
  /**
   * Events let go of from memory (their records stay in the store for the repair job): past the
   * buffer while the log is down, left at close, or enqueued after it.
   */
  onDropped?: (count: number) => void;
  /** Published events whose unpublished records could not be removed (only a needless repair later). */
  onMarkFailed?: (count: number, err: unknown) => void;
}

/**
 * Sends counter events to the event log off the request path: a toggle enqueues its event and
 * answers; batches go out every `lingerMs` or at `maxBatch`. After the log acknowledged a batch, the
 * store forgets the events' unpublished records. A failed batch is retried with back-off; while the
 * log is down at most `maxBuffered` events wait in memory and the rest are let go — never silently:
 * their records stay in the store, and the repair job publishes them (see `repairUnpublished`).
 */
export class CounterEventPublisher {
  private queue: CounterEvent[] = [];
  private timer: NodeJS.Timeout | undefined;
  private inFlight: Promise<void> | undefined;
  private backoffMs = 0;
  private closed = false;

  constructor(
    private readonly events: EventLog,
    private readonly store: CounterStore,
    private readonly hooks: PublisherHooks = {},
    // Back-off at most 2 s: counts must be exact again within 5 s of the log coming back (invariant
    // 5), after the next attempt, the aggregator's batch and a flush.
    private readonly options = { lingerMs: 20, maxBatch: 1000, maxBuffered: 100_000, maxBackoffMs: 2_000 },
  ) {}

  enqueue(event: CounterEvent): void {
    // A toggle that finished during shutdown: its record is in the store, for the repair job.
    if (this.closed) return void this.hooks.onDropped?.(1);
    this.queue.push(event);
    this.trim();
    if (this.queue.length >= this.options.maxBatch && this.backoffMs === 0) this.kick(0);
    else this.kick(this.backoffMs || this.options.lingerMs);
  }

  get buffered(): number {
    return this.queue.length;
  }

  /**
   * Stops taking events and sends what is queued (one attempt per batch) for at most `maxWaitMs`:
   * whatever is left then is in the store's unpublished records, which the repair job publishes.
   */
  async close(maxWaitMs = 3_000): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const send = async (): Promise<void> => {
      await this.inFlight;
      while (this.queue.length > 0) {
        const sent = await this.sendBatch();
        if (!sent) break;
      }
    };
    await finishedWithin(send(), maxWaitMs);
    // Not sent in time: let go of (a send that answers late takes no more).
    const left = this.queue.splice(0);
    if (left.length > 0) this.hooks.onDropped?.(left.length);
  }

  private kick(delayMs: number): void {
    if (this.timer || this.inFlight || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.inFlight = this.drain().finally(() => {
        this.inFlight = undefined;
        if (this.queue.length > 0) this.kick(this.backoffMs || this.options.lingerMs);
      });
    }, delayMs);
  }

  private async drain(): Promise<void> {
    while (this.queue.length > 0 && !this.closed) {
      if (!(await this.sendBatch())) return;
    }
  }

  /** True when the batch went out; on failure the batch is put back in front and back-off grows. */
  private async sendBatch(): Promise<boolean> {
    const batch = this.queue.splice(0, this.options.maxBatch);
    try {
      await this.events.publish(COUNTER_TOPIC, batch.map(counterRecord));
    } catch (err) {
      this.hooks.onFailed?.(batch.length, err);
      // Closing: nothing will send it again (a failure after `close` gave up waiting included).
      if (this.closed) {
        this.hooks.onDropped?.(batch.length);
        return false;
      }
      this.queue.unshift(...batch);
      this.trim();
      this.backoffMs = Math.min(this.options.maxBackoffMs, Math.max(100, this.backoffMs * 2));
      return false;
    }
    this.backoffMs = 0;
    this.hooks.onPublished?.(batch.length);
    try {
      await this.store.markPublished(batch);
    } catch (err) {
      // The events are in the log; a record left behind only costs a needless publish later.
      this.hooks.onMarkFailed?.(batch.length, err);
    }
    return true;
  }

  /** Lets go of the oldest events past `maxBuffered`. */
  private trim(): void {
    const excess = this.queue.length - this.options.maxBuffered;
    if (excess <= 0) return;
    this.queue.splice(0, excess);
    this.hooks.onDropped?.(excess);
  }
}
