import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expect4xx, randomBodies, WRONG_VALUES } from './fuzz.js';
import { Client, signUp, startServer, type ProfileName, type Server, type SignedUp } from './harness.js';

interface RouteCase {
  method: string;
  path: string;
  auth: boolean;
  valid: Record<string, unknown>;
}

const ROUTES: RouteCase[] = [
  {
    method: 'POST',
    path: '/api/v1/auth/send-code',
    auth: false,
    valid: { scene: 'LOGIN', identifierType: 'EMAIL', identifier: 'fuzz@example.test' },
  },
  {
    method: 'POST',
    path: '/api/v1/auth/register',
    auth: false,
    valid: {
      identifierType: 'EMAIL',
      identifier: 'fuzz@example.test',
      code: '123456',
      password: 'abc12345',
      agreeTerms: true,
    },
  },
  {
    method: 'POST',
    path: '/api/v1/auth/login',
    auth: false,
    valid: { identifierType: 'EMAIL', identifier: 'fuzz@example.test', password: 'abc12345' },
  },
  { method: 'POST', path: '/api/v1/auth/token/refresh', auth: false, valid: { refreshToken: 'x.y.z' } },
  { method: 'POST', path: '/api/v1/auth/logout', auth: false, valid: { refreshToken: 'x.y.z' } },
  {
    method: 'POST',
    path: '/api/v1/auth/password/reset',
    auth: false,
    valid: {
      identifierType: 'EMAIL',
      identifier: 'fuzz@example.test',
      code: '123456',
      newPassword: 'abc12345',
    },
  },
  {
    method: 'PATCH',
    path: '/api/v1/profile',
    auth: true,
    valid: {
      nickname: 'fuzzy',
      bio: 'b',
      gender: 'OTHER',
      birthday: '2000-01-01',
      zgId: 'fuzzy_1',
      school: 's',
      tagJson: '[]',
    },
  },
  { method: 'POST', path: '/api/v1/profile/avatar', auth: true, valid: {} },
];

/** Field names the random bodies use: the routes' own and one none of them knows. */
const BODY_KEYS = ['scene', 'identifier', 'code', 'password', 'nickname', 'zgId', 'unknown'];

