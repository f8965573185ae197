import type { DatabaseSync, StatementSync } from 'node:sqlite';
import { sql, type Kysely } from 'kysely';
import { UnavailableError } from '../../platform/errors/errors.js';
import type { Db } from '../../platform/db/database.js';
import type { Database } from '../../platform/db/schema.js';
import {
  COUNTER_TOPIC,
  FACT_METRICS,
  FIELD_INDEX,
  ZERO_COUNTS,
  entityKey,
  eventFor,
  type CounterEvent,
  type Counts,
  type EntityRef,
  type EntityType,
  type FactMetric,
} from '../model.js';
import { decodeSnapshot, encodeSnapshot } from '../snapshot.js';
import { coveredRanges, planStoredViewMark, type OffsetRange } from '../view-marks.js';
import type {
  CounterStore,
  Flags,
  Inspection,
  LoggedViews,
  DeferredEvent,
  StaleEvent,
  ToggleResult,
  ViewIncrement,
} from './counter-store.js';
import { RESTORE_RETRY_AFTER_S } from './counter-store.js';
import { prepareTransactionStatements, runExclusive } from '../../platform/db/sqlite-exclusive.js';

export interface SqliteCounterStoreOptions {
  /** Event log topic the toggles append to. */
  topic?: string;
  /** Told of each toggle refused because the store is unsealed (a replay stopped half-way). */
  onUnsealed?: () => void;
}

// Far below SQLite's bound-parameter limit, and keeps each IN list's plan cheap.
const IN_CHUNK = 500;
// Bounds how long one group commit or flush step holds the database, so reads are not starved.
const MAX_GROUP_COMMIT = 256;
const FLUSH_CHUNK = 256;
// Kept from load time: a test that fakes the timers must not stall every toggle behind a clock it owns.
const nextTurn = setImmediate;
const READ = 0;
const MAX_U32 = 0xffffffff;

interface EntityRow {
  etype: string;
  eid: string;
}

/** One entity's events of an `applyEvents` batch, folded. */
interface Run {
  etype: EntityType;
  eid: string;
  seqs: Set<number>;
  from: number;
  to: number;
  deltas: Map<number, number>;
}

interface ToggleJob {
  run: () => ToggleResult;
  resolve: (result: ToggleResult) => void;
  reject: (err: unknown) => void;
  result?: ToggleResult;
  failed?: { error: unknown };
}

/**
 * `CounterStore` over the embedded database. Every multi-statement step is one SQLite transaction on
 * prepared statements of the raw handle, run synchronously while holding Kysely's connection lock,
 * so nothing else on the single connection can interleave with it.
 *
 * Toggles append their event to `event_log` in the same transaction as the fact change: an event
 * exists exactly when its change committed, so nothing is ever unpublished and no repair is needed.
 * Concurrent toggles share one commit (each inside its own savepoint, so one failing toggle does
 * not undo the others; a toggle alone in its commit needs none): a commit costs far more disk work
 * than the few statements of a toggle, and on a busy endpoint this is what keeps the write rate well
 * above one commit per request.
 */
export class SqliteCounterStore implements CounterStore {
  private readonly kysely: Kysely<Database>;
  private readonly raw: DatabaseSync;
  private readonly topic: string;
  private readonly onUnsealed: () => void;
  private statements: Statements | undefined;
  private clamped = 0;
  private readonly toggleQueue: ToggleJob[] = [];
  private draining = false;
  /** Where the next flush starts looking for dirty entities, so busy low keys cannot starve the rest. */
  private flushCursor: EntityRow | undefined;

  constructor(db: Db, options: SqliteCounterStoreOptions = {}) {
    if (db.dialect !== 'sqlite' || db.raw === undefined) {
      throw new Error(`SqliteCounterStore needs a sqlite database opened by openSqlite, got ${db.dialect}`);
    }
    this.kysely = db.kysely;
    this.raw = db.raw;
    this.topic = options.topic ?? COUNTER_TOPIC;
    this.onUnsealed = options.onUnsealed ?? (() => undefined);
  }

  /** Prepared on first use, since the store may be built before the migrations ran. */
  private get s(): Statements {
    return (this.statements ??= prepareStatements(this.raw));
  }

