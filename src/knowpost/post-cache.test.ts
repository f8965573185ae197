import { describe, expect, it } from 'vitest';
import { createLocalInvalidationBus } from '../platform/cache/create.js';
import type { InvalidationBus } from '../platform/cache/invalidation-bus.js';
import { NoSharedCache } from '../platform/cache/shared-cache.js';
import {
  PostCache,
  POST_INVALIDATION_SCOPE,
  postCacheInvalidator,
  subscribePostCache,
} from './post-cache.js';
import type { AuthorRow, PostReadRepository, PostReadRow } from './post-read.repository.js';
import { PostUrlSigner } from './post-read.model.js';

const row = (id: string, visible = 'public'): PostReadRow => ({
  id,
  authorId: 1,
  status: 'published',
  visible,
  title: `post ${id}`,
  description: null,
  tags: [],
  imgUrls: [],
  contentKey: null,
  isTop: false,
  type: 'image_text',
  publishTime: 1,
});

function setup(shared = new NoSharedCache(), localMaxBytes?: number) {
  const rows = new Map<string, PostReadRow>([
    ['1', row('1')],
    ['2', row('2', 'private')],
  ]);
  const loads: string[][] = [];
  const repo = {
    loadPosts: async (ids: readonly string[]) => {
      loads.push([...ids]);
      return ids.flatMap((id) => (rows.has(id) ? [{ ...rows.get(id)! }] : []));
    },
    feedIds: async (offset: number, limit: number) => [...rows.keys()].slice(offset, offset + limit),
    loadAuthors: async () => [],
  } as unknown as PostReadRepository;
  const cache = new PostCache({
    repo,
    signer: new PostUrlSigner({ presignGet: async (k) => k }, 3600),
    shared,
    localTtlMs: 60_000,
    localMaxEntries: 100,
    ...(localMaxBytes === undefined ? {} : { localMaxBytes }),
    sharedTtlMs: 60_000,
  });
  return { rows, loads, cache, repo };
}

describe(PostCache.name, () => {
  it('keeps public posts in memory and loads the others every time', async () => {
    const { loads, cache } = setup();
    await cache.postsById(['1', '2']);
    await cache.postsById(['1', '2']);
    expect(loads).toEqual([['1', '2'], ['2']]);
  });

  it('keeps no more bytes of posts than it is given, whatever the entry bound', async () => {
    const { rows, loads, cache } = setup(new NoSharedCache(), 128 * 1024);
    // Posts of about 80 kB each (20 image URLs of a kilobyte, and as fetched): one fits, two do not.
    for (const id of ['3', '4'])
      rows.set(id, {
        ...row(id),
        imgUrls: Array.from({ length: 20 }, (_, i) => `https://img.example/${i}/${'x'.repeat(1000)}`),
      });
    await cache.postsById(['3']);
    await cache.postsById(['3']);
    expect(loads).toEqual([['3']]);
    await cache.postsById(['4']);
    await cache.postsById(['3', '4']);
    expect(loads).toEqual([['3'], ['4'], ['3']]);
  });
});

describe('PostCache authors', () => {
  const author = (id: number, nickname: string) => ({ id, nickname }) as unknown as AuthorRow;

  function authorsRig(staleIfErrorMs?: number) {
    const clock = { now: 0 };
    const db = {
      down: false,
      names: new Map([
        [1, 'ann'],
        [2, 'bo'],
      ]),
    };
    const repo = {
      loadAuthors: async (ids: readonly number[]) => {
        if (db.down) throw new Error('connect ECONNREFUSED');
        return ids.map((id) => author(id, db.names.get(id)!));
      },
    } as unknown as PostReadRepository;
    const cache = new PostCache({
      repo,
      signer: new PostUrlSigner({ presignGet: async (k) => k }, 3600),
      shared: new NoSharedCache(),
      localTtlMs: 1_000,
      localMaxEntries: 100,
      sharedTtlMs: 60_000,
      ...(staleIfErrorMs === undefined ? {} : { staleIfErrorMs }),
      now: () => clock.now,
    });
    const names = async (ids: number[]) => [...(await cache.authors(ids)).values()].map((a) => a.nickname);
    return { clock, db, cache, names };
  }

  it('shows authors read lately as they were while the database cannot be read, for staleIfErrorMs', async () => {
    const { clock, db, names } = authorsRig(10_000);
    expect(await names([1])).toEqual(['ann']);
    db.names.set(1, 'ann 2');
    db.down = true;
    clock.now = 5_000;
    expect(await names([1])).toEqual(['ann']);
    // One never read fails the lookup, as one read too long ago does.
    await expect(names([1, 2])).rejects.toThrow(/ECONNREFUSED/);
    clock.now = 11_000;
    await expect(names([1])).rejects.toThrow(/ECONNREFUSED/);
    // Back: read again.
    db.down = false;
    expect(await names([1])).toEqual(['ann 2']);
  });

  it('fails at once without staleIfErrorMs', async () => {
    const { clock, db, names } = authorsRig();
    expect(await names([1])).toEqual(['ann']);
    db.down = true;
    clock.now = 1_000;
    await expect(names([1])).rejects.toThrow(/ECONNREFUSED/);
  });
});

