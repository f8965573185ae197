import { randomUUID } from 'node:crypto';
import type { KeyValueStore } from '../platform/kv/kv.js';

/**
 * Login sessions ("families" of refresh tokens) kept in the shared key-value store:
 *
 * - `auth:fam:{sid}`  → `{uid, ver}` while the session lives: a refresh-token lifetime from sign-in
 *   or from the last rotation; deleting it ends the session for access and refresh tokens alike.
 * - `auth:rt:{jti}`   → sid for the one refresh token of the family that may still be used.
 *   Rotation takes it with GETDEL, so of two concurrent refreshes exactly one wins.
 * - `auth:rtu:{jti}`  → `{sid} {rotatedAtMs}` for refresh tokens already rotated away; presenting
 *   one again is token theft or a replay, and ends the whole family, unless it comes within
 *   `reuseGraceMs` of the rotation: then it is the loser of two refreshes sent at once (two tabs of
 *   one browser sharing the tokens) or a retry after a lost answer ('graced'), and the winner's
 *   tokens stay good.
 * - `auth:rta:{jti}`  → the answer the rotation of `jti` gave, kept for `reuseGraceMs` so that a
 *   graced caller can be given it again. What is kept is opaque here (the service seals it).
 * - `auth:uv:{uid}`   → the user's session version. Tokens carry the version they were issued
 *   under; a password reset bumps it, ending every session of the user without scanning keys.
 */
export class SessionStore {
  constructor(
    private readonly kv: KeyValueStore,
    private readonly refreshTtlMs: number,
    private readonly reuseGraceMs = 0,
    private readonly now: () => number = Date.now,
  ) {}

  async userVersion(userId: number): Promise<number> {
    return Number((await this.kv.get(`auth:uv:${userId}`)) ?? 0);
  }

  async open(userId: number): Promise<{ sid: string; ver: number }> {
    const ver = await this.userVersion(userId);
    const sid = randomUUID();
    await this.kv.set(`auth:fam:${sid}`, JSON.stringify({ uid: userId, ver }), this.refreshTtlMs);
    return { sid, ver };
  }

  /** Records `jti` as the family's current refresh token. */
  async allowRefresh(sid: string, jti: string): Promise<void> {
    await this.kv.set(`auth:rt:${jti}`, sid, this.refreshTtlMs);
  }

  /**
   * Takes a refresh token for rotation. 'ok' for exactly one caller per token; 'graced' when it was
   * rotated less than `reuseGraceMs` ago or is being rotated (the family goes on); 'reused' when it
   * was rotated longer ago (the family is then ended); 'invalid' otherwise. Only genuine tokens may
   * be given: the caller checks the signature.
   */
  async takeRefresh(
    sid: string,
    jti: string,
    userId: number,
    ver: number,
  ): Promise<'ok' | 'graced' | 'reused' | 'invalid'> {
    const taken = await this.kv.getDel(`auth:rt:${jti}`);
    if (taken === null) {
      const rotated = await this.kv.get(`auth:rtu:${jti}`);
      // A genuine token that is neither current nor rotated is being rotated right now.
      if (rotated === null) return this.reuseGraceMs > 0 ? 'graced' : 'invalid';
      // Records written without a time (older releases) count as rotated long ago.
      const at = Number(rotated.split(' ')[1] ?? -Infinity);
      if (this.now() - at < this.reuseGraceMs) return 'graced';
      await this.end(sid);
      return 'reused';
    }
    // Check the family before marking the token as rotated: a concurrent caller that then sees the
    // marker and ends the family cannot turn this winner's answer into a failure half-way.
    const active = taken === sid && (await this.isActive(sid, userId, ver));
    await this.kv.set(`auth:rtu:${jti}`, `${sid} ${this.now()}`, this.refreshTtlMs);
    if (!active) return 'invalid';
    // A session in use lives as long as the refresh token it is about to get; `expire` never
    // brings back a session ended meanwhile.
    return (await this.kv.expire(`auth:fam:${sid}`, this.refreshTtlMs)) ? 'ok' : 'invalid';
  }

  /** Keeps what the rotation of `jti` answered for the grace (nothing without one). */
  async keepAnswer(jti: string, answer: string): Promise<void> {
    if (this.reuseGraceMs > 0) await this.kv.set(`auth:rta:${jti}`, answer, this.reuseGraceMs);
  }

  /** What the rotation of `jti` answered, while kept. */
  async keptAnswer(jti: string): Promise<string | null> {
    return this.kv.get(`auth:rta:${jti}`);
  }

  async isActive(sid: string, userId: number, ver: number): Promise<boolean> {
    const [family = null, current = null] = await this.kv.mget([`auth:fam:${sid}`, `auth:uv:${userId}`]);
    if (family === null) return false;
    const parsed = JSON.parse(family) as { uid: number; ver: number };
    return parsed.uid === userId && parsed.ver === ver && Number(current ?? 0) === ver;
  }

  async end(sid: string): Promise<void> {
    await this.kv.delete(`auth:fam:${sid}`);
  }

  /** Ends every session of the user (password reset). */
  async endAll(userId: number): Promise<void> {
    await this.kv.incr(`auth:uv:${userId}`);
  }
}
