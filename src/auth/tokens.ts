import { randomUUID, type KeyObject } from 'node:crypto';
import { SignJWT, decodeProtectedHeader, jwtVerify, errors as joseErrors } from 'jose';
import type { SigningKey, VerificationKey } from './keys.js';

export type TokenType = 'access' | 'refresh';

/** Claims of both token types: `sid` names the session family, `ver` the user's session version. */
export interface TokenClaims {
  userId: number;
  sid: string;
  ver: number;
  jti: string;
  typ: TokenType;
  exp: number;
}

export interface IssuedToken {
  token: string;
  jti: string;
  expiresAt: Date;
}

/**
 * Signs and verifies RS256 JWTs. Verification pins the algorithm, the issuer and the token type,
 * so a refresh token never passes as an access token and a token from another issuer never passes.
 * Tokens of the keys only accepted (`ZG_JWT_ACCEPTED_KEYS`) pass too, so a key is rotated without
 * signing anyone out.
 */
export class TokenSigner {
  /** The signing key's public half first, then the keys only accepted, by kid. */
  private readonly keys: Map<string, KeyObject>;

  constructor(
    private readonly key: SigningKey,
    private readonly issuer: string,
    private readonly ttlSeconds: Record<TokenType, number>,
    private readonly now: () => number = Date.now,
    accepted: readonly VerificationKey[] = [],
  ) {
    this.keys = new Map([[key.kid, key.publicKey]]);
    for (const k of accepted) if (!this.keys.has(k.kid)) this.keys.set(k.kid, k.publicKey);
  }

  async sign(typ: TokenType, userId: number, sid: string, ver: number): Promise<IssuedToken> {
    const jti = randomUUID();
    const iat = Math.floor(this.now() / 1000);
    const exp = iat + this.ttlSeconds[typ];
    const token = await new SignJWT({ typ, sid, ver })
      .setProtectedHeader({ alg: 'RS256', kid: this.key.kid, typ: 'JWT' })
      .setIssuer(this.issuer)
      .setSubject(String(userId))
      .setJti(jti)
      .setIssuedAt(iat)
      .setExpirationTime(exp)
      .sign(this.key.privateKey);
    return { token, jti, expiresAt: new Date(exp * 1000) };
  }

  /** The claims when the token is genuine, unexpired and of type `typ`; null otherwise. */
  async verify(token: string, typ: TokenType): Promise<TokenClaims | null> {
    try {
      const candidates = this.keysFor(token);
      let payload;
      for (let i = 0; ; i++) {
        try {
          ({ payload } = await jwtVerify(token, candidates[i]!, {
            algorithms: ['RS256'],
            issuer: this.issuer,
            currentDate: new Date(this.now()),
          }));
          break;
        } catch (err) {
          if (!(err instanceof joseErrors.JWSSignatureVerificationFailed) || i + 1 >= candidates.length)
            throw err;
        }
      }
      const userId = Number(payload.sub);
      if (payload.typ !== typ || !Number.isSafeInteger(userId) || userId <= 0) return null;
      if (
        typeof payload.sid !== 'string' ||
        typeof payload.ver !== 'number' ||
        typeof payload.jti !== 'string'
      )
        return null;
      if (typeof payload.exp !== 'number') return null;
      return { userId, sid: payload.sid, ver: payload.ver, jti: payload.jti, typ, exp: payload.exp };
    } catch (err) {
      if (err instanceof joseErrors.JOSEError) return null;
      throw err;
    }
  }

  /**
   * The keys to check a token against: the one it names (`kid`) first, then the others, the signing
   * key first. A key id set by `ZG_JWT_KID` is not the thumbprint an accepted key is known by, and
   * stays the same across a rotation when kept: a token naming it may be another key's.
   */
  private keysFor(token: string): KeyObject[] {
    let kid: unknown;
    try {
      kid = decodeProtectedHeader(token).kid;
    } catch {
      // Malformed: the verification says so.
    }
    const named = typeof kid === 'string' ? this.keys.get(kid) : undefined;
    const all = [...this.keys.values()];
    return named ? [named, ...all.filter((k) => k !== named)] : all;
  }
}
