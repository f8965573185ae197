import { setImmediate as nextTurn } from 'node:timers/promises';
import { recheckUnsettled } from '../platform/workers/recheck.js';
import type { Batch, EventLog } from '../platform/eventlog/eventlog.js';
import { randomUUID } from 'node:crypto';
import { parseCounterEvent } from './aggregator.js';
import type { CounterMetrics } from './counter.metrics.js';
import { counterRecord } from './event-publisher.js';
import {
  COUNTER_TOPIC,
  entityKey,
  FACT_METRICS,
  FIELD_INDEX,
  type CounterEvent,
  type EntityRef,
} from './model.js';
import { ReplayFold } from './replay-fold.js';
import type { CounterStore, Inspection, StaleEvent } from './store/counter-store.js';
import { trimOldest } from '../platform/cache/trim.js';

export type Progress = (message: string) => void;

/** Facts handed to one `replayFacts` call, and how many such calls run at once. */
const REPLAY_CHUNK = 5_000;
const REPLAY_CONCURRENCY = 4;
/** Rebuilds issued together (each a single store call, so a chunk goes out as one write). */
const REBUILD_CHUNK = 250;

/** True when the entity is quiet (everything toggled has been applied) and its snapshot disagrees with its facts. */
export function hasDrift(state: Inspection): boolean {
  if (state.seq !== state.applied || state.pending) return false;
  if (!state.snapshot) return true;
  return FACT_METRICS.some((m) => state.snapshot?.[FIELD_INDEX[m]] !== state.facts[m]);
}

/** Folds pending deltas into snapshots until no dirty group is left (or `maxRounds`). */
export async function flushPending(
  store: CounterStore,
  metrics: CounterMetrics,
  limit = 512,
  maxRounds = 100,
): Promise<number> {
  const stop = metrics.flushDuration.startTimer();
  const clampedBefore = store.clampedFields;
  let total = 0;
  try {
    for (let round = 0; round < maxRounds; round++) {
      const folded = await store.flush(limit);
      total += folded;
      if (folded === 0) break;
      // The embedded store folds synchronously: a long backlog would hold requests off otherwise.
      await nextTurn();
    }
  } finally {
    metrics.clampedFields.inc(store.clampedFields - clampedBefore);
  }
  stop();
  metrics.flushSize.observe(total);
  return total;
}

export interface RepairReport {
  /** Events published again (they now reach the log, replays and the authors' counts). */
  republished: number;
  /** Entities rebuilt from facts because their events could not be published. */
  rebuilt: number;
}

/** Unpublished records taken per round by the repair job and by a replay. */
const UNPUBLISHED_BATCH = 500;
/** Entities the repair job rebuilds at once. */
const REPAIR_REBUILDS_IN_FLIGHT = 8;

/** Longest a record waits between two attempts while the log refuses its event. */
export const REPAIR_RETRY_MAX_MS = 60_000;

/**
 * Events toggled but never acknowledged by the event log (a publish that failed, a process that died
 * with events in memory, a buffer that overflowed) are published again from their records, so the
 * log stays complete for replays and for the consumers of `counter-events`; consumers skip what
 * they already applied. When the log still refuses them, their entities are rebuilt from facts at
 * once (exact whatever happened to the events; the events, when they come, are below the applied
 * mark and skipped) and the records kept for another attempt, after as long as they waited so far
 * (at least `olderThanMs`, at most `REPAIR_RETRY_MAX_MS`): the rebuild made the counts exact, so
 * what waits is only the event's place in the log.
 *
 * A run goes through every stale record, however many a long outage left: after the log refused
 * one batch it is not asked again in that run, and each entity is rebuilt once (a rebuild reads
 * facts newer than every record the run finds, all older than `now`).
 */