  toggle(
    ref: EntityRef,
    metric: FactMetric,
    userId: number,
    on: boolean,
    now: number,
  ): Promise<ToggleResult> {
    return new Promise<ToggleResult>((resolve, reject) => {
      this.toggleQueue.push({ run: () => this.toggleNow(ref, metric, userId, on, now), resolve, reject });
      if (!this.draining) {
        this.draining = true;
        // After the current I/O phase, so the toggles of every request read in it share one commit.
        nextTurn(() => void this.drainToggles());
      }
    });
  }

  private toggleNow(
    ref: EntityRef,
    metric: FactMetric,
    userId: number,
    on: boolean,
    now: number,
  ): ToggleResult {
    const s = this.s;
    const change = on ? s.addFact : s.removeFact;
    if (change.run(ref.etype, ref.eid, metric, userId).changes === 0) {
      return { changed: false, state: on, event: null, published: false };
    }
    const { seq } = s.bumpSeq.get(ref.etype, ref.eid) as { seq: number };
    const event = eventFor(ref, metric, userId, on ? 1 : -1, Number(seq), now);
    s.appendEvent.run(this.topic, entityKey(ref), JSON.stringify(event), now);
    return { changed: true, state: on, event, published: true };
  }

  private async drainToggles(): Promise<void> {
    try {
      while (this.toggleQueue.length > 0) {
        let jobs: ToggleJob[] = [];
        try {
          await this.exclusive(() => {
            // Taken under the lock, so toggles that arrived while waiting for it share this commit.
            jobs = this.toggleQueue.splice(0, MAX_GROUP_COMMIT);
            if (this.s.unsealed.get() !== undefined) {
              this.onUnsealed();
              throw restoring();
            }
            const only = jobs.length === 1 ? jobs[0] : undefined;
            if (only) {
              // Alone in its commit: a failure rolls back the whole transaction, which holds nothing else.
              only.result = only.run();
              return;
            }
            const s = this.s;
            for (const job of jobs) {
              s.savepoint.run();
              try {
                job.result = job.run();
                s.release.run();
              } catch (error) {
                job.failed = { error };
                s.rollbackTo.run();
                s.release.run();
              }
            }
          });
        } catch (err) {
          // Nothing of this group committed: every toggle in it fails, including the ones that ran.
          if (jobs.length === 0) jobs = this.toggleQueue.splice(0, MAX_GROUP_COMMIT);
          for (const job of jobs) job.reject(job.failed ? job.failed.error : err);
          continue;
        }
        for (const job of jobs) {
          if (job.failed) job.reject(job.failed.error);
          else job.resolve(job.result!);
        }
      }
    } finally {
      this.draining = false;
    }
  }

  async flags(userId: number, refs: readonly EntityRef[]): Promise<Flags[]> {
    if (refs.length === 0) return [];
    const held = new Set<string>();
    for (const chunk of chunks(uniqueRefs(refs), IN_CHUNK)) {
      const rows = await this.kysely
        .selectFrom('counter_facts')
        .select(['etype', 'eid', 'metric'])
        .where('user_id', '=', userId)
        .where('metric', 'in', FACT_METRICS)
        .where((eb) =>
          eb.or(
            byType(chunk).map(([etype, eids]) => eb.and([eb('etype', '=', etype), eb('eid', 'in', eids)])),
          ),
        )
        .execute();
      for (const row of rows) held.add(`${row.etype}:${row.eid}:${row.metric}`);
    }
    return refs.map((ref) => {
      const key = entityKey(ref);
      return { like: held.has(`${key}:like`), fav: held.has(`${key}:fav`) };
    });
  }

  async factCounts(ref: EntityRef): Promise<Record<FactMetric, number>> {
    const rows = await this.kysely
      .selectFrom('counter_facts')
      .select(['metric', (eb) => eb.fn.countAll<number>().as('n')])
      .where('etype', '=', ref.etype)
      .where('eid', '=', ref.eid)
      .groupBy('metric')
      .execute();
    const counts: Record<FactMetric, number> = { like: 0, fav: 0 };
    for (const row of rows) if (isFactMetric(row.metric)) counts[row.metric] = Number(row.n);
    return counts;
  }

