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

let nextPost = BigInt(Date.now()) * 1_000_000n;
const newPostId = () => String(++nextPost);

describe.each<ProfileName>(['embedded', 'cluster'])(
  'likes, favourites and counts (%s profile)',
  (profile) => {
    let server: Server;
    let client: Client;
    let author: SignedUp;
    let reader: SignedUp;

    beforeAll(async () => {
      server = await startServer(profile, { ZG_COUNTER_FLUSH_MS: '200', ZG_ENTITY_CACHE_MS: '0' });
      client = new Client(server.baseUrl);
      author = await signUp(server, client);
      reader = await signUp(server, client);
    });
    afterAll(async () => server?.stop());

    const act = (token: string, action: string, entityId: string, entityType = 'knowpost') =>
      client.call('POST', `/api/v1/action/${action}`, { token, body: { entityType, entityId } });
    const counts = (id: string, query = '', token?: string) =>
      client.call('GET', `/api/v1/counter/knowpost/${id}${query}`, { token });

    it('likes and favourites idempotently and shows the counts within 1.5 s', async () => {
      const id = newPostId();
      await server.insertPost({ id, authorId: author.userId });
      expect((await act(reader.accessToken, 'like', id)).body).toEqual({ changed: true, liked: true });
      expect((await act(reader.accessToken, 'like', id)).body).toEqual({ changed: false, liked: true });
      expect((await act(author.accessToken, 'like', id)).body).toEqual({ changed: true, liked: true });
      expect((await act(reader.accessToken, 'fav', id)).body).toEqual({ changed: true, faved: true });
      const started = Date.now();
      const res = await eventually(
        () => counts(id),
        (r) => r.body.counts?.like === 2 && r.body.counts?.fav === 1,
        1500,
      );
      expect(Date.now() - started).toBeLessThanOrEqual(1600);
      expect(res.body).toEqual({
        entityType: 'knowpost',
        entityId: id,
        counts: { read: 0, like: 2, fav: 1, comment: 0, repost: 0 },
      });
      expect((await counts(id, '?metrics=like,bogus')).body.counts).toEqual({ like: 2 });
      // Only unknown names: as if none were given.
      expect((await counts(id, '?metrics=bogus')).body.counts).toEqual(res.body.counts);

      expect((await act(reader.accessToken, 'unlike', id)).body).toEqual({ changed: true, liked: false });
      expect((await act(reader.accessToken, 'unlike', id)).body).toEqual({ changed: false, liked: false });
      expect((await act(reader.accessToken, 'unfav', id)).body).toEqual({ changed: true, faved: false });
      const after = await eventually(
        () => counts(id),
        (r) => r.body.counts?.like === 1 && r.body.counts?.fav === 0,
        1500,
      );
      expect(after.body.counts).toMatchObject({ like: 1, fav: 0 });

      const status = await client.call('GET', `/api/v1/action/status?entityType=knowpost&ids=${id}`, {
        token: author.accessToken,
      });
      expect(status.body).toEqual({ items: [{ entityId: id, liked: true, faved: false }] });
    });

    it('reads counts and flags for a page of posts at once', async () => {
      const ids = [newPostId(), newPostId(), newPostId()];
      for (const id of ids) await server.insertPost({ id, authorId: author.userId });
      await act(reader.accessToken, 'like', ids[0]!);
      await act(reader.accessToken, 'fav', ids[2]!);
      const batch = await eventually(
        () => client.call('GET', `/api/v1/counter/knowpost?ids=${ids.join(',')}&metrics=like,fav`),
        (r) => r.body.items?.[0]?.counts.like === 1 && r.body.items?.[2]?.counts.fav === 1,
        1500,
      );
      expect(batch.body).toEqual({
        entityType: 'knowpost',
        items: [
          { entityId: ids[0], counts: { like: 1, fav: 0 } },
          { entityId: ids[1], counts: { like: 0, fav: 0 } },
          { entityId: ids[2], counts: { like: 0, fav: 1 } },
        ],
      });
      const status = await client.call(
        'GET',
        `/api/v1/action/status?entityType=knowpost&ids=${ids.join(',')}`,
        { token: reader.accessToken },
      );
      expect(status.body.items).toEqual([
        { entityId: ids[0], liked: true, faved: false },
        { entityId: ids[1], liked: false, faved: false },
        { entityId: ids[2], liked: false, faved: true },
      ]);
    });

    it('refuses drafts, deleted posts, other people’s private posts and unknown ids, and leaves them out of lists', async () => {
      const draft = newPostId();
      const deleted = newPostId();
      const privatePost = newPostId();
      const missing = newPostId();
      await server.insertPost({ id: draft, authorId: author.userId, status: 'draft' });
      await server.insertPost({ id: deleted, authorId: author.userId, status: 'deleted' });
      await server.insertPost({ id: privatePost, authorId: author.userId, visible: 'private' });
      for (const id of [draft, deleted, privatePost, missing]) {
        const like = await act(reader.accessToken, 'like', id);
        expect([id, like.status, like.body.code]).toEqual([id, 404, 'NOT_FOUND']);
        expect((await counts(id, '', reader.accessToken)).status).toBe(404);
        expect((await counts(id)).status).toBe(404);
      }
      // the author may like and count their own private post
      expect((await act(author.accessToken, 'like', privatePost)).body).toEqual({
        changed: true,
        liked: true,
      });
      expect((await counts(privatePost, '', author.accessToken)).status).toBe(200);
      const batch = await client.call(
        'GET',
        `/api/v1/counter/knowpost?ids=${[draft, privatePost, missing].join(',')}`,
      );
      expect(batch.body.items).toEqual([]);
      const status = await client.call(
        'GET',
        `/api/v1/action/status?entityType=knowpost&ids=${[draft, privatePost].join(',')}`,
        { token: reader.accessToken },
      );
      expect(status.body.items).toEqual([]);
    });

    it('answers bad input with 4xx and needs a signed-in caller to act', async () => {
      const id = newPostId();
      await server.insertPost({ id, authorId: author.userId });
      expect(
        (await client.call('POST', '/api/v1/action/like', { body: { entityType: 'knowpost', entityId: id } }))
          .status,
      ).toBe(401);
      for (const body of [
        {},
        { entityType: 'comment', entityId: id },
        { entityType: 'knowpost', entityId: 'abc' },
        { entityType: 'knowpost', entityId: -3 },
        { entityType: 'knowpost' },
        [],
      ]) {
        const res = await client.call('POST', '/api/v1/action/fav', { token: reader.accessToken, body });
        expect([JSON.stringify(body), res.status, res.body.code]).toEqual([
          JSON.stringify(body),
          400,
          'BAD_REQUEST',
        ]);
      }
      expect((await client.call('GET', '/api/v1/counter/user/1')).status).toBe(400);
      expect((await client.call('GET', '/api/v1/counter/knowpost/12a')).status).toBe(400);
      const tooMany = Array.from({ length: 101 }, (_, i) => String(i + 1)).join(',');
      expect((await client.call('GET', `/api/v1/counter/knowpost?ids=${tooMany}`)).status).toBe(400);
      expect((await client.call('GET', `/api/v1/action/status?entityType=knowpost&ids=${id}`)).status).toBe(
        401,
      );
    });

    it('limits how many likes and favourites a user makes per minute (429, nothing changed)', async () => {
      const id = newPostId();
      await server.insertPost({ id, authorId: author.userId });
      const busy = await signUp(server, client);
      const limit = 300; // ZG_COUNTER_TOGGLE_LIMIT's default
      const statuses: number[] = [];
      for (let i = 0; i < limit; i += 20) {
        const wave = Array.from({ length: 20 }, (_, k) => ((i + k) % 2 === 0 ? 'like' : 'unlike'));
        statuses.push(
          ...(await Promise.all(wave.map((a) => act(busy.accessToken, a, id)))).map((r) => r.status),
        );
      }
      expect(statuses.filter((s) => s !== 200)).toEqual([]);
      // The 301st, a first favourite, is refused and leaves the post unfavourited.
      const refused = await act(busy.accessToken, 'fav', id);
      expect(refused.status).toBe(429);
      expect(refused.body).toMatchObject({ code: 'RATE_LIMITED' });
      expect(Number(refused.headers.get('retry-after'))).toBeGreaterThan(0);
      const status = await client.call('GET', `/api/v1/action/status?entityType=knowpost&ids=${id}`, {
        token: busy.accessToken,
      });
      expect(status.body).toMatchObject({ items: [{ entityId: id, faved: false }] });
      // Others are not limited by it.
      expect((await act(reader.accessToken, 'fav', id)).body).toEqual({ changed: true, faved: true });
    });

    it('keeps counts exact under concurrent toggles from many users', async () => {
      const ids = [newPostId(), newPostId()];
      for (const id of ids) await server.insertPost({ id, authorId: author.userId });
      const users = [
        author,
        reader,
        ...(await Promise.all(Array.from({ length: 6 }, () => signUp(server, client)))),
      ];
      const state = new Map<string, boolean>();
      let seed = 7;
      const rand = () => (seed = (seed * 48271) % 0x7fffffff) / 0x7fffffff;
      const ops = Array.from({ length: 400 }, () => {
        const user = users[Math.floor(rand() * users.length)]!;
        const id = ids[Math.floor(rand() * ids.length)]!;
        return { user, id, on: rand() < 0.6 };
      });
      // Concurrent in waves; each (user, post) sees its own calls in order, so the final state is known.
      for (let i = 0; i < ops.length; i += 40) {
        const wave = ops.slice(i, i + 40);
        const seen = new Set<string>();
        const now = wave.filter((op) => {
          const key = `${op.user.userId}:${op.id}`;
          if (seen.has(key)) return false;
          seen.add(key);
          return true;
        });
        await Promise.all(now.map((op) => act(op.user.accessToken, op.on ? 'like' : 'unlike', op.id)));
        for (const op of now) state.set(`${op.user.userId}:${op.id}`, op.on);
      }
      for (const id of ids) {
        const expected = [...state.entries()].filter(([k, v]) => k.endsWith(`:${id}`) && v).length;
        const res = await eventually(
          () => counts(id, '?metrics=like'),
          (r) => r.body.counts?.like === expected,
          3000,
        );
        expect([id, res.body.counts.like]).toEqual([id, expected]);
      }
    });
  },
);
