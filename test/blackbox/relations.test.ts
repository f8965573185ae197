import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Client,
  eventually,
  newPhone,
  signUp,
  startServer,
  type ProfileName,
  type Server,
  type SignedUp,
} from './harness.js';

/** Registers a user by phone (codes to phones are written to the server's log). */
async function signUpByPhone(server: Server, client: Client): Promise<SignedUp & { phone: string }> {
  const phone = newPhone();
  const since = Date.now();
  const sent = await client.call('POST', '/api/v1/auth/send-code', {
    body: { scene: 'REGISTER', identifierType: 'PHONE', identifier: phone },
  });
  if (sent.status !== 200) throw new Error(`send-code failed: ${sent.status} ${JSON.stringify(sent.body)}`);
  const code = await server.codeFor(phone, 'REGISTER', since);
  const reg = await client.call('POST', '/api/v1/auth/register', {
    body: { identifierType: 'PHONE', identifier: phone, code, password: 'secret123', agreeTerms: true },
  });
  if (reg.status !== 200) throw new Error(`register failed: ${reg.status} ${JSON.stringify(reg.body)}`);
  return {
    phone,
    identifier: phone,
    password: 'secret123',
    userId: reg.body.user.id,
    accessToken: reg.body.token.accessToken,
    refreshToken: reg.body.token.refreshToken,
  };
}

const CHANGE_LIMIT = 40;

