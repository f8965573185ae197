import { sql, type Kysely } from 'kysely';
import type { Db } from '../db/database.js';
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

/**
 * Fixed-window `RateLimiter` on the embedded database's `kv` table: one row per limited key holding
 * the hit count and the window's end. A hit is one upsert that either counts into the live window or,
 * when the stored window has ended, starts a new one; ended windows are swept opportunistically.
 */
export class SqliteRateLimiter implements RateLimiter {
  private readonly kysely: Kysely<Database>;
  private readonly now: Clock;
  private readonly prefix: string;
  private readonly sweeper: OpportunisticSweeper;

  constructor(db: Db, options: SqliteRateLimiterOptions = {}) {
    if (db.dialect !== 'sqlite') {
      throw new Error(`SqliteRateLimiter needs a sqlite database, got ${db.dialect}`);
    }
    this.kysely = db.kysely;
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
    const now = this.now();
    await this.sweeper.maybeSweep(now);
    const ended = sql<boolean>`kv.expires_at IS NULL OR kv.expires_at <= ${now}`;
    const row = await this.kysely
      .insertInto('kv')
      .values({ k: this.prefix + key, v: '1', expires_at: now + window })
      .onConflict((oc) =>
        oc.column('k').doUpdateSet({
          v: sql<string>`CASE WHEN ${ended} THEN '1' ELSE CAST(CAST(kv.v AS INTEGER) + 1 AS TEXT) END`,
          expires_at: sql<number>`CASE WHEN ${ended} THEN excluded.expires_at ELSE kv.expires_at END`,
        }),
      )
      .returning(['v', 'expires_at'])
      .executeTakeFirstOrThrow();
    return decide(Number(row.v), limit, (row.expires_at ?? now + window) - now);
  }

  async reset(key: string): Promise<void> {
    await this.kysely
      .deleteFrom('kv')
      .where('k', '=', this.prefix + key)
      .execute();
  }
}