  async readSnapshots(refs: readonly EntityRef[]): Promise<(Counts | null)[]> {
    if (refs.length === 0) return [];
    const found = new Map<string, Counts | null>();
    for (const chunk of chunks(uniqueRefs(refs), IN_CHUNK)) {
      const rows = await this.kysely
        .selectFrom('counter_snapshots')
        .select(['etype', 'eid', 'data'])
        .where((eb) =>
          eb.or(
            byType(chunk).map(([etype, eids]) => eb.and([eb('etype', '=', etype), eb('eid', 'in', eids)])),
          ),
        )
        .execute();
      for (const row of rows) found.set(`${row.etype}:${row.eid}`, decodeSnapshot(row.data));
    }
    return refs.map((ref) => found.get(entityKey(ref)) ?? null);
  }

  rebuild(ref: EntityRef): Promise<Counts> {
    return this.exclusive(() => this.rebuildNow(ref, this.snapshotNow(ref)));
  }

  async addViews(entries: readonly ViewIncrement[]): Promise<void> {
    const views = sumViews(entries);
    if (views.size === 0) return;
    await this.exclusive(() => this.addViewsNow(views));
  }

  async addLoggedViews(
    records: readonly LoggedViews[],
    covered?: ReadonlyMap<number, readonly OffsetRange[]>,
    options: { restoring?: boolean } = {},
  ): Promise<number> {
    const ranges = coveredRanges(records, covered);
    for (const record of records) for (const { n } of record.views) checkViewCount(n);
    return this.exclusive(() => {
      const s = this.s;
      if (!options.restoring && s.unsealed.get() !== undefined) throw viewsWait();
      const added: ViewIncrement[] = [];
      for (const [partition, covers] of ranges) {
        const mine = records.filter((r) => r.partition === partition);
        const stored = s.viewMark.get(partition)?.mark as string | undefined;
        const { add, next } = planStoredViewMark(stored, covers, mine);
        mine.forEach((record, i) => {
          if (add[i]) added.push(...record.views);
        });
        s.putViewMark.run(partition, next);
      }
      this.addViewsNow(sumViews(added));
      return added.reduce((sum, { n }) => sum + n, 0);
    });
  }

  private addViewsNow(views: ReadonlyMap<string, ViewIncrement>): void {
    const s = this.s;
    for (const { ref, n } of views.values()) {
      const counts = this.snapshotNow(ref) ?? this.rebuildNow(ref, null);
      counts[READ] = Math.min(MAX_U32, counts[READ] + n);
      s.putSnapshot.run(ref.etype, ref.eid, encodeSnapshot(counts));
    }
  }

  /** Fact-backed fields from the facts, the others from `base`; pending deltas dropped, mark raised. */
  private rebuildNow(ref: EntityRef, base: Counts | null): Counts {
    const s = this.s;
    const counts: Counts = [...(base ?? ZERO_COUNTS)];
    counts[FIELD_INDEX.like] = 0;
    counts[FIELD_INDEX.fav] = 0;
    for (const row of s.countFacts.all(ref.etype, ref.eid) as { metric: string; n: number }[]) {
      if (isFactMetric(row.metric)) counts[FIELD_INDEX[row.metric]] = Number(row.n);
    }
    s.putSnapshot.run(ref.etype, ref.eid, encodeSnapshot(counts));
    s.dropPending.run(ref.etype, ref.eid);
    s.raiseAppliedToSeq.run(ref.etype, ref.eid);
    return counts;
  }

  private snapshotNow(ref: EntityRef): Counts | null {
    const row = this.s.snapshot.get(ref.etype, ref.eid) as { data: Uint8Array } | undefined;
    return decodeSnapshot(row?.data);
  }

  inspect(ref: EntityRef): Promise<Inspection> {
    return this.exclusive(() => {
      const s = this.s;
      const row = s.entity.get(ref.etype, ref.eid) as { seq: number; applied: number } | undefined;
      const facts: Record<FactMetric, number> = { like: 0, fav: 0 };
      for (const f of s.countFacts.all(ref.etype, ref.eid) as { metric: string; n: number }[]) {
        if (isFactMetric(f.metric)) facts[f.metric] = Number(f.n);
      }
      return {
        seq: Number(row?.seq ?? 0),
        applied: Number(row?.applied ?? 0),
        pending: s.hasPending.get(ref.etype, ref.eid) !== undefined,
        snapshot: this.snapshotNow(ref),
        facts,
        // One transaction holds the facts and their log: they are never lost apart, only
        // emptied by a replay, which unseals the store until it has rebuilt them.
        sealed: s.unsealed.get() === undefined,
      };
    }, 'read');
  }