describe.each<ProfileName>(['embedded', 'cluster'])('bad input (%s profile)', (profile) => {
  let server: Server;
  let client: Client;
  let user: SignedUp;

  beforeAll(async () => {
    server = await startServer(profile, { ZG_BODY_LIMIT_BYTES: '16384', ZG_AVATAR_MAX_BYTES: '16384' });
    client = new Client(server.baseUrl);
    user = await signUp(server, client);
  });
  afterAll(async () => server?.stop());

  const send = (route: RouteCase, raw: string | Buffer, contentType = 'application/json') =>
    client.call(route.method, route.path, {
      raw,
      token: route.auth ? user.accessToken : undefined,
      headers: { 'content-type': contentType },
    });

  it('answers malformed JSON, wrong content types and oversized bodies with a 4xx', async () => {
    for (const route of ROUTES) {
      for (const raw of ['{', '{"a":', 'nul', '[1,2', '{"scene":"LOGIN",}', '\u0000\u0001', '']) {
        expect4xx(`${route.path} ${JSON.stringify(raw)}`, await send(route, raw));
      }
      expect4xx(`${route.path} text/plain`, await send(route, 'hello', 'text/plain'));
      expect4xx(
        `${route.path} oversized`,
        await send(route, JSON.stringify({ ...route.valid, pad: 'x'.repeat(20_000) })),
      );
      const oversizedStatus = (await send(route, JSON.stringify({ pad: 'x'.repeat(20_000) }))).status;
      if (route.path !== '/api/v1/profile/avatar') expect(oversizedStatus).toBe(413);
    }
  });

  it('takes a call that carries no body whatever Content-Type it names, as many clients send one on every call', async () => {
    for (const contentType of [
      'application/json',
      'application/json; charset=utf-8',
      'application/x-www-form-urlencoded',
    ]) {
      const headers = { 'content-type': contentType };
      const draft = await client.call('POST', '/api/v1/knowposts/drafts', {
        raw: '',
        token: user.accessToken,
        headers,
      });
      expect({ contentType, status: draft.status }).toEqual({ contentType, status: 200 });
      const removed = await client.call('DELETE', `/api/v1/knowposts/${draft.body.id as string}`, {
        raw: '',
        token: user.accessToken,
        headers,
      });
      expect({ contentType, status: removed.status }).toEqual({ contentType, status: 204 });
    }
    const form = await send(ROUTES[2]!, 'identifierType=EMAIL', 'application/x-www-form-urlencoded');
    expect([form.status, form.body.code]).toEqual([415, 'UNSUPPORTED_MEDIA_TYPE']);
    // JSON sent as plain text is named for what it is, not judged as a string
    const text = await send(ROUTES[2]!, JSON.stringify(ROUTES[2]!.valid), 'text/plain; charset=utf-8');
    expect([text.status, text.body.code]).toEqual([415, 'UNSUPPORTED_MEDIA_TYPE']);
    expect(text.body.message).toContain('Content-Type: application/json');
  });

  it('answers bodies of the wrong type, wrong field types and missing fields with a 4xx', async () => {
    for (const route of ROUTES) {
      for (const body of ['"string"', '42', 'null', '[]', 'true']) {
        expect4xx(`${route.path} body ${body}`, await send(route, body));
      }
      for (const field of Object.keys(route.valid)) {
        for (const wrong of WRONG_VALUES) {
          const res = await send(route, JSON.stringify({ ...route.valid, [field]: wrong }));
          if (res.status < 400) continue; // some odd values are legitimately accepted (e.g. an empty bio)
          expect4xx(`${route.path} ${field}=${JSON.stringify(wrong).slice(0, 20)}`, res);
        }
        const { [field]: _dropped, ...missing } = route.valid;
        const res = await send(route, JSON.stringify(missing));
        expect(res.status).not.toBeGreaterThanOrEqual(500);
      }
    }
  }, 120_000);

  it('never answers random bodies with a 5xx', async () => {
    for (const route of ROUTES) {
      for (const body of randomBodies(route.path.length * 7919, 60, BODY_KEYS)) {
        const res = await send(route, JSON.stringify(body) ?? 'null');
        expect({ route: route.path, body, status: res.status < 500 }).toEqual({
          route: route.path,
          body,
          status: true,
        });
        if (res.status >= 400) expect4xx(route.path, res);
      }
    }
  }, 120_000);

  it('answers 401 to a caller without a valid token before looking at the body', async () => {
    const cases: [string, string, string, string][] = [
      ['PATCH', '/api/v1/profile', 'application/json', '{"nickname": 42}'],
      ['POST', '/api/v1/profile/avatar', 'multipart/form-data; boundary=xyz', 'garbage'],
      ['PATCH', '/api/v1/knowposts/123', 'application/json', '{"foo": 1}'],
      ['POST', '/api/v1/storage/presign', 'application/json', '{'],
      ['POST', '/api/v1/knowposts/description/suggest', 'application/json', '{}'],
      ['POST', '/api/v1/action/like', 'application/json', '{"entityType": 1}'],
    ];
    for (const [method, path, contentType, raw] of cases) {
      for (const token of [undefined, 'not-a-token']) {
        const res = await client.call(method, path, { raw, token, headers: { 'content-type': contentType } });
        expect([path, token, res.status, res.body.code]).toEqual([path, token, 401, 'UNAUTHORIZED']);
      }
    }
  });

  it('answers unknown routes and bad path parameters in the contract shape', async () => {
    expect4xx('unknown route', await client.call('GET', '/api/v1/nope'));
    expect4xx('bad id', await client.call('GET', '/api/v1/profile/-1'));
    expect4xx('huge id', await client.call('GET', '/api/v1/profile/99999999999999999999999'));
    expect4xx('method', await client.call('DELETE', '/api/v1/auth/me'));
    const malformed = await client.call('GET', '/api/v1/knowposts/detail/%ZZ');
    expect(malformed.status).toBe(400);
    expect(malformed.body).toMatchObject({
      code: 'BAD_REQUEST',
      requestId: malformed.headers.get('x-request-id'),
    });
    // Numbers in paths and queries are plain decimal digits: no hex, exponents, signs or spaces.
    const numbers = [
      `/api/v1/profile/0x${user.userId.toString(16)}`,
      `/api/v1/profile/${user.userId}e0`,
      `/api/v1/profile/%20${user.userId}`,
      '/api/v1/knowposts/feed?size=%20',
      '/api/v1/knowposts/feed?page=%2B1',
      '/api/v1/knowposts/feed?size=1e1',
      `/api/v1/relation/following?userId=0x${user.userId.toString(16)}`,
    ];
    for (const path of numbers) {
      const res = await client.call('GET', path, { token: user.accessToken });
      expect([path, res.status, res.body?.code]).toEqual([path, 400, 'BAD_REQUEST']);
    }
    expect((await client.call('GET', `/api/v1/profile/${user.userId}`)).status).toBe(200);
    expect((await client.call('GET', '/api/v1/knowposts/feed?size=10&page=1')).status).toBe(200);
    // Names of the files kept beside stored objects name no object.
    for (const suffix of ['.meta.json', '.tmp', '.tmp.meta']) {
      expect4xx(`files ${suffix}`, await client.call('GET', `/files/avatars/x.png${suffix}`));
    }
  });
});
