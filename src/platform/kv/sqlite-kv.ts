import { sql, type ExpressionBuilder, type Kysely } from 'kysely';
import type { Db } from '../db/database.js';
import type { Database } from '../db/schema.js';
import { checkIncrement, checkTtl, type KeyValueStore } from './kv.js';

export type Clock = () => number;

export interface SqliteKvOptions {
  /** Source of "now" in epoch ms; injectable so expiry can be tested without sleeping. */
  now?: Clock;
  /** How often a write may also delete a batch of expired rows. */
  sweepIntervalMs?: number;
  /** Most rows one opportunistic sweep deletes, so no single write pays for a large backlog. */
  sweepBatch?: number;
}

const DEFAULT_SWEEP_INTERVAL_MS = 60_000;
const DEFAULT_SWEEP_BATCH = 1_000;
// Far below SQLite's bound-parameter limit, and keeps each IN list's plan cheap.
const MGET_CHUNK = 500;

function live(now: number) {
  return (eb: ExpressionBuilder<Database, 'kv'>) =>
    eb.or([eb('kv.expires_at', 'is', null), eb('kv.expires_at', '>', now)]);
}

/**
 * Deletes up to `limit` expired rows of the `kv` table, oldest expiry first, and returns how many went.
 * Uses the partial index on `expires_at`, so it costs the rows it removes, not the table size.
 */
export async function sweepExpiredKv(kysely: Kysely<Database>, now: number, limit: number): Promise<number> {
  const result = await kysely
    .deleteFrom('kv')
    .where('k', 'in', (eb) =>
      eb
        .selectFrom('kv')
        .select('k')
        .where('expires_at', 'is not', null)
        .where('expires_at', '<=', now)
        .orderBy('expires_at')
        .limit(limit),
    )
    .executeTakeFirst();
  return Number(result.numDeletedRows);
}

/**
 * Runs `sweepExpiredKv` at most once per interval, piggybacking on writes; the interval is claimed
 * before the sweep starts so interleaved writes do not all sweep at once. A sweep that fills its
 * batch leaves a backlog, so the next write sweeps again rather than waiting out the interval: rows
 * then cannot expire faster than they are removed.
 */
export class OpportunisticSweeper {
  private nextAt: number;

  constructor(
    private readonly kysely: Kysely<Database>,
    private readonly intervalMs: number,
    private readonly batch: number,
    now: number,
  ) {
    this.nextAt = now + intervalMs;
  }

  async maybeSweep(now: number): Promise<void> {
    if (now < this.nextAt) return;
    this.nextAt = now + this.intervalMs;
    try {
      if ((await sweepExpiredKv(this.kysely, now, this.batch)) >= this.batch) this.nextAt = now;
    } catch {
      // The write that triggered the sweep must not fail because of it; the next interval retries.
    }
  }
}

/**
 * `KeyValueStore` over the embedded database's `kv` table. Each operation is one statement, so it is
 * atomic on its own; expired rows are filtered out by every read and overwritten by every write, and
 * removed in bounded batches by `sweepExpired` (called opportunistically from writes).
 */
export class SqliteKeyValueStore implements KeyValueStore {
  private readonly kysely: Kysely<Database>;
  private readonly now: Clock;
  private readonly sweepBatch: number;
  private readonly sweeper: OpportunisticSweeper;

  constructor(db: Db, options: SqliteKvOptions = {}) {
    if (db.dialect !== 'sqlite') {
      throw new Error(`SqliteKeyValueStore needs a sqlite database, got ${db.dialect}`);
    }
    this.kysely = db.kysely;
    this.now = options.now ?? Date.now;
    this.sweepBatch = options.sweepBatch ?? DEFAULT_SWEEP_BATCH;
    this.sweeper = new OpportunisticSweeper(
      this.kysely,
      options.sweepIntervalMs ?? DEFAULT_SWEEP_INTERVAL_MS,
      this.sweepBatch,
      this.now(),
    );
  }

  async get(key: string): Promise<string | null> {
    const row = await this.kysely
      .selectFrom('kv')
      .select('v')
      .where('k', '=', key)
      .where(live(this.now()))
      .executeTakeFirst();
    return row?.v ?? null;
  }

  async mget(keys: readonly string[]): Promise<(string | null)[]> {
    if (keys.length === 0) return [];
    const now = this.now();
    const unique = [...new Set(keys)];
    const found = new Map<string, string>();
    for (let i = 0; i < unique.length; i += MGET_CHUNK) {
      const rows = await this.kysely
        .selectFrom('kv')
        .select(['k', 'v'])
        .where('k', 'in', unique.slice(i, i + MGET_CHUNK))
        .where(live(now))
        .execute();
      for (const row of rows) found.set(row.k, row.v);
    }
    return keys.map((k) => found.get(k) ?? null);
  }

