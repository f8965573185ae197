import type { EventLog } from '../platform/eventlog/eventlog.js';
import { parseCounterEvent } from './aggregator.js';
import type { CounterMetrics } from './counter.metrics.js';
import {
  COUNTER_TOPIC,
  FACT_METRICS,
  FIELD_INDEX,
  parseEntityKey,
  type CounterEvent,
  type EntityRef,
} from './model.js';
import type { CounterStore, Inspection } from './store/counter-store.js';

export type Progress = (message: string) => void;

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
  let total = 0;
  for (let round = 0; round < maxRounds; round++) {
    const folded = await store.flush(limit);
    total += folded;
    if (folded === 0) break;
  }
  stop();
  metrics.flushSize.observe(total);
  return total;
}

/**
 * Rebuilds entities whose events were toggled but never acknowledged by the event log (a publish that
 * failed, or a process that died with events in memory). Rebuilding from facts is exact whatever
 * happened to those events; events that arrive later are below the applied mark and skipped.
 */
export async function repairUnpublished(
  store: CounterStore,
  metrics: CounterMetrics,
  now: number,
  olderThanMs: number,
): Promise<number> {
  let repaired = 0;
  for (;;) {
    const stale = await store.staleUnpublished(now, olderThanMs, 500);
    if (stale.length === 0) return repaired;
    const unique = new Map(stale.map((s) => [`${s.ref.etype}:${s.ref.eid}`, s.ref]));
    for (const ref of unique.values()) {
      await store.rebuild(ref);
      metrics.rebuilds.inc({ reason: 'unpublished' });
    }
    await store.dropUnpublished(stale);
    repaired += unique.size;
    if (stale.length < 500) return repaired;
  }
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
    while (this.recent.size > this.options.recentCapacity) {
      const oldest = this.recent.keys().next().value;
      if (oldest === undefined) break;
      this.recent.delete(oldest);
    }
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
  drifted: EntityRef[];
  fixed: number;
}

/** `zhiguang counters verify [--fix]`: every entity, snapshot against facts. */
export async function verifyAll(
  store: CounterStore,
  fix: boolean,
  progress: Progress,
): Promise<VerifyReport> {
  const report: VerifyReport = { checked: 0, busy: 0, drifted: [], fixed: 0 };
  let cursor: string | null = '';
  while (cursor !== null) {
    const page: { refs: EntityRef[]; cursor: string | null } = await store.scanEntities(cursor, 500);
    for (const ref of page.refs) {
      const state = await store.inspect(ref);
      report.checked++;
      if (state.seq !== state.applied || state.pending) report.busy++;
      else if (hasDrift(state)) {
        report.drifted.push(ref);
        if (fix) {
          await store.rebuild(ref);
          report.fixed++;
        }
      }
    }
    cursor = page.cursor;
    progress(`verified ${report.checked} entities, ${report.drifted.length} drifted`);
  }
  return report;
}

/** `zhiguang counters rebuild`: every entity (or the given ones) from facts. */
export async function rebuildAll(
  store: CounterStore,
  refs: EntityRef[] | null,
  progress: Progress,
): Promise<number> {
  let rebuilt = 0;
  if (refs) {
    for (const ref of refs) await store.rebuild(ref);
    return refs.length;
  }
  let cursor: string | null = '';
  while (cursor !== null) {
    const page: { refs: EntityRef[]; cursor: string | null } = await store.scanEntities(cursor, 500);
    for (const ref of page.refs) await store.rebuild(ref);
    rebuilt += page.refs.length;
    cursor = page.cursor;
    progress(`rebuilt ${rebuilt} entities`);
  }
  return rebuilt;
}

export interface ReplayReport {
  events: number;
  malformed: number;
  facts: number;
  entities: number;
}

/**
 * Invariant 7, `zhiguang counters replay`: empties the counter store, reads `counter-events` from the
 * earliest record up to the end offsets captured at the start, and rebuilds facts and snapshots.
 * The fold is deterministic: for each (entity, metric, user) the event with the highest seq decides
 * the final state, whatever order the log holds them in. Writers should be stopped while it runs:
 * a toggle made during the replay, after the captured end, may be overwritten.
 */
export async function replayAll(
  store: CounterStore,
  events: EventLog,
  progress: Progress,
): Promise<ReplayReport> {
  const until = await events.endOffsets(COUNTER_TOPIC);
  await store.reset();
  const finals = new Map<string, CounterEvent>();
  const report: ReplayReport = { events: 0, malformed: 0, facts: 0, entities: 0 };
  await events.readRange(COUNTER_TOPIC, until, async (batch) => {
    for (const record of batch.records) {
      const event = parseCounterEvent(record.value);
      if (!event) {
        report.malformed++;
        continue;
      }
      report.events++;
      const key = `${event.entityType}:${event.entityId}:${event.metric}:${event.userId}`;
      const known = finals.get(key);
      if (!known || known.seq < event.seq) finals.set(key, event);
    }
    progress(`read ${report.events} events`);
  });
  const all = [...finals.values()];
  for (let i = 0; i < all.length; i += 5000) {
    await store.replayFacts(all.slice(i, i + 5000));
    progress(`replayed ${Math.min(i + 5000, all.length)} of ${all.length} facts`);
  }
  report.facts = all.length;
  const entities = new Map<string, EntityRef>();
  for (const e of all) {
    const ref = parseEntityKey(`${e.entityType}:${e.entityId}`);
    if (ref) entities.set(`${ref.etype}:${ref.eid}`, ref);
  }
  for (const ref of entities.values()) await store.rebuild(ref);
  report.entities = entities.size;
  progress(`rebuilt ${entities.size} entities`);
  return report;
}
