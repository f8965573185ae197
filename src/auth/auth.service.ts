import { randomBytes } from 'node:crypto';
import { decodeJwt } from 'jose';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  AppError,
  BadRequestError,
  ConflictError,
  RateLimitedError,
  UnavailableError,
  UniqueViolationError,
} from '../platform/errors/errors.js';
import { LruCache } from '../platform/cache/lru.js';
import type { KeyValueStore } from '../platform/kv/kv.js';
import { enforceLimit, type RateLimiter } from '../platform/ratelimit/ratelimit.js';
import type { UserRow, UsersRepository } from '../profile/users.repository.js';
import type { Authenticator } from './authenticator.js';
import type { IdentifierType, Scene } from './code-sender/code-sender.js';
import { NETWORK_ALLOWANCE, rateLimitNetwork, rateLimitSubject } from './client-address.js';
import { normalizeIdentifier } from './identifiers.js';
import { openAnswer, sealAnswer } from './kept-answers.js';
import type { LoginAttempt, LoginAuditRepository } from './login-audit.repository.js';
import { meetsPasswordPolicy, type PasswordHasher } from './passwords.js';
import type { SessionStore } from './sessions.js';
import type { TokenClaims, TokenSigner } from './tokens.js';
import type { VerificationService } from './verification.js';

export interface RequestContext {
  ip: string | null;
  userAgent: string | null;
}

export interface TokenPair {
  accessToken: string;
  accessTokenExpiresAt: string;
  refreshToken: string;
  refreshTokenExpiresAt: string;
}

export interface AuthLimits {
  /**
   * Password logins per identifier and client per window; the identifier as a whole takes
   * `ACCOUNT_LOGIN_CEILING` times as many.
   */
  passwordPerIdentifier: number;
  /**
   * Code sends, code checks and password logins per client (an IPv4 address, an IPv6 /64) per
   * window, each counted apart.
   */
  perIp: number;
  windowMs: number;
}

/** How many times the per-address password limit one identifier takes from all addresses together. */
export const ACCOUNT_LOGIN_CEILING = 10;
/** How long a client an identifier signed in from stays exempt from that identifier's ceiling. */
const KNOWN_CLIENT_MS = 30 * 86_400_000;
/** Token refreshes per session a window (15 minutes): a client refreshes about once per access token. */
const REFRESHES_PER_SESSION = 60;
/**
 * How long, and how often, a graced refresh looks for the answer of the rotation it lost to, which
 * may still be signing its tokens.
 */
const KEPT_ANSWER_WAIT = { tries: 40, everyMs: 25 };

/** A kept refresh answer the caller's client cannot open: kept for another client (or damaged). */
const OTHER_CLIENT = 'other-client';

export class AuthError extends AppError {}

const invalidCredentials = () => new AuthError('INVALID_CREDENTIALS', 'Wrong account or password', 401);
const refreshInvalid = () =>
  new AuthError('REFRESH_TOKEN_INVALID', 'The refresh token is invalid, expired or revoked', 401);
const passwordPolicy = () =>
  new AuthError(
    'PASSWORD_POLICY_VIOLATION',
    'The password needs at least 8 characters with a letter and a digit',
    400,
  );

/**
 * Sign-up, sign-in, token rotation, sign-out and password reset. Answers never tell whether an
 * account exists except where the contract requires it (registering an identifier already taken).
 */
export class AuthService {
  /** Limit refusals already on the record in this window (see `recordRefusal`). */
  private readonly refusalsRecorded: LruCache<true>;

  constructor(
    private readonly users: UsersRepository,
    private readonly audit: LoginAuditRepository,
    private readonly verification: VerificationService,
    private readonly hasher: PasswordHasher,
    private readonly signer: TokenSigner,
    private readonly sessions: SessionStore,
    private readonly authenticator: Authenticator,
    private readonly limiter: RateLimiter,
    /** Remembers the clients each identifier signed in from (`login:known:*`). */
    private readonly kv: KeyValueStore,
    private readonly limits: AuthLimits,
    private readonly defaultAvatar: string,
    /** The deployment's secret that kept refresh answers are sealed with (see `kept-answers.ts`). */
    private readonly answerSecret: Uint8Array,
    private readonly now: () => number = Date.now,
    /** Told of a success that could not be put on the audit record (the success stands). */
    private readonly log?: { error(obj: object, msg: string): void },
  ) {
    this.refusalsRecorded = new LruCache<true>({ maxEntries: 10_000, ttlMs: limits.windowMs });
  }

