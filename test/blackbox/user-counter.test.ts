import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Client,
  eventually,
  signUp,
  startServer,
  type ProfileName,
  type Server,
  type SignedUp,
} from './harness.js';
import { callAs, draftWithContent, publish as publishDraft } from './posts.js';

/**
 * A user's counts as clients read them (`GET /api/v1/relation/counter`), moved by publishing and
 * deleting posts through the public routes: outbox → relay → post-events → user-counters consumer.
 */
const zero = { followings: 0, followers: 0, posts: 0, likedPosts: 0, favedPosts: 0 };

describe.each<ProfileName>(['embedded', 'cluster'])('user counters (%s profile)', (profile) => {
  let server: Server;
  let client: Client;
  let author: SignedUp;
  let reader: SignedUp;

  beforeAll(async () => {
    server = await startServer(profile);
    client = new Client(server.baseUrl);
    [author, reader] = [await signUp(server, client), await signUp(server, client)];
  });
  afterAll(async () => server?.stop());

  /** As the reader by default; `null` sends no token. */
  const counter = (userId: number | string, token: string | null = reader.accessToken) =>
    client.call('GET', `/api/v1/relation/counter?userId=${userId}`, { token: token ?? undefined });
  const as = (user: SignedUp, method: string, path: string, body?: unknown) =>
    callAs(client, user, method, path, body);
  /** A draft with a confirmed markdown body, through presign, PUT and confirm. */
  const draftWithBody = async (user: SignedUp) => (await draftWithContent(client, user)).id;

  async function publish(user: SignedUp): Promise<string> {
    const id = await draftWithBody(user);
    await publishDraft(client, user, id);
    return id;
  }

  it('answers the five counts of any user to a signed-in caller, and refuses everything else', async () => {
    expect((await counter(author.userId)).body).toEqual(zero);
    expect((await counter(reader.userId, reader.accessToken)).body).toEqual(zero);

    const anonymous = await counter(author.userId, null);
    expect(anonymous.status).toBe(401);
    expect(anonymous.body).toMatchObject({ code: 'UNAUTHORIZED', requestId: expect.any(String) });
    expect((await counter(author.userId, 'not-a-token')).status).toBe(401);

    for (const bad of ['0', '-3', 'abc', '1.5', '', '99999999999999999999', `${author.userId}&userId=x`]) {
      const res = await counter(bad);
      expect({ bad, status: res.status, code: res.body.code }).toEqual({
        bad,
        status: 400,
        code: 'BAD_REQUEST',
      });
      expect(res.body.message).toMatch(/userId/);
    }
    const missing = await client.call('GET', '/api/v1/relation/counter', { token: reader.accessToken });
    expect(missing.status).toBe(400);
    expect(missing.body.message).toMatch(/userId/);

    const unknown = await counter(author.userId + 1_000_000);
    expect(unknown.status).toBe(404);
    expect(unknown.body).toMatchObject({ code: 'NOT_FOUND', requestId: expect.any(String) });
  });

  it('counts a published post within seconds, once, and takes it back when the post is deleted', async () => {
    const user = await signUp(server, client);
    // Read first: the snapshot exists, so the count moves by the consumer's delta.
    expect((await counter(user.userId)).body).toEqual(zero);
    const draftOnly = await draftWithBody(user);
    const id = await publish(user);
    const started = Date.now();
    const shown = await eventually(
      () => counter(user.userId),
      (r) => r.body.posts === 1,
    );
    expect(shown.body).toEqual({ ...zero, posts: 1 });
    expect(Date.now() - started).toBeLessThan(5_000);
    // A repeated publish is refused and moves nothing; neither does deleting a draft.
    expect((await as(user, 'POST', `/api/v1/knowposts/${id}/publish`)).status).toBe(409);
    expect((await as(user, 'DELETE', `/api/v1/knowposts/${draftOnly}`)).status).toBe(204);
    await new Promise((r) => setTimeout(r, 1_000));
    expect((await counter(user.userId)).body).toEqual({ ...zero, posts: 1 });

    expect((await as(user, 'DELETE', `/api/v1/knowposts/${id}`)).status).toBe(204);
    const gone = await eventually(
      () => counter(user.userId),
      (r) => r.body.posts === 0,
    );
    expect(gone.body).toEqual(zero);
    // Deleting it again succeeds without counting it down a second time.
    expect((await as(user, 'DELETE', `/api/v1/knowposts/${id}`)).status).toBe(204);
    await new Promise((r) => setTimeout(r, 1_000));
    expect((await counter(user.userId)).body).toEqual(zero);
  });

  it('answers right away from the database for a user never read, and does not count the event on its way again', async () => {
    const user = await signUp(server, client);
    const ids = [await publish(user), await publish(user)];
    // Read at once: the snapshot is rebuilt from the database while the events may still travel.
    expect((await counter(user.userId)).body).toEqual({ ...zero, posts: 2 });
    await new Promise((r) => setTimeout(r, 2_000));
    expect((await counter(user.userId)).body).toEqual({ ...zero, posts: 2 });
    expect((await as(user, 'DELETE', `/api/v1/knowposts/${ids[0]}`)).status).toBe(204);
    const after = await eventually(
      () => counter(user.userId),
      (r) => r.body.posts === 1,
    );
    expect(after.body).toEqual({ ...zero, posts: 1 });
  });

  it('counts public posts only: private ones never, and each visibility change once, also when rebuilt', async () => {
    const user = await signUp(server, client);
    const visibility = async (id: string, visible: string) =>
      expect((await as(user, 'PATCH', `/api/v1/knowposts/${id}/visibility`, { visible })).status).toBe(204);
    const settled = async (n: number) => {
      const shown = await eventually(
        () => counter(user.userId),
        (r) => r.body.posts === n,
      );
      expect(shown.body).toEqual({ ...zero, posts: n });
      // Nothing more arrives: every event was counted once.
      await new Promise((r) => setTimeout(r, 1_000));
      expect((await counter(user.userId)).body).toEqual({ ...zero, posts: n });
      expect((await counter(user.userId, user.accessToken)).body.posts).toBe(n);
    };

    // Flipped before anyone read the count: the first read rebuilds it from the database while the
    // flips' events are still on their way, and none of them may count again.
    const flipped = await draftWithBody(user);
    await visibility(flipped, 'private');
    await publishDraft(client, user, flipped);
    for (const visible of ['public', 'followers', 'public', 'private', 'public'])
      await visibility(flipped, visible);
    expect((await counter(user.userId)).body).toEqual({ ...zero, posts: 1 });
    await settled(1);

    const secret = await draftWithBody(user);
    await visibility(secret, 'private');
    await publishDraft(client, user, secret);
    await settled(1);
    await visibility(secret, 'public');
    await settled(2);
    await visibility(secret, 'unlisted');
    await visibility(secret, 'private');
    await settled(1);
    expect((await as(user, 'DELETE', `/api/v1/knowposts/${secret}`)).status).toBe(204);
    expect((await as(user, 'DELETE', `/api/v1/knowposts/${flipped}`)).status).toBe(204);
    await settled(0);
  });

  it("moves the author's likes and favourites received with every change on their posts, once", async () => {
    const user = await signUp(server, client);
    const fans = [await signUp(server, client), await signUp(server, client)];
    const [first, second] = [await publish(user), await publish(user)];
    expect((await counter(user.userId)).body).toEqual({ ...zero, posts: 2 });
    const act = async (fan: SignedUp, action: string, postId: string) => {
      const res = await as(fan, 'POST', `/api/v1/action/${action}`, {
        entityType: 'knowpost',
        entityId: postId,
      });
      expect(res.status).toBe(200);
      return res.body;
    };
    await act(fans[0]!, 'like', first);
    await act(fans[1]!, 'like', first);
    await act(fans[1]!, 'like', second);
    await act(fans[0]!, 'fav', second);
    expect(await act(fans[0]!, 'like', first)).toEqual({ changed: false, liked: true });
    const shown = await eventually(
      () => counter(user.userId),
      (r) => r.body.likedPosts === 3 && r.body.favedPosts === 1,
    );
    expect(shown.body).toEqual({ ...zero, posts: 2, likedPosts: 3, favedPosts: 1 });

    await act(fans[1]!, 'unlike', first);
    await act(fans[0]!, 'unfav', second);
    const after = await eventually(
      () => counter(user.userId),
      (r) => r.body.likedPosts === 2 && r.body.favedPosts === 0,
    );
    expect(after.body).toEqual({ ...zero, posts: 2, likedPosts: 2 });
    // Nobody else's counts moved.
    expect((await counter(fans[0]!.userId)).body).toEqual(zero);
    await new Promise((r) => setTimeout(r, 1_000));
    expect((await counter(user.userId)).body).toEqual({ ...zero, posts: 2, likedPosts: 2 });
  });
});
