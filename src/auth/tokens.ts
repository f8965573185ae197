import { randomUUID } from 'node:crypto';
import { SignJWT, jwtVerify, errors as joseErrors } from 'jose';
import type { SigningKey } from './keys.js';

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
 */
export class TokenSigner {
  constructor(
    private readonly key: SigningKey,
    private readonly issuer: string,
    private readonly ttlSeconds: Record<TokenType, number>,
    private readonly now: () => number = Date.now,
  ) {}

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
      const { payload } = await jwtVerify(token, this.key.publicKey, {
        algorithms: ['RS256'],
        issuer: this.issuer,
        currentDate: new Date(this.now()),
      });
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
}