describe('PostCache feed pages', () => {
  function feedOf(length: number) {
    const feed = Array.from({ length }, (_, i) => `p${i}`);
    const queries: [number, number][] = [];
    const repo = {
      feedIds: async (offset: number, limit: number) => {
        queries.push([offset, limit]);
        return feed.slice(offset, offset + limit);
      },
    } as unknown as PostReadRepository;
    const cache = new PostCache({
      repo,
      signer: new PostUrlSigner({ presignGet: async (k) => k }, 3600),
      shared: new NoSharedCache(),
      localTtlMs: 60_000,
      localMaxEntries: 100,
      sharedTtlMs: 60_000,
    });
    return { feed, queries, cache };
  }

  it('cuts every page of every size from blocks, with hasMore right at every edge', async () => {
    for (const length of [0, 1, 49, 50, 51, 100, 237]) {
      const { feed, cache } = feedOf(length);
      for (let size = 1; size <= 50; size++) {
        for (let page = 1; (page - 1) * size <= length + size; page++) {
          const start = (page - 1) * size;
          expect(await cache.feedPage(page, size), `${length} posts, page ${page} of ${size}`).toEqual({
            ids: feed.slice(start, start + size),
            hasMore: length > start + size,
          });
        }
      }
    }
  });

  it('cuts a page short when asked, reading no block past the cut', async () => {
    const { feed, queries, cache } = feedOf(1_000);
    // Page 334 of 30 starts at 9,990 of a feed 10,000 deep: 10 ids, one block (here: 190 at 50).
    expect(await cache.feedPage(7, 30, 10)).toEqual({ ids: feed.slice(180, 190), hasMore: true });
    expect(queries).toEqual([[150, 51]]);
    expect(await cache.feedPage(1, 5, 5)).toEqual({ ids: feed.slice(0, 5), hasMore: true });
    await expect(cache.feedPage(1, 5, 6)).rejects.toThrow(RangeError);
  });

  it('keeps one key per block, whatever pages and sizes are asked for, and reads a page with one query', async () => {
    const { queries, cache } = feedOf(1_000);
    expect(await cache.feedPage(2, 30)).toMatchObject({ ids: expect.arrayContaining(['p30', 'p59']) });
    expect(queries).toEqual([[0, 101]]); // blocks 0 and 1 at once
    for (let size = 1; size <= 50; size++)
      for (let page = 1; page * size <= 1_000; page++) await cache.feedPage(page, size);
    // 20 blocks cover the 1,000 posts; each was read once.
    expect(queries.length).toBeLessThanOrEqual(20);
    queries.length = 0;
    await cache.feedPage(1, 20);
    await cache.feedPage(7, 13);
    expect(queries).toEqual([]);
  });

  it('cuts a page from one read when one of its blocks was not cached, not from blocks of two moments', async () => {
    const { feed, queries, cache } = feedOf(200);
    expect((await cache.feedPage(1, 50)).ids).toEqual(feed.slice(0, 50));
    // A post published whose announcement has not reached this process yet.
    feed.unshift('new');
    const page = await cache.feedPage(2, 30); // block 0 cached, block 1 not
    expect(queries).toEqual([
      [0, 51],
      [0, 101],
    ]);
    expect(page.ids).toEqual(feed.slice(30, 60));
    expect(new Set(page.ids).size).toBe(30);
  });
});