  async sendCode(scene: Scene, type: IdentifierType, rawIdentifier: string, ctx: RequestContext) {
    const identifier = normalizeIdentifier(type, rawIdentifier);
    // Before anything about the account: the same answer whether it exists or not.
    if (!this.verification.delivers(type)) {
      throw new UnavailableError(
        'Codes cannot be sent to phone numbers here; use an e-mail address or a password',
        // This deployment sends none: trying again does not help.
        { retryAfterSeconds: null },
      );
    }
    await this.limitIp('send', ctx);
    const existing = await this.users.findByIdentifier(type, identifier);
    if (scene === 'REGISTER' && existing)
      throw new ConflictError('This identifier is already registered', 'IDENTIFIER_EXISTS');
    const deliver = scene === 'REGISTER' || existing !== undefined;
    const expireSeconds = await this.verification.send(scene, type, identifier, deliver);
    return { identifier, scene, expireSeconds };
  }

  async register(
    input: {
      identifierType: IdentifierType;
      identifier: string;
      code: string;
      password?: string | undefined;
      agreeTerms?: boolean | undefined;
    },
    ctx: RequestContext,
  ) {
    if (input.agreeTerms !== true)
      throw new AuthError('TERMS_NOT_ACCEPTED', 'The terms must be accepted', 400);
    const identifier = normalizeIdentifier(input.identifierType, input.identifier);
    if (input.password !== undefined && !meetsPasswordPolicy(input.password)) throw passwordPolicy();
    // A sign-up opens a session: its guesses and refusals are on the record as a sign-in's.
    await this.limitSignIn('verify', identifier, 'REGISTER', ctx);
    // The code first: otherwise any made-up code would tell, without limit, who is registered.
    await this.verifyOnRecord('REGISTER', identifier, input.code, 'REGISTER', ctx);
    if (await this.users.findByIdentifier(input.identifierType, identifier)) {
      throw new ConflictError('This identifier is already registered', 'IDENTIFIER_EXISTS');
    }
    const passwordHash = input.password === undefined ? null : await this.hasher.hash(input.password);
    const user = await this.createUser(input.identifierType, identifier, passwordHash);
    await this.rememberClient(identifier, ctx);
    await this.recordSuccess(
      { userId: user.id, identifier, channel: 'REGISTER', success: true, reason: null },
      ctx,
    );
    return { user, token: await this.issue(user.id) };
  }

  async loginWithPassword(
    type: IdentifierType,
    rawIdentifier: string,
    password: string,
    ctx: RequestContext,
  ) {
    const identifier = normalizeIdentifier(type, rawIdentifier);
    await this.limitSignIn('login', identifier, 'PASSWORD', ctx);
    const pairKey = `login:id:${identifier}:${ctx.ip ? rateLimitSubject(ctx.ip) : '-'}`;
    const limit = this.limits.passwordPerIdentifier;
    // Per account *and* address, so one address cannot lock a person out of their own account; the
    // account as a whole has a higher ceiling that bounds guessing spread over many addresses. An
    // attempt refused for its address does not count against the account, and a client the account
    // signed in from before is not held by the ceiling: many addresses guessing cannot lock the
    // owner out of the places they use.
    let decision = await this.limiter.hit(pairKey, limit, this.limits.windowMs);
    if (decision.allowed && !(await this.knownClient(identifier, ctx))) {
      decision = await this.limiter.hit(
        `login:id:${identifier}`,
        limit * ACCOUNT_LOGIN_CEILING,
        this.limits.windowMs,
      );
    }
    if (!decision.allowed) {
      await this.recordRefusal(identifier, 'PASSWORD', ctx, `account:${identifier}`);
      throw new RateLimitedError('Too many sign-in attempts; try again later', decision.retryAfterMs / 1000);
    }
    const user = await this.users.findByIdentifier(type, identifier);
    if (!user || user.password_hash === null) {
      await this.hasher.burn(password);
      await this.record(
        {
          userId: user?.id ?? null,
          identifier,
          channel: 'PASSWORD',
          success: false,
          reason: 'INVALID_CREDENTIALS',
        },
        ctx,
      );
      throw invalidCredentials();
    }
    const verified = (await this.hasher.verify(password, user.password_hash))
      ? await this.sessionVersionForPassword(user.id, user.password_hash, password)
      : null;
    if (verified === null) {
      await this.record(
        { userId: user.id, identifier, channel: 'PASSWORD', success: false, reason: 'INVALID_CREDENTIALS' },
        ctx,
      );
      throw invalidCredentials();
    }
    await this.limiter.reset(pairKey);
    if (this.hasher.needsRehash(user.password_hash)) {
      // The hash predates the current cost: stored anew, unless the password changed meanwhile.
      // Best effort: the sign-in stands either way, and the next one tries again.
      await this.hasher
        .hash(password)
        .then((next) => this.users.replacePasswordHash(user.id, user.password_hash!, next))
        .catch(() => undefined);
    }
    await this.rememberClient(identifier, ctx);
    await this.recordSuccess(
      { userId: user.id, identifier, channel: 'PASSWORD', success: true, reason: null },
      ctx,
    );
    return { user, token: await this.issue(user.id, verified) };
  }

