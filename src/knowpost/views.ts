import { setTimeout as sleep } from 'node:timers/promises';
import { finishedWithin } from '../platform/workers/deadline.js';
import { Counter, Gauge, type Registry } from 'prom-client';
import { entityKey, isEntityId, isEntityType, type EntityType } from '../counter/model.js';
import type { CounterStore, LoggedViews } from '../counter/store/counter-store.js';
import type { OffsetRange } from '../counter/view-marks.js';
import {
  IDEMPOTENT_COMMIT_INTERVAL_MS,
  PublishTimeoutError,
  type DeliveredRecord,
  type EventLog,
  type EventRecord,
  type Subscription,
} from '../platform/eventlog/eventlog.js';
import type { RestoreParts } from '../counter/restore.js';
import type { Platform } from '../platform/wiring.js';
import type { ViewSink } from './detail.service.js';

/**
 * Views (the snapshot's `read` field). A detail read records a view in this process's buffer, which
 * sums views per post and publishes them in batches to `read-events` when it holds `maxItems` views,
 * `flushMs` after the first view it took, and on shutdown. A record carries the sums of up to
 * `VIEWS_PER_RECORD` posts, so the event log and the consumer handle a few records per flush
 * whatever the number of posts read. The `view-agg` consumer adds a batch's views to the snapshots
 * with `addLoggedViews`, which counts each record once however often and in whatever batches it is
 * handed (a crash before the commit, a rebalance, a retry), and commits (at most once a second).
 * Views may be approximate, likes and favourites may not. Views are lost where a process dies with
 * views in its buffer, and, counted in `zg_views_dropped_total`, where a shutdown's 3 s run out,
 * past `maxPosts` posts buffered while the log cannot be reached, and for a publish that timed out
 * and never settled. A publish that timed out and then failed is sent again:
 * a broker that hangs would otherwise lose every view of its outage, at the risk of counting twice
 * a record the broker wrote without telling. A mark past `VIEW_MARK_RANGES` ranges takes its
 * oldest gap as added (`planViewMark`).
 */
export const VIEW_TOPIC = 'read-events';
export const VIEW_GROUP = 'view-agg';
/** Posts whose views one `read-events` record carries at most (about 15 KB of JSON). */
export const VIEWS_PER_RECORD = 500;
/** Entries (a post's views in a record) one `addLoggedViews` call of `view-agg` takes at most. */
export const VIEWS_PER_CALL = 20_000;

/** Views of one post. */
export interface ViewEvent {
  etype: EntityType;
  eid: string;
  n: number;
  ts: number;
}

/** A `read-events` record: `[postId, views]` pairs of one entity type, published at `ts`. */
interface ViewRecordBody {
  etype: EntityType;
  views: [string, number][];
  ts: number;
}

const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v > 0;

/**
 * The views a `read-events` record carries, or null when any part of it is malformed. Also reads
 * the one-post form (`{etype, eid, n, ts}`) that publishers wrote before records were packed.
 */
export function parseViewRecord(value: string): ViewEvent[] | null {
  let v: Partial<ViewRecordBody & Omit<ViewEvent, 'etype'>>;
  try {
    v = JSON.parse(value) as typeof v;
  } catch {
    return null;
  }
  if (typeof v !== 'object' || v === null) return null;
  const etype = v.etype;
  if (!isEntityType(etype)) return null;
  const ts = typeof v.ts === 'number' ? v.ts : 0;
  if (v.views === undefined)
    return isEntityId(v.eid) && isCount(v.n) ? [{ etype, eid: v.eid, n: v.n, ts }] : null;
  if (!Array.isArray(v.views) || v.views.length === 0) return null;
  const events: ViewEvent[] = [];
  for (const entry of v.views as unknown[]) {
    if (!Array.isArray(entry) || entry.length !== 2 || !isEntityId(entry[0]) || !isCount(entry[1]))
      return null;
    events.push({ etype, eid: entry[0], n: entry[1], ts });
  }
  return events;
}