describe(postCacheInvalidator.name, () => {
  it('drops the post at once in this process and tells the others, but not for a post never listed', async () => {
    const { rows, loads, cache } = setup();
    const bus = createLocalInvalidationBus();
    const heard: string[][] = [];
    bus.subscribe(POST_INVALIDATION_SCOPE, (ids) => heard.push([...ids]));
    subscribePostCache(cache, bus);
    const sut = postCacheInvalidator(cache, bus, (err) => {
      throw err;
    });
    expect((await cache.post('1'))?.title).toBe('post 1');
    const generation = cache.localGeneration;
    await sut({ id: '1', authorId: 1, kind: 'created', draft: true, unlisted: true });
    await sut({ id: '1', authorId: 1, kind: 'updated', draft: true, unlisted: true });
    await sut({ id: '1', authorId: 1, kind: 'deleted', draft: true, unlisted: true });
    // A private post edited or pinned: no cache holds it, no page lists it.
    await sut({ id: '1', authorId: 1, kind: 'updated', draft: false, unlisted: true });
    await sut({ id: '1', authorId: 1, kind: 'top', draft: false, unlisted: true });
    expect(heard).toEqual([]);
    expect(cache.localGeneration).toBe(generation);
    // Made visible to followers: who may see it changed, which every process must hear of.
    await sut({ id: '1', authorId: 1, kind: 'visibility', draft: false, unlisted: true });
    expect(heard).toEqual([['1']]);
    heard.length = 0;
    rows.set('1', { ...row('1'), title: 'renamed' });
    const pending = sut({ id: '1', authorId: 1, kind: 'updated', draft: false, unlisted: false });
    expect((await cache.post('1'))?.title).toBe('renamed');
    await pending;
    expect(heard).toEqual([['1']]);
    expect(loads).toHaveLength(2);
  });

  it('announces a change only once the shared tier has dropped it, and even when that failed', async () => {
    const order: string[] = [];
    let fail = false;
    const slow = Object.assign(new NoSharedCache(), {
      invalidate: async () => {
        await new Promise((resolve) => setTimeout(resolve, 20));
        order.push('shared dropped');
        if (fail) throw new Error('redis down');
      },
    });
    const { cache } = setup(slow);
    const bus: InvalidationBus = {
      publish: async () => {
        order.push('announced');
      },
      subscribe: () => () => {},
      onGap: () => () => {},
      close: async () => {},
    };
    const errors: unknown[] = [];
    const sut = postCacheInvalidator(cache, bus, (err) => errors.push(err));
    await sut({ id: '1', authorId: 1, kind: 'updated', draft: false, unlisted: false });
    fail = true;
    await sut({ id: '1', authorId: 1, kind: 'deleted', draft: false, unlisted: false });
    // Two keys each time (the post and the feed pages' guard).
    expect(order).toEqual([
      'shared dropped',
      'shared dropped',
      'announced',
      'shared dropped',
      'shared dropped',
      'announced',
    ]);
    expect(errors).toHaveLength(1);
  });

  it('reports a failing shared tier instead of throwing', async () => {
    const broken = Object.assign(new NoSharedCache(), {
      invalidate: async () => {
        throw new Error('redis down');
      },
    });
    const { cache } = setup(broken);
    const errors: unknown[] = [];
    const sut = postCacheInvalidator(cache, createLocalInvalidationBus(), (err) => errors.push(err));
    await sut({ id: '1', authorId: 1, kind: 'deleted', draft: false, unlisted: false });
    expect(errors).toHaveLength(1);
  });
});

describe(subscribePostCache.name, () => {
  it('empties this process’s caches when the bus may have lost announcements', async () => {
    const { rows, loads, cache } = setup();
    let gap = () => {};
    const bus: InvalidationBus = {
      publish: async () => {},
      subscribe: () => () => {},
      onGap: (handler) => {
        gap = handler;
        return () => {};
      },
      close: async () => {},
    };
    subscribePostCache(cache, bus);
    await cache.post('1');
    rows.set('1', { ...row('1'), title: 'changed while disconnected' });
    expect((await cache.post('1'))?.title).toBe('post 1');
    gap();
    expect((await cache.post('1'))?.title).toBe('changed while disconnected');
    expect(loads).toHaveLength(2);
  });
});
