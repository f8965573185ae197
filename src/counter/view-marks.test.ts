import { describe, expect, it } from 'vitest';
import {
  coveredRanges,
  formatViewMark,
  inRanges,
  mergeRanges,
  offsetRuns,
  parseViewMark,
  planViewMark,
  VIEW_MARK_RANGES,
  type OffsetRange,
} from './view-marks.js';

const views = [{ ref: { etype: 'knowpost' as const, eid: '12' }, n: 1 }];

describe('view marks', () => {
  it('reads what it writes, and nothing else as a mark', () => {
    const mark = {
      ts: 1_700_000_000_123,
      ranges: [[0n, 4n] as const, [9n, 9_007_199_254_740_993n] as const],
    };
    expect(formatViewMark(mark)).toBe('1700000000123:0-4,9-9007199254740993');
    expect(parseViewMark(formatViewMark(mark))).toEqual(mark);
    for (const bad of [
      '',
      '5',
      '5:',
      'x:1-2',
      '5:2-1',
      '5:1-2,2-3',
      '5:1-2,3-4',
      '5:3-4,1-2',
      '5:1-2,',
      '-1:1-2',
    ]) {
      expect(parseViewMark(bad), bad).toBeNull();
    }
    expect(parseViewMark(null)).toBeNull();
  });

  it('finds runs, merges ranges that overlap or touch, and finds offsets in them', () => {
    expect(offsetRuns([5n, 3n, 4n, 9n, 4n, 11n, 10n])).toEqual([
      [3n, 5n],
      [9n, 11n],
    ]);
    expect(
      mergeRanges([
        [10n, 12n],
        [1n, 3n],
        [4n, 4n],
        [11n, 20n],
        [30n, 31n],
      ]),
    ).toEqual([
      [1n, 4n],
      [10n, 20n],
      [30n, 31n],
    ]);
    const ranges: OffsetRange[] = [
      [1n, 4n],
      [10n, 20n],
    ];
    expect([0n, 1n, 4n, 5n, 9n, 10n, 20n, 21n].map((o) => inRanges(ranges, o))).toEqual([
      false,
      true,
      true,
      false,
      false,
      true,
      true,
      false,
    ]);
  });

  it('adds what no range names or what is later, and starts anew for a topic made again', () => {
    const mark = { ts: 100, ranges: [[0n, 9n] as const] };
    const plan = planViewMark(
      mark,
      [[8n, 12n]],
      [
        { offset: 8n, timestamp: 90 },
        { offset: 9n, timestamp: 100 },
        { offset: 10n, timestamp: 50 },
        { offset: 12n, timestamp: 120 },
      ],
    );
    expect(plan.add).toEqual([false, false, true, true]);
    expect(plan.next).toEqual({ ts: 120, ranges: [[0n, 12n]] });
    // A record in a range but later than the mark: the offsets restarted.
    const anew = planViewMark(
      mark,
      [[2n, 3n]],
      [
        { offset: 2n, timestamp: 101 },
        { offset: 3n, timestamp: 99 },
      ],
    );
    expect(anew.add).toEqual([true, true]);
    expect(anew.next).toEqual({ ts: 101, ranges: [[2n, 3n]] });
    expect(planViewMark(null, [[5n, 5n]], [{ offset: 5n, timestamp: 0 }])).toEqual({
      add: [true],
      next: { ts: 0, ranges: [[5n, 5n]] },
    });
  });

  it(`keeps ${VIEW_MARK_RANGES} ranges at most, the lowest merged`, () => {
    let mark = null as ReturnType<typeof planViewMark>['next'] | null;
    for (let i = 0; i < VIEW_MARK_RANGES + 3; i++) {
      const offset = BigInt(i * 10);
      mark = planViewMark(mark, [[offset, offset]], [{ offset, timestamp: 1 }]).next;
    }
    expect(mark!.ranges).toHaveLength(VIEW_MARK_RANGES);
    expect(mark!.ranges.slice(0, 2)).toEqual([
      [0n, 30n],
      [40n, 40n],
    ]);
    expect(mark!.ranges.at(-1)).toEqual([180n, 180n]);
    expect(parseViewMark(formatViewMark(mark!))).toEqual(mark);
  });

  it(`merges the lowest of many ranges given at once into one, in time linear in their number`, () => {
    const count = 100_000;
    const covered = Array.from({ length: count }, (_, i): [bigint, bigint] => [BigInt(i * 2), BigInt(i * 2)]);
    const started = performance.now();
    const { next } = planViewMark({ ts: 1, ranges: [[1n, 1n]] }, covered, []);
    // Quadratic, 100,000 ranges took half a minute.
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(next.ranges).toHaveLength(VIEW_MARK_RANGES);
    const highest = BigInt((count - 1) * 2);
    expect(next.ranges[0]).toEqual([0n, highest - BigInt((VIEW_MARK_RANGES - 1) * 2)]);
    expect(next.ranges.at(-1)).toEqual([highest, highest]);
  });

  it('adds a record handed twice in one call once', () => {
    const plan = planViewMark(
      { ts: 5, ranges: [[0n, 1n]] },
      [[0n, 3n]],
      [
        { offset: 2n, timestamp: 5 },
        { offset: 3n, timestamp: 5 },
        { offset: 1n, timestamp: 5 },
        { offset: 2n, timestamp: 5 },
        { offset: 3n, timestamp: 5 },
      ],
    );
    expect(plan.add).toEqual([true, true, false, false, false]);
  });

  it('names the ranges of a call, its records’ runs by default, and refuses records outside them', () => {
    const records = [0, 1, 2, 5].map((o, i) => ({
      partition: i % 2,
      offset: BigInt(o),
      timestamp: 1,
      views,
    }));
    expect(coveredRanges(records)).toEqual(
      new Map([
        [
          0,
          [
            [0n, 0n],
            [2n, 2n],
          ],
        ],
        [
          1,
          [
            [1n, 1n],
            [5n, 5n],
          ],
        ],
      ]),
    );
    const covered = new Map<number, OffsetRange[]>([
      [0, [[0n, 2n]]],
      [
        1,
        [
          [3n, 5n],
          [1n, 2n],
        ],
      ],
    ]);
    expect(coveredRanges(records, covered)).toEqual(
      new Map([
        [0, [[0n, 2n]]],
        [1, [[1n, 5n]]],
      ]),
    );
    expect(() => coveredRanges(records, new Map([[1, [[2n, 5n]]]]))).toThrow(RangeError);
    expect(() => coveredRanges(records, new Map([[1, [[5n, 1n]]]]))).toThrow(RangeError);
    for (const place of [{ partition: 1.5 }, { offset: -2n }, { timestamp: Number.NaN }]) {
      expect(() => coveredRanges([{ ...records[0]!, ...place }])).toThrow(RangeError);
    }
  });
});
