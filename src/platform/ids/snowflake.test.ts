import { describe, expect, it } from 'vitest';
import { SnowflakeGenerator, parseSnowflake } from './snowflake.js';

describe(SnowflakeGenerator.name, () => {
  it('makes unique, increasing ids that carry the time and worker', () => {
    let now = Date.UTC(2026, 5, 1);
    const sut = new SnowflakeGenerator(37, () => now);
    const ids = Array.from({ length: 10_000 }, (_, i) => {
      if (i % 1000 === 0) now++;
      return sut.next();
    });
    expect(new Set(ids).size).toBe(ids.length);
    const asBig = ids.map(BigInt);
    expect(asBig.every((id, i) => i === 0 || id > asBig[i - 1]!)).toBe(true);
    expect(parseSnowflake(ids[0]!)).toEqual({
      timestampMs: Date.UTC(2026, 5, 1) + 1,
      workerId: 37,
      sequence: 0,
    });
    expect(ids[0]).toMatch(/^\d{17,19}$/);
  });

  it('stays unique and increasing when the clock steps back', () => {
    let now = Date.UTC(2026, 5, 1, 12);
    const sut = new SnowflakeGenerator(1, () => now);
    const before = [sut.next(), sut.next()];
    now -= 5_000;
    const after = Array.from({ length: 5000 }, () => sut.next());
    const all = [...before, ...after].map(BigInt);
    expect(new Set(all).size).toBe(all.length);
    expect(all.every((id, i) => i === 0 || id > all[i - 1]!)).toBe(true);
  });

  it('moves to the next millisecond when 4,096 ids are used within one', () => {
    const sut = new SnowflakeGenerator(2, () => Date.UTC(2026, 0, 1));
    const ids = Array.from({ length: 4097 }, () => sut.next());
    expect(parseSnowflake(ids[4095]!).sequence).toBe(4095);
    expect(parseSnowflake(ids[4096]!)).toMatchObject({ sequence: 0, timestampMs: Date.UTC(2026, 0, 1) + 1 });
  });

  it('refuses worker ids outside 0..1023', () => {
    expect(() => new SnowflakeGenerator(1024)).toThrow(RangeError);
    expect(() => new SnowflakeGenerator(-1)).toThrow(RangeError);
  });
});