  async applyEvents(events: readonly CounterEvent[]): Promise<{ applied: number; skipped: number }> {
    if (events.length === 0) return { applied: 0, skipped: 0 };
    const runs = new Map<string, Run>();
    let skipped = 0;
    for (const event of events) {
      const key = `${event.entityType}:${event.entityId}`;
      let run = runs.get(key);
      if (!run) {
        run = {
          etype: event.entityType,
          eid: event.entityId,
          seqs: new Set(),
          from: event.seq,
          to: event.seq,
          deltas: new Map(),
        };
        runs.set(key, run);
      }
      if (run.seqs.has(event.seq)) {
        skipped++;
        continue;
      }
      run.seqs.add(event.seq);
      run.from = Math.min(run.from, event.seq);
      run.to = Math.max(run.to, event.seq);
      run.deltas.set(event.idx, (run.deltas.get(event.idx) ?? 0) + event.delta);
    }
    return this.exclusive(() => {
      const s = this.s;
      let applied = 0;
      for (const run of runs.values()) {
        const row = s.entity.get(run.etype, run.eid) as { applied: number } | undefined;
        const mark = Number(row?.applied ?? 0);
        if (run.to <= mark) {
          skipped += run.seqs.size;
          continue;
        }
        // What was at or below the mark had been counted already (a rebuild from facts below).
        for (const seq of run.seqs) {
          if (seq > mark) applied++;
          else skipped++;
        }
        if (run.from === mark + 1 && run.to - run.from + 1 === run.seqs.size) {
          // A zero net delta still marks the entity dirty, so its next flush writes (or rebuilds) the snapshot.
          for (const [idx, delta] of run.deltas) s.addPending.run(run.etype, run.eid, idx, delta);
          s.markApplied.run(run.etype, run.eid, run.to);
        } else {
          // A gap or an overlap with the mark: the deltas alone cannot be placed exactly, the facts can.
          const ref = { etype: run.etype, eid: run.eid };
          this.rebuildNow(ref, this.snapshotNow(ref));
        }
      }
      return { applied, skipped };
    });
  }

  async flush(limit: number): Promise<number> {
    let folded = 0;
    while (folded < limit) {
      const step = Math.min(FLUSH_CHUNK, limit - folded);
      const { entities: n, clamped } = await this.exclusive(() => this.flushNow(step));
      // Counted once the transaction committed (a rolled back fold is done again).
      this.clamped += clamped;
      folded += n;
      if (n < step) break;
    }
    return folded;
  }

  private flushNow(limit: number): { entities: number; clamped: number } {
    const s = this.s;
    let clamped = 0;
    const cursor = this.flushCursor ?? { etype: '', eid: '' };
    const dirty = s.dirtyAfter.all(cursor.etype, cursor.eid, limit) as unknown as EntityRow[];
    if (dirty.length < limit && this.flushCursor) {
      dirty.push(
        ...(s.dirtyUpTo.all(cursor.etype, cursor.eid, limit - dirty.length) as unknown as EntityRow[]),
      );
    }
    for (const row of dirty) {
      const ref = { etype: row.etype as EntityType, eid: row.eid };
      const counts = this.snapshotNow(ref);
      if (counts === null) {
        this.rebuildNow(ref, null);
        continue;
      }
      for (const { idx, delta } of s.pending.all(ref.etype, ref.eid) as { idx: number; delta: number }[]) {
        const value = counts[idx];
        if (value === undefined) continue;
        // A negative total would mean a lost increment; clamping keeps the snapshot encodable meanwhile.
        const sum = value + Number(delta);
        if (sum < 0) clamped += 1;
        counts[idx] = Math.max(0, sum);
      }
      s.putSnapshot.run(ref.etype, ref.eid, encodeSnapshot(counts));
      s.dropPending.run(ref.etype, ref.eid);
    }
    const last = dirty[dirty.length - 1];
    if (last) this.flushCursor = { etype: last.etype, eid: last.eid };
    return { entities: dirty.length, clamped };
  }

  get clampedFields(): number {
    return this.clamped;
  }

  async isQuiet(): Promise<boolean> {
    const row = await this.kysely.selectFrom('counter_pending').select('idx').limit(1).executeTakeFirst();
    return row === undefined;
  }

