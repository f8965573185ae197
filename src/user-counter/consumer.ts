import {
  IDEMPOTENT_COMMIT_INTERVAL_MS,
  type DeliveredRecord,
  type EventLog,
  type Subscription,
} from '../platform/eventlog/eventlog.js';
import { parsePostEvent, POST_TOPIC } from '../knowpost/post-events.js';
import type { UserCounterDelta } from './model.js';
import type { UserCounterStore } from './store/user-counter-store.js';
import type { UserCounterMetrics } from './user-counter.metrics.js';

export const USER_COUNTER_GROUP = 'user-counters';

/**
 * One topic the consumer reads and how its records move user counts. `toDeltas` returns null for a
 * record that is not a well-formed event (it is reported and skipped) and [] for one that moves no
 * count. Every delta of a record names the record's event, so a redelivery is recognised per user.
 */
export interface UserCounterFeed {
  topic: string;
  toDeltas(value: string): UserCounterDelta[] | null;
}

/**
 * `post-events`: a post entering its author's public posts (`published`) adds one to their
 * `posts`, one leaving them (`unpublished`) takes it back; a `changed` one moves nothing.
 */
export const postEventsFeed: UserCounterFeed = {
  topic: POST_TOPIC,
  toDeltas(value) {
    const event = parsePostEvent(value);
    if (!event || !(event.authorId > 0)) return null;
    if (event.type === 'changed') return [];
    return [
      {
        eventId: event.eventId,
        userId: event.authorId,
        field: 'posts',
        delta: event.type === 'published' ? 1 : -1,
      },
    ];
  },
};

export interface UserCounterConsumerOptions {
  maxBatch: number;
  maxWaitMs: number;
  /** Told about records that are not events of their topic (logged and skipped). */
  onMalformed: (record: DeliveredRecord) => void;
  /** Told about failures the subscription recovered from (the batch is delivered again). */
  onError: (err: unknown) => void;
  /** Told which users a batch moved, once it is applied (the reconciler checks them first). */
  onApplied?: (userIds: number[]) => void;
  now?: () => number;
}

/**
 * The `user-counters` consumer: maps each batch's records to deltas and applies them in one store
 * call, which is idempotent by (user, event). The batch's offsets are committed only after that
 * resolved (gathered with the next batches' for up to a second); a crash in between redelivers them
 * and the store skips what it already applied.
 */
export class UserCounterConsumer {
  private subscription: Subscription | undefined;
  private readonly feeds: Map<string, UserCounterFeed>;
  private readonly now: () => number;

  constructor(
    private readonly events: EventLog,
    private readonly store: UserCounterStore,
    feeds: readonly UserCounterFeed[],
    private readonly metrics: UserCounterMetrics,
    private readonly options: UserCounterConsumerOptions,
  ) {
    this.feeds = new Map(feeds.map((f) => [f.topic, f]));
    this.now = options.now ?? Date.now;
  }

  get topics(): string[] {
    return [...this.feeds.keys()];
  }

  async start(): Promise<void> {
    this.subscription = await this.events.subscribe({
      group: USER_COUNTER_GROUP,
      topics: this.topics,
      maxBatch: this.options.maxBatch,
      maxWaitMs: this.options.maxWaitMs,
      // Nobody waits on these within a fraction of a second; fewer, larger fetches are cheaper.
      fetchMaxWaitMs: 250,
      commitIntervalMs: IDEMPOTENT_COMMIT_INTERVAL_MS,
      handler: async (batch) => {
        const feed = this.feeds.get(batch.topic);
        const deltas: UserCounterDelta[] = [];
        let newest = 0;
        for (const record of batch.records) {
          newest = Math.max(newest, record.timestamp);
          const mapped = feed?.toDeltas(record.value) ?? null;
          if (mapped) deltas.push(...mapped);
          else {
            this.metrics.events.inc({ outcome: 'malformed' });
            this.options.onMalformed(record);
          }
        }
        // Before applying: while a batch fails and comes again, the gauge keeps growing.
        if (newest > 0) this.metrics.consumerLag.set(Math.max(0, this.now() - newest));
        const { applied, skipped } = await this.store.apply(deltas, this.now());
        this.metrics.events.inc({ outcome: 'applied' }, applied);
        this.metrics.events.inc({ outcome: 'duplicate' }, skipped);
        if (deltas.length > 0) this.options.onApplied?.([...new Set(deltas.map((d) => d.userId))]);
      },
      onError: this.options.onError,
    });
  }

  async stop(): Promise<void> {
    await this.subscription?.close();
    this.subscription = undefined;
  }
}