export class ViewMetrics {
  readonly buffered: Gauge;
  readonly recorded: Counter;
  readonly published: Counter;
  readonly publishFailed: Counter;
  readonly dropped: Counter;
  readonly applied: Counter;
  readonly skipped: Counter;

  constructor(registry: Registry) {
    const registers = [registry];
    this.buffered = new Gauge({
      name: 'zg_views_buffered',
      help: 'Views recorded in this process waiting in its buffer (not those being published to read-events)',
      registers,
    });
    this.recorded = new Counter({
      name: 'zg_views_recorded_total',
      help: 'Views recorded by detail reads in this process',
      registers,
    });
    this.published = new Counter({
      name: 'zg_views_published_total',
      help: 'Views acknowledged by the event log',
      registers,
    });
    this.publishFailed = new Counter({
      name: 'zg_views_publish_failed_total',
      help: 'Views whose publish failed (kept for the next attempt unless the buffer is full)',
      registers,
    });
    this.dropped = new Counter({
      name: 'zg_views_dropped_total',
      help: 'Views given up: buffer full while the event log was unreachable, recorded after shutdown, not published within the shutdown budget, or published without an answer in time',
      registers,
    });
    this.applied = new Counter({
      name: 'zg_views_applied_total',
      help: 'Views added to snapshots by view-agg',
      registers,
    });
    this.skipped = new Counter({
      name: 'zg_views_skipped_total',
      help: 'Views of read-events records view-agg was handed again and found already added (after a rebalance, a crash or a failed call), left out',
      registers,
    });
  }
}

export interface ViewRecorderOptions {
  /** Publish once this many views are buffered. */
  maxItems: number;
  /** Publish at the latest this long after the first buffered view. */
  flushMs: number;
  /** Distinct posts kept while the event log cannot be reached; views of further posts are dropped. */
  maxPosts?: number;
  /**
   * How much longer a publish that timed out (and may still land) is waited for before its views
   * count as dropped rather than being published again, which could count them twice.
   */
  settleWaitMs?: number;
  onError?: (err: unknown) => void;
  now?: () => number;
}

/** A pause between the attempts of a shutdown to publish what a failed publish left. */
const CLOSE_RETRY_MS = 100;

type RecordOutcome = 'published' | 'failed' | 'unknown';

/** The in-process buffer of views; see the module comment. */
export class ViewRecorder implements ViewSink {
  private pending = new Map<string, number>();
  private count = 0;
  private timer: NodeJS.Timeout | undefined;
  private chain: Promise<void> = Promise.resolve();
  private closed = false;
  /** A flush is waiting behind the one in flight: later triggers join it instead of queueing more. */
  private queued = false;
  /** Set once `close` gave up: views of a publish that fails afterwards are dropped, not kept. */
  private abandoned = false;
  private readonly maxPosts: number;
  private readonly settleWaitMs: number;
  private readonly now: () => number;

  constructor(
    private readonly events: Pick<EventLog, 'publish'>,
    private readonly metrics: ViewMetrics,
    private readonly options: ViewRecorderOptions,
  ) {
    this.maxPosts = options.maxPosts ?? 100_000;
    this.settleWaitMs = options.settleWaitMs ?? 60_000;
    this.now = options.now ?? Date.now;
  }

  record(postId: string): void {
    this.metrics.recorded.inc();
    if (this.closed) {
      this.metrics.dropped.inc();
      return;
    }
    this.add(postId, 1);
    if (this.count >= this.options.maxItems) void this.flush();
    else this.schedule();
  }

