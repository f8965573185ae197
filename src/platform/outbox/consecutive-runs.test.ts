import { describe, expect, it } from 'vitest';
import { consecutiveRuns } from './mysql-outbox-store.js';

describe('consecutiveRuns', () => {
  it('covers exactly the ids, in order, with the fewest runs', () => {
    expect(consecutiveRuns([])).toEqual([]);
    expect(consecutiveRuns([7])).toEqual([[7, 7]]);
    expect(consecutiveRuns([5, 3, 4, 9, 10, 12])).toEqual([
      [3, 5],
      [9, 10],
      [12, 12],
    ]);
    expect(consecutiveRuns([2, 2, 1])).toEqual([[1, 2]]);
  });

  it('never spans an id it was not given', () => {
    const ids = Array.from({ length: 300 }, (_, i) => i * 3 + (i % 2)).filter((id) => id % 7 !== 0);
    const given = new Set(ids);
    const runs = consecutiveRuns(ids);
    let covered = 0;
    for (const [from, to] of runs) {
      for (let id = from; id <= to; id++) expect(given.has(id)).toBe(true);
      covered += to - from + 1;
    }
    expect(covered).toBe(given.size);
  });
});
