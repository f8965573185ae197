import type { DatabaseSync, StatementSync } from 'node:sqlite';
import type { Kysely } from 'kysely';
import { decodeSnapshot, encodeSnapshot } from '../../counter/snapshot.js';
import type { Db } from '../../platform/db/database.js';
import type { Database } from '../../platform/db/schema.js';
import { FIELD_MAX, fromLayout, toLayout, type UserCounterDelta, type UserCounts } from '../model.js';
import { eventRuns } from './runs.js';
import {
  checkUserId,
  DEFAULT_RETENTION_MS,
  parseSequencedEventId,
  type ApplyResult,
  type UserCounterStore,
  type UserInspection,
  type WriteOptions,
  type WriteResult,
} from './user-counter-store.js';
import { prepareTransactionStatements, runExclusive } from '../../platform/db/sqlite-exclusive.js';

export interface SqliteUserCounterStoreOptions {
  /** How long a (user, event) pair stays recorded as applied. */
  retentionMs?: number;
}

// Far below SQLite's bound-parameter limit, and keeps each IN list's plan cheap.
const IN_CHUNK = 500;
/** Expired applied ids one apply removes at least, so the table cannot grow faster than it is trimmed. */
const SWEEP_MIN = 1_000;

/**
 * `UserCounterStore` over the embedded database: `user_counters` (snapshot bytes, null when not
 * known, and the version), `user_counter_applied` ((user, event) pairs with the time they were
 * recorded) and `user_counter_marks` (per (user, source), the highest seq of sequenced ids). Each operation that writes is one `BEGIN IMMEDIATE` transaction on prepared statements,
 * run synchronously while holding Kysely's connection lock, so nothing can interleave with it — not
 * in this process, and not in another one (the admin command line) that shares the file.
 */
export class SqliteUserCounterStore implements UserCounterStore {
  private readonly kysely: Kysely<Database>;
  private readonly raw: DatabaseSync;
  private readonly retentionMs: number;
  private statements: Statements | undefined;

  constructor(db: Db, options: SqliteUserCounterStoreOptions = {}) {
    if (db.dialect !== 'sqlite' || db.raw === undefined) {
      throw new Error(
        `SqliteUserCounterStore needs a sqlite database opened by openSqlite, got ${db.dialect}`,
      );
    }
    this.kysely = db.kysely;
    this.raw = db.raw;
    this.retentionMs = options.retentionMs ?? DEFAULT_RETENTION_MS;
  }

  /** Prepared on first use, since the store may be built before the migrations ran. */
  private get s(): Statements {
    return (this.statements ??= prepareStatements(this.raw));
  }

  async read(userIds: readonly number[]): Promise<(UserCounts | null)[]> {
    if (userIds.length === 0) return [];
    userIds.forEach(checkUserId);
    const found = new Map<number, UserCounts | null>();
    const unique = [...new Set(userIds)];
    for (let i = 0; i < unique.length; i += IN_CHUNK) {
      const rows = await this.kysely
        .selectFrom('user_counters')
        .select(['user_id', 'data'])
        .where('user_id', 'in', unique.slice(i, i + IN_CHUNK))
        .execute();
      for (const row of rows) found.set(Number(row.user_id), decode(row.data));
    }
    return userIds.map((id) => found.get(id) ?? null);
  }

  async apply(deltas: readonly UserCounterDelta[], now: number): Promise<ApplyResult> {
    const { runs, repeats } = eventRuns(deltas);
    if (runs.length === 0) return { applied: 0, skipped: repeats };
    return this.exclusive(() => {
      const s = this.s;
      s.sweep.run(now - this.retentionMs, Math.max(SWEEP_MIN, runs.length * 2));
      let applied = 0;
      let skipped = repeats;
      for (const run of runs) {
        if (!this.record(run.userId, run.eventId, now)) {
          skipped += run.deltas.size;
          continue;
        }
        applied += run.deltas.size;
        const row = s.bump.get(run.userId) as { data: Uint8Array | null };
        const counts = decodeSnapshot(row.data);
        // No snapshot: the database already holds this change and the next rebuild will read it.
        if (!counts) continue;
        for (const [idx, delta] of run.deltas) counts[idx] = saturate((counts[idx] ?? 0) + delta);
        s.putData.run(encodeSnapshot(counts), run.userId);
      }
      return { applied, skipped };
    });
  }

  async write(userId: number, counts: UserCounts, options: WriteOptions, now: number): Promise<WriteResult> {
    checkUserId(userId);
    const bytes = encodeSnapshot(toLayout(counts));
    return this.exclusive((): WriteResult => {
      const s = this.s;
      const row = s.row.get(userId) as { data: Uint8Array | null; version: number } | undefined;
      const current = decode(row?.data);
      if (options.ifAbsent && current) return { outcome: 'present', counts: current };
      const version = Number(row?.version ?? 0);
      if (options.ifVersion !== undefined && version !== options.ifVersion) {
        return { outcome: 'conflict', version };
      }
      // Raising the version refuses the write of a rebuild that read it before this one.
      s.writeData.run(userId, bytes);
      for (const eventId of new Set(options.markApplied ?? [])) this.record(userId, eventId, now);
      return { outcome: 'written' };
    });
  }

