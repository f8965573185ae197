import type { CounterEvent, Counts, EntityRef, FactMetric } from '../model.js';
import type { OffsetRange } from '../view-marks.js';

/**
 * Everything the counter pipeline keeps about entities: fact sets, per-entity change numbers,
 * pending deltas and snapshots. Embedded: SQLite tables. Cluster: Redis, where every key one script
 * touches shares the hash tag of the entity's *group* (a hash of the entity onto `groups` slots),
 * so a group's facts, pending deltas and snapshot bucket change together atomically, also on Redis
 * Cluster.
 *
 * Exactness rests on one number per entity: `seq`, raised by one with every fact change, in the same
 * atomic step, and carried by the change's event. Each entity also has an *applied* mark: the
 * highest seq whose delta has reached its pending deltas or snapshot. Deltas of events at or below
 * the mark are skipped, so redelivered or replayed events never count twice, and a rebuild from facts
 * (which raises the mark to the current seq) never races with events still in flight.
 *
 * Semantics every adapter guarantees (proved by `counter-store.contract.ts`):
 * - `toggle` is atomic and idempotent: `changed` is true exactly when the fact set changed; then the
 *   entity's seq is raised and the change's event returned. Adding a present member or removing an
 *   absent one changes nothing and returns no event.
 * - A returned event is durable from the moment `toggle` resolves: embedded appends it to the event
 *   log in the same transaction (`event.published` true); cluster records it as *unpublished* in the
 *   same script, until `markPublished` is called after the event log acknowledged it. Unpublished
 *   events older than a bound are found by `staleUnpublished`, with the event, so they can be
 *   published again or their entities rebuilt; `deferUnpublished` makes them stale again later.
 * - `applyEvents` is atomic per group and idempotent. Per entity, the batch's events (deduplicated by
 *   seq, in any order) are folded in memory into a run `fromSeq..toSeq`. A run that is entirely at or
 *   below the applied mark is skipped; a contiguous run starting right after the mark is added to
 *   pending deltas and the mark set to `toSeq`; anything else — a gap (an event not seen yet, e.g.
 *   published late by another process) or a run straddling the mark — rebuilds the entity from facts
 *   in the same atomic step (see `rebuild`), which is exact whatever the event log's order.
 * - `flush` folds the pending deltas of up to `limit` dirty groups into snapshots, each group in one
 *   atomic step (no window between reading and clearing). Several flushers may run at once. An entity
 *   whose snapshot is missing or malformed when its deltas are folded is rebuilt from facts instead.
 * - `readSnapshots` is one round trip for any number of entities; null marks a missing or malformed
 *   snapshot. `rebuild` sets like and fav from fact cardinalities, keeps the other fields when the old
 *   snapshot is readable (zero otherwise), drops the entity's pending deltas and raises its applied
 *   mark to its current seq — atomically, so concurrent rebuilds of one entity cannot interleave.
 * - `addViews` adds to the snapshot's `read` field only, atomically per group (cluster) or per call
 *   (embedded): concurrent calls sum exactly; like and fav, pending deltas, seq and applied marks are
 *   untouched. An entity whose snapshot is missing or malformed is first rebuilt from facts (see
 *   `rebuild`), then gets the views. Views carry no event id: a call made again adds them again.
 * - `addLoggedViews` adds the views of records of the views log (`read-events`) as `addViews` does,
 *   each record at most once: per partition of the log the store keeps a `ViewMark` beside the
 *   views, written in the same atomic step (per group on cluster, per call on embedded): ranges of
 *   offsets whose records it added and the latest time among them. A record at an offset in one of
 *   the ranges and not later than the time was added before and is skipped, whoever hands it again,
 *   in whatever order and however its batch is cut: a call retried after it failed part-way, a
 *   batch handed again after a crash or a rebalance, records fetched before a rebalance handed after
 *   others, a member still handling a partition taken from it. A later record in a range is of a
 *   topic made again, whose offsets restarted, and is added. The caller names, per partition, the
 *   ranges a call covers (`covered`): each record of them is in the call or was in an earlier call
 *   that returned; by default the runs of consecutive offsets among the call's own records. `reset`
 *   drops the marks with the views. While the facts are not whole (a group unsealed: a replay under
 *   way, a loss) a call is refused (UnavailableError), changing nothing, unless it is the replay's
 *   own (`restoring`): a consumer's marks written while a replay refills the store could name
 *   records the replay has yet to add back.
 * - `reset` empties the whole store (facts too); `replayFacts` re-applies the fact changes of events:
 *   for each (entity, metric, user) the event with the highest seq decides the fact, whatever the
 *   order of the array (deterministic: the result depends only on the events), and seq counters are
 *   raised to at least each event's seq, so new changes continue above replayed ones. Separate calls
 *   apply in call order.
 */
export interface ToggleResult {
  changed: boolean;
  /** Whether the user holds the metric after the call. */
  state: boolean;
  event: CounterEvent | null;
  /** True when the store already appended the event to the event log (embedded); else the caller publishes it. */
  published: boolean;
}

export interface ViewIncrement {
  ref: EntityRef;
  n: number;
}

/** The views one record of the views log carried, and where it sits in the log. */
export interface LoggedViews {
  /** Non-negative integers, as the log numbers them. */
  partition: number;
  offset: bigint;
  /** When the record was written: ms since the epoch, 0 when the log gives none. */
  timestamp: number;
  views: readonly ViewIncrement[];
}

export interface Flags {
  like: boolean;
  fav: boolean;
}

export interface StaleEvent {
  ref: EntityRef;
  /** Opaque handle for `markPublished`-style removal after the repair. */
  token: string;
  /** The event itself, for publishing again; null when the record does not hold it. */
  event: CounterEvent | null;
}