  async staleUnpublished(_now: number, _olderThanMs: number, _limit: number): Promise<StaleEvent[]> {
    return [];
  }

  async markPublished(_events: readonly CounterEvent[]): Promise<void> {
    // Events are in the log from the moment their toggle committed.
  }

  async dropUnpublished(_entries: readonly StaleEvent[]): Promise<void> {
    // Nothing is ever recorded as unpublished here.
  }

  async deferUnpublished(_entries: readonly DeferredEvent[]): Promise<void> {
    // Nothing is ever recorded as unpublished here.
  }

  async scanEntities(cursor: string, limit: number): Promise<{ refs: EntityRef[]; cursor: string | null }> {
    const max = Math.max(1, Math.floor(limit));
    const at = cursor.indexOf(':');
    const etype = at < 0 ? '' : cursor.slice(0, at);
    const eid = at < 0 ? '' : cursor.slice(at + 1);
    // Every entity that ever changed has a row in counter_entities, so with the snapshots that covers
    // every entity with facts. Each side is limited on its own first, so a page reads about `max`
    // rows of each table whatever the table sizes.
    const { rows } = await sql<EntityRow>`
      SELECT etype, eid FROM (
        SELECT etype, eid FROM counter_entities WHERE (etype, eid) > (${etype}, ${eid})
        ORDER BY etype, eid LIMIT ${max})
      UNION
      SELECT etype, eid FROM (
        SELECT etype, eid FROM counter_snapshots WHERE (etype, eid) > (${etype}, ${eid})
        ORDER BY etype, eid LIMIT ${max})
      ORDER BY etype, eid LIMIT ${max}`.execute(this.kysely);
    const refs = rows.map((r) => ({ etype: r.etype as EntityType, eid: r.eid }));
    const last = refs[refs.length - 1];
    return { refs, cursor: refs.length === max && last ? entityKey(last) : null };
  }

  async sampleEntities(limit: number): Promise<EntityRef[]> {
    const max = Math.floor(limit);
    if (!(max >= 1)) return [];
    const { rows } = await sql<EntityRow>`
      SELECT etype, eid FROM counter_snapshots ORDER BY random() LIMIT ${max}`.execute(this.kysely);
    return rows.map((r) => ({ etype: r.etype as EntityType, eid: r.eid }));
  }

  /**
   * Facts are rows of the database itself, never lost apart from it; but a replay empties them and
   * rebuilds them from the log. It unseals the store first and seals it once done, and the mark is
   * a row: a replay that stops half-way (killed, or out of disk) leaves toggles refused (503) until
   * a replay completes, as on the cluster profile. A toggle taken meanwhile would restart its
   * entity's seq at 1, below the events the log holds, and the next replay would revert it.
   */
  async seal(groups?: readonly number[], _token?: string): Promise<void> {
    // One group, 0: `unseal` found the store unsealed already when it answered none.
    if (groups && !groups.includes(0)) return;
    await this.exclusive(() => void this.s.seal.run());
  }

  async claimForRestore(_token: string): Promise<void> {
    // Nothing empties the database under a replay but the replay itself.
  }

  async unseal(_token?: string): Promise<number[]> {
    const wasSealed = await this.exclusive(() => {
      const sealed = this.s.unsealed.get() === undefined;
      this.s.unseal.run();
      return sealed;
    });
    // The one group there is: sealed again if the replay stops before its reset.
    return wasSealed ? [0] : [];
  }

  async unsealedGroups(): Promise<number> {
    return this.exclusive(() => (this.s.unsealed.get() === undefined ? 0 : 1), 'read');
  }

  async restoring(): Promise<boolean> {
    return (await this.unsealedGroups()) > 0;
  }

  async reset(): Promise<void> {
    await this.exclusive(() => {
      for (const table of ['counter_facts', 'counter_entities', 'counter_pending', 'counter_snapshots']) {
        this.raw.exec(`DELETE FROM ${table}`);
      }
      this.raw.exec('DELETE FROM counter_view_marks');
      this.flushCursor = undefined;
    });
  }