  async inspect(userId: number, eventIds: readonly string[] = []): Promise<UserInspection> {
    checkUserId(userId);
    return this.exclusive(() => {
      const s = this.s;
      const row = s.row.get(userId) as { data: Uint8Array | null; version: number } | undefined;
      return {
        counts: decode(row?.data),
        version: Number(row?.version ?? 0),
        applied: eventIds.map((id) => this.isRecorded(userId, id)),
      };
    }, 'read');
  }

  async remove(userIds: readonly number[]): Promise<void> {
    userIds.forEach(checkUserId);
    for (let i = 0; i < userIds.length; i += IN_CHUNK) {
      await this.kysely
        .updateTable('user_counters')
        .set({ data: null })
        .where('user_id', 'in', userIds.slice(i, i + IN_CHUNK))
        .execute();
    }
  }

  async removeAll(): Promise<boolean> {
    const result = await this.kysely
      .updateTable('user_counters')
      .set({ data: null })
      .where('data', 'is not', null)
      .executeTakeFirst();
    return Number(result.numUpdatedRows) > 0;
  }

  async writeRawSnapshot(userId: number, bytes: Buffer | null): Promise<void> {
    checkUserId(userId);
    await this.exclusive(() => void this.s.upsertData.run(userId, bytes));
  }

  /** Records an event as applied to the user (inside a transaction); false when it already was. */
  private record(userId: number, eventId: string, now: number): boolean {
    const sequenced = parseSequencedEventId(eventId);
    if (!sequenced) return this.s.record.run(userId, eventId, now).changes > 0;
    return this.s.raiseMark.run(userId, sequenced.source, sequenced.seq).changes > 0;
  }

  private isRecorded(userId: number, eventId: string): boolean {
    const sequenced = parseSequencedEventId(eventId);
    if (!sequenced) return this.s.isRecorded.get(userId, eventId) !== undefined;
    const row = this.s.mark.get(userId, sequenced.source) as { seq: number } | undefined;
    return row !== undefined && sequenced.seq <= Number(row.seq);
  }

  /** One transaction under Kysely's connection lock (see `runExclusive`). */
  private exclusive<T>(work: () => T, mode: 'write' | 'read' = 'write'): Promise<T> {
    return runExclusive(this.kysely, this.raw, this.s, work, mode);
  }
}

function decode(data: Uint8Array | null | undefined): UserCounts | null {
  const counts = decodeSnapshot(data);
  return counts ? fromLayout(counts) : null;
}

function saturate(value: number): number {
  return Math.min(Math.max(0, value), FIELD_MAX);
}

type Statements = ReturnType<typeof prepareStatements>;

// node:sqlite binds every JS number as REAL; the casts keep integer columns integers.
function prepareStatements(raw: DatabaseSync) {
  const p = (text: string): StatementSync => raw.prepare(text);
  return {
    ...prepareTransactionStatements(raw),
    row: p('SELECT data, version FROM user_counters WHERE user_id = CAST(? AS INTEGER)'),
    // One statement says whether the pair is new: the insert changes a row exactly then.
    record: p(
      `INSERT INTO user_counter_applied (user_id, event_id, applied_at)
       VALUES (CAST(? AS INTEGER), ?, CAST(? AS INTEGER)) ON CONFLICT DO NOTHING`,
    ),
    // Changes a row exactly when the seq is above the mark (or there was none).
    raiseMark: p(
      `INSERT INTO user_counter_marks (user_id, source, seq)
       VALUES (CAST(? AS INTEGER), ?, CAST(? AS INTEGER))
       ON CONFLICT (user_id, source) DO UPDATE SET seq = excluded.seq WHERE excluded.seq > seq`,
    ),
    mark: p('SELECT seq FROM user_counter_marks WHERE user_id = CAST(? AS INTEGER) AND source = ?'),
    isRecorded: p(
      'SELECT 1 AS one FROM user_counter_applied WHERE user_id = CAST(? AS INTEGER) AND event_id = ?',
    ),
    bump: p(
      `INSERT INTO user_counters (user_id, data, version) VALUES (CAST(? AS INTEGER), NULL, 1)
       ON CONFLICT (user_id) DO UPDATE SET version = version + 1 RETURNING data`,
    ),
    putData: p('UPDATE user_counters SET data = ? WHERE user_id = CAST(? AS INTEGER)'),
    writeData: p(
      `INSERT INTO user_counters (user_id, data, version) VALUES (CAST(? AS INTEGER), ?, 1)
       ON CONFLICT (user_id) DO UPDATE SET data = excluded.data, version = version + 1`,
    ),
    upsertData: p(
      `INSERT INTO user_counters (user_id, data, version) VALUES (CAST(? AS INTEGER), ?, 0)
       ON CONFLICT (user_id) DO UPDATE SET data = excluded.data`,
    ),
    // Oldest first through the index on applied_at, so a sweep costs the rows it removes.
    sweep: p(
      `DELETE FROM user_counter_applied WHERE (user_id, event_id) IN (
         SELECT user_id, event_id FROM user_counter_applied WHERE applied_at < CAST(? AS INTEGER)
         ORDER BY applied_at LIMIT CAST(? AS INTEGER))`,
    ),
  };
}
