import { describe, expect, it } from 'vitest';
import { PostObjectPurger } from './post-purge.js';

describe(PostObjectPurger.name, () => {
  it('goes on past a post the store refuses, and leaves it for the next round', async () => {
    const purged: string[] = [];
    const posts = {
      deletedUnpurged: async (before: number) => {
        expect(before).toBe(1_000_000 - 600_000);
        return ['1', '2', '3'].filter((id) => !purged.includes(id));
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
      now: () => 1_000_000,
      onError: (_err, id) => errors.push(id),
    });
    expect(await sut.runOnce()).toEqual({ posts: 2, objects: 4 });
    expect(purged).toEqual(['1', '3']);
    expect(errors).toEqual(['2']);
    refuse = false;
    expect(await sut.runOnce()).toEqual({ posts: 1, objects: 2 });
    expect(purged).toEqual(['1', '3', '2']);
  });
});
