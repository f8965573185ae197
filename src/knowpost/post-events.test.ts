import { describe, expect, it } from 'vitest';
import {
  CROSSINGS_KEPT_MS,
  CROSSINGS_MAX,
  parseCrossings,
  withCrossing,
  type PublicCrossing,
} from './post-events.js';

describe("a post's kept crossings", () => {
  it('keep the latest ones up to a bound, and drop what they outlived', () => {
    let json = '[]';
    for (let i = 1; i <= CROSSINGS_MAX + 5; i++) json = withCrossing(json, [i, 1, i]);
    const kept = parseCrossings(json);
    expect(kept).toHaveLength(CROSSINGS_MAX);
    expect(kept[0]).toEqual([6, 1, 6]);
    expect(kept.at(-1)).toEqual([CROSSINGS_MAX + 5, 1, CROSSINGS_MAX + 5]);

    const later = CROSSINGS_MAX + 5 + CROSSINGS_KEPT_MS;
    expect(parseCrossings(withCrossing(json, [9_999, -1, later]))).toEqual([
      [CROSSINGS_MAX + 5, 1, CROSSINGS_MAX + 5],
      [9_999, -1, later],
    ]);
  });

  it('read nothing from what is not a list of crossings', () => {
    for (const json of ['', 'null', '{}', '"x"', '[[1,2,3]]', '[[1,1]]', '[["1",1,2]]'])
      expect(parseCrossings(json)).toEqual([]);
    const good: PublicCrossing = [0, -1, 5];
    expect(parseCrossings(JSON.stringify([good, [1, 0, 5]]))).toEqual([good]);
  });
});