  /**
   * The session version a sign-in with the password just checked against `checkedHash` may open its
   * session under, or null when the password changed meanwhile. A reset stores the new hash, then
   * bumps the version: the version is read first and the hash after it, so either the hash read is
   * the new one (the password is checked against it) or the version read is the old one (a reset
   * that finishes meanwhile ends the session it opens). A hash that changed without a new password
   * (stored anew at another cost by a concurrent sign-in) takes the same password.
   */
  private async sessionVersionForPassword(
    userId: number,
    checkedHash: string,
    password: string,
  ): Promise<number | null> {
    const ver = await this.sessions.userVersion(userId);
    const current = (await this.users.findById(userId))?.password_hash ?? null;
    if (current === checkedHash) return ver;
    return current !== null && (await this.hasher.verify(password, current)) ? ver : null;
  }

  async loginWithCode(type: IdentifierType, rawIdentifier: string, code: string, ctx: RequestContext) {
    const identifier = normalizeIdentifier(type, rawIdentifier);
    // A code's five tries are per identifier: one client guessing across many accounts is held here.
    await this.limitSignIn('verify', identifier, 'CODE', ctx);
    await this.verifyOnRecord('LOGIN', identifier, code, 'CODE', ctx);
    const user = await this.users.findByIdentifier(type, identifier);
    if (!user) {
      // A code is only ever sent to existing accounts for LOGIN; this is a deleted account.
      await this.record(
        { userId: null, identifier, channel: 'CODE', success: false, reason: 'INVALID_CREDENTIALS' },
        ctx,
      );
      throw invalidCredentials();
    }
    await this.rememberClient(identifier, ctx);
    await this.recordSuccess(
      { userId: user.id, identifier, channel: 'CODE', success: true, reason: null },
      ctx,
    );
    return { user, token: await this.issue(user.id) };
  }

