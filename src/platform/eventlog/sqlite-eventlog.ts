import { setImmediate as nextTurn } from 'node:timers/promises';
import { sql } from 'kysely';
import { backoffMs } from '../workers/backoff.js';
import type { Db } from '../db/database.js';
import type {
  Batch,
  DeliveredRecord,
  EndOffsets,
  EventLog,
  EventRecord,
  SubscribeOptions,
  Subscription,
} from './eventlog.js';

export interface SqliteEventLogOptions {
  /** How often an idle subscription looks for records published by other processes. */
  idlePollMs?: number;
  /** First and longest wait before a failed batch is delivered again. */
  retryBackoffMs?: { min: number; max: number };
  /** Age at which `prune` may delete a record of a topic not kept forever (default Kafka's: 7 days). */
  retentionMs?: number;
  /** How often the log prunes itself; 0 leaves pruning to explicit `prune` calls. */
  pruneIntervalMs?: number;
  /** Most records one delete statement removes, so the write lock is never held for long. */
  pruneChunk?: number;
  /** The clock records are stamped with and aged by. */
  now?: () => number;
  /** Told of a periodic prune that failed (the next one tries again). */
  onPruneError?: (err: unknown) => void;
}

// Four bound values a row; stays well below SQLite's limit on variables per statement.
const INSERT_CHUNK = 500;
const DEFAULT_MAX_BATCH = 100;
const DEFAULT_RETENTION_MS = 7 * 24 * 60 * 60 * 1000;
const DEFAULT_PRUNE_INTERVAL_MS = 5 * 60 * 1000;
const DEFAULT_PRUNE_CHUNK = 1_000;
/**
 * Pseudo group whose offset 0 on a topic marks it keep-forever: durable with the log, never moved (no
 * subscription may use the name), and holding every record "not yet consumed" for the retention.
 */
const KEEP_FOREVER_GROUP = '__keep_forever';

/**
 * Event log in the embedded database: one table with a global autoincrement offset, one partition
 * (0) per topic. SQLite serialises writers, so offsets become visible in order and a reader never
 * passes over a row that commits later with a smaller offset.
 *
 * Within one instance a group is consumed by one subscription at a time; a second subscription of
 * the same group waits until the first closes, like an extra member of a one-partition Kafka group.
 *
 * Retention: `prune` (run every `pruneIntervalMs` once `ensureTopics` was first called, so the topics
 * to keep are recorded before anything goes) deletes the oldest records of a topic up to the first
 * one that is younger than `retentionMs`, that some group which committed on the topic has not
 * consumed yet, or that is the topic's newest (which keeps its end offset). A topic no group committed
 * on, or one ever named keep-forever, keeps every record.
 */
export class SqliteEventLog implements EventLog {
  private readonly idlePollMs: number;
  private readonly backoff: { min: number; max: number };
  private readonly subscriptions = new Set<SqliteSubscription>();
  private readonly groupQueues = new Map<string, SqliteSubscription[]>();
  private readonly retentionMs: number;
  private readonly pruneIntervalMs: number;
  private readonly pruneChunk: number;
  private readonly now: () => number;
  private readonly onPruneError: (err: unknown) => void;
  private pruneTimer: NodeJS.Timeout | undefined;
  private pruning: Promise<number> | undefined;
  private closed = false;

  constructor(
    private readonly db: Db,
    options: SqliteEventLogOptions = {},
  ) {
    if (db.dialect !== 'sqlite') throw new Error('SqliteEventLog needs the sqlite dialect');
    this.idlePollMs = options.idlePollMs ?? 25;
    this.backoff = options.retryBackoffMs ?? { min: 100, max: 5_000 };
    this.retentionMs = options.retentionMs ?? DEFAULT_RETENTION_MS;
    this.pruneIntervalMs = options.pruneIntervalMs ?? DEFAULT_PRUNE_INTERVAL_MS;
    this.pruneChunk = Math.max(1, options.pruneChunk ?? DEFAULT_PRUNE_CHUNK);
    this.now = options.now ?? Date.now;
    this.onPruneError = options.onPruneError ?? (() => undefined);
  }