/** A stale entry kept for another attempt, as if toggled at `at`. */
export interface DeferredEvent extends StaleEvent {
  at: number;
}

/** One entity's state, read in one atomic step, for reconciliation. */
export interface Inspection {
  seq: number;
  applied: number;
  /** Whether the entity has deltas not yet folded into its snapshot. */
  pending: boolean;
  snapshot: Counts | null;
  facts: Record<FactMetric, number>;
  /**
   * Whether the facts are whole. False in a group a store requiring seals holds unsealed (see
   * `seal`): it lost its data, or a replay is under way, and the facts may be missing some.
   */
  sealed: boolean;
}

export interface CounterStore {
  toggle(ref: EntityRef, metric: FactMetric, userId: number, on: boolean, now: number): Promise<ToggleResult>;
  /** Which metrics `userId` holds for each entity, in order; one round trip. */
  flags(userId: number, refs: readonly EntityRef[]): Promise<Flags[]>;
  /** Cardinality of each fact set of the entity. */
  factCounts(ref: EntityRef): Promise<Record<FactMetric, number>>;
  readSnapshots(refs: readonly EntityRef[]): Promise<(Counts | null)[]>;
  rebuild(ref: EntityRef): Promise<Counts>;
  /**
   * Adds `n` views (a non-negative safe integer) to each entry's snapshot `read` field; entries of one
   * entity are summed. Saturates at 2^32 - 1. One round trip for any number of entries.
   */
  addViews(entries: readonly ViewIncrement[]): Promise<void>;
  /**
   * Adds the views of records of the views log, each at most once (see the marks above); how many
   * views it added, those of records skipped as added before left out. Entries as `addViews`; a
   * record placed outside the numbers above, or outside the ranges its partition's `covered` names,
   * is refused (RangeError) before anything is added.
   */
  addLoggedViews(
    records: readonly LoggedViews[],
    covered?: ReadonlyMap<number, readonly OffsetRange[]>,
    options?: { restoring?: boolean },
  ): Promise<number>;
  /**
   * The entity's seq, applied mark, pending state, snapshot and fact counts as of one instant. When
   * `seq === applied` and nothing is pending, the snapshot must equal the facts; anything else is drift.
   */
  inspect(ref: EntityRef): Promise<Inspection>;
  applyEvents(events: readonly CounterEvent[]): Promise<{ applied: number; skipped: number }>;
  /** Returns how many entities' deltas were folded. */
  flush(limit: number): Promise<number>;
  /**
   * Snapshot fields this instance's folds clamped at zero since it was created: a fold that would
   * go below zero means an increment was lost upstream, so anything but 0 is a bug to look into.
   */
  readonly clampedFields: number;
  /** True when no group has pending deltas (the pipeline is quiet as far as the store knows). */
  isQuiet(): Promise<boolean>;
  /** Events toggled before `now - olderThanMs` and not yet marked published. */
  staleUnpublished(now: number, olderThanMs: number, limit: number): Promise<StaleEvent[]>;
  markPublished(events: readonly CounterEvent[]): Promise<void>;
  /** Forget stale entries once their events were published again or their entities rebuilt. */
  dropUnpublished(entries: readonly StaleEvent[]): Promise<void>;
  /** Keeps stale entries for another attempt: each found again `olderThanMs` after its `at`. */
  deferUnpublished(entries: readonly DeferredEvent[]): Promise<void>;
  /** Up to `limit` entities that have facts or a snapshot, after `cursor` (opaque, '' to start). */
  scanEntities(cursor: string, limit: number): Promise<{ refs: EntityRef[]; cursor: string | null }>;
  /** Random entities with a snapshot (for the reconciler's sample). */
  sampleEntities(limit: number): Promise<EntityRef[]>;
  reset(): Promise<void>;
  replayFacts(events: readonly CounterEvent[]): Promise<void>;
  /**
   * Records that the store holds its facts (in the given groups, by default all). Cluster: a store
   * that can lose them (Redis coming back empty) refuses toggles where they are gone, with a 503,
   * until a replay has brought them back and sealed it again; a reset unseals. Embedded: facts live
   * in the database and are never lost apart from it, but a replay that stopped after emptying them
   * leaves the store unsealed there too (one group, 0).
   */
  seal(groups?: readonly number[], token?: string): Promise<void>;
  /**
   * Refuses toggles from now on (a replay under way); the groups that were sealed, for `seal`. With
   * a replay's `token` (see `claimForRestore`).
   */
  unseal(token?: string): Promise<number[]>;
  /**
   * Leaves a replay's `token` on every group (after its reset emptied them), and `seal` with the
   * token then seals a group only while it still carries it: a store emptied again under the replay
   * (Redis wiped) is not sealed by it. Embedded: nothing empties the database under a replay; a no-op.
   */
  claimForRestore(token: string): Promise<void>;
  /** How many groups refuse toggles now (a replay under way, or one stopped half-way; data lost). */
  unsealedGroups(): Promise<number>;
  /**
   * Whether toggles are refused now for a restore (one read: the first group's seal, which a replay
   * takes away with every other and a loss of the data with it); for readiness.
   */
  restoring(): Promise<boolean>;
  /** Overwrites (or with null deletes) a snapshot's raw bytes; for tests and repair tools only. */
  writeRawSnapshot(ref: EntityRef, bytes: Buffer | null): Promise<void>;
}

/** The `Retry-After` of likes, favourites and views refused while a store is restored: a replay takes a while. */
export const RESTORE_RETRY_AFTER_S = 5;