  /** Publishes what is buffered now; resolves when that publish (and any before it) finished. */
  flush(): Promise<void> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.queued) return this.chain;
    this.queued = true;
    this.chain = this.chain.then(() => {
      this.queued = false;
      return this.publishBuffered();
    });
    return this.chain;
  }

  /**
   * Publishes what is left, trying again after a failed publish, for at most `maxWaitMs` in all (a
   * shutdown has a budget, and a publish to an unreachable log takes up to its timeout). Views
   * recorded afterwards, or not published in time, are dropped (views may be approximate) and
   * reported.
   */
  async close(maxWaitMs = 3_000): Promise<void> {
    this.closed = true;
    const deadline = performance.now() + maxWaitMs;
    let finished: boolean;
    for (;;) {
      finished = await finishedWithin(this.flush(), Math.max(0, deadline - performance.now()));
      const left = deadline - performance.now();
      if (!finished || this.count === 0 || left <= 0) break;
      await sleep(Math.min(CLOSE_RETRY_MS, left));
    }
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.abandoned = true;
    const unpublished = this.count;
    if (unpublished > 0) {
      this.pending = new Map();
      this.count = 0;
      this.metrics.buffered.dec(unpublished);
      this.metrics.dropped.inc(unpublished);
      this.options.onError?.(new Error(`${unpublished} views dropped: not published before closing`));
    }
    if (!finished) this.options.onError?.(new Error(`views not published within ${maxWaitMs} ms of closing`));
  }

  private add(postId: string, n: number): boolean {
    const had = this.pending.get(postId);
    if (had === undefined && this.pending.size >= this.maxPosts) {
      this.metrics.dropped.inc(n);
      return false;
    }
    this.pending.set(postId, (had ?? 0) + n);
    this.count += n;
    this.metrics.buffered.inc(n);
    return true;
  }

  private schedule(): void {
    if (this.timer || this.count === 0) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.flush();
    }, this.options.flushMs);
    this.timer.unref();
  }

  private async publishBuffered(): Promise<void> {
    if (this.pending.size === 0) return;
    const batch = this.pending;
    const total = this.count;
    this.pending = new Map();
    this.count = 0;
    this.metrics.buffered.dec(total);
    const ts = this.now();
    const posts = [...batch];
    const parts: { record: EventRecord; views: [string, number][] }[] = [];
    for (let i = 0; i < posts.length; i += VIEWS_PER_RECORD) {
      const views = posts.slice(i, i + VIEWS_PER_RECORD);
      parts.push({
        views,
        record: {
          // Views need no order, so the key only spreads records over partitions.
          key: entityKey({ etype: 'knowpost', eid: views[0]![0] }),
          value: JSON.stringify({ etype: 'knowpost', views, ts } satisfies ViewRecordBody),
        },
      });
    }
    // One send per record, so that a record refused is kept without the ones that were written.
    const outcomes = await Promise.all(parts.map((part) => this.publishRecord(part.record)));
    let kept = false;
    for (const [i, { views }] of parts.entries()) {
      const n = views.reduce((sum, [, v]) => sum + v, 0);
      const outcome = outcomes[i]!;
      if (outcome === 'published') this.metrics.published.inc(n);
      else if (outcome === 'unknown' || this.abandoned) this.metrics.dropped.inc(n);
      else {
        this.metrics.publishFailed.inc(n);
        // Kept for the next attempt; views are approximate, but an outage should not lose them all.
        for (const [eid, v] of views) kept = this.add(eid, v) || kept;
      }
    }
    if (kept && !this.closed) this.schedule();
  }

  /**
   * Publishes one record. A publish that timed out may still land: it is waited for (at most
   * `settleWaitMs`) rather than tried again, and counts as `unknown` when it never settles.
   */
  private async publishRecord(record: EventRecord): Promise<RecordOutcome> {
    try {
      await this.events.publish(VIEW_TOPIC, [record]);
      return 'published';
    } catch (err) {
      this.options.onError?.(err);
      if (!(err instanceof PublishTimeoutError)) return 'failed';
      try {
        if (await finishedWithin(err.outcome, this.settleWaitMs)) return 'published';
      } catch {
        return 'failed';
      }
      this.options.onError?.(
        new Error(`a view record published ${this.settleWaitMs} ms ago was never acknowledged; dropped`),
      );
      return 'unknown';
    }
  }
}