export async function repairUnpublished(
  store: CounterStore,
  events: EventLog,
  metrics: CounterMetrics,
  now: number,
  olderThanMs: number,
): Promise<RepairReport> {
  const report: RepairReport = { republished: 0, rebuilt: 0 };
  let logRefused = false;
  const rebuilt = new Set<string>();
  for (;;) {
    const stale = await store.staleUnpublished(now, olderThanMs, UNPUBLISHED_BATCH);
    if (stale.length === 0) return report;
    const withEvent = stale.filter((s) => s.event !== null);
    const withoutEvent = stale.filter((s) => s.event === null);
    let sent = false;
    if (withEvent.length > 0 && !logRefused) {
      try {
        await events.publish(
          COUNTER_TOPIC,
          withEvent.map((s) => counterRecord(s.event!)),
        );
        sent = true;
        metrics.eventsRepublished.inc(withEvent.length);
        report.republished += withEvent.length;
      } catch {
        // Counted, and answered by the rebuilds below; the records wait for the next attempt.
        metrics.eventsPublishFailed.inc(withEvent.length);
        logRefused = true;
      }
    }
    const unique = new Map<string, EntityRef>();
    for (const s of sent ? withoutEvent : stale) {
      const key = entityKey(s.ref);
      if (!rebuilt.has(key)) unique.set(key, s.ref);
    }
    await forEachConcurrently([...unique.values()], REPAIR_REBUILDS_IN_FLIGHT, async (ref) => {
      await store.rebuild(ref);
      rebuilt.add(entityKey(ref));
      metrics.rebuilds.inc({ reason: 'unpublished' });
    });
    report.rebuilt += unique.size;
    await store.dropUnpublished(sent ? stale : withoutEvent);
    if (!sent)
      await store.deferUnpublished(withEvent.map((s) => ({ ...s, at: retryAt(s, now, olderThanMs) })));
    if (stale.length < UNPUBLISHED_BATCH) return report;
  }
}

/**
 * When a record the log refused is tried again: after as long as its event has waited so far (so a
 * long outage's backlog is walked a few times a minute, not at every run), at least `olderThanMs`
 * and at most `REPAIR_RETRY_MAX_MS`; returned as the time it is then `olderThanMs` older than.
 */
function retryAt(stale: StaleEvent, now: number, olderThanMs: number): number {
  const waited = stale.event ? now - stale.event.ts : 0;
  return now + Math.max(0, Math.min(waited, REPAIR_RETRY_MAX_MS) - olderThanMs);
}

/**
 * Invariant 8: compares snapshots with facts for recently touched and random entities, heals drift
 * and counts what it found. Recently touched entities are remembered by the aggregator's process.
 */
export class CounterReconciler {
  private readonly recent = new Map<string, EntityRef>();

  constructor(
    private readonly store: CounterStore,
    private readonly metrics: CounterMetrics,
    private readonly options = { recentCapacity: 10_000, sampleRecent: 200, sampleRandom: 100 },
  ) {}

  touched(events: readonly CounterEvent[]): void {
    for (const e of events) {
      const key = `${e.entityType}:${e.entityId}`;
      this.recent.delete(key);
      this.recent.set(key, { etype: e.entityType, eid: e.entityId });
    }
    trimOldest(this.recent, this.options.recentCapacity);
  }

  async runOnce(): Promise<{ checked: number; drifted: number }> {
    const recent = [...this.recent.values()].slice(-this.options.sampleRecent);
    const random = await this.store.sampleEntities(this.options.sampleRandom);
    const refs = new Map([...recent, ...random].map((r) => [`${r.etype}:${r.eid}`, r]));
    let drifted = 0;
    for (const ref of refs.values()) {
      if (hasDrift(await this.store.inspect(ref))) {
        drifted++;
        this.metrics.driftFound.inc();
        await this.store.rebuild(ref);
        this.metrics.rebuilds.inc({ reason: 'drift' });
        this.metrics.driftHealed.inc();
      }
    }
    return { checked: refs.size, drifted };
  }
}

export interface VerifyReport {
  checked: number;
  busy: number;
  /** Entities whose snapshot disagreed with their facts; the first `LISTED` of them are listed. */
  driftedEntities: number;
  drifted: EntityRef[];
  fixed: number;
}

