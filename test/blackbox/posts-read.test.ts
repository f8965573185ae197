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
import { fetchBytes, PNG, writePost, type NewPost } from './posts.js';

/**
 * Reading posts as clients do: detail, the public feed and the author's own list, with live counts and
 * flags, through every cache tier; and what they must never show to someone else.
 */
const FEED_ITEM_KEYS = [
  'authorAvatar',
  'authorNickname',
  'coverImage',
  'description',
  'faved',
  'favoriteCount',
  'id',
  'isTop',
  'likeCount',
  'liked',
  'tagJson',
  'tags',
  'title',
];
const DETAIL_KEYS = [
  'authorAvatar',
  'authorId',
  'authorNickname',
  'authorTagJson',
  'contentUrl',
  'description',
  'faved',
  'favoriteCount',
  'id',
  'images',
  'isTop',
  'likeCount',
  'liked',
  'publishTime',
  'tags',
  'title',
  'type',
  'visible',
];

describe.each<ProfileName>(['embedded', 'cluster'])('reading posts (%s profile)', (profile) => {
  let server: Server;
  let client: Client;
  let author: SignedUp;
  let reader: SignedUp;
  const bodies = new Map<string, Buffer>();

  beforeAll(async () => {
    server = await startServer(profile, {
      ZG_COUNTER_FLUSH_MS: '200',
      // Long enough that only invalidation can explain a change showing at once.
      ZG_POST_CACHE_MS: '30000',
      ZG_POST_SHARED_CACHE_MS: '60000',
    });
    client = new Client(server.baseUrl);
    [author, reader] = [await signUp(server, client), await signUp(server, client)];
  });
  afterAll(async () => server?.stop());

  const call = (method: string, path: string, token?: string, body?: unknown) =>
    client.call(method, path, { token, ...(body !== undefined ? { body } : {}) });
  const ok = <R extends { status: number; body: any }>(res: R, status = 204): R => {
    expect(res.status, JSON.stringify(res.body)).toBe(status);
    return res;
  };

  /** A post written through the public write routes; its body is kept to compare with reads. */
  async function newPost(user: SignedUp, spec: NewPost = {}): Promise<string> {
    const { id, content } = await writePost(client, user, spec);
    bodies.set(id, content);
    return id;
  }

  const detail = (id: string, token?: string) => call('GET', `/api/v1/knowposts/detail/${id}`, token);

  /** Every id of the public feed, walking the pages until `hasMore` is false. */
  async function feedIds(token?: string): Promise<string[]> {
    const ids: string[] = [];
    for (let page = 1; page < 100; page++) {
      const res = ok(await call('GET', `/api/v1/knowposts/feed?page=${page}&size=50`, token), 200);
      ids.push(...res.body.items.map((i: { id: string }) => i.id));
      if (!res.body.hasMore) return ids;
    }
    throw new Error('feed did not end');
  }

  async function feedItem(id: string, token?: string) {
    const res = ok(await call('GET', '/api/v1/knowposts/feed?page=1&size=50', token), 200);
    return res.body.items.find((i: { id: string }) => i.id === id);
  }

  it('serves detail and feed items in the contract’s shapes, with fetchable URLs', async () => {
    ok(await call('PATCH', '/api/v1/profile', author.accessToken, { tagJson: '["rust","go"]' }), 200);
    const external = 'https://images.example.test/a.png';
    const before = Date.now();
    const id = await newPost(author, {
      title: 'Shapes',
      tags: ['a', 'b'],
      description: 'short',
      images: 2,
      externalImages: [external],
    });
    const res = ok(await detail(id), 200);
    expect(Object.keys(res.body).sort()).toEqual(DETAIL_KEYS);
    const me = ok(await call('GET', '/api/v1/auth/me', author.accessToken), 200).body;
    expect(res.body).toMatchObject({
      id,
      title: 'Shapes',
      description: 'short',
      tags: ['a', 'b'],
      authorId: String(author.userId),
      authorNickname: me.nickname,
      authorAvatar: me.avatar,
      authorTagJson: '["rust","go"]',
      likeCount: 0,
      favoriteCount: 0,
      liked: false,
      faved: false,
      isTop: false,
      visible: 'public',
      type: 'image_text',
    });
    expect(Date.parse(res.body.publishTime)).toBeGreaterThanOrEqual(before - 1000);
    expect(res.body.publishTime).toBe(new Date(Date.parse(res.body.publishTime)).toISOString());
    expect(await fetchBytes(res.body.contentUrl)).toEqual({ status: 200, bytes: bodies.get(id) });
    expect(res.body.images).toHaveLength(3);
    expect(res.body.images[2]).toBe(external);
    for (const url of res.body.images.slice(0, 2))
      expect(await fetchBytes(url)).toEqual({ status: 200, bytes: PNG });

    const item = await feedItem(id);
    expect(Object.keys(item).sort()).toEqual(FEED_ITEM_KEYS);
    expect(item).toMatchObject({
      id,
      title: 'Shapes',
      description: 'short',
      tags: ['a', 'b'],
      authorNickname: me.nickname,
      authorAvatar: me.avatar,
      tagJson: '["rust","go"]',
      likeCount: 0,
      favoriteCount: 0,
      liked: false,
      faved: false,
      isTop: false,
    });
    expect(await fetchBytes(item.coverImage)).toEqual({ status: 200, bytes: PNG });
    const bare = await newPost(author, { title: 'No images' });
    expect((await feedItem(bare)).coverImage).toBeNull();
    expect(ok(await detail(bare), 200).body.images).toEqual([]);
  });

  it('pages the feed newest first, clamps the size and answers bad paging with 400', async () => {
    const ids = [await newPost(author), await newPost(author), await newPost(author)];
    const first = ok(await call('GET', '/api/v1/knowposts/feed?page=1&size=2'), 200).body;
    expect(first).toMatchObject({ page: 1, size: 2, hasMore: true });
    expect(first.items.map((i: { id: string }) => i.id)).toEqual([ids[2], ids[1]]);
    const second = ok(await call('GET', '/api/v1/knowposts/feed?page=2&size=2'), 200).body;
    expect(second.items[0].id).toBe(ids[0]);
    const all = await feedIds();
    expect(new Set(all).size).toBe(all.length);
    expect(all.indexOf(ids[2]!)).toBeLessThan(all.indexOf(ids[1]!));
    expect(all.indexOf(ids[1]!)).toBeLessThan(all.indexOf(ids[0]!));

    const anonymous = ok(await call('GET', '/api/v1/knowposts/feed'), 200);
    const defaults = anonymous.body;
    expect([defaults.page, defaults.size]).toEqual([1, 20]);
    // A cache in front keyed by URL keeps no signed-in caller's answer, nor gives one another's.
    expect(anonymous.headers.get('vary')).toMatch(/authorization/i);
    expect(anonymous.headers.get('cache-control')).toBe('no-store');
    for (const path of [
      '/api/v1/knowposts/feed',
      '/api/v1/knowposts/mine',
      `/api/v1/knowposts/detail/${ids[0]}`,
    ]) {
      const signedIn = ok(await call('GET', path, author.accessToken), 200);
      expect(signedIn.headers.get('cache-control'), path).toBe('private, no-store');
      expect(signedIn.headers.get('vary'), path).toMatch(/authorization/i);
    }
    expect(ok(await call('GET', '/api/v1/knowposts/feed?size=500'), 200).body.size).toBe(50);
    expect(ok(await call('GET', '/api/v1/knowposts/feed?size=0'), 200).body.size).toBe(1);
    // The feed pages through its newest 10,000 posts.
    const last = ok(await call('GET', '/api/v1/knowposts/feed?page=200&size=50'), 200).body;
    expect(last).toEqual({ items: [], page: 200, size: 50, hasMore: false });
    // Beyond them a page is empty, as past the feed's end.
    for (const query of ['page=201&size=50', 'page=10001']) {
      const page = Number(/page=(\d+)/.exec(query)![1]);
      const size = query.includes('size=50') ? 50 : 20;
      const beyond = await call('GET', `/api/v1/knowposts/feed?${query}`);
      expect(beyond.status, query).toBe(200);
      expect(beyond.body, query).toEqual({ items: [], page, size, hasMore: false });
    }
    for (const query of ['page=0', 'page=abc', 'size=1.5', 'page=-1']) {
      const bad = await call('GET', `/api/v1/knowposts/feed?${query}`);
      expect(bad.status, query).toBe(400);
      expect(bad.body).toMatchObject({ code: 'BAD_REQUEST', requestId: expect.any(String) });
    }
  });

  it('lists the caller’s published posts in mine, top ones first, and nobody else’s', async () => {
    const writer = await signUp(server, client);
    const older = await newPost(writer, { title: 'older' });
    const top = await newPost(writer, { title: 'top' });
    ok(await call('PATCH', `/api/v1/knowposts/${top}/top`, writer.accessToken, { isTop: true }));
    const privatePost = await newPost(writer, { visible: 'private' });
    const newest = await newPost(writer, { title: 'newest' });
    const draft = await newPost(writer, { publish: false });
    const deleted = await newPost(writer);
    ok(await call('DELETE', `/api/v1/knowposts/${deleted}`, writer.accessToken));
    await newPost(reader);

    const mine = ok(await call('GET', '/api/v1/knowposts/mine?page=1&size=10', writer.accessToken), 200).body;
    expect(mine.items.map((i: { id: string }) => i.id)).toEqual([top, newest, privatePost, older]);
    expect(mine).toMatchObject({ page: 1, size: 10, hasMore: false });
    expect(mine.items[0].isTop).toBe(true);
    expect(Object.keys(mine.items[0]).sort()).toEqual(FEED_ITEM_KEYS);
    expect(mine.items.map((i: { id: string }) => i.id)).not.toContain(draft);

    const paged = ok(await call('GET', '/api/v1/knowposts/mine?page=2&size=3', writer.accessToken), 200).body;
    expect(paged).toMatchObject({ page: 2, size: 3, hasMore: false });
    expect(paged.items.map((i: { id: string }) => i.id)).toEqual([older]);
    expect((await call('GET', '/api/v1/knowposts/mine')).status).toBe(401);
  });

  it('never shows a private, unlisted or draft post to anyone but its author, nor a deleted one', async () => {
    const privatePost = await newPost(author, { visible: 'private' });
    const draft = await newPost(author, { publish: false });
    const deleted = await newPost(author);
    const unlisted = await newPost(author, { visible: 'unlisted' });
    // Everyone has read the deleted one while it was public, so every tier may hold it.
    ok(await detail(deleted), 200);
    ok(await detail(deleted, reader.accessToken), 200);
    expect(await feedIds()).toContain(deleted);
    ok(await call('DELETE', `/api/v1/knowposts/${deleted}`, author.accessToken));

    // The author reads each, so each could now sit in a cache.
    const own = ok(await detail(privatePost, author.accessToken), 200).body;
    expect(own).toMatchObject({ id: privatePost, visible: 'private' });
    expect(await fetchBytes(own.contentUrl)).toEqual({ status: 200, bytes: bodies.get(privatePost) });
    expect(ok(await detail(draft, author.accessToken), 200).body).toMatchObject({
      id: draft,
      publishTime: null,
    });
    expect(ok(await detail(unlisted, author.accessToken), 200).body.visible).toBe('unlisted');
    expect((await detail(deleted, author.accessToken)).status).toBe(404);
    expect(await feedIds(author.accessToken)).not.toContain(privatePost);

    for (const token of [undefined, reader.accessToken]) {
      for (const id of [privatePost, draft, deleted, unlisted]) {
        const res = await detail(id, token);
        expect(res.status, `${id} ${token ? 'reader' : 'anonymous'}`).toBe(404);
        expect(res.body).toMatchObject({ code: 'NOT_FOUND' });
      }
      const ids = await feedIds(token);
      for (const id of [privatePost, draft, deleted, unlisted]) expect(ids).not.toContain(id);
    }
  });

  it('hides a post from others at once when it turns private, and shows it again when public', async () => {
    const id = await newPost(author);
    for (const token of [undefined, reader.accessToken]) {
      ok(await detail(id, token), 200);
      expect(await feedIds(token)).toContain(id);
    }
    ok(await call('PATCH', `/api/v1/knowposts/${id}/visibility`, author.accessToken, { visible: 'private' }));
    for (const token of [undefined, reader.accessToken]) {
      expect((await detail(id, token)).status).toBe(404);
      expect(await feedIds(token)).not.toContain(id);
    }
    expect(ok(await detail(id, author.accessToken), 200).body.visible).toBe('private');
    // The change also went out as a post event, and the workers invalidated the post again.
    const invalidated = async () => {
      const text = await (await fetch(`${server.baseUrl}/metrics`)).text();
      return Number(/^zg_post_cache_invalidations_total (\S+)$/m.exec(text)?.[1] ?? 0);
    };
    const before = await invalidated();
    ok(
      await call('PATCH', `/api/v1/knowposts/${id}/visibility`, author.accessToken, { visible: 'followers' }),
    );
    expect(await eventually(invalidated, (n) => n > before, 10_000)).toBeGreaterThan(before);

    ok(await call('PATCH', `/api/v1/knowposts/${id}/visibility`, author.accessToken, { visible: 'public' }));
    expect(ok(await detail(id, reader.accessToken), 200).body.visible).toBe('public');
    expect(await feedIds()).toContain(id);
    ok(await call('PATCH', `/api/v1/knowposts/${id}`, author.accessToken, { title: 'Renamed' }));
    expect(ok(await detail(id), 200).body.title).toBe('Renamed');
    expect((await feedItem(id)).title).toBe('Renamed');
  });

  it('counts each detail read as a view, shown in the counts within 1.5 s, and no HEAD request', async () => {
    const id = await newPost(author);
    for (const token of [undefined, reader.accessToken]) {
      const head = await fetch(`${server.baseUrl}/api/v1/knowposts/detail/${id}`, {
        method: 'HEAD',
        headers: token ? { authorization: `Bearer ${token}` } : {},
      });
      expect(head.status).toBe(200);
    }
    for (let i = 0; i < 3; i++) ok(await detail(id, i === 0 ? reader.accessToken : undefined), 200);
    expect((await detail('1')).status).toBe(404);
    const started = Date.now();
    const counts = await eventually(
      () => call('GET', `/api/v1/counter/knowpost/${id}`),
      (r) => r.body.counts?.read === 3,
      1500,
    );
    expect(counts.body.counts.read).toBe(3);
    expect(Date.now() - started).toBeLessThanOrEqual(1700);
    // Nothing else was on its way.
    await new Promise((resolve) => setTimeout(resolve, 1200));
    expect((await call('GET', `/api/v1/counter/knowpost/${id}`)).body.counts.read).toBe(3);
    const metrics = await (await fetch(`${server.baseUrl}/metrics`)).text();
    const value = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, 'm').exec(metrics)?.[1]);
    expect(value('zg_views_published_total')).toBeGreaterThanOrEqual(3);
    expect(value('zg_views_applied_total')).toBeGreaterThanOrEqual(3);
  });

  it('shows likes, favourites and the viewer’s flags in detail and feed within 1.5 s', async () => {
    const id = await newPost(author);
    ok(await detail(id), 200);
    expect((await feedItem(id)).likeCount).toBe(0);
    ok(
      await call('POST', '/api/v1/action/like', reader.accessToken, { entityType: 'knowpost', entityId: id }),
      200,
    );
    ok(
      await call('POST', '/api/v1/action/fav', reader.accessToken, { entityType: 'knowpost', entityId: id }),
      200,
    );
    ok(
      await call('POST', '/api/v1/action/like', author.accessToken, { entityType: 'knowpost', entityId: id }),
      200,
    );
    const started = Date.now();
    const seen = await eventually(
      () => detail(id, reader.accessToken),
      (r) => r.body.likeCount === 2 && r.body.favoriteCount === 1,
      1500,
    );
    expect(seen.body).toMatchObject({ likeCount: 2, favoriteCount: 1, liked: true, faved: true });
    const item = await eventually(
      () => feedItem(id, reader.accessToken),
      (i) => i?.likeCount === 2,
      Math.max(0, 1500 - (Date.now() - started)),
    );
    expect(item).toMatchObject({ likeCount: 2, favoriteCount: 1, liked: true, faved: true });
    expect(Date.now() - started).toBeLessThanOrEqual(1700);
    // Flags belong to the viewer: the author liked but did not favourite; anonymous sees none.
    expect(ok(await detail(id, author.accessToken), 200).body).toMatchObject({ liked: true, faved: false });
    expect(await feedItem(id)).toMatchObject({ likeCount: 2, liked: false, faved: false });
  });

  it('answers bad ids, unknown posts and invalid tokens in the error shape', async () => {
    const id = await newPost(author);
    for (const bad of ['abc', '0', '12345678901234567890', '-1']) {
      const res = await detail(bad);
      expect(res.status, bad).toBe(400);
      expect(res.body).toMatchObject({ code: 'BAD_REQUEST' });
    }
    expect((await detail('999999999999')).status).toBe(404);
    for (const path of [
      `/api/v1/knowposts/detail/${id}`,
      '/api/v1/knowposts/feed',
      '/api/v1/knowposts/mine',
    ]) {
      const res = await call('GET', path, 'not-a-token');
      expect(res.status, path).toBe(401);
      expect(res.body).toMatchObject({ code: 'UNAUTHORIZED', requestId: expect.any(String) });
    }
  });
});