  async refresh(refreshToken: string, ctx: RequestContext): Promise<TokenPair> {
    const claims = await this.signer.verify(refreshToken, 'refresh');
    if (!claims) throw refreshInvalid();
    // A session refreshes about once per access token lifetime: a bound per session (not per address,
    // which many users may share) stops a client presenting a spent token in a loop.
    await enforceLimit(
      this.limiter,
      `auth:refresh:sid:${claims.sid}`,
      REFRESHES_PER_SESSION,
      this.limits.windowMs,
      'refreshes of this session',
    );
    const { outcome, undo } = await this.sessions.takeForRotation(
      claims.sid,
      claims.jti,
      claims.userId,
      claims.ver,
    );
    if (outcome === 'ok') {
      let pair: TokenPair;
      try {
        pair = await this.issueInSession(claims.userId, claims.sid, claims.ver);
      } catch (err) {
        // The new token may not be allowed: the old one is put back for the client's retry.
        await undo().catch(() => undefined);
        throw err;
      }
      // The old token is spent and the new one allowed: failing now would leave the client without
      // a session. Keeping the answer only spares a retry; its failure leaves that retry refused.
      await this.sessions
        .keepAnswer(claims.jti, sealAnswer(JSON.stringify(pair), this.answerSecret, refreshToken, ctx))
        .catch(() => undefined);
      return pair;
    }
    const again = outcome === 'graced' ? await this.answerAgain(refreshToken, claims, ctx) : null;
    if (again !== null && again !== OTHER_CLIENT) {
      // Tokens handed out once more: on the record, as any sign-in.
      await this.recordRefresh(claims.userId, true, 'REFRESH_ANSWER_REPEATED', ctx);
      return again;
    }
    if (outcome === 'reused') this.authenticator.forgetSession(claims.sid);
    // Another client within the grace is refused, the session going on, but on the record as such:
    // it may be the owner behind a second address, or a thief who rotated first.
    const reason =
      outcome === 'reused'
        ? 'REFRESH_TOKEN_REUSED'
        : again === OTHER_CLIENT
          ? 'REFRESH_OTHER_CLIENT'
          : 'REFRESH_TOKEN_INVALID';
    await this.recordRefreshRefusal(claims.userId, reason, ctx);
    throw refreshInvalid();
  }

  /**
   * The answer a rotation of this refresh token gave, for a caller who presents it again within the
   * grace from the same client (the answer was lost on its way, or two tabs refreshed at once), while
   * the session lives; `OTHER_CLIENT` when the answer kept cannot be opened with this client's
   * address and user agent; null otherwise. Another client is refused without ending the session:
   * one client's requests may leave from two addresses (IPv4 and IPv6, rotating IPv6 addresses,
   * carrier NAT), and ending it would sign the owner out.
   */
  private async answerAgain(
    refreshToken: string,
    claims: TokenClaims,
    client: RequestContext,
  ): Promise<TokenPair | typeof OTHER_CLIENT | null> {
    for (let tries = 1; ; tries++) {
      const kept = await this.sessions.keptAnswer(claims.jti);
      // The rotation this caller waits for was refused meanwhile.
      if (kept === 'refused') return null;
      if (kept !== null) {
        const answer = openAnswer(kept.sealed, this.answerSecret, refreshToken, client);
        if (answer === null) return OTHER_CLIENT;
        if (!(await this.sessions.isActive(claims.sid, claims.userId, claims.ver))) return null;
        const pair = JSON.parse(answer) as TokenPair;
        // Only while its refresh token is still current: once the tab that got it first has rotated
        // it in turn, this caller would hold a spent token, whose next use ends the session.
        return (await this.sessions.isCurrent(decodeJwt(pair.refreshToken).jti ?? '')) ? pair : null;
      }
      if (tries >= KEPT_ANSWER_WAIT.tries) return null;
      await sleep(KEPT_ANSWER_WAIT.everyMs);
    }
  }

  async logout(refreshToken: string): Promise<void> {
    const claims = await this.signer.verify(refreshToken, 'refresh');
    if (!claims) throw refreshInvalid();
    await this.sessions.end(claims.sid);
    this.authenticator.forgetSession(claims.sid);
  }

  async resetPassword(
    type: IdentifierType,
    rawIdentifier: string,
    code: string,
    newPassword: string,
    ctx: RequestContext,
  ) {
    const identifier = normalizeIdentifier(type, rawIdentifier);
    if (!meetsPasswordPolicy(newPassword)) throw passwordPolicy();
    // A reset is a sign-in by code: its guesses and refusals are on the record as a code sign-in's.
    await this.limitSignIn('verify', identifier, 'RESET', ctx);
    await this.verifyOnRecord('RESET_PASSWORD', identifier, code, 'RESET', ctx);
    const user = await this.users.findByIdentifier(type, identifier);
    if (!user) {
      await this.record(
        { userId: null, identifier, channel: 'RESET', success: false, reason: 'VERIFICATION_NOT_FOUND' },
        ctx,
      );
      throw new BadRequestError('No valid code; ask for a new one', 'VERIFICATION_NOT_FOUND');
    }
    const passwordHash = await this.hasher.hash(newPassword);
    // Every session ends before the password changes (a failure after it would leave an intruder's
    // sessions alive with the owner's code spent) and again after it, for a sign-in with the old
    // password that read the version in between.
    await this.sessions.endAll(user.id);
    this.authenticator.forgetAllSessions();
    await this.users.update(user.id, { password_hash: passwordHash, updated_at: this.now() });
    await this.sessions.endAll(user.id);
    this.authenticator.forgetAllSessions();
    await this.recordSuccess(
      { userId: user.id, identifier, channel: 'RESET', success: true, reason: null },
      ctx,
    );
  }

