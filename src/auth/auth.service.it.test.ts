import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { LightMyRequestResponse } from 'fastify';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { buildApp, type App } from '../app.js';
import { loadConfig } from '../platform/config/config.js';
import { LoginAuditRepository } from './login-audit.repository.js';
import { AuthService } from './auth.service.js';
import { PasswordHasher } from './passwords.js';
import { SessionStore } from './sessions.js';
import { UnavailableError } from '../platform/errors/errors.js';
import { UsersRepository } from '../profile/users.repository.js';

const dataDirs: string[] = [];
/** A data directory of the test's own, removed once the file's tests are done. */
function tempDataDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  dataDirs.push(dir);
  return dir;
}
afterAll(() => {
  for (const dir of dataDirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

describe(AuthService.name, () => {
  let app: App;
  const codes: { identifier: string; code: string }[] = [];
  const logged: { level: number; msg?: string }[] = [];

  beforeAll(async () => {
    const dataDir = tempDataDir('zg-auth-');
    const logger = pino(
      { level: 'info' },
      {
        write(line: string) {
          const entry = JSON.parse(line) as {
            level: number;
            msg?: string;
            identifier?: string;
            code?: string;
          };
          logged.push(entry);
          if (entry.msg === 'verification code' && entry.identifier && entry.code)
            codes.push({ identifier: entry.identifier, code: entry.code });
        },
      },
    );
    app = await buildApp(loadConfig({ ZG_DATA_DIR: dataDir, ZG_PASSWORD_HASH_COST: '10', PORT: '0' }), {
      logger,
    });
  });
  afterAll(async () => app?.close());

  const post = async (url: string, payload: unknown, ip = '10.0.0.1') =>
    app.http.inject({
      method: 'POST',
      url,
      payload: payload as Record<string, unknown>,
      remoteAddress: ip,
      headers: { 'user-agent': 'vitest' },
    });

  /** Registers an account by e-mail code from `ip`; its user and tokens. */
  const signUp = async (identifier: string, ip: string) => {
    await post('/api/v1/auth/send-code', { scene: 'REGISTER', identifierType: 'EMAIL', identifier }, ip);
    const code = codes.findLast((c) => c.identifier === identifier)?.code;
    const res = await post(
      '/api/v1/auth/register',
      { identifierType: 'EMAIL', identifier, code, password: 'abc12345', agreeTerms: true },
      ip,
    );
    return res.json<{ user: { id: number }; token: { refreshToken: string } }>();
  };

  /** Signs in with the password `signUp` sets, from `ip`. */
  const signIn = (identifier: string, ip: string) =>
    post('/api/v1/auth/login', { identifierType: 'EMAIL', identifier, password: 'abc12345' }, ip);

  /** Resets the password by e-mail code from `ip`; the reset's answer. */
  const resetPassword = async (identifier: string, newPassword: string, ip = '10.0.0.1') => {
    await post(
      '/api/v1/auth/send-code',
      { scene: 'RESET_PASSWORD', identifierType: 'EMAIL', identifier },
      ip,
    );
    const code = codes.findLast((c) => c.identifier === identifier)?.code;
    return post(
      '/api/v1/auth/password/reset',
      { identifierType: 'EMAIL', identifier, code, newPassword },
      ip,
    );
  };

  it('audits every sign-in attempt, failed or not, with its channel and reason', async () => {
    const identifier = 'audit@example.test';
    await post('/api/v1/auth/send-code', { scene: 'REGISTER', identifierType: 'EMAIL', identifier });
    const code = codes.findLast((c) => c.identifier === identifier)?.code;
    const register = (withCode: string | undefined) =>
      post('/api/v1/auth/register', {
        identifierType: 'EMAIL',
        identifier,
        code: withCode,
        password: 'abc12345',
        agreeTerms: true,
      });
    // A sign-up opens a session: a guessed code is on the record too.
    expect((await register(code === '000000' ? '000001' : '000000')).statusCode).toBe(400);
    const reg = await register(code);
    expect(reg.statusCode).toBe(200);
    const userId = reg.json<{ user: { id: number } }>().user.id;

    expect(
      (await post('/api/v1/auth/login', { identifierType: 'EMAIL', identifier, password: 'wrong-123' }))
        .statusCode,
    ).toBe(401);
    expect(
      (await post('/api/v1/auth/login', { identifierType: 'EMAIL', identifier, password: 'abc12345' }))
        .statusCode,
    ).toBe(200);
    expect(
      (await post('/api/v1/auth/login', { identifierType: 'EMAIL', identifier, code: '000000' })).statusCode,
    ).toBe(400);
    expect(
      (
        await post('/api/v1/auth/login', {
          identifierType: 'EMAIL',
          identifier: 'nobody@example.test',
          password: 'abc12345',
        })
      ).statusCode,
    ).toBe(401);
    // A reset is a sign-in by code: a guessed code is on the record too.
    expect(
      (
        await post('/api/v1/auth/password/reset', {
          identifierType: 'EMAIL',
          identifier,
          code: '000000',
          newPassword: 'xyz98765',
        })
      ).statusCode,
    ).toBe(400);

    const audit = new LoginAuditRepository(app.platform.db);
    const rows = await audit.forIdentifier(identifier);
    expect(rows.map((r) => [r.channel, r.success, r.reason])).toEqual([
      ['RESET', 0, 'VERIFICATION_NOT_FOUND'],
      ['CODE', 0, 'VERIFICATION_NOT_FOUND'],
      ['PASSWORD', 1, null],
      ['PASSWORD', 0, 'INVALID_CREDENTIALS'],
      ['REGISTER', 1, null],
      ['REGISTER', 0, 'VERIFICATION_MISMATCH'],
    ]);
    expect((await audit.forUser(userId)).length).toBe(3);
    expect(await audit.forIdentifier('nobody@example.test')).toEqual([
      { channel: 'PASSWORD', success: 0, reason: 'INVALID_CREDENTIALS' },
    ]);
  });

  it('gives a kept refresh answer again to its own client only, while the session lives, on the record', async () => {
    const refresh = (refreshToken: string, ip: string) =>
      post('/api/v1/auth/token/refresh', { refreshToken }, ip);

    const first = await signUp('again@example.test', '10.0.9.1');
    const answer = await refresh(first.token.refreshToken, '10.0.9.1');
    expect(answer.statusCode).toBe(200);
    const again = await refresh(first.token.refreshToken, '10.0.9.1');
    expect(again.json()).toEqual(answer.json());
    const audit = new LoginAuditRepository(app.platform.db);
    // Newest first.
    expect(
      (await audit.forUser(first.user.id))
        .filter((r) => r.channel === 'REFRESH')
        .map((r) => [r.success, r.reason]),
    ).toEqual([[1, 'REFRESH_ANSWER_REPEATED']]);

    // The spent token from another address (the same user agent) within the grace: refused, while
    // the session goes on (one client's requests may leave from two addresses).
    const copied = await signUp('copied@example.test', '10.0.9.1');
    const rotated = await refresh(copied.token.refreshToken, '10.0.9.1');
    expect(rotated.statusCode).toBe(200);
    expect((await refresh(copied.token.refreshToken, '10.0.9.2')).statusCode).toBe(401);
    expect((await refresh(copied.token.refreshToken, '10.0.9.1')).json()).toEqual(rotated.json());
    expect(
      (await refresh(rotated.json<{ refreshToken: string }>().refreshToken, '10.0.9.1')).statusCode,
    ).toBe(200);
    expect(
      (await audit.forUser(copied.user.id))
        .filter((r) => r.channel === 'REFRESH')
        .map((r) => [r.success, r.reason]),
    ).toEqual([
      [1, 'REFRESH_ANSWER_REPEATED'],
      [0, 'REFRESH_OTHER_CLIENT'],
    ]);

    // A password reset in between ends the session: the kept answer is not given out.
    expect((await resetPassword('again@example.test', 'xyz98765', '10.0.9.1')).statusCode).toBe(204);
    expect((await refresh(first.token.refreshToken, '10.0.9.1')).statusCode).toBe(401);

    // Once the answer's own refresh token was rotated in turn, it is not given out again: the
    // caller would hold a spent token, whose next use ends the session.
    const turned = await signUp('turn@example.test', '10.0.9.1');
    const once = await refresh(turned.token.refreshToken, '10.0.9.1');
    expect((await refresh(turned.token.refreshToken, '10.0.9.1')).json()).toEqual(once.json());
    const next = await refresh(once.json<{ refreshToken: string }>().refreshToken, '10.0.9.1');
    expect(next.statusCode).toBe(200);
    expect((await refresh(turned.token.refreshToken, '10.0.9.1')).statusCode).toBe(401);

    // A rotation refused (the session had ended) leaves nothing to wait for: refused at once.
    const second = await signUp('refused@example.test', '10.0.9.1');
    const logout = await post('/api/v1/auth/logout', { refreshToken: second.token.refreshToken }, '10.0.9.1');
    expect(logout.statusCode).toBe(204);
    expect((await refresh(second.token.refreshToken, '10.0.9.1')).statusCode).toBe(401);
    const started = performance.now();
    expect((await refresh(second.token.refreshToken, '10.0.9.1')).statusCode).toBe(401);
    expect(performance.now() - started).toBeLessThan(500);
  });

  it('records a spent refresh token presented in a loop once a window per client, and limits refreshes per session', async () => {
    const ended = await signUp('looped@example.test', '10.0.7.1');
    const logout = await post('/api/v1/auth/logout', { refreshToken: ended.token.refreshToken }, '10.0.7.1');
    expect(logout.statusCode).toBe(204);
    const refresh = async (ip: string) =>
      (await post('/api/v1/auth/token/refresh', { refreshToken: ended.token.refreshToken }, ip)).statusCode;
    const statuses: number[] = [];
    for (let i = 0; i < 60; i++) statuses.push(await refresh(i % 2 === 0 ? '10.0.7.1' : '10.0.7.2'));
    expect(statuses.every((s) => s === 401)).toBe(true);
    // The session's allowance is spent, from whichever address.
    expect(await refresh('10.0.7.3')).toBe(429);
    const audit = new LoginAuditRepository(app.platform.db);
    expect(
      (await audit.forUser(ended.user.id)).filter((r) => r.channel === 'REFRESH').map((r) => r.reason),
    ).toEqual(['REFRESH_TOKEN_INVALID', 'REFRESH_TOKEN_INVALID']);
    // Other sessions, behind the same addresses, refresh as before.
    const other = await signUp('neighbour@example.test', '10.0.7.1');
    const rotated = await post(
      '/api/v1/auth/token/refresh',
      { refreshToken: other.token.refreshToken },
      '10.0.7.1',
    );
    expect(rotated.statusCode).toBe(200);
  });

  it('answers a rotation whose answer could not be kept, and then refuses its retry without ending the session', async () => {
    const signedUp = await signUp('unkept@example.test', '10.0.8.1');
    const keep = vi
      .spyOn(SessionStore.prototype, 'keepAnswer')
      .mockRejectedValueOnce(new Error('store down'));
    try {
      const rotated = await post(
        '/api/v1/auth/token/refresh',
        { refreshToken: signedUp.token.refreshToken },
        '10.0.8.1',
      );
      expect(keep).toHaveBeenCalledTimes(1);
      expect(rotated.statusCode).toBe(200);
      const started = performance.now();
      const retry = await post(
        '/api/v1/auth/token/refresh',
        { refreshToken: signedUp.token.refreshToken },
        '10.0.8.1',
      );
      expect(retry.statusCode).toBe(401);
      // The waiter gives up after its bounded wait for an answer that will not come.
      expect(performance.now() - started).toBeLessThan(3_000);
      // The session the rotation handed out lives on.
      const next = await post(
        '/api/v1/auth/token/refresh',
        { refreshToken: rotated.json<{ refreshToken: string }>().refreshToken },
        '10.0.8.1',
      );
      expect(next.statusCode).toBe(200);
    } finally {
      keep.mockRestore();
    }
  });

  it('puts a refresh token back when its rotation fails half-way, so the retry rotates it (no sign-out on a 503)', async () => {
    // Failing after the token was taken: in the rotation itself, or while allowing the new token.
    for (const step of ['isActive', 'allowRefresh'] as const) {
      const signedUp = await signUp(`half-${step.toLowerCase()}@example.test`, '10.0.8.1');
      const spy = vi
        .spyOn(SessionStore.prototype, step)
        .mockRejectedValueOnce(new UnavailableError('injected: the store did not answer'));
      try {
        const failed = await post(
          '/api/v1/auth/token/refresh',
          { refreshToken: signedUp.token.refreshToken },
          '10.0.8.1',
        );
        expect({ step, status: failed.statusCode }).toEqual({ step, status: 503 });
        // The retry rotates the same token, as if the first had never come.
        const retry = await post(
          '/api/v1/auth/token/refresh',
          { refreshToken: signedUp.token.refreshToken },
          '10.0.8.1',
        );
        expect({ step, status: retry.statusCode }).toEqual({ step, status: 200 });
        const next = await post(
          '/api/v1/auth/token/refresh',
          { refreshToken: retry.json<{ refreshToken: string }>().refreshToken },
          '10.0.8.1',
        );
        expect(next.statusCode).toBe(200);
      } finally {
        spy.mockRestore();
      }
    }
  });

  it('answers a reset and a sign-in that happened even when their audit record cannot be written, and logs it', async () => {
    await signUp('audit-down@example.test', '10.0.8.1');
    const down = vi
      .spyOn(LoginAuditRepository.prototype, 'record')
      .mockRejectedValue(new Error('injected: audit table unreachable'));
    try {
      expect((await resetPassword('audit-down@example.test', 'new54321', '10.0.8.1')).statusCode).toBe(204);
      const signedIn = await post(
        '/api/v1/auth/login',
        { identifierType: 'EMAIL', identifier: 'audit-down@example.test', password: 'new54321' },
        '10.0.8.1',
      );
      expect(signedIn.statusCode).toBe(200);
    } finally {
      down.mockRestore();
    }
    const missed = logged.filter(
      (l) => l.msg === 'a successful sign-in could not be put on the audit record',
    );
    expect(missed.map((l) => l.level)).toEqual([50, 50]);
  });

  it('ends every session of a reset whose last steps fail after the password changed', async () => {
    const identifier = 'reset-fails@example.test';
    const signedUp = await signUp(identifier, '10.0.6.1');
    let changed = false;
    // The originals, called with the instance the spies get.
    // eslint-disable-next-line @typescript-eslint/unbound-method
    const update = UsersRepository.prototype.update;
    const updated = vi.spyOn(UsersRepository.prototype, 'update').mockImplementation(async function (
      this: UsersRepository,
      ...args
    ) {
      const out = await update.apply(this, args);
      changed = true;
      return out;
    });
    // The store of sessions out of reach from the moment the password changed.
    // eslint-disable-next-line @typescript-eslint/unbound-method
    const endAll = SessionStore.prototype.endAll;
    const ended = vi.spyOn(SessionStore.prototype, 'endAll').mockImplementation(async function (
      this: SessionStore,
      userId: number,
    ) {
      if (changed) throw Object.assign(new Error('injected: Redis down'), { code: 'ECONNRESET' });
      return endAll.call(this, userId);
    });
    try {
      expect((await resetPassword(identifier, 'new24680', '10.0.6.1')).statusCode).toBe(503);
    } finally {
      ended.mockRestore();
      updated.mockRestore();
    }
    expect(changed).toBe(true);
    // The session opened before the reset (an intruder's, say) is over all the same.
    const refreshed = await post(
      '/api/v1/auth/token/refresh',
      { refreshToken: signedUp.token.refreshToken },
      '10.0.6.1',
    );
    expect(refreshed.statusCode).toBe(401);
  });

  it('ends a session that a sign-in opens with the old password while a reset finishes', async () => {
    const identifier = 'overlap@example.test';
    await signUp(identifier, '10.0.7.1');
    // The next password check takes its time: the reset runs to its end meanwhile.
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    // The password given is the right one: the check says so, once the reset is done.
    const verify = vi.spyOn(PasswordHasher.prototype, 'verify').mockImplementationOnce(async () => {
      await held;
      return true;
    });
    try {
      const overlapping = signIn(identifier, '10.0.7.1');
      await vi.waitFor(() => expect(verify).toHaveBeenCalled());
      expect((await resetPassword(identifier, 'new12345')).statusCode).toBe(204);
      release();
      const res = await overlapping;
      // Refused, or let in to a session the reset has already ended: never a live session.
      if (res.statusCode === 200) {
        const me = await app.http.inject({
          method: 'GET',
          url: '/api/v1/auth/me',
          headers: {
            authorization: `Bearer ${res.json<{ token: { accessToken: string } }>().token.accessToken}`,
          },
        });
        expect(me.statusCode).toBe(401);
      } else expect(res.statusCode).toBe(401);
    } finally {
      release();
      verify.mockRestore();
    }
  });

  it('stores a password hash of an earlier cost anew at sign-in', async () => {
    const identifier = 'rehash@example.test';
    const { user } = await signUp(identifier, '10.0.7.5');
    const users = app.platform.db.kysely;
    await users
      .updateTable('users')
      .set({ password_hash: await new PasswordHasher(11).hash('abc12345') })
      .where('id', '=', user.id)
      .execute();
    expect((await signIn(identifier, '10.0.7.5')).statusCode).toBe(200);
    const row = await users
      .selectFrom('users')
      .select('password_hash')
      .where('id', '=', user.id)
      .executeTakeFirstOrThrow();
    expect(row.password_hash).toMatch(/^scrypt\$10\$8\$1\$/);
    expect((await signIn(identifier, '10.0.7.5')).statusCode).toBe(200);
  });

  it('lets a sign-in in whose account hash was stored anew at another cost while it checked', async () => {
    const identifier = 'twice@example.test';
    const { user } = await signUp(identifier, '10.0.7.9');
    const users = app.platform.db.kysely;
    const verify = vi.spyOn(PasswordHasher.prototype, 'verify').mockImplementationOnce(async () => {
      // A concurrent sign-in stores the same password's hash anew meanwhile.
      await users
        .updateTable('users')
        .set({ password_hash: await new PasswordHasher(10).hash('abc12345') })
        .where('id', '=', user.id)
        .execute();
      return true;
    });
    try {
      expect((await signIn(identifier, '10.0.7.9')).statusCode).toBe(200);
    } finally {
      verify.mockRestore();
    }
  });

  it('names the values a field may take when it takes none of them', async () => {
    const res = await post('/api/v1/auth/send-code', {
      scene: 'SIGNUP',
      identifierType: 'EMAIL',
      identifier: 'x@example.test',
    });
    expect(res.statusCode).toBe(400);
    expect(res.json()).toMatchObject({
      code: 'BAD_REQUEST',
      message: 'body.scene must be one of "REGISTER", "LOGIN", "RESET_PASSWORD"',
    });
  });

  it('limits code sends per client address', async () => {
    const config = app.config.authLimits;
    const results: number[] = [];
    for (let i = 0; i < config.perIp + 1; i++) {
      const res = await post(
        '/api/v1/auth/send-code',
        { scene: 'LOGIN', identifierType: 'EMAIL', identifier: `ip${i}@example.test` },
        '10.9.9.9',
      );
      results.push(res.statusCode);
    }
    expect(results.slice(0, config.perIp).every((s) => s === 200)).toBe(true);
    expect(results.at(-1)).toBe(429);
    // No proxy is trusted by default: a forged X-Forwarded-For names nobody.
    const forged = await app.http.inject({
      method: 'POST',
      url: '/api/v1/auth/send-code',
      payload: { scene: 'LOGIN', identifierType: 'EMAIL', identifier: 'forged@example.test' },
      remoteAddress: '10.9.9.9',
      headers: { 'x-forwarded-for': '198.51.100.23' },
    });
    expect(forged.statusCode).toBe(429);
    expect(
      (
        await post(
          '/api/v1/auth/send-code',
          { scene: 'LOGIN', identifierType: 'EMAIL', identifier: 'other@example.test' },
          '10.9.9.10',
        )
      ).statusCode,
    ).toBe(200);
  });
});

describe('client addresses behind a trusted proxy', () => {
  let app: App;

  beforeAll(async () => {
    const dataDir = tempDataDir('zg-auth-proxy-');
    const config = loadConfig({
      ZG_DATA_DIR: dataDir,
      ZG_PASSWORD_HASH_COST: '10',
      PORT: '0',
      ZG_TRUST_PROXY: '10.1.1.1',
      ZG_AUTH_IP_LIMIT: '2',
    });
    app = await buildApp(config, { logger: pino({ level: 'silent' }) });
  });
  afterAll(async () => app?.close());

  const login = (forwardedFor: string) =>
    app.http.inject({
      method: 'POST',
      url: '/api/v1/auth/login',
      payload: { identifierType: 'EMAIL', identifier: 'nobody@example.test', password: 'wrong1234' },
      remoteAddress: '10.1.1.1',
      headers: { 'x-forwarded-for': forwardedFor },
    });

  it('limits each client the proxy names on its own, and audits a name that is no address as the proxy', async () => {
    expect((await login('203.0.113.7')).statusCode).toBe(401);
    expect((await login('203.0.113.7')).statusCode).toBe(401);
    expect((await login('203.0.113.7')).statusCode).toBe(429);
    expect((await login('203.0.113.8')).statusCode).toBe(401);

    expect((await login('x'.repeat(300))).statusCode).toBe(401);
    const rows = await app.platform.db.kysely
      .selectFrom('login_audit')
      .select('ip')
      .orderBy('id', 'desc')
      .limit(1)
      .execute();
    expect(rows).toEqual([{ ip: '10.1.1.1' }]);

    // An IPv6 address with a zone of any length is an address: audited without its zone, which the
    // column (64 characters on MySQL) could not hold.
    expect((await login(`fe80::1%${'a'.repeat(200)}`)).statusCode).toBe(401);
    const [zoned] = await app.platform.db.kysely
      .selectFrom('login_audit')
      .select('ip')
      .orderBy('id', 'desc')
      .limit(1)
      .execute();
    expect(zoned).toEqual({ ip: 'fe80::1' });
  });

  it('audits sign-ins refused for their address', async () => {
    const attempt = (payload: Record<string, unknown>) =>
      app.http.inject({
        method: 'POST',
        url: '/api/v1/auth/login',
        payload: { identifierType: 'EMAIL', identifier: 'held@example.test', ...payload },
        remoteAddress: '10.1.1.1',
        headers: { 'x-forwarded-for': '203.0.113.90' },
      });
    const statuses = [];
    for (let i = 0; i < 4; i++) statuses.push((await attempt({ password: 'wrong1234' })).statusCode);
    for (let i = 0; i < 3; i++) statuses.push((await attempt({ code: '123456' })).statusCode);
    expect(statuses).toEqual([401, 401, 429, 429, 400, 400, 429]);
    // The client, refused, names another identifier: still one refusal on the record a window.
    expect((await attempt({ identifier: 'held2@example.test', password: 'wrong1234' })).statusCode).toBe(429);
    expect(await new LoginAuditRepository(app.platform.db).forIdentifier('held2@example.test')).toEqual([]);
    // The first refusal of a window is on the record, not every one after it.
    const audit = new LoginAuditRepository(app.platform.db);
    expect((await audit.forIdentifier('held@example.test')).map((r) => [r.channel, r.reason])).toEqual([
      ['CODE', 'RATE_LIMITED'],
      ['CODE', 'VERIFICATION_NOT_FOUND'],
      ['CODE', 'VERIFICATION_NOT_FOUND'],
      ['PASSWORD', 'RATE_LIMITED'],
      ['PASSWORD', 'INVALID_CREDENTIALS'],
      ['PASSWORD', 'INVALID_CREDENTIALS'],
    ]);
  });

  it('limits an IPv6 client by its /64', async () => {
    expect((await login('2001:db8:1:2::a')).statusCode).toBe(401);
    expect((await login('2001:db8:1:2:ffff::b')).statusCode).toBe(401);
    expect((await login('2001:db8:1:2::c')).statusCode).toBe(429);
    expect((await login('2001:db8:1:3::a')).statusCode).toBe(401);
  });

  it('limits code checks from the /64s of one IPv6 /48 together, at sixteen clients’ allowance', async () => {
    let n = 0;
    const check = (forwardedFor: string) =>
      app.http.inject({
        method: 'POST',
        url: '/api/v1/auth/login',
        payload: { identifierType: 'EMAIL', identifier: `net${n++}@example.test`, code: '123456' },
        remoteAddress: '10.1.1.1',
        headers: { 'x-forwarded-for': forwardedFor },
      });
    const statuses: number[] = [];
    for (let net = 0; net < 17; net++)
      for (const host of ['a', 'b']) statuses.push((await check(`2001:db8:2:${net}::${host}`)).statusCode);
    // The limit is 2 per client: 32 for the network, whichever of its /64s they come from.
    expect(statuses.slice(0, 32).every((s) => s !== 429)).toBe(true);
    expect(statuses.slice(32)).toEqual([429, 429]);
    expect((await check('2001:db8:3:1::a')).statusCode).not.toBe(429);
    // Password sign-ins are counted apart from code checks.
    expect((await login('2001:db8:2:99::a')).statusCode).toBe(401);
  });

  it('limits password sign-ins from the /64s of one IPv6 /48 together, whatever accounts they name', async () => {
    let n = 0;
    const spray = (forwardedFor: string) =>
      app.http.inject({
        method: 'POST',
        url: '/api/v1/auth/login',
        payload: { identifierType: 'EMAIL', identifier: `spray${n++}@example.test`, password: 'Password1' },
        remoteAddress: '10.1.1.1',
        headers: { 'x-forwarded-for': forwardedFor },
      });
    const statuses: number[] = [];
    for (let net = 0; net < 17; net++)
      for (const host of ['a', 'b']) statuses.push((await spray(`2001:db8:5:${net}::${host}`)).statusCode);
    expect(statuses.slice(0, 32).every((s) => s === 401)).toBe(true);
    expect(statuses.slice(32)).toEqual([429, 429]);
    expect((await spray('2001:db8:6:1::a')).statusCode).toBe(401);
  });

  it('limits code checks per client, across accounts and apart from sends and sign-ins', async () => {
    const check = (url: string, identifier: string, extra: Record<string, unknown>) =>
      app.http.inject({
        method: 'POST',
        url,
        payload: { identifierType: 'EMAIL', identifier, code: '123456', ...extra },
        remoteAddress: '10.1.1.1',
        headers: { 'x-forwarded-for': '198.51.100.60' },
      });
    const statuses = [
      (await check('/api/v1/auth/login', 'g1@example.test', {})).statusCode,
      (await check('/api/v1/auth/register', 'g2@example.test', { agreeTerms: true })).statusCode,
      (await check('/api/v1/auth/password/reset', 'g3@example.test', { newPassword: 'abc12345' })).statusCode,
      (await check('/api/v1/auth/login', 'g4@example.test', {})).statusCode,
    ];
    expect(statuses).toEqual([400, 400, 429, 429]);
    // Password sign-ins from the same client are counted apart.
    expect((await login('198.51.100.60')).statusCode).toBe(401);
  });
});

describe('requests whose connection was reset', () => {
  let app: App;
  let port = 0;

  beforeAll(async () => {
    const dataDir = tempDataDir('zg-auth-reset-');
    const config = loadConfig({
      ZG_DATA_DIR: dataDir,
      ZG_PASSWORD_HASH_COST: '10',
      PORT: '0',
      ZG_AUTH_IP_LIMIT: '3',
    });
    app = await buildApp(config, { logger: pino({ level: 'silent' }) });
    await app.http.listen({ host: '127.0.0.1', port: 0 });
    port = (app.http.server.address() as AddressInfo).port;
  });
  afterAll(async () => app?.close());

  /** Sends a whole send-code request and resets the connection at once, reading no answer. */
  const sendAndReset = (identifier: string) =>
    new Promise<void>((resolve, reject) => {
      const body = JSON.stringify({ scene: 'REGISTER', identifierType: 'EMAIL', identifier });
      const socket = connect(port, '127.0.0.1', () => {
        socket.write(
          `POST /api/v1/auth/send-code HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
            `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
          () => {
            socket.resetAndDestroy();
            resolve();
          },
        );
      });
      socket.on('error', reject);
    });

  it('counts them against the address they came from', async () => {
    const statuses = async () =>
      (
        await fetch(`http://127.0.0.1:${port}/api/v1/auth/send-code`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            scene: 'REGISTER',
            identifierType: 'EMAIL',
            identifier: 'last@example.test',
          }),
        })
      ).status;
    for (let i = 0; i < 3; i++) await sendAndReset(`reset${i}@example.test`);
    // The reset requests are handled all the same; give them the time.
    await sleep(300);
    expect(await statuses()).toBe(429);
  });
});