/** `verifyAll`: rounds of checking busy entities again, and how many it keeps for them. */
const RECHECK_ROUNDS = 2;
const RECHECK_MAX = 10_000;
/** Drifted entities a report lists; a store that drifted everywhere would not fit the heap. */
export const LISTED = 1_000;

/**
 * `zhiguang counters verify [--fix]`: every entity, snapshot against facts. An entity with deltas not
 * folded yet (busy) cannot be compared; those are checked again after `recheckMs` (longer than a
 * flush interval), twice at most, and only those still busy then are reported so.
 */
export async function verifyAll(
  store: CounterStore,
  fix: boolean,
  progress: Progress,
  recheckMs = 1_500,
): Promise<VerifyReport> {
  const report: VerifyReport = { checked: 0, busy: 0, driftedEntities: 0, drifted: [], fixed: 0 };
  const busy: EntityRef[] = [];
  const check = async (ref: EntityRef): Promise<boolean> => {
    const state = await store.inspect(ref);
    if (state.seq !== state.applied || state.pending) return false;
    if (hasDrift(state)) {
      report.driftedEntities++;
      if (report.drifted.length < LISTED) report.drifted.push(ref);
      if (fix) {
        await store.rebuild(ref);
        report.fixed++;
      }
    }
    return true;
  };
  let cursor: string | null = '';
  while (cursor !== null) {
    const page: { refs: EntityRef[]; cursor: string | null } = await store.scanEntities(cursor, 500);
    for (const ref of page.refs) {
      report.checked++;
      if (await check(ref)) continue;
      if (busy.length < RECHECK_MAX) busy.push(ref);
      else report.busy++;
    }
    cursor = page.cursor;
    progress(`verified ${report.checked} entities, ${report.driftedEntities} drifted`);
  }
  const unsettled = await recheckUnsettled(busy, { rounds: RECHECK_ROUNDS, pauseMs: recheckMs }, check, (n) =>
    progress(`checking ${n} busy entities again`),
  );
  report.busy += unsettled.length;
  return report;
}

/** `zhiguang counters rebuild`: every entity (or the given ones) from facts. */
export async function rebuildAll(
  store: CounterStore,
  refs: EntityRef[] | null,
  progress: Progress,
): Promise<number> {
  let rebuilt = 0;
  const rebuildChunk = (chunk: EntityRef[]) => Promise.all(chunk.map((ref) => store.rebuild(ref)));
  if (refs) {
    await forEachConcurrently(chunked(refs, REBUILD_CHUNK), 1, rebuildChunk);
    return refs.length;
  }
  let cursor: string | null = '';
  while (cursor !== null) {
    const page: { refs: EntityRef[]; cursor: string | null } = await store.scanEntities(cursor, 500);
    await forEachConcurrently(chunked(page.refs, REBUILD_CHUNK), 1, rebuildChunk);
    rebuilt += page.refs.length;
    cursor = page.cursor;
    progress(`rebuilt ${rebuilt} entities`);
  }
  return rebuilt;
}

export interface ReplayReport {
  /** Toggles that had not reached the log yet, published before it was read. */
  published: number;
  events: number;
  malformed: number;
  facts: number;
  entities: number;
}

/**
 * Invariant 7, `zhiguang counters replay`: refuses, changing nothing, when `counter-events` no longer
 * holds every record it was given; otherwise reads it from the earliest record up to the
 * end offsets captured at the start, then empties the counter store and rebuilds facts and snapshots
 * (the topic keeps every record: it is created with `retention.ms=-1`).
 * The fold is deterministic: for each (entity, metric, user) the event with the highest seq decides
 * the final state, whatever order the log holds them in. It is kept in a temporary SQLite database
 * (`ReplayFold`), so the heap holds a few chunks whatever the size of the log, and freed however
 * the replay ends. The surviving facts are replayed entity by entity (an entity's facts next to each
 * other), several chunks at a time;
 * each fact is a distinct (entity, metric, user) and seq counters only ever rise to a maximum, so the
 * result does not depend on how the chunks interleave. Toggles are refused while it runs (the store
 * is unsealed first and sealed once whole), so none can fall after the captured end and be lost.
 * Workers may run beside it: their folds are idempotent by seq (and `replayViews` adds views as
 * `view-agg` does, each record once).
 */
