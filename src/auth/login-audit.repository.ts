import { Counter, type Registry } from 'prom-client';
import type { Db } from '../platform/db/database.js';

export interface LoginAttempt {
  userId: number | null;
  identifier: string;
  channel: 'PASSWORD' | 'CODE' | 'REGISTER' | 'REFRESH' | 'RESET';
  success: boolean;
  reason: string | null;
  ip: string | null;
  userAgent: string | null;
}

/** One row per login attempt, successful or not. */
export class LoginAuditRepository {
  constructor(
    private readonly db: Db,
    private readonly now: () => number = Date.now,
  ) {}

  async record(attempt: LoginAttempt): Promise<void> {
    await this.db.kysely
      .insertInto('login_audit')
      .values({
        user_id: attempt.userId,
        identifier: attempt.identifier,
        channel: attempt.channel,
        success: attempt.success ? 1 : 0,
        reason: attempt.reason,
        // Without an IPv6 zone, which names an interface of the client's host and may be of any length.
        ip: attempt.ip?.replace(/%.*$/s, '').slice(0, 64) ?? null,
        user_agent: attempt.userAgent?.slice(0, 512) ?? null,
        created_at: this.now(),
      })
      .execute();
  }

  /**
   * Deletes attempts recorded before `cutoff` (ms since the epoch), oldest first, range by range of
   * at most `batch` ids (short statements while sign-ins go on), and stops at the first range with
   * nothing that old (and a recent attempt) or after `maxBatches` ranges; how many rows went. Ids
   * grow with time, so it reads little more than the rows it deletes (the table has no index on the
   * time); a row stamped more than a day ahead by a wrong clock is kept and walked past.
   */
  async deleteBefore(
    cutoff: number,
    options: { batch?: number; maxBatches?: number; signal?: AbortSignal } = {},
  ): Promise<number> {
    const batch = options.batch ?? 5_000;
    const maxBatches = options.maxBatches ?? 1_000;
    let deleted = 0;
    let from = await this.firstIdFrom(0);
    for (let i = 0; i < maxBatches && from !== undefined && !options.signal?.aborted; i++) {
      const result = await this.db.kysely
        .deleteFrom('login_audit')
        .where('id', '>=', from)
        .where('id', '<', from + batch)
        .where('created_at', '<', cutoff)
        .executeTakeFirst();
      const n = Number(result.numDeletedRows);
      // Nothing that old here: the recent rows begin, unless every row here is stamped far ahead
      // (a wrong clock), which is never deleted and must not stop later rounds.
      if (n === 0 && (await this.holdsRecent(from, from + batch, cutoff))) break;
      deleted += n;
      from = await this.firstIdFrom(from + batch);
    }
    return deleted;
  }

  /** Whether ids [from, to) hold an attempt made since `cutoff` and not stamped beyond a day ahead. */
  private async holdsRecent(from: number, to: number, cutoff: number): Promise<boolean> {
    const row = await this.db.kysely
      .selectFrom('login_audit')
      .select('id')
      .where('id', '>=', from)
      .where('id', '<', to)
      .where('created_at', '>=', cutoff)
      .where('created_at', '<=', this.now() + 86_400_000)
      .limit(1)
      .executeTakeFirst();
    return row !== undefined;
  }

  /** The first id at or above `id` (past a gap in the ids), if any. */
  private async firstIdFrom(id: number): Promise<number | undefined> {
    const row = await this.db.kysely
      .selectFrom('login_audit')
      .select('id')
      .where('id', '>=', id)
      .orderBy('id')
      .limit(1)
      .executeTakeFirst();
    return row === undefined ? undefined : Number(row.id);
  }

  async forUser(
    userId: number,
    limit = 50,
  ): Promise<{ channel: string; success: number; reason: string | null }[]> {
    return this.db.kysely
      .selectFrom('login_audit')
      .select(['channel', 'success', 'reason'])
      .where('user_id', '=', userId)
      .orderBy('id', 'desc')
      .limit(limit)
      .execute();
  }

  async forIdentifier(
    identifier: string,
    limit = 50,
  ): Promise<{ channel: string; success: number; reason: string | null }[]> {
    return this.db.kysely
      .selectFrom('login_audit')
      .select(['channel', 'success', 'reason'])
      .where('identifier', '=', identifier)
      .orderBy('id', 'desc')
      .limit(limit)
      .execute();
  }
}

/** `zg_login_audit_deleted_total`: attempts deleted from the login audit once past their retention. */
export function loginAuditDeletedCounter(registry: Registry): Counter {
  return new Counter({
    name: 'zg_login_audit_deleted_total',
    help: 'Sign-in attempts deleted from the login audit after ZG_LOGIN_AUDIT_DAYS',
    registers: [registry],
  });
}