describe('password sign-in limits', () => {
  let app: App;
  const codes = new Map<string, string>();
  beforeAll(async () => {
    const logger = pino(
      { level: 'info' },
      {
        write(line: string) {
          const entry = JSON.parse(line) as { msg?: string; identifier?: string; code?: string };
          if (entry.msg === 'verification code' && entry.identifier && entry.code)
            codes.set(entry.identifier, entry.code);
        },
      },
    );
    const config = loadConfig({
      ZG_DATA_DIR: tempDataDir('zg-auth-lock-'),
      ZG_PASSWORD_HASH_COST: '10',
      PORT: '0',
      ZG_AUTH_LOGIN_LIMIT: '2',
    });
    app = await buildApp(config, { logger });
  });
  afterAll(async () => app?.close());

  const call = (url: string, payload: Record<string, unknown>, ip: string) =>
    app.http.inject({ method: 'POST', url, payload, remoteAddress: ip });
  const login = async (password: string, ip: string) =>
    (
      await call(
        '/api/v1/auth/login',
        { identifierType: 'EMAIL', identifier: 'victim@example.test', password },
        ip,
      )
    ).statusCode;

  it('keeps one address from locking a person out, and caps the account across new addresses', async () => {
    const identifier = 'victim@example.test';
    await call(
      '/api/v1/auth/send-code',
      { scene: 'REGISTER', identifierType: 'EMAIL', identifier },
      '10.0.0.1',
    );
    const reg = await call(
      '/api/v1/auth/register',
      {
        identifierType: 'EMAIL',
        identifier,
        code: codes.get(identifier),
        password: 'right-123',
        agreeTerms: true,
      },
      '10.0.0.1',
    );
    expect(reg.statusCode).toBe(200);

    expect([await login('wrong-123', '203.0.113.1'), await login('wrong-123', '203.0.113.1')]).toEqual([
      401, 401,
    ]);
    expect(await login('right-123', '203.0.113.1')).toBe(429);
    expect(await login('right-123', '198.51.100.5')).toBe(200);

    // 10 × 2 attempts a window for the account: 3 so far, 17 more from other addresses, then none.
    for (let i = 0; i < 17; i++) expect(await login('wrong-123', `192.0.2.${10 + (i >> 1)}`)).toBe(401);
    expect(await login('wrong-123', '192.0.2.200')).toBe(429);
    expect(await login('right-123', '198.51.100.6')).toBe(429);
    // where the owner signed in before, the ceiling does not hold them
    expect(await login('right-123', '198.51.100.5')).toBe(200);
  });
});

