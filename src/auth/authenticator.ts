import { UnauthorizedError } from '../platform/errors/errors.js';
import type { SessionStore } from './sessions.js';
import type { TokenClaims, TokenSigner } from './tokens.js';
import { trimOldest } from '../platform/cache/trim.js';

export interface Principal {
  userId: number;
  sid: string;
}

/**
 * Turns a bearer token into a principal on every authenticated request, cheaply.
 *
 * An RS256 verification costs more than the rest of a like request, so verified access tokens are
 * cached (bounded, never past their expiry). Revocation is still honoured: whether the session is
 * alive is asked of the shared session store, and that answer is cached for at most
 * `sessionCheckMs`; sessions this process ends are forgotten at once.
 */
export class Authenticator {
  private readonly verified = new Map<string, TokenClaims>();
  private readonly sessionChecks = new Map<
    string,
    { active: boolean; at: number; userId: number; ver: number }
  >();
  /** Moves whenever sessions are forgotten: a check read before that must not be kept after it. */
  private forgets = 0;

  constructor(
    private readonly signer: TokenSigner,
    private readonly sessions: SessionStore,
    private readonly sessionCheckMs: number,
    private readonly maxEntries = 50_000,
    private readonly now: () => number = Date.now,
  ) {}

  async authenticate(token: string): Promise<Principal> {
    const claims = await this.claims(token);
    if (!claims) throw new UnauthorizedError('Invalid or expired access token');
    if (!(await this.sessionActive(claims))) throw new UnauthorizedError('Session has ended');
    return { userId: claims.userId, sid: claims.sid };
  }

  /** Forget what this process knows of a session (it was just ended here). */
  forgetSession(sid: string): void {
    this.forgets++;
    this.sessionChecks.delete(sid);
  }

  /** Forget every cached session check (a user's sessions were all ended here). */
  forgetAllSessions(): void {
    this.forgets++;
    this.sessionChecks.clear();
  }

  private async claims(token: string): Promise<TokenClaims | null> {
    const cached = this.verified.get(token);
    const nowSec = this.now() / 1000;
    if (cached) {
      if (cached.exp > nowSec) return cached;
      this.verified.delete(token);
      return null;
    }
    const claims = await this.signer.verify(token, 'access');
    if (!claims) return null;
    this.remember(this.verified, token, claims);
    return claims;
  }

  private async sessionActive(claims: TokenClaims): Promise<boolean> {
    const now = this.now();
    const cached = this.sessionChecks.get(claims.sid);
    if (
      cached &&
      cached.userId === claims.userId &&
      cached.ver === claims.ver &&
      // An answer from before a clock stepped back is as old as can be, not fresh for the step.
      now >= cached.at &&
      now - cached.at < this.sessionCheckMs
    ) {
      return cached.active;
    }
    const forgets = this.forgets;
    const active = await this.sessions.isActive(claims.sid, claims.userId, claims.ver);
    // A session ended here while the store was asked may have been read as active: answered, not kept.
    if (forgets !== this.forgets) return active;
    this.remember(this.sessionChecks, claims.sid, {
      active,
      at: now,
      userId: claims.userId,
      ver: claims.ver,
    });
    return active;
  }

  /** Insertion-ordered maps make a cheap bounded cache: the oldest entry goes first. */
  private remember<V>(map: Map<string, V>, key: string, value: V): void {
    map.delete(key);
    map.set(key, value);
    trimOldest(map, this.maxEntries);
  }
}
