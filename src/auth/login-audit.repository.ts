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