  async replayFacts(events: readonly CounterEvent[]): Promise<void> {
    if (events.length === 0) return;
    // Per (entity, metric, user) the highest seq decides, whatever the order of the array.
    const finals = new Map<string, CounterEvent>();
    for (const e of events) {
      const key = `${e.entityType}:${e.entityId}:${e.metric}:${e.userId}`;
      const known = finals.get(key);
      if (!known || known.seq < e.seq) finals.set(key, e);
    }
    await this.exclusive(() => {
      const s = this.s;
      for (const e of finals.values()) {
        (e.delta > 0 ? s.addFact : s.removeFact).run(e.entityType, e.entityId, e.metric, e.userId);
      }
      const seqs = new Map<string, { etype: string; eid: string; seq: number }>();
      for (const e of events) {
        const key = `${e.entityType}:${e.entityId}`;
        const top = seqs.get(key);
        if (!top) seqs.set(key, { etype: e.entityType, eid: e.entityId, seq: e.seq });
        else if (e.seq > top.seq) top.seq = e.seq;
      }
      for (const { etype, eid, seq } of seqs.values()) s.raiseSeq.run(etype, eid, seq);
    });
  }

  async writeRawSnapshot(ref: EntityRef, bytes: Buffer | null): Promise<void> {
    if (bytes === null) {
      await this.kysely
        .deleteFrom('counter_snapshots')
        .where('etype', '=', ref.etype)
        .where('eid', '=', ref.eid)
        .execute();
      return;
    }
    await this.kysely
      .insertInto('counter_snapshots')
      .values({ etype: ref.etype, eid: ref.eid, data: bytes })
      .onConflict((oc) =>
        oc.columns(['etype', 'eid']).doUpdateSet((eb) => ({ data: eb.ref('excluded.data') })),
      )
      .execute();
  }

  /** One transaction under Kysely's connection lock (see `runExclusive`). */
  private exclusive<T>(work: () => T, mode: 'write' | 'read' = 'write'): Promise<T> {
    return runExclusive(this.kysely, this.raw, this.s, work, mode);
  }
}

type Statements = ReturnType<typeof prepareStatements>;