/**
 * Adds `read-events` records to the counter store with `addLoggedViews`, at most `VIEWS_PER_CALL`
 * entries a call, naming with each call, per partition, the run of consecutive offsets handed to
 * it so far: every record from its first to its last offset was in a call whose views were added.
 * So a mark spans the records of a partition that carried no views of its group too, and stays one
 * range while the records keep coming in order. The records of calls that went through are skipped
 * when the records are handed again after a later call failed.
 */
export class LoggedViewAdder {
  private runs = new Map<number, ViewRun>();

  constructor(
    private readonly store: Pick<CounterStore, 'addLoggedViews'>,
    private readonly onMalformed: (record: DeliveredRecord) => void,
    /** Told of each call that went through: the views added and those the records hold. */
    private readonly onAdded: (added: number, total: number) => void = () => undefined,
    /** The replay's own calls, taken while the store is restored (see `addLoggedViews`). */
    private readonly restoring = false,
  ) {}

  /** Forgets the runs: the next records start new ones (a consumer that subscribes anew). */
  forget(): void {
    this.runs = new Map();
  }

  async add(delivered: readonly DeliveredRecord[]): Promise<void> {
    const runs = new Map(this.runs);
    let records: LoggedViews[] = [];
    let covered = new Map<number, OffsetRange[]>();
    let entries = 0;
    let total = 0;
    const call = async (): Promise<void> => {
      if (records.length > 0) {
        const added = await this.store.addLoggedViews(
          records,
          covered,
          this.restoring ? { restoring: true } : {},
        );
        this.onAdded(added, total);
      }
      this.runs = new Map(runs);
      records = [];
      covered = new Map();
      entries = 0;
      total = 0;
    };
    for (const record of delivered) {
      const timestamp = recordTime(record);
      const run = extendRun(runs.get(record.partition), record.offset, timestamp);
      runs.set(record.partition, run);
      const ranges = covered.get(record.partition);
      if (!ranges) covered.set(record.partition, [run.range]);
      else if (ranges[ranges.length - 1]![0] === run.range[0]) ranges[ranges.length - 1] = run.range;
      else ranges.push(run.range);
      const events = parseViewRecord(record.value);
      if (events === null) {
        this.onMalformed(record);
        continue;
      }
      const views = events.map((e) => ({ ref: { etype: e.etype, eid: e.eid }, n: e.n }));
      records.push({ partition: record.partition, offset: record.offset, timestamp, views });
      for (const e of events) total += e.n;
      entries += views.length;
      if (entries >= VIEWS_PER_CALL) await call();
    }
    await call();
  }
}

/** The `view-agg` consumer (worker role): adds each batch's views to the snapshots (`LoggedViewAdder`). */
export class ViewAggregator {
  private subscription: Subscription | undefined;
  private readonly adder: LoggedViewAdder;

  constructor(
    private readonly events: EventLog,
    store: Pick<CounterStore, 'addLoggedViews'>,
    metrics: ViewMetrics,
    private readonly onError: (err: unknown) => void,
    private readonly options: { maxBatch: number; maxWaitMs: number } = { maxBatch: 5000, maxWaitMs: 100 },
  ) {
    this.adder = new LoggedViewAdder(
      store,
      (record) =>
        onError(new Error(`skipping a malformed view record at ${record.partition}:${record.offset}`)),
      (added, total) => {
        metrics.applied.inc(added);
        if (added < total) metrics.skipped.inc(total - added);
      },
    );
  }

