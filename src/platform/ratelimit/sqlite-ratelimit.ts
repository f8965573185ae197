import type { DatabaseSync, StatementSync } from 'node:sqlite';
import type { Kysely } from 'kysely';
import type { Db } from '../db/database.js';
import {
  prepareTransactionStatements,
  runExclusive,
  type TransactionStatements,
} from '../db/sqlite-exclusive.js';
import type { Database } from '../db/schema.js';
import { OpportunisticSweeper, type Clock } from '../kv/sqlite-kv.js';
import { checkWindow, decide, type RateLimitDecision, type RateLimiter } from './ratelimit.js';

export interface SqliteRateLimiterOptions {
  now?: Clock;
  /** Namespace inside the shared `kv` table, kept apart from keys of the key-value store. */
  prefix?: string;
  sweepIntervalMs?: number;
  sweepBatch?: number;
}

/** Hits taken into one transaction at most, so a burst cannot hold the database for long. */
const MAX_GROUP = 256;
// Kept from load time: a test that fakes the timers must not stall every hit behind a clock it owns.
const nextTurn = setImmediate;

interface Hit {
  key: string;
  limit: number;
  window: number;
  resolve: (decision: RateLimitDecision) => void;
  reject: (err: unknown) => void;
}

/**
 * Fixed-window `RateLimiter` on the embedded database's `kv` table: one row per limited key holding
 * the hit count and the window's end. A hit is one upsert that either counts into the live window or,
 * when the stored window has ended, starts a new one; ended windows are swept opportunistically.
 *
 * Hits wait for the next turn of the event loop and commit together, in one transaction on a
 * prepared statement (a rate-limited route hits the limiter on every request, and a commit of its
 * own per hit would cost more than the rest of a like). Each hit still reads the count its own
 * upsert left, so the decisions are those of hits made one after the other.
 */
export class SqliteRateLimiter implements RateLimiter {
  private readonly kysely: Kysely<Database>;
  private readonly raw: DatabaseSync;
  private readonly now: Clock;
  private readonly prefix: string;
  private readonly sweeper: OpportunisticSweeper;
  private statements: { tx: TransactionStatements; upsert: StatementSync } | undefined;
  private readonly queue: Hit[] = [];
  private draining = false;

  constructor(db: Db, options: SqliteRateLimiterOptions = {}) {
    if (db.dialect !== 'sqlite' || db.raw === undefined) {
      throw new Error(`SqliteRateLimiter needs a sqlite database opened by openSqlite, got ${db.dialect}`);
    }
    this.kysely = db.kysely;
    this.raw = db.raw;
    this.now = options.now ?? Date.now;
    this.prefix = options.prefix ?? 'rl:';
    this.sweeper = new OpportunisticSweeper(
      this.kysely,
      options.sweepIntervalMs ?? 60_000,
      options.sweepBatch ?? 1_000,
      this.now(),
    );
  }

  async hit(key: string, limit: number, windowMs: number): Promise<RateLimitDecision> {
    const window = checkWindow(limit, windowMs);
    return new Promise<RateLimitDecision>((resolve, reject) => {
      this.queue.push({ key: this.prefix + key, limit, window, resolve, reject });
      if (!this.draining) {
        this.draining = true;
        nextTurn(() => void this.drain());
      }
    });
  }

  async reset(key: string): Promise<void> {
    await this.kysely
      .deleteFrom('kv')
      .where('k', '=', this.prefix + key)
      .execute();
  }

  private async drain(): Promise<void> {
    try {
      while (this.queue.length > 0) {
        const now = this.now();
        await this.sweeper.maybeSweep(now);
        const hits = this.queue.splice(0, MAX_GROUP);
        let rows: { v: string; expires_at: number }[];
        try {
          // Prepared on first use, since the limiter may be built before the migrations ran.
          const { tx, upsert } = (this.statements ??= prepare(this.raw));
          rows = await runExclusive(this.kysely, this.raw, tx, () =>
            hits.map((h) => upsert.get(h.key, now + h.window, now) as { v: string; expires_at: number }),
          );
        } catch (err) {
          for (const h of hits) h.reject(err);
          continue;
        }
        hits.forEach((h, i) => {
          const row = rows[i]!;
          h.resolve(decide(Number(row.v), h.limit, Number(row.expires_at) - now));
        });
      }
    } finally {
      this.draining = false;
    }
  }
}

// node:sqlite binds every JS number as REAL; the casts keep the integer column integer.
function prepare(raw: DatabaseSync) {
  return {
    tx: prepareTransactionStatements(raw),
    upsert: raw.prepare(
      `INSERT INTO kv (k, v, expires_at) VALUES (?, '1', CAST(? AS INTEGER))
       ON CONFLICT (k) DO UPDATE SET
         v = CASE WHEN kv.expires_at IS NULL OR kv.expires_at <= CAST(?3 AS INTEGER) THEN '1'
                  ELSE CAST(CAST(kv.v AS INTEGER) + 1 AS TEXT) END,
         expires_at = CASE WHEN kv.expires_at IS NULL OR kv.expires_at <= CAST(?3 AS INTEGER)
                           THEN excluded.expires_at ELSE kv.expires_at END
       RETURNING v, expires_at`,
    ),
  };
}