describe.each<ProfileName>(['embedded', 'cluster'])('follows, lists and counts (%s profile)', (profile) => {
  let server: Server;
  let client: Client;
  let a: SignedUp & { phone: string };
  let b: SignedUp;

  beforeAll(async () => {
    server = await startServer(profile, { ZG_RELATION_CHANGE_LIMIT: String(CHANGE_LIMIT) });
    client = new Client(server.baseUrl);
    a = await signUpByPhone(server, client);
    b = await signUp(server, client);
  });
  afterAll(async () => server?.stop());

  const follow = (who: SignedUp, to: number | string, action = 'follow') =>
    client.call('POST', `/api/v1/relation/${action}?toUserId=${to}`, { token: who.accessToken });
  const status = (who: SignedUp, to: number) =>
    client.call('GET', `/api/v1/relation/status?toUserId=${to}`, { token: who.accessToken });
  const list = (who: SignedUp, kind: string, query: string) =>
    client.call('GET', `/api/v1/relation/${kind}?${query}`, { token: who.accessToken });
  const ids = (res: { body: unknown }) => (res.body as { id: number }[]).map((p) => p.id);
  const counter = (who: SignedUp, userId: number) =>
    client.call('GET', `/api/v1/relation/counter?userId=${userId}`, { token: who.accessToken });
  /** Waits until the user's counts and both lists show `followings` and `followers` (ids, newest first). */
  const settled = async (who: SignedUp, userId: number, followings: number[], followers: number[]) => {
    const read = async () => ({
      counts: (await counter(who, userId)).body,
      following: ids(await list(who, 'following', `userId=${userId}&limit=100`)),
      followers: ids(await list(who, 'followers', `userId=${userId}&limit=100`)),
    });
    const want = {
      counts: expect.objectContaining({ followings: followings.length, followers: followers.length }),
      following: followings,
      followers,
    };
    const seen = await eventually(read, (v) => {
      try {
        expect(v).toEqual(want);
        return true;
      } catch {
        return false;
      }
    });
    expect(seen).toEqual(want);
  };

  it('two users following each other are mutual; counts and lists agree with the follows', async () => {
    expect((await follow(a, b.userId)).body).toBe(true);
    expect((await follow(b, a.userId)).body).toBe(true);
    expect((await status(a, b.userId)).body).toEqual({ following: true, followedBy: true, mutual: true });
    expect((await status(b, a.userId)).body).toEqual({ following: true, followedBy: true, mutual: true });
    await settled(a, a.userId, [b.userId], [b.userId]);
    await settled(a, b.userId, [a.userId], [a.userId]);
    expect((await counter(b, b.userId)).body).toEqual({
      followings: 1,
      followers: 1,
      posts: 0,
      likedPosts: 0,
      favedPosts: 0,
    });
  });

  it('a repeated follow answers false and changes nothing', async () => {
    expect((await follow(a, b.userId)).body).toBe(false);
    expect((await follow(a, b.userId)).body).toBe(false);
    await new Promise((r) => setTimeout(r, 600)); // time for any event to be projected
    await settled(a, b.userId, [a.userId], [a.userId]);
    await settled(a, a.userId, [b.userId], [b.userId]);
  });

  it('unfollow reverses it, once', async () => {
    expect((await follow(a, b.userId, 'unfollow')).body).toBe(true);
    expect((await follow(a, b.userId, 'unfollow')).body).toBe(false);
    expect((await status(a, b.userId)).body).toEqual({ following: false, followedBy: true, mutual: false });
    expect((await status(b, a.userId)).body).toEqual({ following: true, followedBy: false, mutual: false });
    await settled(b, a.userId, [], [b.userId]);
    await settled(b, b.userId, [a.userId], []);
    // Follow again: a second cycle is counted like the first.
    expect((await follow(a, b.userId)).body).toBe(true);
    await settled(b, b.userId, [a.userId], [a.userId]);
  });

  it('lists never carry phone numbers or e-mail addresses', async () => {
    for (const who of [a, b]) {
      for (const kind of ['following', 'followers']) {
        for (const owner of [a.userId, b.userId]) {
          const res = await list(who, kind, `userId=${owner}`);
          expect(res.status).toBe(200);
          const text = JSON.stringify(res.body);
          expect(text).not.toContain(a.phone);
          expect(text).not.toContain(b.identifier);
          for (const p of res.body as Record<string, unknown>[]) {
            expect(p).not.toHaveProperty('phone');
            expect(p).not.toHaveProperty('email');
            expect(p).toMatchObject({
              id: expect.any(Number),
              nickname: expect.any(String),
              zgId: expect.any(String),
            });
          }
        }
      }
    }
  });

  it('pages by exclusive cursor and by offset, completely and in order', async () => {
    const owner = await signUp(server, client);
    const fans: SignedUp[] = [];
    for (let i = 0; i < 7; i++) {
      const fan = await signUp(server, client);
      fans.push(fan);
      expect((await follow(fan, owner.userId)).body).toBe(true);
    }
    const newestFirst = fans.map((f) => f.userId).reverse();
    await settled(owner, owner.userId, [], newestFirst);

    const seen: number[] = [];
    let res = await list(owner, 'followers', `userId=${owner.userId}&limit=3`);
    const cursors: string[] = [];
    for (;;) {
      expect(res.status).toBe(200);
      seen.push(...ids(res));
      const next = res.headers.get('x-next-cursor');
      if (!next) break;
      cursors.push(next);
      // offset is ignored when a cursor is given, also one past what an offset alone may be
      res = await list(
        owner,
        'followers',
        `userId=${owner.userId}&limit=3&offset=${cursors.length === 1 ? 5 : 500_000}&cursor=${encodeURIComponent(next)}`,
      );
    }
    expect(seen).toEqual(newestFirst);
    expect(cursors).toHaveLength(2);

    const byOffset = await list(owner, 'followers', `userId=${owner.userId}&limit=3&offset=3`);
    expect(ids(byOffset)).toEqual(newestFirst.slice(3, 6));
    expect(byOffset.headers.get('x-next-cursor')).not.toBeNull();
    const last = await list(owner, 'followers', `userId=${owner.userId}&limit=3&offset=6`);
    expect(ids(last)).toEqual(newestFirst.slice(6));
    expect(last.headers.get('x-next-cursor')).toBeNull();

    // An unfollow between pages: the next page still starts right after what was seen.
    const [firstPage] = [await list(owner, 'followers', `userId=${owner.userId}&limit=3`)];
    const gone = fans.find((f) => f.userId === newestFirst[2])!;
    expect((await follow(gone, owner.userId, 'unfollow')).body).toBe(true);
    await settled(
      owner,
      owner.userId,
      [],
      newestFirst.filter((id) => id !== gone.userId),
    );
    const after = await list(
      owner,
      'followers',
      `userId=${owner.userId}&limit=10&cursor=${encodeURIComponent(firstPage.headers.get('x-next-cursor')!)}`,
    );
    expect(ids(after)).toEqual(newestFirst.slice(3));

    const mine = await list(fans[0]!, 'following', `userId=${fans[0]!.userId}`);
    expect(ids(mine)).toEqual([owner.userId]);
  });

  it('rejects following yourself (400), unknown users (404) and calls without a token (401)', async () => {
    const self = await follow(a, a.userId);
    expect(self.status).toBe(400);
    expect(self.body).toMatchObject({
      code: 'BAD_REQUEST',
      // named as schema errors name query parameters
      message: 'querystring.toUserId: you cannot follow yourself',
      requestId: expect.any(String),
    });
    for (const action of ['follow', 'unfollow']) {
      const unknown = await follow(a, 987_654_321, action);
      expect(unknown.status).toBe(404);
      expect(unknown.body).toMatchObject({ code: 'NOT_FOUND' });
    }
    expect((await status(a, 987_654_321)).status).toBe(404);
    expect((await list(a, 'following', 'userId=987654321')).status).toBe(404);
    expect((await list(a, 'followers', 'userId=987654321')).status).toBe(404);
    expect((await client.call('POST', `/api/v1/relation/follow?toUserId=${b.userId}`)).status).toBe(401);
    expect((await client.call('GET', `/api/v1/relation/followers?userId=${b.userId}`)).status).toBe(401);
  });

  it('answers fuzzed query parameters with 4xx in the error shape, never 5xx', async () => {
    const badIds = [
      '',
      'abc',
      '-1',
      '0',
      '1.5',
      '1e3',
      '0x10',
      '99999999999999999999',
      '%00',
      '[]',
      '1;DROP',
      ' ',
      '１',
    ];
    const cases: [string, string][] = [];
    for (const v of badIds) {
      cases.push(['POST', `/api/v1/relation/follow?toUserId=${v}`]);
      cases.push(['POST', `/api/v1/relation/unfollow?toUserId=${v}`]);
      cases.push(['GET', `/api/v1/relation/status?toUserId=${v}`]);
      cases.push(['GET', `/api/v1/relation/following?userId=${v}`]);
      cases.push(['GET', `/api/v1/relation/followers?userId=${v}`]);
    }
    cases.push(['POST', '/api/v1/relation/follow'], ['GET', '/api/v1/relation/followers']);
    cases.push(['POST', `/api/v1/relation/follow?toUserId=${b.userId}&toUserId=${a.userId}`]);
    for (const q of [
      'limit=0',
      'limit=101',
      'limit=-1',
      'limit=x',
      'offset=-1',
      'offset=x',
      'offset=1e12',
      'offset=100001',
    ]) {
      cases.push(['GET', `/api/v1/relation/followers?userId=${b.userId}&${q}`]);
    }
    for (const c of [
      'x',
      '1.2.3',
      '.',
      '1.',
      '.1',
      '1.0',
      'a'.repeat(100),
      '9999999999999999.1',
      '-1.5',
      '1.-5',
    ]) {
      cases.push(['GET', `/api/v1/relation/following?userId=${b.userId}&cursor=${encodeURIComponent(c)}`]);
    }
    for (const [method, path] of cases) {
      const res = await client.call(method, path, { token: a.accessToken });
      expect({ path, status: res.status >= 400 && res.status < 500 }).toEqual({ path, status: true });
      expect(res.body).toMatchObject({
        code: expect.any(String),
        message: expect.any(String),
        requestId: expect.any(String),
      });
    }
    // Optional parameters sent empty, as clients that always send every parameter do: not sent.
    const plain = await client.call('GET', `/api/v1/relation/followers?userId=${b.userId}`, {
      token: a.accessToken,
    });
    const empty = await client.call(
      'GET',
      `/api/v1/relation/followers?userId=${b.userId}&limit=&offset=&cursor=`,
      {
        token: a.accessToken,
      },
    );
    expect(plain.status).toBe(200);
    expect({ status: empty.status, body: empty.body }).toEqual({ status: 200, body: plain.body });
  });

  it("counts likes and favourites of an author's posts as received", async () => {
    const author = await signUp(server, client);
    const fan = await signUp(server, client);
    const posts = [
      String(BigInt(Date.now()) * 1_000_000n + 1n),
      String(BigInt(Date.now()) * 1_000_000n + 2n),
    ];
    for (const id of posts) await server.insertPost({ id, authorId: author.userId });
    const act = (action: string, entityId: string) =>
      client.call('POST', `/api/v1/action/${action}`, {
        token: fan.accessToken,
        body: { entityType: 'knowpost', entityId },
      });
    expect((await act('like', posts[0]!)).status).toBe(200);
    expect((await act('like', posts[1]!)).status).toBe(200);
    expect((await act('fav', posts[1]!)).status).toBe(200);
    const received = () => counter(author, author.userId).then((r) => r.body);
    expect(await eventually(received, (c) => c.likedPosts === 2 && c.favedPosts === 1)).toMatchObject({
      likedPosts: 2,
      favedPosts: 1,
    });
    expect((await act('unlike', posts[0]!)).status).toBe(200);
    expect(await eventually(received, (c) => c.likedPosts === 1)).toMatchObject({
      likedPosts: 1,
      favedPosts: 1,
    });
    // The fan received nothing.
    expect((await counter(author, fan.userId)).body).toMatchObject({ likedPosts: 0, favedPosts: 0 });
  });

  it('limits how many follows and unfollows a user makes per minute (429)', async () => {
    const busy = await signUp(server, client);
    const target = await signUp(server, client);
    const statuses: number[] = [];
    for (let i = 0; i < CHANGE_LIMIT + 2; i++) {
      statuses.push((await follow(busy, target.userId, i % 2 === 0 ? 'follow' : 'unfollow')).status);
    }
    expect(statuses.slice(0, CHANGE_LIMIT).every((s) => s === 200)).toBe(true);
    expect(statuses.slice(CHANGE_LIMIT)).toEqual([429, 429]);
    const limited = await follow(busy, target.userId);
    expect(limited.body).toMatchObject({ code: 'RATE_LIMITED' });
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThan(0);
  });
});