  /** Opens a session, under `version` when the caller read it before checking a credential. */
  private async issue(userId: number, version?: number): Promise<TokenPair> {
    const { sid, ver } = await this.sessions.open(userId, version);
    return this.issueInSession(userId, sid, ver);
  }

  private async issueInSession(userId: number, sid: string, ver: number): Promise<TokenPair> {
    const [access, refresh] = await Promise.all([
      this.signer.sign('access', userId, sid, ver),
      this.signer.sign('refresh', userId, sid, ver),
    ]);
    await this.sessions.allowRefresh(sid, refresh.jti);
    return {
      accessToken: access.token,
      accessTokenExpiresAt: access.expiresAt.toISOString(),
      refreshToken: refresh.token,
      refreshTokenExpiresAt: refresh.expiresAt.toISOString(),
    };
  }

  private async createUser(
    type: IdentifierType,
    identifier: string,
    passwordHash: string | null,
  ): Promise<UserRow> {
    for (let attempt = 0; ; attempt++) {
      const now = this.now();
      try {
        return await this.users.insert({
          phone: type === 'PHONE' ? identifier : null,
          email: type === 'EMAIL' ? identifier : null,
          password_hash: passwordHash,
          nickname: `知光用户${randomBytes(4).toString('hex')}`,
          avatar: this.defaultAvatar,
          bio: null,
          zg_id: `zg_${randomBytes(5).toString('hex')}`,
          gender: 'UNKNOWN',
          birthday: null,
          school: null,
          tags_json: '[]',
          created_at: now,
          updated_at: now,
        });
      } catch (err) {
        if (!(err instanceof UniqueViolationError)) throw err;
        // The identifier was taken by a concurrent registration; a zg_id clash is just retried.
        if (err.constraint?.includes('zg_id') && attempt < 5) continue;
        throw new ConflictError('This identifier is already registered', 'IDENTIFIER_EXISTS');
      }
    }
  }

  private knownKey(identifier: string, ip: string): string {
    return `login:known:${identifier}:${rateLimitSubject(ip)}`;
  }

  private async knownClient(identifier: string, ctx: RequestContext): Promise<boolean> {
    return ctx.ip !== null && (await this.kv.get(this.knownKey(identifier, ctx.ip))) !== null;
  }

  private async rememberClient(identifier: string, ctx: RequestContext): Promise<void> {
    if (ctx.ip) await this.kv.set(this.knownKey(identifier, ctx.ip), '1', KNOWN_CLIENT_MS);
  }

  private async limitIp(action: string, ctx: RequestContext): Promise<void> {
    // Requests whose address is not known share one allowance: never none.
    await this.limitBy(`auth:${action}:ip:${ctx.ip ? rateLimitSubject(ctx.ip) : '-'}`, 1, 'address');
    // An IPv6 client moving from /64 to /64 of its network meets the network's allowance: for what
    // costs a delivery, guesses a code or tries a password (the limits per identifier bound one
    // account, not a password tried against many).
    const network = ctx.ip ? rateLimitNetwork(ctx.ip) : null;
    if (network) await this.limitBy(`auth:${action}:net:${network}`, NETWORK_ALLOWANCE, 'network');
  }

  /** One hit on `key`, allowed `clients` times the per-address limit a window; 429 past it. */
  private async limitBy(key: string, clients: number, what: 'address' | 'network'): Promise<void> {
    const decision = await this.limiter.hit(key, this.limits.perIp * clients, this.limits.windowMs);
    if (!decision.allowed)
      throw new RateLimitedError(
        `Too many requests from this ${what}; try again later`,
        decision.retryAfterMs / 1000,
      );
  }

