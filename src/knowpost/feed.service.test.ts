import { describe, expect, it } from 'vitest';
import type { Counts, EntityRef } from '../counter/model.js';
import { refOf, withCountsCache, type PostInteractions } from './feed.service.js';

function inner() {
  const calls: string[][] = [];
  let like = 1;
  const sut: PostInteractions = {
    counts: async (refs: readonly EntityRef[]) => {
      calls.push(refs.map((r) => r.eid));
      return refs.map((): Counts => [0, like, 0, 0, 0]);
    },
    flags: async (_userId, refs) => refs.map(() => ({ like: true, fav: false })),
  };
  return { sut, calls, setLike: (n: number) => (like = n) };
}

describe(withCountsCache.name, () => {
  it('reads each post’s counts at most once per ttl, shared by concurrent callers', async () => {
    let now = 0;
    const { sut, calls, setLike } = inner();
    const cached = withCountsCache(sut, { ttlMs: 200, maxEntries: 100, now: () => now });
    const [a, b] = await Promise.all([
      cached.counts([refOf('1'), refOf('2')]),
      cached.counts([refOf('2'), refOf('3'), refOf('2')]),
    ]);
    expect(a.map((c) => c[1])).toEqual([1, 1]);
    expect(b).toHaveLength(3);
    expect(calls.flat().sort()).toEqual(['1', '2', '3']);
    setLike(5);
    now = 199;
    expect((await cached.counts([refOf('1')]))[0]![1]).toBe(1);
    now = 200;
    expect((await cached.counts([refOf('1'), refOf('3')])).map((c) => c[1])).toEqual([5, 5]);
    expect(calls).toHaveLength(3);
  });

  it('always reads flags live and is the identity when disabled', async () => {
    const { sut } = inner();
    expect(withCountsCache(sut, { ttlMs: 0, maxEntries: 10 })).toBe(sut);
    const cached = withCountsCache(sut, { ttlMs: 1000, maxEntries: 10 });
    expect(await cached.flags(1, [refOf('1')])).toEqual([{ like: true, fav: false }]);
  });
});