export async function replayAll(
  store: CounterStore,
  events: EventLog,
  progress: Progress,
  { now = Date.now, force = false, signal, refill, holds }: ReplayOptions = {},
): Promise<ReplayReport> {
  // Before the reset a stop is the signal's, whichever step notices it first (a progress report
  // may, when the caller's throws): it is said as the signal says it.
  const beforeReset: Progress = (message) => {
    signal?.throwIfAborted();
    progress(message);
  };
  if (!(await events.holdsEveryRecord(COUNTER_TOPIC))) {
    throw new Error(
      `${COUNTER_TOPIC} no longer holds its earliest records (removed by retention or by hand): a replay ` +
        'would empty the store of the likes and favourites they hold. Nothing was changed.',
    );
  }
  // A sample of the store as it is before the log is captured: every change it holds is then in
  // the log read below (or published by the next line), whatever is toggled meanwhile.
  const sample = await store.sampleEntities(SAMPLE_CHECKED);
  const sampled = await Promise.all(
    sample.map(async (ref) => ({ ref, seq: (await store.inspect(ref)).seq })),
  );
  // Records strictly older than the time given: + 1 takes those of this very millisecond too.
  const published = await publishWaiting(store, events, now() + 1, beforeReset);
  const until = await events.endOffsets(COUNTER_TOPIC);
  // On disk, not in the heap: a log of millions of likes would not fit a default heap (see ReplayFold).
  const folded = ReplayFold.open();
  try {
    const report: ReplayReport = { published, events: 0, malformed: 0, facts: 0, entities: 0 };
    const fold = async (batch: Batch): Promise<void> => {
      signal?.throwIfAborted();
      const parsed: CounterEvent[] = [];
      for (const record of batch.records) {
        const event = parseCounterEvent(record.value);
        if (event) parsed.push(event);
        else report.malformed++;
      }
      folded.add(parsed);
      report.events += parsed.length;
      beforeReset(`read ${report.events} events`);
    };
    const logged = (ref: EntityRef): number => folded.loggedSeq(ref);
    await events.readRange(COUNTER_TOPIC, until, fold, REPLAY_CHUNK);
    // A log that is not this store's at all (another prefix or broker) is told before anything
    // changes, by a sample of the store; the whole store is compared once toggles are refused.
    const strays = countStrays(sampled, logged);
    if (strays.entities > 0 && !force) throw notThisLog(strays);

    // From here on toggles are refused (503): none can fall after the end read and be lost to the
    // reset. What was toggled while the log was read is published and read now; then the store is
    // compared with the whole log. Should the replay stop before its reset (an error, a refusal,
    // Ctrl-C), the groups that were sealed are sealed again; killed outright, it leaves toggles
    // refused until a replay completes.
    // Left on every group and required by the seals below: a store emptied under the replay (Redis
    // wiped, the claim's key with it) stays unsealed whenever it happens, for the next replay.
    const token = randomUUID();
    const sealed = await store.unseal(token);
    let emptied = false;
    try {
      // Every record left, however recent its clock made it: no toggle can add one now.
      report.published += await publishWaiting(store, events, Number.MAX_SAFE_INTEGER, beforeReset);
      const end = await events.endOffsets(COUNTER_TOPIC);
      await events.readRange(COUNTER_TOPIC, end, fold, REPLAY_CHUNK, until);
      const ahead = await changesNotLogged(store, logged, beforeReset, signal);
      if (ahead.entities > 0 && !force) throw notThisLog(ahead);
      signal?.throwIfAborted();
      if (holds && !(await holds())) throw claimLost();
      // Emptied only once the whole log is read: a read that fails leaves the store as it was.
      emptied = true;
      await store.reset();
      await store.claimForRestore(token);
      // Emptied again between the reset and the token (the claim's key gone with it): stop here.
      if (holds && !(await holds())) throw claimLost();
    } catch (err) {
      // Sealed again only by the replay that still holds the deployment's claim: another may have
      // unsealed the store since and be refilling it.
      if (!emptied && (!holds || (await holds().catch(() => false)))) await store.seal(sealed, token);
      throw err;
    }

    report.facts = folded.factCount();
    report.entities = await replayFolded(store, folded, report.facts, progress);
    // What else the reset emptied (views), while the store still refuses writers that would race.
    await refill?.();
    // A replay that lost its claim meanwhile leaves the sealing to the one that took it over.
    if (holds && !(await holds())) throw claimLost();
    // Its facts are whole again: toggles are taken (in each group that still carries the token).
    await store.seal(undefined, token);
    const unsealed = await store.unsealedGroups();
    if (unsealed > 0) {
      throw new Error(
        `${unsealed} counter group(s) were emptied while the replay refilled them (the store lost its data again); they stay refused until a replay completes`,
      );
    }
    return report;
  } finally {
    folded.close();
  }
}

