import { DatabaseSync, type StatementSync } from 'node:sqlite';
import { eventFor, type CounterEvent, type EntityRef, type EntityType, type FactMetric } from './model.js';

/** Facts handed to one `replayFacts` call, and the entities they finish. */
export interface ReplayChunk {
  facts: CounterEvent[];
  /** Entities all of whose facts are in this chunk: rebuilt as soon as it is replayed. */
  complete: EntityRef[];
  /**
   * Entities with more facts than a chunk holds, whose last fact is in this one: rebuilt once every
   * chunk is replayed (their earlier chunks may still be in flight).
   */
  spanning: EntityRef[];
}

/**
 * SQLite's page cache for the fold, in KiB; the rest of the table stays on disk. Outside the heap and
 * fixed whatever the log holds. Random upserts miss it more as the table grows: folding 6 million
 * events took 122 s with 64 MiB, 67 s with 128 MiB and 53 s with 256 MiB.
 */
const CACHE_KIB = 256 * 1024;

/**
 * The fold of a replay (invariant 7): for each (entity, metric, user), the event with the highest
 * seq, and for each entity the highest seq the log holds of it. A log holds tens of millions of
 * likes and favourites over the years, each toggled one kept (unliked ones too); held in the heap they
 * outgrow a default Node process, which then dies after the replay refused toggles. So they are
 * kept in SQLite's own temporary database, with a page cache of `CACHE_KIB`: its file is made under
 * `SQLITE_TMPDIR` or `TMPDIR` (on a tmpfs it lives in memory all the same, outside the heap) and
 * unlinked as soon as it is open, so the system frees it however the replay ends, killed included.
 *
 * Nothing here needs to survive a crash (a replay killed half-way starts again from the log), so the
 * database keeps no journal, does not sync, and the whole fold is one transaction that is never
 * committed: a commit would only write out the pages the batch touched, and random upserts touch a
 * page per event or so (committing each batch of 5,000 doubled the time of a 2-million-event fold).
 * Pages past the cache are written to the file as the transaction grows, so memory stays bounded.
 */
export class ReplayFold {
  private readonly db: DatabaseSync;
  private readonly upsertFact: StatementSync;
  private readonly upsertLogged: StatementSync;
  private readonly selectLogged: StatementSync;

  /** A fresh fold; `cacheKiB` is the page cache it keeps in memory. */
  static open(cacheKiB = CACHE_KIB): ReplayFold {
    return new ReplayFold(cacheKiB);
  }

  private constructor(cacheKiB: number) {
    // '': a temporary database, its file unlinked once made.
    this.db = new DatabaseSync('');
    try {
      this.db.exec(`
        PRAGMA journal_mode = OFF;
        PRAGMA synchronous = OFF;
        PRAGMA locking_mode = EXCLUSIVE;
        PRAGMA temp_store = FILE;
        PRAGMA cache_size = -${cacheKiB};
        CREATE TABLE facts (
          etype TEXT NOT NULL,
          eid TEXT NOT NULL,
          metric TEXT NOT NULL,
          user INTEGER NOT NULL,
          seq INTEGER NOT NULL,
          delta INTEGER NOT NULL,
          ts REAL NOT NULL,
          PRIMARY KEY (etype, eid, metric, user)
        ) WITHOUT ROWID;
        CREATE TABLE logged (
          etype TEXT NOT NULL,
          eid TEXT NOT NULL,
          seq INTEGER NOT NULL,
          PRIMARY KEY (etype, eid)
        ) WITHOUT ROWID;
      `);
      // Ties keep the event first folded, as any order would: two events of one entity never share a seq.
      this.upsertFact = this.db.prepare(`
        INSERT INTO facts (etype, eid, metric, user, seq, delta, ts) VALUES (?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT (etype, eid, metric, user) DO UPDATE
          SET seq = excluded.seq, delta = excluded.delta, ts = excluded.ts
          WHERE excluded.seq > facts.seq`);
      this.upsertLogged = this.db.prepare(`
        INSERT INTO logged (etype, eid, seq) VALUES (?, ?, ?)
        ON CONFLICT (etype, eid) DO UPDATE SET seq = excluded.seq WHERE excluded.seq > logged.seq`);
      this.selectLogged = this.db.prepare('SELECT seq FROM logged WHERE etype = ? AND eid = ?');
      this.db.exec('BEGIN');
    } catch (err) {
      this.db.close();
      throw err;
    }
  }