  /**
   * Topics are only a column here: nothing to create. Keep-forever is recorded durably and never
   * undone, so a later call that leaves a topic out of `keepForever` does not expose it to pruning.
   */
  async ensureTopics(_topics: string[], options: { keepForever?: readonly string[] } = {}): Promise<void> {
    const forever = [...new Set(options.keepForever ?? [])];
    if (forever.length > 0) {
      await this.db.kysely
        .insertInto('consumer_offsets')
        .values(forever.map((topic) => ({ group_id: KEEP_FOREVER_GROUP, topic, next_offset: 0 })))
        .onConflict((oc) => oc.columns(['group_id', 'topic']).doNothing())
        .execute();
    }
    if (!this.closed && this.pruneTimer === undefined && this.pruneIntervalMs > 0) {
      this.pruneTimer = setInterval(() => {
        // A failed run (say, the file busy past the timeout) deletes nothing; the next one retries.
        this.prune().catch((err: unknown) => {
          try {
            this.onPruneError(err);
          } catch {
            // A failing reporter must not become an unhandled rejection.
          }
        });
      }, this.pruneIntervalMs);
      this.pruneTimer.unref();
    }
  }

  /**
   * Deletes what the retention lets go (see the class comment), a bounded chunk per statement;
   * resolves with the number of records deleted. A call while one runs joins that run.
   */
  prune(): Promise<number> {
    this.pruning ??= this.pruneTopics().finally(() => {
      this.pruning = undefined;
    });
    return this.pruning;
  }

  async publish(topic: string, records: EventRecord[]): Promise<void> {
    if (this.closed) throw new Error('event log is closed');
    if (records.length === 0) return;
    const ts = this.now();
    const rows = records.map((r) => ({ topic, key: r.key, value: r.value, ts }));
    await this.db.kysely.transaction().execute(async (trx) => {
      for (let i = 0; i < rows.length; i += INSERT_CHUNK) {
        await trx
          .insertInto('event_log')
          .values(rows.slice(i, i + INSERT_CHUNK))
          .execute();
      }
    });
    for (const sub of this.subscriptions) if (sub.topics.includes(topic)) sub.wake();
  }

  async subscribe(options: SubscribeOptions): Promise<Subscription> {
    if (this.closed) throw new Error('event log is closed');
    if (options.topics.length === 0) throw new Error('subscribe needs at least one topic');
    if (options.group === KEEP_FOREVER_GROUP) throw new Error(`group name ${KEEP_FOREVER_GROUP} is reserved`);
    if (options.fromLatest) await this.pinToLatest(options.group, options.topics);
    const sub = new SqliteSubscription(this.db, options, this.idlePollMs, this.backoff, (s) =>
      this.release(s),
    );
    this.subscriptions.add(sub);
    const queue = this.groupQueues.get(options.group) ?? [];
    queue.push(sub);
    this.groupQueues.set(options.group, queue);
    sub.start(queue[0] === sub);
    return sub;
  }

  async endOffsets(topic: string): Promise<EndOffsets> {
    const row = await this.db.kysely
      .selectFrom('event_log')
      .select((eb) => eb.fn.max<number | null>('offset').as('last'))
      .where('topic', '=', topic)
      .executeTakeFirst();
    const last = row?.last;
    return new Map([[0, last === null || last === undefined ? 0n : BigInt(last) + 1n]]);
  }