/**
 * The second half of a replay, into the emptied store: the folded facts in chunks of whole entities
 * (see `ReplayFold.chunks`), `REPLAY_CONCURRENCY` at a time, each chunk read from the fold only when
 * a call is free to take it. An entity is rebuilt as soon as the chunk holding all of its facts is
 * replayed (while other chunks are still being replayed); one spanning several chunks waits for the
 * end. Returns the entities rebuilt.
 */
async function replayFolded(
  store: CounterStore,
  folded: ReplayFold,
  facts: number,
  progress: Progress,
): Promise<number> {
  let replayed = 0;
  let rebuilt = 0;
  /** At most one per `REPLAY_CHUNK` facts. */
  const spanning: EntityRef[] = [];
  const rebuild = async (refs: readonly EntityRef[]): Promise<void> => {
    await forEachConcurrently(chunked(refs, REBUILD_CHUNK), 1, (part) =>
      Promise.all(part.map((ref) => store.rebuild(ref))),
    );
    rebuilt += refs.length;
  };
  await forEachConcurrently(folded.chunks(REPLAY_CHUNK), REPLAY_CONCURRENCY, async (chunk) => {
    spanning.push(...chunk.spanning);
    await store.replayFacts(chunk.facts);
    replayed += chunk.facts.length;
    await rebuild(chunk.complete);
    progress(`replayed ${replayed} of ${facts} facts, rebuilt ${rebuilt} entities`);
    // The embedded store answers synchronously: without turns a replay would hold off its lease's
    // renewals (losing its claim after 20 s), the signals that stop it and, in a server, requests.
    await nextTurn();
  });
  await rebuild(spanning);
  progress(`rebuilt ${rebuilt} entities`);
  return rebuilt;
}

/**
 * Before a replay reads the log: every toggle whose event has not reached it yet (a process stopped
 * while the log was down) is published from its record, or the replay would empty the store of it.
 * Fails, changing nothing, while the log refuses them or when a record carries no event.
 */
async function publishWaiting(
  store: CounterStore,
  events: EventLog,
  now: number,
  progress: Progress,
): Promise<number> {
  let published = 0;
  for (;;) {
    const waiting = await store.staleUnpublished(now, 0, UNPUBLISHED_BATCH);
    if (waiting.length === 0) return published;
    if (waiting.some((w) => w.event === null)) {
      throw new Error(
        'unpublished toggles without their event (written by an older release) wait for the repair job; ' +
          'run a worker until they are gone, then replay',
      );
    }
    await events.publish(
      COUNTER_TOPIC,
      waiting.map((w) => counterRecord(w.event!)),
    );
    await store.dropUnpublished(waiting);
    published += waiting.length;
    progress(`published ${published} toggles that had not reached the log`);
    if (waiting.length < UNPUBLISHED_BATCH) return published;
  }
}

