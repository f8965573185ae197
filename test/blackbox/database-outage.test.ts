/**
 * A cluster server whose MariaDB stops answering (its connections hang, as a host that vanished):
 * it stays in rotation (readiness degraded); likes, favourites and counts of posts the process read
 * recently go on, from what it knew of their visibility, and posts read before are served from the
 * caches with live counts; a post it never read answers 503; once the database answers again,
 * everything does.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { services } from '../rig/resources.js';
import { tcpProxy } from '../rig/tcp-proxy.js';
import { Client, eventually, signUp, startServer, type Server, type SignedUp } from './harness.js';

const ENTITY_CACHE_MS = 300;

describe('a cluster server while its database does not answer', () => {
  let proxy: Awaited<ReturnType<typeof tcpProxy>>;
  let server: Server;
  let client: Client;
  let author: SignedUp;
  let reader: SignedUp;
  const base = BigInt(Date.now()) * 1_000_000n;
  const read = String(base + 1n);
  const unread = String(base + 2n);

  beforeAll(async () => {
    proxy = await tcpProxy(new URL(services.mysqlRootUrl()));
    server = await startServer(
      'cluster',
      {
        ZG_ENTITY_CACHE_MS: String(ENTITY_CACHE_MS),
        ZG_POST_CACHE_MS: String(ENTITY_CACHE_MS),
        ZG_MYSQL_TIMEOUT_MS: '1000',
      },
      {
        mysqlUrl: (url) => {
          const through = new URL(url);
          through.host = new URL(proxy.url).host;
          return through.toString();
        },
      },
    );
    client = new Client(server.baseUrl);
    author = await signUp(server, client);
    reader = await signUp(server, client);
    await server.insertPost({ id: read, authorId: author.userId });
    await server.insertPost({ id: unread, authorId: author.userId });
  }, 120_000);

  afterAll(async () => {
    proxy?.thaw();
    await server?.stop();
    await proxy?.close();
  });

  const act = (action: string, id: string) =>
    client.call('POST', `/api/v1/action/${action}`, {
      token: reader.accessToken,
      body: { entityType: 'knowpost', entityId: id },
    });
  const likes = async (id: string) => {
    const res = await client.call('GET', `/api/v1/counter/knowpost/${id}?metrics=like,fav`);
    return { status: res.status, counts: res.body?.counts };
  };

  it('takes likes and favourites of a post read before, refuses one never read, and recovers', async () => {
    expect(await likes(read)).toEqual({ status: 200, counts: { like: 0, fav: 0 } });
    const detail = () => client.call('GET', `/api/v1/knowposts/detail/${read}`);
    const feed = () => client.call('GET', '/api/v1/knowposts/feed?page=1&size=20');
    expect((await detail()).status).toBe(200);
    expect((await feed()).status).toBe(200);
    const follow = await client.call('POST', `/api/v1/relation/follow?toUserId=${author.userId}`, {
      token: reader.accessToken,
    });
    expect(follow.body).toBe(true);

    proxy.freeze();
    await sleep(ENTITY_CACHE_MS + 100);
    // Posts read before are served from the caches, their counts live.
    expect((await detail()).body).toMatchObject({ id: read, likeCount: 0 });
    const page = await feed();
    expect(page.status).toBe(200);
    expect(page.body.items.map((i: { id: string }) => i.id)).toEqual(expect.arrayContaining([read, unread]));
    expect((await act('like', read)).body).toEqual({ changed: true, liked: true });
    expect((await act('fav', read)).body).toEqual({ changed: true, faved: true });
    // Answered at once now, without waiting for the database first.
    const started = Date.now();
    expect((await act('unlike', read)).body).toEqual({ changed: true, liked: false });
    expect((await act('like', read)).body).toEqual({ changed: true, liked: true });
    expect(Date.now() - started).toBeLessThan(900);
    expect(
      await eventually(
        () => likes(read),
        (r) => r.counts?.like === 1,
      ),
    ).toEqual({
      status: 200,
      counts: { like: 1, fav: 1 },
    });

    expect(await eventually(detail, (r) => r.body?.likeCount === 1)).toMatchObject({
      status: 200,
      body: { likeCount: 1, favoriteCount: 1 },
    });

    const refused = await act('like', unread);
    expect(refused.status).toBe(503);
    expect(refused.body).toMatchObject({ code: 'UNAVAILABLE' });

    // What needs the database answers 503: after the deadline while it has answered lately, then
    // at once (the pool's connections hang: the deadline tells).
    const profile = () => client.call('GET', `/api/v1/profile/${author.userId}`);
    for (let i = 0; i < 4; i++) expect((await profile()).status).toBe(503);
    // Asked at once, and asked by a lone client now and then: no request is the one that waits to
    // find out whether the database is back (a probe in the background does).
    const lone: number[] = [];
    for (let i = 0; i < 3; i++) {
      await sleep(1_100);
      const asked = Date.now();
      expect((await profile()).status).toBe(503);
      lone.push(Date.now() - asked);
    }
    expect(lone.filter((ms) => ms >= 500)).toEqual([]);
    const reads = await Promise.all(
      Array.from({ length: 5 }, async () => {
        const asked = Date.now();
        const res = await profile();
        return { status: res.status, code: res.body?.code, fast: Date.now() - asked < 500 };
      }),
    );
    expect(reads.map(({ status, code }) => ({ status, code }))).toEqual(
      Array.from({ length: 5 }, () => ({ status: 503, code: 'UNAVAILABLE' })),
    );
    expect(reads.filter((r) => !r.fast)).toEqual([]);

    // Follows fail at once too, none behind a batch trying the database.
    await sleep(1_100);
    const changes = await Promise.all(
      Array.from({ length: 10 }, async (_, i) => {
        const started = Date.now();
        const res = await client.call(
          'POST',
          `/api/v1/relation/${i % 2 ? 'unfollow' : 'follow'}?toUserId=${author.userId}`,
          {
            token: reader.accessToken,
          },
        );
        return { status: res.status, ms: Date.now() - started };
      }),
    );
    expect(changes.map((c) => c.status)).toEqual(Array<number>(10).fill(503));
    expect(changes.filter((c) => c.ms >= 500)).toEqual([]);

    // Still in rotation.
    const ready = await client.call('GET', '/readyz');
    expect({ status: ready.status, body: ready.body }).toMatchObject({
      status: 200,
      body: { status: 'degraded', checks: { database: 'down', redis: 'ok' } },
    });

    const metrics = await (await fetch(`${server.baseUrl}/metrics`)).text();
    expect(Number(/^zg_counter_stale_visibility_total (\d+)/m.exec(metrics)?.[1])).toBeGreaterThan(0);
    expect(server.logLines().some((l) => String(l.msg).startsWith('database out of reach'))).toBe(true);

    // The database answers again (the connections it left hanging are reset).
    proxy.cut();
    proxy.thaw();
    const liked = await eventually(
      () => act('like', unread),
      (r) => r.status === 200,
      20_000,
    );
    expect(liked.body).toEqual({ changed: true, liked: true });
    expect(
      await eventually(
        () => likes(unread),
        (r) => r.counts?.like === 1,
      ),
    ).toEqual({
      status: 200,
      counts: { like: 1, fav: 0 },
    });
  }, 60_000);
});