describe('phone codes without an SMS gateway', () => {
  let app: App;
  beforeAll(async () => {
    const dataDir = tempDataDir('zg-auth-sms-');
    const config = loadConfig({ ZG_DATA_DIR: dataDir, PORT: '0', ZG_SMS_LOG_CODES: 'false' });
    app = await buildApp(config, { logger: pino({ level: 'silent' }) });
  });
  afterAll(async () => app?.close());

  it('are refused alike for every scene and account, and e-mail codes still go', async () => {
    const send = (scene: string, identifierType: string, identifier: string) =>
      app.http.inject({
        method: 'POST',
        url: '/api/v1/auth/send-code',
        payload: { scene, identifierType, identifier },
      });
    for (const scene of ['REGISTER', 'LOGIN', 'RESET_PASSWORD']) {
      const res = await send(scene, 'PHONE', '13800138000');
      expect(res.statusCode).toBe(503);
      expect(res.json()).toMatchObject({
        code: 'UNAVAILABLE',
        message: 'Codes cannot be sent to phone numbers here; use an e-mail address or a password',
      });
    }
    expect((await send('REGISTER', 'EMAIL', 'mail@example.test')).statusCode).toBe(200);
  });
});

describe('a signing key rotation', () => {
  it('keeps users signed in when the new key comes with the old one accepted, and lists both', async () => {
    const dataDir = tempDataDir('zg-rotate-');
    const pem = () =>
      generateKeyPairSync('rsa', { modulusLength: 2048 })
        .privateKey.export({ type: 'pkcs8', format: 'pem' })
        .toString();
    const [oldKey, newKey] = [pem(), pem()];
    const codes: string[] = [];
    const logger = pino(
      { level: 'info' },
      {
        write(line: string) {
          const entry = JSON.parse(line) as { msg?: string; code?: string };
          if (entry.msg === 'verification code' && entry.code) codes.push(entry.code);
        },
      },
    );
    const start = (env: Record<string, string>) =>
      buildApp(loadConfig({ ZG_DATA_DIR: dataDir, ZG_PASSWORD_HASH_COST: '10', PORT: '0', ...env }), {
        logger,
      });
    const call = (
      app: App,
      method: 'GET' | 'POST',
      url: string,
      token?: string,
      payload?: object,
    ): Promise<LightMyRequestResponse> =>
      app.http.inject({
        method,
        url,
        ...(payload === undefined ? {} : { payload }),
        headers: token === undefined ? {} : { authorization: `Bearer ${token}` },
      });

    let app = await start({ ZG_JWT_PRIVATE_KEY: oldKey });
    const identifier = 'rotate@example.test';
    await call(app, 'POST', '/api/v1/auth/send-code', undefined, {
      scene: 'REGISTER',
      identifierType: 'EMAIL',
      identifier,
    });
    const registered = await call(app, 'POST', '/api/v1/auth/register', undefined, {
      identifierType: 'EMAIL',
      identifier,
      code: codes.at(-1),
      agreeTerms: true,
    });
    const { accessToken, refreshToken } = registered.json<{
      token: { accessToken: string; refreshToken: string };
    }>().token;
    await app.close();

    app = await start({ ZG_JWT_PRIVATE_KEY: newKey, ZG_JWT_ACCEPTED_KEYS: oldKey });
    try {
      expect((await call(app, 'GET', '/api/v1/auth/me', accessToken)).statusCode).toBe(200);
      const refreshed = await call(app, 'POST', '/api/v1/auth/token/refresh', undefined, { refreshToken });
      expect(refreshed.statusCode).toBe(200);
      const fresh = refreshed.json<{ accessToken: string }>().accessToken;
      expect((await call(app, 'GET', '/api/v1/auth/me', fresh)).statusCode).toBe(200);
      const jwks = (await call(app, 'GET', '/.well-known/jwks.json')).json<{ keys: { kid: string }[] }>();
      expect(jwks.keys).toHaveLength(2);
      // The new tokens name the new key, the first listed.
      const header = JSON.parse(Buffer.from(fresh.split('.')[0]!, 'base64url').toString()) as { kid: string };
      expect(header.kid).toBe(jwks.keys[0]!.kid);
    } finally {
      await app.close();
    }

    // Without the old key, its tokens are refused.
    app = await start({ ZG_JWT_PRIVATE_KEY: newKey });
    try {
      expect((await call(app, 'GET', '/api/v1/auth/me', accessToken)).statusCode).toBe(401);
    } finally {
      await app.close();
    }
  });
});