  /**
   * Folds a batch of events. A failure leaves the fold unusable (there is no journal to roll back
   * with): the replay fails and the fold is closed.
   */
  add(events: readonly CounterEvent[]): void {
    // SQLite rolls the whole fold back on some failures (a full disk): never go on without it.
    if (!this.db.isTransaction) throw new Error('the replay fold was rolled back after an earlier failure');
    try {
      // The entity's highest seq is written once per batch, not once per event.
      const highest = new Map<string, CounterEvent>();
      for (const e of events) {
        // The stores read no `ts`; a record without a numeric one still replays.
        const ts = typeof e.ts === 'number' && Number.isFinite(e.ts) ? e.ts : 0;
        this.upsertFact.run(e.entityType, e.entityId, e.metric, e.userId, e.seq, e.delta, ts);
        const key = `${e.entityType}:${e.entityId}`;
        if ((highest.get(key)?.seq ?? 0) < e.seq) highest.set(key, e);
      }
      for (const e of highest.values()) this.upsertLogged.run(e.entityType, e.entityId, e.seq);
    } catch (err) {
      throw new Error(
        `the replay fold failed: ${(err as Error).message} (its temporary file is under SQLITE_TMPDIR or ` +
          'TMPDIR, /tmp when neither is set: about 60 bytes a like or favourite ever toggled)',
        { cause: err },
      );
    }
  }

  /** The highest seq the log holds of the entity (0 when it names none). */
  loggedSeq(ref: EntityRef): number {
    const row = this.selectLogged.get(ref.etype, ref.eid) as { seq: number } | undefined;
    return row?.seq ?? 0;
  }

  /** Surviving facts: one per (entity, metric, user) ever toggled. */
  factCount(): number {
    return (this.db.prepare('SELECT COUNT(*) AS n FROM facts').get() as { n: number }).n;
  }

  /**
   * The surviving facts in chunks of at most `size`, read lazily in entity order (the primary key's,
   * so no sort), an entity's facts next to each other. A chunk holds whole entities where it can: one
   * that would not fit what is left of a chunk starts the next, and only one with more facts than a
   * chunk holds spans several. Only the chunks a caller holds are in memory.
   */
  *chunks(size: number): Generator<ReplayChunk> {
    // Two reads of the same index in the same order: how many facts each entity has, and the facts.
    const entities = this.db
      .prepare('SELECT etype, eid, COUNT(*) AS n FROM facts GROUP BY etype, eid ORDER BY etype, eid')
      .iterate() as Iterator<{ etype: EntityType; eid: string; n: number }>;
    const facts = this.db
      .prepare('SELECT etype, eid, metric, user, seq, delta, ts FROM facts ORDER BY etype, eid, metric, user')
      .iterate() as Iterator<FactRow>;
    let current: ReplayChunk = { facts: [], complete: [], spanning: [] };
    for (let entity = entities.next(); !entity.done; entity = entities.next()) {
      const { etype, eid, n } = entity.value;
      const ref: EntityRef = { etype, eid };
      if (current.facts.length > 0 && current.facts.length + n > size) {
        yield current;
        current = { facts: [], complete: [], spanning: [] };
      }
      for (let i = 0; i < n; i++) {
        if (current.facts.length >= size) {
          yield current;
          current = { facts: [], complete: [], spanning: [] };
        }
        const row = facts.next();
        if (row.done || row.value.etype !== etype || row.value.eid !== eid) {
          throw new Error(`replay fold: the facts of ${etype}:${eid} ended early`);
        }
        const { metric, user, seq, delta, ts } = row.value;
        current.facts.push(eventFor(ref, metric, user, delta, seq, ts));
      }
      (n > size ? current.spanning : current.complete).push(ref);
    }
    if (current.facts.length > 0) yield current;
  }

  /** Closes the database, which frees its file; safe to call again. */
  close(): void {
    if (this.db.isOpen) this.db.close();
  }
}

interface FactRow {
  etype: EntityType;
  eid: string;
  metric: FactMetric;
  user: number;
  seq: number;
  delta: 1 | -1;
  ts: number;
}
