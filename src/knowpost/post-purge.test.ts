import { describe, expect, it } from 'vitest';
import { PostObjectPurger } from './post-purge.js';

describe(PostObjectPurger.name, () => {
  it('goes on past a post the store refuses, and tries it again ten minutes later', async () => {
    const purged: string[] = [];
    let now = 1_000_000;
    const posts = {
      deletedUnpurged: async (before: number, limit: number) => {
        expect(before).toBe(now - 600_000);
        return ['1', '2', '3'].filter((id) => !purged.includes(id)).slice(0, limit);
      },
      markPurged: async (id: string) => void purged.push(id),
    };
    let refuse = true;
    const storage = {
      deletePrefix: async (prefix: string) => {
        if (prefix === 'posts/2' && refuse) throw new Error('AccessDenied');
        return 2;
      },
    };
    const errors: string[] = [];
    const sut = new PostObjectPurger(posts, storage, {
      graceMs: 600_000,
      now: () => now,
      onError: (_err, id) => errors.push(id),
    });
    expect(await sut.runOnce()).toEqual({ posts: 2, objects: 4 });
    expect(purged).toEqual(['1', '3']);
    expect(errors).toEqual(['2']);
    refuse = false;
    expect(await sut.runOnce()).toEqual({ posts: 0, objects: 0 });
    now += 10 * 60_000;
    expect(await sut.runOnce()).toEqual({ posts: 1, objects: 2 });
    expect(purged).toEqual(['1', '3', '2']);
  });

  it('ends its round at a store out of reach, and at its stop signal, never between a delete and its mark', async () => {
    const purged: string[] = [];
    const deleted: string[] = [];
    const posts = {
      deletedUnpurged: async () => ['1', '2', '3'].filter((id) => !purged.includes(id)),
      markPurged: async (id: string) => void purged.push(id),
    };
    let down = true;
    const storage = {
      deletePrefix: async (prefix: string) => {
        if (down) throw Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' });
        deleted.push(prefix);
        return 1;
      },
    };
    const errors: string[] = [];
    let now = 1_000_000;
    const sut = new PostObjectPurger(posts, storage, {
      graceMs: 0,
      now: () => now,
      onError: (_e, id) => errors.push(id),
    });
    // Out of reach: one post tried, the others wait for the next round.
    expect(await sut.runOnce()).toEqual({ posts: 0, objects: 0 });
    expect(errors).toEqual(['1']);
    down = false;
    now += 10 * 60_000;
    const stop = new AbortController();
    const stopping = { ...posts, markPurged: async (id: string) => (purged.push(id), stop.abort()) };
    const stopped = new PostObjectPurger(stopping, storage, { graceMs: 0, now: () => now });
    expect(await stopped.runOnce(stop.signal)).toEqual({ posts: 1, objects: 1 });
    expect([deleted, purged]).toEqual([['posts/1'], ['1']]);
  });

  it('is not held up by a full batch of posts the store keeps refusing', async () => {
    const purged: string[] = [];
    const ids = Array.from({ length: 6 }, (_, i) => String(i + 1));
    const posts = {
      deletedUnpurged: async (_before: number, limit: number) =>
        ids.filter((id) => !purged.includes(id)).slice(0, limit),
      markPurged: async (id: string) => void purged.push(id),
    };
    const storage = {
      deletePrefix: async (prefix: string) => {
        if (Number(prefix.slice('posts/'.length)) <= 3) throw new Error('AccessDenied');
        return 1;
      },
    };
    const sut = new PostObjectPurger(posts, storage, { graceMs: 0, batch: 3, onError: () => undefined });
    expect(await sut.runOnce()).toEqual({ posts: 3, objects: 3 });
    expect(purged).toEqual(['4', '5', '6']);
    expect(await sut.runOnce()).toEqual({ posts: 0, objects: 0 });
  });

  it('takes a backlog a batch after another within its budget, and ends a round that makes no progress', async () => {
    const purged: string[] = [];
    let ids = Array.from({ length: 250 }, (_, i) => String(i + 1));
    let queries = 0;
    const posts = {
      deletedUnpurged: async (_before: number, limit: number) => {
        queries++;
        return ids.filter((id) => !purged.includes(id)).slice(0, limit);
      },
      markPurged: async (id: string) => void purged.push(id),
    };
    const sut = new PostObjectPurger(posts, { deletePrefix: async () => 1 }, { graceMs: 0 });
    expect(await sut.runOnce()).toEqual({ posts: 250, objects: 250 });
    expect(queries).toBe(3);
    // Refused by a store that forgets nothing: past the posts it keeps for later, a batch failing
    // whole ends the round instead of being taken again and again.
    ids = Array.from({ length: 1_500 }, (_, i) => `r${i}`);
    let tries = 0;
    const refusing = new PostObjectPurger(
      posts,
      {
        deletePrefix: async () => {
          tries++;
          throw new Error('AccessDenied');
        },
      },
      { graceMs: 0, onError: () => undefined },
    );
    expect(await refusing.runOnce()).toEqual({ posts: 0, objects: 0 });
    expect(tries).toBe(1_100);
  });
});