// node:sqlite binds every JS number as REAL; the casts keep integer columns and results integers.
function prepareStatements(raw: DatabaseSync) {
  const p = (text: string): StatementSync => raw.prepare(text);
  return {
    ...prepareTransactionStatements(raw),
    savepoint: p('SAVEPOINT counter_toggle'),
    release: p('RELEASE counter_toggle'),
    rollbackTo: p('ROLLBACK TO counter_toggle'),
    addFact: p(
      `INSERT INTO counter_facts (etype, eid, metric, user_id) VALUES (?, ?, ?, CAST(? AS INTEGER))
       ON CONFLICT DO NOTHING`,
    ),
    removeFact: p(
      `DELETE FROM counter_facts WHERE etype = ? AND eid = ? AND metric = ? AND user_id = CAST(? AS INTEGER)`,
    ),
    bumpSeq: p(
      `INSERT INTO counter_entities (etype, eid, seq, applied) VALUES (?, ?, 1, 0)
       ON CONFLICT (etype, eid) DO UPDATE SET seq = seq + 1 RETURNING seq`,
    ),
    appendEvent: p(`INSERT INTO event_log (topic, key, value, ts) VALUES (?, ?, ?, CAST(? AS INTEGER))`),
    entity: p('SELECT seq, applied FROM counter_entities WHERE etype = ? AND eid = ?'),
    // seq follows the mark up, so a change made after events of an unknown entity were applied
    // (only possible after a reset) is numbered above them instead of being skipped.
    markApplied: p(
      `INSERT INTO counter_entities (etype, eid, seq, applied) VALUES (?1, ?2, CAST(?3 AS INTEGER), CAST(?3 AS INTEGER))
       ON CONFLICT (etype, eid) DO UPDATE SET
         applied = max(applied, excluded.applied), seq = max(seq, excluded.applied)`,
    ),
    raiseSeq: p(
      `INSERT INTO counter_entities (etype, eid, seq, applied) VALUES (?, ?, CAST(? AS INTEGER), 0)
       ON CONFLICT (etype, eid) DO UPDATE SET seq = max(seq, excluded.seq)`,
    ),
    // A mark above seq means seq went backwards (lost writes): seq is raised so that new changes are
    // numbered above everything already counted.
    raiseAppliedToSeq: p(
      `INSERT INTO counter_entities (etype, eid, seq, applied) VALUES (?, ?, 0, 0)
       ON CONFLICT (etype, eid) DO UPDATE SET seq = max(seq, applied), applied = max(seq, applied)`,
    ),
    addPending: p(
      `INSERT INTO counter_pending (etype, eid, idx, delta) VALUES (?, ?, CAST(? AS INTEGER), CAST(? AS INTEGER))
       ON CONFLICT (etype, eid, idx) DO UPDATE SET delta = delta + excluded.delta`,
    ),
    pending: p('SELECT idx, delta FROM counter_pending WHERE etype = ? AND eid = ?'),
    hasPending: p('SELECT 1 AS one FROM counter_pending WHERE etype = ? AND eid = ? LIMIT 1'),
    dropPending: p('DELETE FROM counter_pending WHERE etype = ? AND eid = ?'),
    dirtyAfter: p(
      `SELECT DISTINCT etype, eid FROM counter_pending WHERE (etype, eid) > (?, ?)
       ORDER BY etype, eid LIMIT CAST(? AS INTEGER)`,
    ),
    dirtyUpTo: p(
      `SELECT DISTINCT etype, eid FROM counter_pending WHERE (etype, eid) <= (?, ?)
       ORDER BY etype, eid LIMIT CAST(? AS INTEGER)`,
    ),
    snapshot: p('SELECT data FROM counter_snapshots WHERE etype = ? AND eid = ?'),
    putSnapshot: p(
      `INSERT INTO counter_snapshots (etype, eid, data) VALUES (?, ?, ?)
       ON CONFLICT (etype, eid) DO UPDATE SET data = excluded.data`,
    ),
    countFacts: p(
      'SELECT metric, count(*) AS n FROM counter_facts WHERE etype = ? AND eid = ? GROUP BY metric',
    ),
    unsealed: p(`SELECT 1 AS one FROM counter_meta WHERE k = 'unsealed'`),
    unseal: p(`INSERT INTO counter_meta (k, v) VALUES ('unsealed', 1) ON CONFLICT DO NOTHING`),
    seal: p(`DELETE FROM counter_meta WHERE k = 'unsealed'`),
    viewMark: p('SELECT mark FROM counter_view_marks WHERE partition = CAST(? AS INTEGER)'),
    putViewMark: p(
      `INSERT INTO counter_view_marks (partition, mark) VALUES (CAST(? AS INTEGER), ?)
       ON CONFLICT (partition) DO UPDATE SET mark = excluded.mark`,
    ),
  };
}

function checkViewCount(n: number): void {
  if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`invalid view count: ${n}`);
}

/** The views of each entity summed (saturating), zeros left out; throws on a negative or fractional count. */
function sumViews(entries: readonly ViewIncrement[]): Map<string, ViewIncrement> {
  const views = new Map<string, ViewIncrement>();
  for (const { ref, n } of entries) {
    checkViewCount(n);
    if (n === 0) continue;
    const key = entityKey(ref);
    const seen = views.get(key);
    if (seen) seen.n = Math.min(MAX_U32, seen.n + n);
    else views.set(key, { ref, n });
  }
  return views;
}

function isFactMetric(value: string): value is FactMetric {
  return (FACT_METRICS as readonly string[]).includes(value);
}

function uniqueRefs(refs: readonly EntityRef[]): EntityRef[] {
  const seen = new Map<string, EntityRef>();
  for (const ref of refs) seen.set(entityKey(ref), ref);
  return [...seen.values()];
}

function byType(refs: readonly EntityRef[]): [EntityType, string[]][] {
  const groups = new Map<EntityType, string[]>();
  for (const ref of refs) {
    const eids = groups.get(ref.etype);
    if (eids) eids.push(ref.eid);
    else groups.set(ref.etype, [ref.eid]);
  }
  return [...groups];
}

function chunks<T>(items: readonly T[], size: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}

function viewsWait(): UnavailableError {
  return new UnavailableError('Views wait while the counter store is being restored; try again later', {
    retryAfterSeconds: RESTORE_RETRY_AFTER_S,
  });
}

function restoring(): UnavailableError {
  return new UnavailableError(
    'Likes and favourites are being restored (a counters replay is under way or stopped half-way); try again later',
    { retryAfterSeconds: RESTORE_RETRY_AFTER_S },
  );
}
