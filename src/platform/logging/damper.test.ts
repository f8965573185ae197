import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { damped, dampedByKind } from './damper.js';

describe('damped lines', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  const clock = () => Date.now();

  it('writes the first at once, then one an interval, each with how many were held before it', () => {
    const say = damped(1_000, clock);
    const written: [string, number][] = [];
    for (let i = 0; i < 5; i++) say((held) => written.push([`a${i}`, held]));
    expect(written).toEqual([['a0', 0]]);
    vi.advanceTimersByTime(400);
    // A line after the interval is written with the count, and the held ones are not told again.
    vi.setSystemTime(Date.now() + 700);
    say((held) => written.push(['b', held]));
    vi.advanceTimersByTime(5_000);
    expect(written).toEqual([
      ['a0', 0],
      ['b', 4],
    ]);
  });

  it('writes the last line held back when the flood stops, with how many others were held', () => {
    const say = damped(1_000, clock);
    const written: [string, number][] = [];
    for (let i = 0; i < 50; i++) say((held) => written.push([`a${i}`, held]));
    vi.advanceTimersByTime(999);
    expect(written).toEqual([['a0', 0]]);
    vi.advanceTimersByTime(1);
    expect(written).toEqual([
      ['a0', 0],
      ['a49', 48],
    ]);
    // That line began an interval of its own: the next is held, and told at its end.
    say((held) => written.push(['b', held]));
    expect(written).toHaveLength(2);
    vi.advanceTimersByTime(1_000);
    expect(written.at(-1)).toEqual(['b', 0]);
    vi.advanceTimersByTime(10_000);
    expect(written).toHaveLength(3);
    // Quiet for longer than an interval: the next line goes at once.
    say((held) => written.push(['c', held]));
    expect(written.at(-1)).toEqual(['c', 0]);
  });

  it('keeps to one line an interval when a timer runs late', () => {
    let at = 0;
    const say = damped(1_000, () => at);
    const written: [string, number][] = [];
    say((held) => written.push(['a', held]));
    say((held) => written.push(['held', held]));
    // The interval ends and a line comes before the timer has run: it is written at once...
    at = 1_000;
    say((held) => written.push(['b', held]));
    say((held) => written.push(['held again', held]));
    // ...and the late timer does not write the one held after it within b's interval.
    vi.advanceTimersByTime(1_000);
    expect(written).toEqual([
      ['a', 0],
      ['b', 1],
    ]);
    at = 2_000;
    vi.advanceTimersByTime(1_000);
    expect(written.at(-1)).toEqual(['held again', 0]);
  });

  it('damps each kind apart', () => {
    const say = dampedByKind(1_000, clock);
    const written: string[] = [];
    for (let i = 0; i < 3; i++) {
      say('redis', () => written.push('redis'));
      say('mysql', () => written.push('mysql'));
    }
    expect(written).toEqual(['redis', 'mysql']);
    vi.advanceTimersByTime(1_000);
    expect(written.sort()).toEqual(['mysql', 'mysql', 'redis', 'redis']);
  });
});