  async start(): Promise<void> {
    this.adder.forget();
    this.subscription = await this.events.subscribe({
      group: VIEW_GROUP,
      topics: [VIEW_TOPIC],
      maxBatch: this.options.maxBatch,
      maxWaitMs: this.options.maxWaitMs,
      // Nobody waits on these within a fraction of a second; fewer, larger fetches are cheaper.
      fetchMaxWaitMs: 250,
      // Records handed again are found added and skipped (see `addLoggedViews`).
      commitIntervalMs: IDEMPOTENT_COMMIT_INTERVAL_MS,
      handler: (batch) => this.adder.add(batch.records),
      onError: this.onError,
    });
  }

  async stop(): Promise<void> {
    await this.subscription?.close();
    this.subscription = undefined;
  }
}

/** When a record was written, in ms; 0 when the log has no time for it (Kafka gives -1 then). */
function recordTime(record: DeliveredRecord): number {
  return Math.max(0, Math.trunc(record.timestamp)) || 0;
}

/** A run of consecutive offsets a consumer handled, and the latest record time in it. */
export interface ViewRun {
  range: OffsetRange;
  ts: number;
}

/**
 * The run after a record at `offset`, written at `ts`, was handled: the next offset extends it, one
 * inside it (handed again: a partition read again from its last commit) leaves it, any other starts
 * a new run, as does one inside it but later than all of it (a topic made again, offsets restarted).
 */
export function extendRun(run: ViewRun | undefined, offset: bigint, ts: number): ViewRun {
  const [from, to] = run?.range ?? [0n, -2n];
  if (!run || offset < from || offset > to + 1n || (offset <= to && ts > run.ts)) {
    return { range: [offset, offset], ts };
  }
  return { range: offset > to ? [from, offset] : run.range, ts: Math.max(run.ts, ts) };
}

export interface ViewReplayReport {
  viewRecords: number;
  /** Views the records read hold. */
  views: number;
  /** Of those, views found added already (by `view-agg`, running beside the replay). */
  viewsAddedBeside: number;
  malformedViewRecords: number;
}

/**
 * Part of `zhiguang counters replay`, once it has emptied the store (views and their marks
 * included) and before it seals it again: adds back the views of every record `read-events` holds,
 * from its earliest record to the end captured now, with `addLoggedViews` as the `view-agg`
 * consumer does. A running `view-agg` (in worker processes, or a server of role `all`) is refused
 * meanwhile, changing nothing, and handed its records again until the store is sealed; then it
 * finds in the marks those the replay added and skips them, whatever it had committed or handled
 * before the reset. Views are lost only with the records the topic no longer holds (retention).
 */
export async function replayViews(
  events: EventLog,
  store: Pick<CounterStore, 'addLoggedViews'>,
  progress: (message: string) => void,
): Promise<ViewReplayReport> {
  const until = await events.endOffsets(VIEW_TOPIC);
  const report: ViewReplayReport = { viewRecords: 0, views: 0, viewsAddedBeside: 0, malformedViewRecords: 0 };
  const adder = new LoggedViewAdder(
    store,
    () => report.malformedViewRecords++,
    (added, total) => {
      report.views += total;
      report.viewsAddedBeside += total - added;
    },
    true,
  );
  await events.readRange(VIEW_TOPIC, until, async (batch) => {
    await adder.add(batch.records);
    report.viewRecords = report.viewRecords + batch.records.length;
    progress(`read ${report.viewRecords} view records, ${report.views} views`);
  });
  report.viewRecords -= report.malformedViewRecords;
  return report;
}

/** What restoring the counter store of `platform` takes (`restoreCounters`), its views included. */
export function counterRestoreParts(
  platform: Pick<Platform, 'counterStore' | 'events' | 'kv' | 'markCountersRestored'>,
): RestoreParts {
  return {
    store: platform.counterStore,
    events: platform.events,
    kv: platform.kv,
    markRestored: () => platform.markCountersRestored(),
    addViewsBack: (progress) => replayViews(platform.events, platform.counterStore, progress),
  };
}
