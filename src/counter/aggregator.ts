import {
  IDEMPOTENT_COMMIT_INTERVAL_MS,
  type EventLog,
  type Subscription,
} from '../platform/eventlog/eventlog.js';
import type { CounterMetrics } from './counter.metrics.js';
import { COUNTER_TOPIC, FIELD_INDEX, parseEntityKey, type CounterEvent } from './model.js';
import type { CounterStore } from './store/counter-store.js';

export const COUNTER_GROUP = 'counter-agg';

/**
 * Reads one record's event; a record that is not a counter event is reported and skipped. The
 * snapshot field (`idx`) is the metric's, whatever the record says.
 */
export function parseCounterEvent(value: string): CounterEvent | null {
  try {
    const e = JSON.parse(value) as Partial<CounterEvent>;
    if (
      typeof e.entityType === 'string' &&
      typeof e.entityId === 'string' &&
      // An entity and a user the stores take: a record they would refuse (in a replay, after the
      // store was emptied) is malformed here already.
      parseEntityKey(`${e.entityType}:${e.entityId}`) !== null &&
      (e.metric === 'like' || e.metric === 'fav') &&
      (e.delta === 1 || e.delta === -1) &&
      typeof e.seq === 'number' &&
      Number.isSafeInteger(e.seq) &&
      e.seq > 0 &&
      typeof e.userId === 'number' &&
      Number.isSafeInteger(e.userId) &&
      e.userId >= 0
    ) {
      // The field follows from the metric; a record naming another is not trusted with it.
      return { ...(e as CounterEvent), idx: FIELD_INDEX[e.metric] };
    }
  } catch {
    // fall through
  }
  return null;
}

/**
 * The `counter-agg` consumer: hands each batch of events to the store, which folds them per entity
 * and applies the deltas together with the entities' applied marks in one atomic step per group.
 * The batch's offsets are committed only after that, gathered with the next batches' for up to a
 * second (each commit is a write on the broker); a crash before the commit redelivers those batches,
 * and the applied marks make the second delivery a no-op. Large batches are cheaper per event (one script per group and batch); at low
 * rates `maxWaitMs` keeps them small, so counts do not wait for a batch to fill.
 */
export class CounterAggregator {
  private subscription: Subscription | undefined;

  constructor(
    private readonly events: EventLog,
    private readonly store: CounterStore,
    private readonly metrics: CounterMetrics,
    private readonly onError: (err: unknown) => void,
    private readonly options: {
      maxBatch: number;
      maxWaitMs: number;
      onApplied?: (events: CounterEvent[]) => void;
    } = {
      maxBatch: 20_000,
      maxWaitMs: 50,
    },
    private readonly now: () => number = Date.now,
  ) {}

  async start(): Promise<void> {
    this.subscription = await this.events.subscribe({
      group: COUNTER_GROUP,
      topics: [COUNTER_TOPIC],
      maxBatch: this.options.maxBatch,
      maxWaitMs: this.options.maxWaitMs,
      // Applied marks make a redelivered event a no-op.
      commitIntervalMs: IDEMPOTENT_COMMIT_INTERVAL_MS,
      handler: async (batch) => {
        const parsed: CounterEvent[] = [];
        let newest = 0;
        for (const record of batch.records) {
          const event = parseCounterEvent(record.value);
          if (event) parsed.push(event);
          else
            this.onError(
              new Error(`skipping a malformed counter event at ${record.partition}:${record.offset}`),
            );
          newest = Math.max(newest, record.timestamp);
        }
        // Before applying: while a batch fails and comes again, the gauge keeps growing.
        if (newest > 0) this.metrics.consumerLag.set(Math.max(0, this.now() - newest));
        const { applied, skipped } = await this.store.applyEvents(parsed);
        this.metrics.eventsApplied.inc({ outcome: 'applied' }, applied);
        this.metrics.eventsApplied.inc({ outcome: 'skipped' }, skipped);
        this.options.onApplied?.(parsed);
      },
      onError: this.onError,
    });
  }

  async stop(): Promise<void> {
    await this.subscription?.close();
    this.subscription = undefined;
  }
}