export interface ReplayOptions {
  now?: () => number;
  /** Replays even when the store holds changes the log does not (they are lost). */
  force?: boolean;
  /** Stops the replay, changing nothing, until it empties the store (not after). */
  signal?: AbortSignal;
  /** Run once the facts are back, before the store is sealed (views added back: `replayViews`). */
  refill?: () => Promise<void>;
  /**
   * Whether the caller still holds the deployment's claim on replays (see `restoreCounters`): asked
   * before the reset and before sealing; a replay that no longer holds it stops, changing nothing
   * before the reset and leaving the store unsealed after it, for the replay holding it now.
   */
  holds?: () => Promise<boolean>;
}

function claimLost(): Error {
  return new Error(
    'the replay lost its claim on the deployment (the key-value store was out of reach, or the process was stopped, for longer than the claim lasts): another replay may be running; this one stopped',
  );
}

/** Entities of the store compared with the log before toggles are refused. */
const SAMPLE_CHECKED = 500;

function notThisLog(ahead: Strays): Error {
  return new Error(
    `the counter store holds changes ${COUNTER_TOPIC} does not: ${ahead.entities} entities have a higher ` +
      `seq than the log holds (${ahead.examples.join(', ')}). Either the log read is not this ` +
      "store's (another ZG_KAFKA_PREFIX or broker), or toggles are still being made (by processes of a " +
      'release that does not refuse them during a replay: stop them). A replay would lose those changes. ' +
      'Nothing was changed; --force replays all the same.',
  );
}

/** What the store holds that the log does not: how many entities, and a few of them. */
interface Strays {
  entities: number;
  examples: string[];
}

/** The highest seq the log holds of an entity (0 when it names none). */
type LoggedSeq = (ref: EntityRef) => number;

/**
 * Adds to `found` each entity whose seq in the store is above the highest the log holds of it
 * (none at all for an entity the log does not name): changes a replay would lose.
 */
function countStrays(
  states: readonly { ref: EntityRef; seq: number }[],
  logged: LoggedSeq,
  found: Strays = { entities: 0, examples: [] },
): Strays {
  for (const { ref, seq } of states) {
    const inLog = logged(ref);
    if (seq <= inLog) continue;
    found.entities++;
    if (found.examples.length < 5)
      found.examples.push(`${entityKey(ref)} at seq ${seq}, the log up to ${inLog}`);
  }
  return found;
}

/** `countStrays` over every entity of the store. */
async function changesNotLogged(
  store: CounterStore,
  logged: LoggedSeq,
  progress: Progress,
  signal?: AbortSignal,
): Promise<Strays> {
  const found: Strays = { entities: 0, examples: [] };
  let checked = 0;
  let cursor: string | null = '';
  while (cursor !== null) {
    signal?.throwIfAborted();
    const page: { refs: EntityRef[]; cursor: string | null } = await store.scanEntities(cursor, 500);
    for (const chunk of chunked(page.refs, REBUILD_CHUNK)) {
      const states = await Promise.all(
        chunk.map(async (ref) => ({ ref, seq: (await store.inspect(ref)).seq })),
      );
      countStrays(states, logged, found);
    }
    checked += page.refs.length;
    cursor = page.cursor;
    if (checked > 0) progress(`compared ${checked} entities of the store with the log`);
    await nextTurn();
  }
  return found;
}

function chunked<T>(items: readonly T[], size: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}

/**
 * Calls `work` for every item with at most `concurrency` calls in flight; the first failure stops
 * handing out items and is rethrown once the calls in flight have settled. Items are taken from
 * `items` only when a call is free for them, so a generator is read no further ahead than that.
 */
async function forEachConcurrently<T>(
  items: Iterable<T>,
  concurrency: number,
  work: (item: T) => Promise<unknown>,
): Promise<void> {
  const iterator = items[Symbol.iterator]();
  let failed = false;
  const lane = async (): Promise<void> => {
    while (!failed) {
      try {
        const next = iterator.next();
        if (next.done) return;
        await work(next.value);
      } catch (err) {
        failed = true;
        throw err;
      }
    }
  };
  const lanes = Array.from({ length: Math.max(1, concurrency) }, lane);
  const rejected = (await Promise.allSettled(lanes)).find(
    (r): r is PromiseRejectedResult => r.status === 'rejected',
  );
  if (rejected) throw rejected.reason;
}
