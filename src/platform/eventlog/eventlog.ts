/**
 * Event log: named topics of keyed records, consumed by consumer groups (SQLite table on embedded,
 * Apache Kafka on cluster).
 *
 * Semantics every adapter guarantees (proved by `eventlog.contract.ts`):
 * - `publish` resolves only after every record is durably acknowledged by the log; it rejects when
 *   any record could not be written (callers must then buffer or repair; nothing is dropped silently).
 *   A publish that takes too long rejects with `PublishTimeoutError`: its records may still land.
 * - Records with the same key are delivered in publish order. Records with different keys may interleave.
 * - Delivery is at-least-once per consumer group: a batch's offsets are committed only after its
 *   handler resolved; a batch whose handler threw, or that was in flight when its subscription or
 *   process went away, is delivered again. Handlers must therefore be idempotent.
 * - A new group starts from the earliest retained record unless `fromLatest` is set.
 * - `endOffsets` captures, for a replay, where the log ends now; `readRange` reads from the earliest
 *   record up to those offsets without touching any group's committed position.
 * - Offsets are opaque per partition; compare only those from the same partition.
 */
/**
 * A publish that did not finish within its time: the send goes on, so its records may still be
 * written. `outcome` settles when the send does (resolves once the log acknowledged every record).
 */
export class PublishTimeoutError extends Error {
  constructor(
    message: string,
    readonly outcome: Promise<void>,
  ) {
    super(message);
    this.name = 'PublishTimeoutError';
  }
}

export interface EventRecord {
  key: string;
  value: string;
}

export interface DeliveredRecord extends EventRecord {
  topic: string;
  partition: number;
  /** Position within the partition; strictly increasing per partition. */
  offset: bigint;
  timestamp: number;
}

export interface Batch {
  topic: string;
  records: DeliveredRecord[];
}

/**
 * `commitIntervalMs` of the consumers whose handlers are idempotent for redelivered records: at most
 * one offset commit a second, however small their batches.
 */
export const IDEMPOTENT_COMMIT_INTERVAL_MS = 1_000;

export interface SubscribeOptions {
  group: string;
  topics: string[];
  /** Most records handed to one handler call. */
  maxBatch?: number;
  /** Longest wait to fill a batch before handing over what there is. */
  maxWaitMs?: number;
  /**
   * Where the log fetches in bulk (Kafka): the longest a fetch may wait for more records to arrive,
   * which delays a record by as much under light load. Subscriptions nobody waits on take longer.
   */
  fetchMaxWaitMs?: number;
  fromLatest?: boolean;
  /**
   * How long the commits of handled batches may be gathered into one (Kafka: each offset commit is
   * a write on the broker). A crash, or partitions moving to another member, then delivers up to
   * this much again, so only handlers that are idempotent for redelivered records may set it;
   * `close` commits everything handled. 0 (the default) commits after every batch; an adapter may
   * commit sooner than asked.
   */
  commitIntervalMs?: number;
  /**
   * Handles one batch. When it resolves, the batch's offsets are committed for the group (see
   * `commitIntervalMs`); when it throws, nothing is committed and the same records are delivered
   * again (after a back-off).
   */
  handler: (batch: Batch) => Promise<void>;
  /** Called with errors the subscription recovered from (handler failures, lost connections). */
  onError?: (err: unknown) => void;
}

export interface Subscription {
  /**
   * Stops fetching, waits for the in-flight handler call (and its commit) to finish and leaves the
   * group. Records fetched but not yet handed to the handler are left uncommitted.
   */
  close(): Promise<void>;
}

/** Map of `partition -> next offset` (one past the last record) per topic. */
export type EndOffsets = Map<number, bigint>;

export interface EventLog {
  /**
   * Creates topics that do not exist yet; idempotent. Topics named in `keepForever` (also among
   * `topics`) keep every record, whatever the log's default retention: replays read them whole.
   */
  ensureTopics(topics: string[], options?: { keepForever?: readonly string[] }): Promise<void>;
  publish(topic: string, records: EventRecord[]): Promise<void>;
  /**
   * Resolves once the subscription has joined its group and fixed its starting position (so a
   * `fromLatest` subscription sees every record published after this resolves); rejects when that
   * first start fails. Later outages are retried in the background and reported to `onError`.
   */
  subscribe(options: SubscribeOptions): Promise<Subscription>;
  endOffsets(topic: string): Promise<EndOffsets>;
  /**
   * Where a consumer group goes on reading the topic: per partition, the offset after the last
   * record it committed (comparable with `endOffsets`). Partitions the group never committed on are
   * left out, so a group that never ran gives an empty map.
   */
  committedOffsets(group: string, topic: string): Promise<EndOffsets>;
  /**
   * How many consumers are members of the group now: on Kafka those of every process (a member
   * whose process died stays until its session times out; one that closed leaves at once), on
   * SQLite this instance's subscriptions (one process serves the database).
   */
  groupMembers(group: string): Promise<number>;
  /**
   * Whether the topic still holds every record ever published to it (none removed by retention or by
   * hand), so a replay from its earliest record sees all of them. May answer false when it cannot
   * tell; a topic deleted and made anew looks whole.
   */
  holdsEveryRecord(topic: string): Promise<boolean>;
  /**
   * Reads every record from the earliest retained one (or, per partition, from the offset `from`
   * gives, end offsets captured earlier) up to (excluding) `until`, in batches, in partition order,
   * independent of any consumer group.
   */
  readRange(
    topic: string,
    until: EndOffsets,
    handler: (batch: Batch) => Promise<void>,
    maxBatch?: number,
    from?: EndOffsets,
  ): Promise<void>;
  /** Can the log be reached now (for /readyz). */
  ping(): Promise<boolean>;
  close(): Promise<void>;
}
