import { createPrivateKey, generateKeyPairSync } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, newEmail, newPhone, signUp, startServer, type ProfileName, type Server } from './harness.js';

const REUSE_GRACE_MS = 1_000;

describe.each<ProfileName>(['embedded', 'cluster'])('accounts (%s profile)', (profile) => {
  let server: Server;
  let client: Client;

  beforeAll(async () => {
    server = await startServer(profile, { ZG_REFRESH_REUSE_GRACE_MS: String(REUSE_GRACE_MS) });
    client = new Client(server.baseUrl);
  });
  afterAll(async () => server?.stop());

  const expectError = (res: { status: number; body: any }, status: number, code: string) => {
    expect({ status: res.status, code: res.body?.code }).toEqual({ status, code });
    expect(typeof res.body.message).toBe('string');
    expect(typeof res.body.requestId).toBe('string');
  };

  it('registers with a code, logs in with the password, reads /me, refreshes and logs out', async () => {
    const user = await signUp(server, client);
    const me = await client.call('GET', '/api/v1/auth/me', { token: user.accessToken });
    expect(me.status).toBe(200);
    expect(me.body).toMatchObject({
      id: user.userId,
      email: user.identifier,
      phone: null,
      gender: 'UNKNOWN',
      tagJson: '[]',
    });
    expect(me.body.nickname).toMatch(/^知光用户[0-9a-f]{8}$/);
    expect(me.body.zhId).toMatch(/^[a-zA-Z0-9_]{4,32}$/);
    expect(me.body.avatar).toMatch(/^https?:\/\//);

    const login = await client.call('POST', '/api/v1/auth/login', {
      body: { identifierType: 'EMAIL', identifier: user.identifier.toUpperCase(), password: user.password },
    });
    expect(login.status).toBe(200);
    expect(login.body.user.id).toBe(user.userId);
    const { accessToken, refreshToken, accessTokenExpiresAt, refreshTokenExpiresAt } = login.body.token;
    const accessLife = Date.parse(accessTokenExpiresAt) - Date.now();
    const refreshLife = Date.parse(refreshTokenExpiresAt) - Date.now();
    expect(accessLife).toBeGreaterThan(14 * 60_000);
    expect(accessLife).toBeLessThanOrEqual(15 * 60_000);
    expect(refreshLife).toBeGreaterThan(7 * 86_400_000 - 60_000);

    const refreshed = await client.call('POST', '/api/v1/auth/token/refresh', { body: { refreshToken } });
    expect(refreshed.status).toBe(200);
    expect(refreshed.body.refreshToken).not.toBe(refreshToken);
    expect((await client.call('GET', '/api/v1/auth/me', { token: refreshed.body.accessToken })).status).toBe(
      200,
    );

    const out = await client.call('POST', '/api/v1/auth/logout', {
      body: { refreshToken: refreshed.body.refreshToken },
    });
    expect(out.status).toBe(204);
    expectError(
      await client.call('GET', '/api/v1/auth/me', { token: refreshed.body.accessToken }),
      401,
      'UNAUTHORIZED',
    );
    expectError(await client.call('GET', '/api/v1/auth/me', { token: accessToken }), 401, 'UNAUTHORIZED');
    expectError(
      await client.call('POST', '/api/v1/auth/token/refresh', {
        body: { refreshToken: refreshed.body.refreshToken },
      }),
      401,
      'REFRESH_TOKEN_INVALID',
    );
    // the first session is a separate family and still works
    expect((await client.call('GET', '/api/v1/auth/me', { token: user.accessToken })).status).toBe(200);
  });

  it('logs in with a code sent to a phone number', async () => {
    const phone = newPhone();
    let since = Date.now();
    await client.call('POST', '/api/v1/auth/send-code', {
      body: { scene: 'REGISTER', identifierType: 'PHONE', identifier: phone },
    });
    const code = await server.codeFor(phone, 'REGISTER', since);
    const reg = await client.call('POST', '/api/v1/auth/register', {
      body: { identifierType: 'PHONE', identifier: phone, code, agreeTerms: true },
    });
    expect(reg.status).toBe(200);
    expect(reg.body.user.phone).toBe(phone);

    since = Date.now();
    const sent = await client.call('POST', '/api/v1/auth/send-code', {
      body: { scene: 'LOGIN', identifierType: 'PHONE', identifier: phone },
    });
    expect(sent.body).toEqual({ identifier: phone, scene: 'LOGIN', expireSeconds: 300 });
    const loginCode = await server.codeFor(phone, 'LOGIN', since);
    const login = await client.call('POST', '/api/v1/auth/login', {
      body: { identifierType: 'PHONE', identifier: phone, code: loginCode },
    });
    expect(login.status).toBe(200);
    expect(login.body.user.id).toBe(reg.body.user.id);
    // a code works once
    expectError(
      await client.call('POST', '/api/v1/auth/login', {
        body: { identifierType: 'PHONE', identifier: phone, code: loginCode },
      }),
      400,
      'VERIFICATION_NOT_FOUND',
    );
    // no password was set: password login is refused without saying why
    expectError(
      await client.call('POST', '/api/v1/auth/login', {
        body: { identifierType: 'PHONE', identifier: phone, password: 'abcdefg1' },
      }),
      401,
      'INVALID_CREDENTIALS',
    );
  });

  it('answers every refusal of the contract with its status and code', async () => {
    const user = await signUp(server, client);
    const post = (path: string, body: unknown) => client.call('POST', `/api/v1/auth/${path}`, { body });

    expectError(
      await post('send-code', { scene: 'REGISTER', identifierType: 'EMAIL', identifier: user.identifier }),
      409,
      'IDENTIFIER_EXISTS',
    );
    expectError(
      await post('send-code', { scene: 'REGISTER', identifierType: 'PHONE', identifier: '2345' }),
      400,
      'BAD_REQUEST',
    );
    expectError(
      await post('send-code', { scene: 'REGISTER', identifierType: 'EMAIL', identifier: 'not-an-email' }),
      400,
      'BAD_REQUEST',
    );

    const fresh = newEmail();
    expect(
      (await post('send-code', { scene: 'REGISTER', identifierType: 'EMAIL', identifier: fresh })).status,
    ).toBe(200);
    expectError(
      await post('send-code', { scene: 'REGISTER', identifierType: 'EMAIL', identifier: fresh }),
      429,
      'VERIFICATION_RATE_LIMIT',
    );
    const code = await server.codeFor(fresh, 'REGISTER');
    const wrong = code === '000000' ? '111111' : '000000';
    expectError(
      await post('register', { identifierType: 'EMAIL', identifier: fresh, code, agreeTerms: false }),
      400,
      'TERMS_NOT_ACCEPTED',
    );
    // Left out is not accepted either, and says so in the same words.
    expectError(
      await post('register', { identifierType: 'EMAIL', identifier: fresh, code }),
      400,
      'TERMS_NOT_ACCEPTED',
    );
    expectError(
      await post('register', {
        identifierType: 'EMAIL',
        identifier: fresh,
        code,
        password: 'short',
        agreeTerms: true,
      }),
      400,
      'PASSWORD_POLICY_VIOLATION',
    );
    // Every password outside the policy gets the policy's answer, an empty or a long one too.
    for (const password of ['onlyletters', '', `a1${'x'.repeat(127)}`])
      expectError(
        await post('register', {
          identifierType: 'EMAIL',
          identifier: fresh,
          code,
          password,
          agreeTerms: true,
        }),
        400,
        'PASSWORD_POLICY_VIOLATION',
      );
    expectError(
      await post('register', { identifierType: 'EMAIL', identifier: fresh, code: wrong, agreeTerms: true }),
      400,
      'VERIFICATION_MISMATCH',
    );
    expectError(
      await post('register', { identifierType: 'EMAIL', identifier: newEmail(), code, agreeTerms: true }),
      400,
      'VERIFICATION_NOT_FOUND',
    );
    // A registered identifier without a code of its own answers as a free one does: no oracle.
    expectError(
      await post('register', {
        identifierType: 'EMAIL',
        identifier: user.identifier,
        code,
        agreeTerms: true,
      }),
      400,
      'VERIFICATION_NOT_FOUND',
    );

    expectError(
      await post('login', { identifierType: 'EMAIL', identifier: user.identifier, password: 'wrong-pass1' }),
      401,
      'INVALID_CREDENTIALS',
    );
    expectError(
      await post('login', { identifierType: 'EMAIL', identifier: newEmail(), password: 'wrong-pass1' }),
      401,
      'INVALID_CREDENTIALS',
    );
    expectError(
      await post('login', { identifierType: 'EMAIL', identifier: user.identifier }),
      400,
      'BAD_REQUEST',
    );
    expectError(
      await post('login', {
        identifierType: 'EMAIL',
        identifier: user.identifier,
        password: 'a1aaaaaa',
        code: '123456',
      }),
      400,
      'BAD_REQUEST',
    );
    expectError(await post('token/refresh', { refreshToken: 'garbage' }), 401, 'REFRESH_TOKEN_INVALID');
    expectError(await post('logout', { refreshToken: user.accessToken }), 401, 'REFRESH_TOKEN_INVALID');
    expectError(await client.call('GET', '/api/v1/auth/me'), 401, 'UNAUTHORIZED');
    expectError(
      await client.call('GET', '/api/v1/auth/me', { headers: { authorization: 'Basic abc' } }),
      401,
      'UNAUTHORIZED',
    );
  });

  it('does not tell whether an account exists when asked for a login or reset code', async () => {
    const unknown = newEmail();
    const res = await client.call('POST', '/api/v1/auth/send-code', {
      body: { scene: 'LOGIN', identifierType: 'EMAIL', identifier: unknown },
    });
    expect(res.status).toBe(200);
    expect(res.body).toEqual({ identifier: unknown, scene: 'LOGIN', expireSeconds: 300 });
    await expect(server.codeFor(unknown, 'LOGIN', 0, 2000)).rejects.toThrow(/no LOGIN code/);
  });

  it('never accepts a refresh token as a bearer token', async () => {
    const user = await signUp(server, client);
    expectError(
      await client.call('GET', '/api/v1/auth/me', { token: user.refreshToken }),
      401,
      'UNAUTHORIZED',
    );
  });

  it('rotates a refresh token once: two tabs refreshing at once get the same answer', async () => {
    for (let round = 0; round < 3; round++) {
      const user = await signUp(server, client);
      const results = await Promise.all(
        [0, 1].map(() =>
          client.call('POST', '/api/v1/auth/token/refresh', { body: { refreshToken: user.refreshToken } }),
        ),
      );
      expect(results.map((r) => r.status)).toEqual([200, 200]);
      expect(results[1]!.body).toEqual(results[0]!.body);
      const pair = results[0]!.body;
      expect(pair.refreshToken).not.toBe(user.refreshToken);
      expect((await client.call('GET', '/api/v1/auth/me', { token: pair.accessToken })).status).toBe(200);
      const next = await client.call('POST', '/api/v1/auth/token/refresh', {
        body: { refreshToken: pair.refreshToken },
      });
      expect(next.status).toBe(200);
    }
  });

  it('answers a retry after a lost answer again, and no other client', async () => {
    const user = await signUp(server, client);
    const refresh = (userAgent: string) =>
      client.call('POST', '/api/v1/auth/token/refresh', {
        body: { refreshToken: user.refreshToken },
        headers: { 'user-agent': userAgent },
      });
    const first = await refresh('zhiguang-app/1.0');
    expect(first.status).toBe(200);
    // Someone else with the same token, within the grace: refused, and the session goes on.
    expectError(await refresh('curl/8.0'), 401, 'REFRESH_TOKEN_INVALID');
    // The client whose answer was lost, retrying: the same answer, and it works.
    const retry = await refresh('zhiguang-app/1.0');
    expect(retry.status).toBe(200);
    expect(retry.body).toEqual(first.body);
    expect((await client.call('GET', '/api/v1/auth/me', { token: retry.body.accessToken })).status).toBe(200);
    // Not after the session ended.
    expect(
      (await client.call('POST', '/api/v1/auth/logout', { body: { refreshToken: retry.body.refreshToken } }))
        .status,
    ).toBe(204);
    expectError(await refresh('zhiguang-app/1.0'), 401, 'REFRESH_TOKEN_INVALID');
  });

  it('ends the whole session family when a rotated refresh token is used again', async () => {
    const user = await signUp(server, client);
    const first = await client.call('POST', '/api/v1/auth/token/refresh', {
      body: { refreshToken: user.refreshToken },
    });
    expect(first.status).toBe(200);
    // Within the grace it is answered again (the other tab, a retry); after it, a replay ends the
    // session.
    const again = await client.call('POST', '/api/v1/auth/token/refresh', {
      body: { refreshToken: user.refreshToken },
    });
    expect(again.body).toEqual(first.body);
    expect((await client.call('GET', '/api/v1/auth/me', { token: first.body.accessToken })).status).toBe(200);
    await sleep(REUSE_GRACE_MS + 100);
    expectError(
      await client.call('POST', '/api/v1/auth/token/refresh', { body: { refreshToken: user.refreshToken } }),
      401,
      'REFRESH_TOKEN_INVALID',
    );
    expectError(
      await client.call('POST', '/api/v1/auth/token/refresh', {
        body: { refreshToken: first.body.refreshToken },
      }),
      401,
      'REFRESH_TOKEN_INVALID',
    );
    expectError(
      await client.call('GET', '/api/v1/auth/me', { token: first.body.accessToken }),
      401,
      'UNAUTHORIZED',
    );
  });

  it('resets a password with a code and ends every session of the user', async () => {
    const user = await signUp(server, client);
    const second = await client.call('POST', '/api/v1/auth/login', {
      body: { identifierType: 'EMAIL', identifier: user.identifier, password: user.password },
    });
    const since = Date.now();
    await client.call('POST', '/api/v1/auth/send-code', {
      body: { scene: 'RESET_PASSWORD', identifierType: 'EMAIL', identifier: user.identifier },
    });
    const code = await server.codeFor(user.identifier, 'RESET_PASSWORD', since);
    expectError(
      await client.call('POST', '/api/v1/auth/password/reset', {
        body: { identifierType: 'EMAIL', identifier: user.identifier, code, newPassword: 'weak' },
      }),
      400,
      'PASSWORD_POLICY_VIOLATION',
    );
    const reset = await client.call('POST', '/api/v1/auth/password/reset', {
      body: { identifierType: 'EMAIL', identifier: user.identifier, code, newPassword: 'new-secret-9' },
    });
    expect(reset.status).toBe(204);
    for (const token of [user.accessToken, second.body.token.accessToken]) {
      expectError(await client.call('GET', '/api/v1/auth/me', { token }), 401, 'UNAUTHORIZED');
    }
    expectError(
      await client.call('POST', '/api/v1/auth/token/refresh', { body: { refreshToken: user.refreshToken } }),
      401,
      'REFRESH_TOKEN_INVALID',
    );
    expectError(
      await client.call('POST', '/api/v1/auth/login', {
        body: { identifierType: 'EMAIL', identifier: user.identifier, password: user.password },
      }),
      401,
      'INVALID_CREDENTIALS',
    );
    const login = await client.call('POST', '/api/v1/auth/login', {
      body: { identifierType: 'EMAIL', identifier: user.identifier, password: 'new-secret-9' },
    });
    expect(login.status).toBe(200);
    expect(
      (await client.call('GET', '/api/v1/auth/me', { token: login.body.token.accessToken })).status,
    ).toBe(200);
  });

  it('counts code attempts atomically: 20 parallel wrong guesses use at most 5 and kill the code', async () => {
    const identifier = newEmail();
    const since = Date.now();
    await client.call('POST', '/api/v1/auth/send-code', {
      body: { scene: 'REGISTER', identifierType: 'EMAIL', identifier },
    });
    const code = await server.codeFor(identifier, 'REGISTER', since);
    const wrong = String((Number(code) + 1) % 1_000_000).padStart(6, '0');
    const guesses = await Promise.all(
      Array.from({ length: 20 }, () =>
        client.call('POST', '/api/v1/auth/register', {
          body: { identifierType: 'EMAIL', identifier, code: wrong, agreeTerms: true },
        }),
      ),
    );
    const codes = guesses.map((g) => g.body.code);
    expect(codes.filter((c) => c === 'VERIFICATION_MISMATCH').length).toBeLessThanOrEqual(5);
    expect(codes.filter((c) => c === 'VERIFICATION_TOO_MANY_ATTEMPTS').length).toBeGreaterThanOrEqual(15);
    const right = await client.call('POST', '/api/v1/auth/register', {
      body: { identifierType: 'EMAIL', identifier, code, agreeTerms: true },
    });
    expect(right.status).toBe(429);
    expect(right.body.code).toBe('VERIFICATION_TOO_MANY_ATTEMPTS');
  });

  it('limits password guessing per account', async () => {
    const user = await signUp(server, client);
    const statuses: number[] = [];
    for (let i = 0; i < 12; i++) {
      const res = await client.call('POST', '/api/v1/auth/login', {
        body: { identifierType: 'EMAIL', identifier: user.identifier, password: `wrong-${i}-x1` },
      });
      statuses.push(res.status);
    }
    expect(statuses.slice(0, 10).every((s) => s === 401)).toBe(true);
    expect(statuses.slice(10)).toEqual([429, 429]);
    const blocked = await client.call('POST', '/api/v1/auth/login', {
      body: { identifierType: 'EMAIL', identifier: user.identifier, password: user.password },
    });
    expect(blocked.status).toBe(429);
    expect(blocked.body.code).toBe('RATE_LIMITED');
    expect(Number(blocked.headers.get('retry-after'))).toBeGreaterThan(0);
  });

  it('rejects tokens signed with another algorithm, another key or for another issuer', async () => {
    const user = await signUp(server, client);
    const key = createPrivateKey(server.privateKeyPem);
    const claims = { typ: 'access', sid: 'x', ver: 0 };
    const sign = (iss: string, signingKey = key) =>
      new SignJWT(claims)
        .setProtectedHeader({ alg: 'RS256' })
        .setIssuer(iss)
        .setSubject(String(user.userId))
        .setJti('j')
        .setIssuedAt()
        .setExpirationTime('10m')
        .sign(signingKey);

    const otherIssuer = await sign('someone-else');
    const otherKey = await sign(
      server.issuer,
      generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey,
    );
    const hs256 = await new SignJWT(claims)
      .setProtectedHeader({ alg: 'HS256' })
      .setIssuer(server.issuer)
      .setSubject(String(user.userId))
      .setIssuedAt()
      .setExpirationTime('10m')
      .sign(new TextEncoder().encode(server.privateKeyPem));
    const [header, payload] = user.accessToken.split('.');
    const none = `${Buffer.from(JSON.stringify({ alg: 'none' })).toString('base64url')}.${payload}.`;
    const tampered = `${header}.${Buffer.from(JSON.stringify({ ...JSON.parse(Buffer.from(payload!, 'base64url').toString()), sub: '1' })).toString('base64url')}.${user.accessToken.split('.')[2]}`;
    for (const token of [otherIssuer, otherKey, hs256, none, tampered]) {
      expectError(await client.call('GET', '/api/v1/auth/me', { token }), 401, 'UNAUTHORIZED');
    }
  });

  it('publishes the signing key as a JWKS', async () => {
    const res = await client.call('GET', '/.well-known/jwks.json');
    expect(res.status).toBe(200);
    expect(res.body.keys).toHaveLength(1);
    expect(res.body.keys[0]).toMatchObject({ kty: 'RSA', alg: 'RS256', use: 'sig' });
    expect(typeof res.body.keys[0].kid).toBe('string');
    expect(res.body.keys[0].d).toBeUndefined();
    // Also under the auth routes, where the contract lists it.
    const listed = await client.call('GET', '/api/v1/auth/.well-known/jwks.json');
    expect([listed.status, listed.body]).toEqual([200, res.body]);
  });
});
