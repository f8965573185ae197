import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { KeyValueStore } from '../platform/kv/kv.js';

export type RefreshOutcome = 'ok' | 'graced' | 'reused' | 'invalid';

/** How `auth:rtu:{jti}` tells a rotation that was refused (the session had ended). */
const REFUSED = 'refused';
/** How often, and how far apart, a missing rotation mark is read (see `rotationMark`). */
const MARK_READS = 4;
const MARK_READ_GAP_MS = 25;
/**
 * How long a rotation mark outlives the grace. Past the grace a rotated token is told by the
 * family's current token (`auth:cur`), so a session keeps a mark only for its last rotations, not
 * one per rotation for a refresh-token lifetime.
 */
const MARK_SLACK_MS = 60_000;

/**
 * Login sessions ("families" of refresh tokens) kept in the shared key-value store:
 *
 * - `auth:fam:{sid}`  → `{uid, ver}` while the session lives: a refresh-token lifetime from sign-in
 *   or from the last rotation; deleting it ends the session for access and refresh tokens alike.
 * - `auth:rt:{jti}`   → sid for the one refresh token of the family that may still be used.
 *   Rotation takes it with GETDEL, so of two concurrent refreshes exactly one wins.
 * - `auth:cur:{sid}`  → that token's jti. Every refresh token of a family was its current one once
 *   (its sid is signed into it), so one that is not current any more was rotated away: presenting
 *   it again is token theft or a replay, and ends the whole family…
 * - `auth:rtu:{jti}`  → `{sid} {rotatedAtMs}[ refused]`, kept for `reuseGraceMs` and a minute after
 *   a rotation: …unless it comes within `reuseGraceMs` of the rotation: then it is the loser of two
 *   refreshes sent at once (two tabs of one browser sharing the tokens) or a retry after a lost
 *   answer ('graced'), and the winner's tokens stay good. (Marks of earlier releases, kept for a
 *   refresh-token lifetime, are read the same way.)
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

  /**
   * A new session under the user's version, or under `version` read earlier: a session opened under
   * a version a reset has passed since is ended from the start.
   */
  async open(userId: number, version?: number): Promise<{ sid: string; ver: number }> {
    const ver = version ?? (await this.userVersion(userId));
    const sid = randomUUID();
    await this.kv.set(`auth:fam:${sid}`, JSON.stringify({ uid: userId, ver }), this.refreshTtlMs);
    return { sid, ver };
  }

  /** Records `jti` as the family's current refresh token. */
  async allowRefresh(sid: string, jti: string): Promise<void> {
    await this.kv.set(`auth:rt:${jti}`, sid, this.refreshTtlMs);
    await this.kv.set(`auth:cur:${sid}`, jti, this.refreshTtlMs);
  }

  /**
   * Takes a refresh token for rotation. 'ok' for exactly one caller per token; 'graced' when its
   * rotation began less than `reuseGraceMs` ago and was not refused (the family goes on; its answer
   * is or will be kept); 'reused' when it was rotated longer ago (the family is then ended);
   * 'invalid' otherwise.
   */
  async takeRefresh(sid: string, jti: string, userId: number, ver: number): Promise<RefreshOutcome> {
    return (await this.takeForRotation(sid, jti, userId, ver)).outcome;
  }

  /**
   * `takeRefresh`, with a way back for an 'ok' whose rotation then fails before the new token is
   * allowed: `undo` puts the token back (see `undoRotation`).
   */
  async takeForRotation(
    sid: string,
    jti: string,
    userId: number,
    ver: number,
  ): Promise<{ outcome: RefreshOutcome; undo: () => Promise<void> }> {
    const outcome = (value: RefreshOutcome) => ({ outcome: value, undo: async () => {} });
    const taken = await this.kv.getDel(`auth:rt:${jti}`);
    if (taken === null) {
      const rotated = await this.rotationMark(jti);
      if (rotated === null) {
        // Rotated away longer ago than its mark is kept, when the family's current token is another.
        const current = await this.kv.get(`auth:cur:${sid}`);
        if (current === null || current === jti) return outcome('invalid');
        await this.end(sid);
        return outcome('reused');
      }
      // Records written without a time (older releases) count as rotated long ago.
      const [, at = -Infinity, refused] = rotated.split(' ');
      if (this.now() - Number(at) < this.reuseGraceMs)
        return outcome(refused === REFUSED ? 'invalid' : 'graced');
      await this.end(sid);
      return outcome('reused');
    }
    const rotatedAt = this.now();
    const undo = () => this.undoRotation(taken, jti, `${sid} ${rotatedAt}`);
    try {
      return { outcome: await this.rotate(taken, sid, jti, userId, ver, rotatedAt), undo };
    } catch (err) {
      // Unanswered, the client tries again with the same token: it must find it as it was.
      await undo().catch(() => undefined);
      throw err;
    }
  }

  private async rotate(
    taken: string,
    sid: string,
    jti: string,
    userId: number,
    ver: number,
    rotatedAt: number,
  ): Promise<'ok' | 'invalid'> {
    const mark = (outcome = '') =>
      this.kv.set(
        `auth:rtu:${jti}`,
        `${sid} ${rotatedAt}${outcome && ` ${outcome}`}`,
        this.reuseGraceMs + MARK_SLACK_MS,
      );
    // With a grace, the token is marked at once: a caller presenting it meanwhile (the other tab)
    // then finds the rotation under way and waits for its answer. Without one, the family is checked
    // first: such a caller ends the family, and must not turn this winner's answer into a failure
    // half-way.
    if (this.reuseGraceMs > 0) await mark();
    // A session in use lives as long as the refresh token it is about to get; `expire` never
    // brings back a session ended meanwhile.
    const active =
      taken === sid &&
      (await this.isActive(sid, userId, ver)) &&
      (await this.kv.expire(`auth:fam:${sid}`, this.refreshTtlMs));
    // Refused: nobody need wait for an answer that will not come.
    if (!active || this.reuseGraceMs === 0) await mark(active ? '' : REFUSED);
    return active ? 'ok' : 'invalid';
  }

  /**
   * Puts back a refresh token taken for a rotation that could not be completed (the store failed
   * before the new token was allowed), so that the client's retry rotates it instead of finding it
   * spent: a 503 there must not sign the user out. Then its rotation mark goes, so the token is
   * neither taken as rotated away nor waited for; only this rotation's own mark (`mark`), so that of
   * a rotation of the token put back (a second tab) stays.
   */
  private async undoRotation(taken: string, jti: string, mark: string): Promise<void> {
    await this.kv.set(`auth:rt:${jti}`, taken, this.refreshTtlMs);
    await this.kv.deleteIfEquals(`auth:rtu:${jti}`, mark);
  }

  /**
   * The mark of the rotation of `jti`. A rotation takes the token and marks it in two steps, and a
   * caller in another process can come in between: with a grace, a missing mark is read again a few
   * times, briefly.
   */
  private async rotationMark(jti: string): Promise<string | null> {
    for (let tries = 1; ; tries++) {
      const mark = await this.kv.get(`auth:rtu:${jti}`);
      if (mark !== null || this.reuseGraceMs === 0 || tries >= MARK_READS) return mark;
      await sleep(MARK_READ_GAP_MS);
    }
  }

  /** Keeps what the rotation of `jti` answered for the grace (nothing without one). */
  async keepAnswer(jti: string, answer: string): Promise<void> {
    if (this.reuseGraceMs > 0) await this.kv.set(`auth:rta:${jti}`, answer, this.reuseGraceMs);
  }

  /**
   * What the rotation of `jti` answered, while kept; 'refused' when that rotation was refused (no
   * answer will come); null otherwise.
   */
  async keptAnswer(jti: string): Promise<{ sealed: string } | 'refused' | null> {
    const [sealed = null, rotated = null] = await this.kv.mget([`auth:rta:${jti}`, `auth:rtu:${jti}`]);
    if (sealed !== null) return { sealed };
    return rotated?.split(' ')[2] === REFUSED ? 'refused' : null;
  }

  /** Whether `jti` is its family's refresh token that may still be used. */
  async isCurrent(jti: string): Promise<boolean> {
    return (await this.kv.get(`auth:rt:${jti}`)) !== null;
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