  /**
   * Whether every subscription open in this process has handled (committed past) the newest record
   * of each of its topics: nothing written so far is still on its way to a consumer here.
   */
  async caughtUp(): Promise<boolean> {
    if (this.subscriptions.size === 0) return true;
    const topics = [...new Set([...this.subscriptions].flatMap((sub) => sub.topics))];
    // One lookup per topic on its index (a GROUP BY over the log would read every record).
    const [ends, commits] = await Promise.all([
      Promise.all(
        topics.map(async (topic) => {
          const row = await this.db.kysely
            .selectFrom('event_log')
            .select((eb) => eb.fn.max<number | null>('offset').as('last'))
            .where('topic', '=', topic)
            .executeTakeFirst();
          return [topic, row?.last ?? null] as const;
        }),
      ),
      this.db.kysely.selectFrom('consumer_offsets').select(['group_id', 'topic', 'next_offset']).execute(),
    ]);
    const last = new Map(
      ends.flatMap(([topic, end]) => (end === null ? [] : [[topic, Number(end)] as const])),
    );
    const next = new Map(
      commits.map((row) => [`${row.group_id}\u0000${row.topic}`, Number(row.next_offset)]),
    );
    for (const sub of this.subscriptions)
      for (const topic of sub.topics) {
        const newest = last.get(topic);
        if (newest !== undefined && (next.get(`${sub.group}\u0000${topic}`) ?? 0) <= newest) return false;
      }
    return true;
  }

  async groupMembers(group: string): Promise<number> {
    return this.groupQueues.get(group)?.length ?? 0;
  }

  async committedOffsets(group: string, topic: string): Promise<EndOffsets> {
    const row = await this.db.kysely
      .selectFrom('consumer_offsets')
      .select('next_offset')
      .where('group_id', '=', group)
      .where('topic', '=', topic)
      .executeTakeFirst();
    return row ? new Map([[0, BigInt(row.next_offset)]]) : new Map();
  }

  /**
   * Offsets here are global, so a topic's first one tells nothing: a keep-forever topic is never
   * pruned, and neither is one that no group committed on; any other may have been.
   */
  async holdsEveryRecord(topic: string): Promise<boolean> {
    const commits = await this.db.kysely
      .selectFrom('consumer_offsets')
      .select('group_id')
      .where('topic', '=', topic)
      .execute();
    return commits.length === 0 || commits.some((c) => c.group_id === KEEP_FOREVER_GROUP);
  }

  async readRange(
    topic: string,
    until: EndOffsets,
    handler: (batch: Batch) => Promise<void>,
    maxBatch = 500,
    from?: EndOffsets,
  ): Promise<void> {
    const end = until.get(0);
    if (end === undefined || end <= 0n) return;
    let next = Number(from?.get(0) ?? 0n);
    for (;;) {
      const rows = await this.db.kysely
        .selectFrom('event_log')
        .selectAll()
        .where('topic', '=', topic)
        .where('offset', '>=', next)
        .where('offset', '<', Number(end))
        .orderBy('offset')
        .limit(maxBatch)
        .execute();
      if (rows.length === 0) return;
      await handler({ topic, records: rows.map(toDelivered) });
      next = rows[rows.length - 1]!.offset + 1;
      if (rows.length < maxBatch) return;
      // The reads and the handler's writes are synchronous here: without a turn of the event loop
      // between chunks, a long read would hold off timers (a lease's renewal), signals and requests.
      await nextTurn();
    }
  }

  async ping(): Promise<boolean> {
    try {
      await sql`select 1`.execute(this.db.kysely);
      return true;
    } catch {
      return false;
    }
  }