  /** Checks a code; a wrong one (or any failure) is on the record under `channel`. */
  private async verifyOnRecord(
    scene: Scene,
    identifier: string,
    code: string,
    channel: 'CODE' | 'RESET' | 'REGISTER',
    ctx: RequestContext,
  ): Promise<void> {
    try {
      await this.verification.verify(scene, identifier, code);
    } catch (err) {
      const reason = err instanceof AppError ? err.code : 'ERROR';
      await this.record({ userId: null, identifier, channel, success: false, reason }, ctx);
      throw err;
    }
  }

  /** The per-address limit of a sign-in; a refusal is on the record like any failed sign-in. */
  private async limitSignIn(
    action: string,
    identifier: string,
    channel: 'PASSWORD' | 'CODE' | 'RESET' | 'REGISTER',
    ctx: RequestContext,
  ): Promise<void> {
    try {
      await this.limitIp(action, ctx);
    } catch (err) {
      // Keyed by the client alone: one client past its limit may name a new identifier each time.
      if (err instanceof RateLimitedError) await this.recordRefusal(identifier, channel, ctx, 'address');
      throw err;
    }
  }

  /**
   * A sign-in refused by a limit, on the record: the first one per limit (`scope`), channel and
   * client in a window (in this process), so a client hammering away past its limit writes a row a
   * window, not one per request. A failure to record leaves the answer a 429, and the next refusal
   * tries again.
   */
  private async recordRefusal(
    identifier: string,
    channel: 'PASSWORD' | 'CODE' | 'RESET' | 'REGISTER',
    ctx: RequestContext,
    scope: string,
  ) {
    await this.recordOncePerWindow(`${channel}|${scope}`, ctx, () =>
      this.record({ userId: null, identifier, channel, success: false, reason: 'RATE_LIMITED' }, ctx),
    ).catch(() => undefined);
  }

  /**
   * A refused refresh on the record. A spent or ended session's token is recorded once per user and
   * client in a window (in this process), so a client presenting it in a loop writes a row a window,
   * not one a request; a reuse (which ends its session) and a refusal within the grace, each bounded
   * by its session, always.
   */
  private async recordRefreshRefusal(userId: number, reason: string, ctx: RequestContext) {
    if (reason !== 'REFRESH_TOKEN_INVALID') return this.recordRefresh(userId, false, reason, ctx);
    await this.recordOncePerWindow(`REFRESH|${userId}|${reason}`, ctx, () =>
      this.recordRefresh(userId, false, reason, ctx),
    );
  }

  /**
   * Runs `write` unless it ran for `key` and this client in the current window (in this process);
   * one that fails is tried again by the next call.
   */
  private async recordOncePerWindow(key: string, ctx: RequestContext, write: () => Promise<void>) {
    const scoped = `${key}|${ctx.ip ? rateLimitSubject(ctx.ip) : '-'}`;
    if (this.refusalsRecorded.get(scoped)) return;
    this.refusalsRecorded.set(scoped, true);
    try {
      await write();
    } catch (err) {
      this.refusalsRecorded.delete(scoped);
      throw err;
    }
  }

  private recordRefresh(userId: number, success: boolean, reason: string, ctx: RequestContext) {
    return this.record({ userId, identifier: `user:${userId}`, channel: 'REFRESH', success, reason }, ctx);
  }

  private record(attempt: Omit<LoginAttempt, 'ip' | 'userAgent'>, ctx: RequestContext): Promise<void> {
    return this.audit.record({ ...attempt, ip: ctx.ip, userAgent: ctx.userAgent });
  }

  /**
   * A success on the record, once what it did is done (an account made, a code used up, a password
   * replaced): a record that cannot be written is logged, and the success answered all the same,
   * rather than a 5xx for something that happened.
   */
  private async recordSuccess(
    attempt: Omit<LoginAttempt, 'ip' | 'userAgent'>,
    ctx: RequestContext,
  ): Promise<void> {
    try {
      await this.record(attempt, ctx);
    } catch (err) {
      this.log?.error(
        { err, userId: attempt.userId, channel: attempt.channel },
        'a successful sign-in could not be put on the audit record',
      );
    }
  }
}
