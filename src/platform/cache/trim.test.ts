import { describe, expect, it } from 'vitest';
import { trimOldest } from './trim.js';

describe(trimOldest.name, () => {
  it('keeps the newest keys of a small Map or Set exactly at the limit', () => {
    const map = new Map(Array.from({ length: 12 }, (_, i) => [i, i] as const));
    trimOldest(map, 10);
    expect([...map.keys()]).toEqual([2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    const set = new Set([1, 2, 3]);
    trimOldest(set, Number.NaN);
    expect(set.size).toBe(3);
    trimOldest(set, 0);
    expect(set.size).toBe(0);
  });

  it('trims a large one a 64th below its limit, so a churning one starts a walk once per many inserts', () => {
    const map = new Map<number, number>();
    let walks = 0;
    const counted = {
      get size() {
        return map.size;
      },
      keys: () => {
        walks++;
        return map.keys();
      },
      delete: (key: number) => map.delete(key),
    };
    for (let i = 0; i < 50_000; i++) {
      map.set(i, i);
      trimOldest(counted, 10_000);
      expect(map.size).toBeLessThanOrEqual(10_000);
    }
    expect(map.size).toBeGreaterThanOrEqual(10_000 - 10_000 / 64);
    // 40,000 evictions, 156 at a time.
    expect(walks).toBeLessThanOrEqual(Math.ceil(40_000 / 156));
    expect(map.has(49_999)).toBe(true);
  });

  it('deletes through the callback given', () => {
    const map = new Map([
      ['a', 1],
      ['b', 2],
      ['c', 3],
    ]);
    const removed: string[] = [];
    trimOldest(map, 1, (key) => {
      removed.push(key);
      map.delete(key);
    });
    expect([removed, [...map.keys()]]).toEqual([['a', 'b'], ['c']]);
  });
});