  /** Closes every subscription; the database stays open (its owner closes it). */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.pruneTimer);
    // A prune in flight stops after its current statement; the database must outlive it.
    await Promise.all([
      ...[...this.subscriptions].map((s) => s.close()),
      this.pruning?.catch(() => undefined),
    ]);
  }

  private async pruneTopics(): Promise<number> {
    if (this.closed) return 0;
    const cutoff = this.now() - this.retentionMs;
    // A keep-forever topic's pseudo group is pinned at 0, so its minimum is 0: nothing below to delete.
    const commits = await this.db.kysely
      .selectFrom('consumer_offsets')
      .select((eb) => ['topic', eb.fn.min<number>('next_offset').as('consumed')])
      .groupBy('topic')
      .execute();
    let deleted = 0;
    for (const { topic, consumed } of commits) {
      if (this.closed) break;
      if (Number(consumed) <= 0) continue;
      // Up to, not including, the newest record (which keeps the end offset) and the first unconsumed.
      const end = Number((await this.endOffsets(topic)).get(0) ?? 0n);
      if (end === 0) continue;
      const bound = Math.min(Number(consumed), end - 1);
      // The oldest records first, a chunk at a time, up to the first one younger than the retention.
      // SQLite answers synchronously here, so the loop gives the event loop a turn between chunks:
      // requests are served while a long backlog goes.
      while (!this.closed) {
        const rows = await this.db.kysely
          .selectFrom('event_log')
          .select(['offset', 'ts'])
          .where('topic', '=', topic)
          .where('offset', '<', bound)
          .orderBy('offset')
          .limit(this.pruneChunk)
          .execute();
        if (rows.length === 0) break;
        const old = rows.findIndex((r) => Number(r.ts) >= cutoff);
        const last = old === -1 ? rows.length - 1 : old - 1;
        if (last >= 0) {
          const result = await this.db.kysely
            .deleteFrom('event_log')
            .where('topic', '=', topic)
            .where('offset', '>=', Number(rows[0]!.offset))
            .where('offset', '<=', Number(rows[last]!.offset))
            .executeTakeFirst();
          deleted += Number(result.numDeletedRows);
        }
        if (old !== -1 || rows.length < this.pruneChunk) break;
        await nextTurn();
      }
      await nextTurn();
    }
    return deleted;
  }

  /** A group with no position yet starts after the newest record of any topic. */
  private async pinToLatest(group: string, topics: string[]): Promise<void> {
    const row = await this.db.kysely
      .selectFrom('event_log')
      .select((eb) => eb.fn.max<number | null>('offset').as('last'))
      .executeTakeFirst();
    const next = Number(row?.last ?? 0) + 1;
    await this.db.kysely
      .insertInto('consumer_offsets')
      .values(topics.map((topic) => ({ group_id: group, topic, next_offset: next })))
      .onConflict((oc) => oc.columns(['group_id', 'topic']).doNothing())
      .execute();
  }

  private release(sub: SqliteSubscription): void {
    this.subscriptions.delete(sub);
    const queue = this.groupQueues.get(sub.group);
    if (!queue) return;
    const wasActive = queue[0] === sub;
    const rest = queue.filter((s) => s !== sub);
    if (rest.length === 0) this.groupQueues.delete(sub.group);
    else this.groupQueues.set(sub.group, rest);
    if (wasActive) rest[0]?.activate();
  }
}

function toDelivered(row: {
  offset: number;
  topic: string;
  key: string;
  value: string;
  ts: number;
}): DeliveredRecord {
  return {
    topic: row.topic,
    partition: 0,
    offset: BigInt(row.offset),
    key: row.key,
    value: row.value,
    timestamp: Number(row.ts),
  };
}

class SqliteSubscription implements Subscription {
  readonly group: string;
  readonly topics: string[];
  private readonly maxBatch: number;
  private active = false;
  private closing = false;
  private loop: Promise<void> | undefined;
  private wakeUp: (() => void) | undefined;
  private pending = false;

  constructor(
    private readonly db: Db,
    private readonly options: SubscribeOptions,
    private readonly idlePollMs: number,
    private readonly backoff: { min: number; max: number },
    private readonly onClosed: (s: SqliteSubscription) => void,
  ) {
    this.group = options.group;
    this.topics = [...new Set(options.topics)];
    this.maxBatch = Math.max(1, options.maxBatch ?? DEFAULT_MAX_BATCH);
  }

