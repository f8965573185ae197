import { describe, expect, it } from 'vitest';
import type { Counts, EntityRef } from './model.js';
import { recentCounts, type CountsReader } from './recent-counts.js';

const post = (eid: string): EntityRef => ({ etype: 'knowpost', eid });

function source() {
  const calls: string[][] = [];
  let like = 1;
  const read: CountsReader = async (refs) => {
    calls.push(refs.map((r) => `${r.etype}:${r.eid}`));
    return refs.map((): Counts => [0, like, 0, 0, 0]);
  };
  return { read, calls, setLike: (n: number) => (like = n) };
}

describe(recentCounts.name, () => {
  it('reads each entity’s counts at most once per ttl, shared by concurrent callers', async () => {
    let now = 0;
    const { read, calls, setLike } = source();
    const cached = recentCounts(read, { ttlMs: 200, maxEntries: 100, now: () => now });
    const [a, b] = await Promise.all([
      cached([post('1'), post('2')]),
      cached([post('2'), post('3'), post('2')]),
    ]);
    expect(a.map((c) => c[1])).toEqual([1, 1]);
    expect(b).toHaveLength(3);
    expect(calls.flat().sort()).toEqual(['knowpost:1', 'knowpost:2', 'knowpost:3']);
    setLike(5);
    now = 199;
    expect((await cached([post('1')]))[0]![1]).toBe(1);
    now = 200;
    expect((await cached([post('1'), post('3')])).map((c) => c[1])).toEqual([5, 5]);
    expect(calls).toHaveLength(3);
  });

  it('keeps entity types apart and is the reader itself when disabled', async () => {
    const { read, calls } = source();
    expect(recentCounts(read, { ttlMs: 0, maxEntries: 10 })).toBe(read);
    const cached = recentCounts(read, { ttlMs: 1000, maxEntries: 10 });
    await cached([post('1'), { etype: 'user', eid: '1' } as unknown as EntityRef]);
    expect(calls).toEqual([['knowpost:1', 'user:1']]);
  });
});