  async set(key: string, value: string, ttlMs?: number): Promise<void> {
    const ttl = checkTtl(ttlMs);
    const now = this.now();
    await this.sweeper.maybeSweep(now);
    await this.kysely
      .insertInto('kv')
      .values({ k: key, v: value, expires_at: ttl === undefined ? null : now + ttl })
      .onConflict((oc) =>
        oc.column('k').doUpdateSet((eb) => ({
          v: eb.ref('excluded.v'),
          expires_at: eb.ref('excluded.expires_at'),
        })),
      )
      .execute();
  }

  async setIfAbsent(key: string, value: string, ttlMs?: number): Promise<boolean> {
    const ttl = checkTtl(ttlMs);
    const now = this.now();
    await this.sweeper.maybeSweep(now);
    // A conflicting row is overwritten only when it has expired, i.e. when the key is logically missing.
    const row = await this.kysely
      .insertInto('kv')
      .values({ k: key, v: value, expires_at: ttl === undefined ? null : now + ttl })
      .onConflict((oc) =>
        oc
          .column('k')
          .doUpdateSet((eb) => ({
            v: eb.ref('excluded.v'),
            expires_at: eb.ref('excluded.expires_at'),
          }))
          .where('kv.expires_at', '<=', now),
      )
      .returning('k')
      .executeTakeFirst();
    return row !== undefined;
  }

  async getDel(key: string): Promise<string | null> {
    const now = this.now();
    const row = await this.kysely
      .deleteFrom('kv')
      .where('k', '=', key)
      .returning(['v', 'expires_at'])
      .executeTakeFirst();
    if (!row || (row.expires_at !== null && row.expires_at <= now)) return null;
    return row.v;
  }

  async delete(key: string): Promise<boolean> {
    const now = this.now();
    const row = await this.kysely
      .deleteFrom('kv')
      .where('k', '=', key)
      .returning('expires_at')
      .executeTakeFirst();
    return row !== undefined && (row.expires_at === null || row.expires_at > now);
  }

  async incr(key: string, by = 1, ttlMs?: number): Promise<number> {
    checkIncrement(by);
    const ttl = checkTtl(ttlMs);
    const now = this.now();
    await this.sweeper.maybeSweep(now);
    const expired = sql<boolean>`kv.expires_at IS NOT NULL AND kv.expires_at <= ${now}`;
    // node:sqlite binds every JS number as REAL, so the increment is cast back to INTEGER to keep
    // the stored text an integer ("6", not "6.0").
    const row = await this.kysely
      .insertInto('kv')
      .values({ k: key, v: String(by), expires_at: ttl === undefined ? null : now + ttl })
      .onConflict((oc) =>
        oc
          .column('k')
          .doUpdateSet({
            v: sql<string>`CASE WHEN ${expired} THEN excluded.v
              ELSE CAST(CAST(kv.v AS INTEGER) + CAST(${by} AS INTEGER) AS TEXT) END`,
            expires_at: sql<
              number | null
            >`CASE WHEN ${expired} THEN excluded.expires_at ELSE kv.expires_at END`,
          })
          // Refuse to count on top of a non-integer value (matching Redis) instead of treating it as 0.
          .where(sql<boolean>`${expired} OR CAST(CAST(kv.v AS INTEGER) AS TEXT) = kv.v`),
      )
      .returning('v')
      .executeTakeFirst();
    if (!row) throw new Error(`value of ${JSON.stringify(key)} is not an integer`);
    return Number(row.v);
  }

  expire(key: string, ttlMs: number): Promise<boolean> {
    return this.extend(key, ttlMs);
  }

  expireIfEquals(key: string, value: string, ttlMs: number): Promise<boolean> {
    return this.extend(key, ttlMs, value);
  }

  /** Gives a live key (holding `value`, when given) `ttlMs` from now. */
  private async extend(key: string, ttlMs: number, value?: string): Promise<boolean> {
    const ttl = checkTtl(ttlMs) as number;
    const now = this.now();
    let update = this.kysely
      .updateTable('kv')
      .set({ expires_at: now + ttl })
      .where('k', '=', key)
      .where(live(now));
    if (value !== undefined) update = update.where('v', '=', value);
    const result = await update.executeTakeFirst();
    return result.numUpdatedRows > 0n;
  }

  async deleteIfEquals(key: string, value: string): Promise<boolean> {
    const result = await this.kysely
      .deleteFrom('kv')
      .where('k', '=', key)
      .where('v', '=', value)
      .where(live(this.now()))
      .executeTakeFirst();
    return result.numDeletedRows > 0n;
  }

  async ttl(key: string): Promise<number | null> {
    const now = this.now();
    const row = await this.kysely
      .selectFrom('kv')
      .select('expires_at')
      .where('k', '=', key)
      .where(live(now))
      .executeTakeFirst();
    if (!row) return null;
    return row.expires_at === null ? -1 : row.expires_at - now;
  }

  /** Deletes up to `limit` expired rows; returns how many were deleted. */
  sweepExpired(limit = this.sweepBatch): Promise<number> {
    return sweepExpiredKv(this.kysely, this.now(), limit);
  }
}