  start(active: boolean): void {
    this.active = active;
    this.loop = this.run();
  }

  activate(): void {
    this.active = true;
    this.wake();
  }

  wake(): void {
    this.pending = true;
    const w = this.wakeUp;
    this.wakeUp = undefined;
    w?.();
  }

  async close(): Promise<void> {
    if (!this.closing) {
      this.closing = true;
      this.wake();
    }
    await this.loop;
  }

  private async run(): Promise<void> {
    let failures = 0;
    let positions: Map<string, number> | undefined;
    try {
      while (!this.closing) {
        if (!this.active) {
          await this.sleep(undefined);
          continue;
        }
        try {
          positions ??= await this.loadPositions();
          let full = false;
          for (const topic of this.topics) {
            if (this.closing) break;
            const from = positions.get(topic) ?? 0;
            const rows = await this.db.kysely
              .selectFrom('event_log')
              .selectAll()
              .where('topic', '=', topic)
              .where('offset', '>=', from)
              .orderBy('offset')
              .limit(this.maxBatch)
              .execute();
            if (rows.length === 0) continue;
            try {
              await this.options.handler({ topic, records: rows.map(toDelivered) });
            } catch (err) {
              throw new HandlerFailed(err);
            }
            const next = rows[rows.length - 1]!.offset + 1;
            await this.commit(topic, next);
            positions.set(topic, next);
            failures = 0;
            if (rows.length === this.maxBatch) full = true;
          }
          if (!full) await this.sleep(this.idlePollMs);
          // A backlog is worked off in full batches, read and handled synchronously: a turn of the
          // event loop between them keeps the server answering requests meanwhile.
          else await nextTurn();
        } catch (err) {
          this.report(err instanceof HandlerFailed ? err.cause : err);
          // The committed positions are the truth again after a failure.
          positions = undefined;
          const delay = backoffMs(this.backoff, failures);
          failures++;
          await this.sleep(delay, true);
        }
      }
    } finally {
      this.onClosed(this);
    }
  }

  private async loadPositions(): Promise<Map<string, number>> {
    const rows = await this.db.kysely
      .selectFrom('consumer_offsets')
      .select(['topic', 'next_offset'])
      .where('group_id', '=', this.group)
      .where('topic', 'in', this.topics)
      .execute();
    return new Map(rows.map((r) => [r.topic, Number(r.next_offset)]));
  }

  /** Monotonic upsert, so a repeated or late commit can never move the group backwards. */
  private async commit(topic: string, next: number): Promise<void> {
    await this.db.kysely
      .insertInto('consumer_offsets')
      .values({ group_id: this.group, topic, next_offset: next })
      .onConflict((oc) =>
        oc
          .columns(['group_id', 'topic'])
          .doUpdateSet({ next_offset: sql<number>`max(next_offset, excluded.next_offset)` }),
      )
      .execute();
  }

  private report(err: unknown): void {
    try {
      this.options.onError?.(err);
    } catch {
      // A failing error reporter must not stop the subscription.
    }
  }

  /** Waits `ms` (or until woken); a back-off ignores publish wake-ups so a failing batch is not hammered. */
  private sleep(ms: number | undefined, ignorePublishes = false): Promise<void> {
    if (this.closing) return Promise.resolve();
    if (!ignorePublishes && this.pending) {
      this.pending = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | undefined;
      const finish = (): void => {
        clearTimeout(timer);
        if (this.wakeUp === onWake) this.wakeUp = undefined;
        resolve();
      };
      const onWake = (): void => {
        if (ignorePublishes && !this.closing) {
          this.wakeUp = onWake;
          return;
        }
        this.pending = false;
        finish();
      };
      if (ms !== undefined) timer = setTimeout(finish, ms);
      this.wakeUp = onWake;
    });
  }
}

class HandlerFailed extends Error {
  constructor(cause: unknown) {
    super('batch handler failed', { cause });
  }
}
