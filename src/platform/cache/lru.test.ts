import { describe, expect, it } from 'vitest';
import { LruCache, roughBytes } from './lru.js';

describe(LruCache.name, () => {
  const clock = () => {
    let now = 1_000;
    return { now: () => now, advance: (ms: number) => (now += ms) };
  };

  it('returns what was set until its time to live has passed', () => {
    const c = clock();
    const sut = new LruCache<string>({ maxEntries: 10, ttlMs: 100, now: c.now });
    sut.set('a', 'A');
    expect(sut.get('a')).toBe('A');
    c.advance(99);
    expect(sut.get('a')).toBe('A');
    c.advance(1);
    expect(sut.get('a')).toBeUndefined();
    expect(sut.size).toBe(0);
  });

  it('takes an entry set after the clock says it is now (a clock stepped back) as expired', () => {
    const c = clock();
    const sut = new LruCache<string>({ maxEntries: 10, ttlMs: 100, now: c.now });
    sut.set('a', 'A');
    c.advance(-3_600_000);
    expect(sut.get('a')).toBeUndefined();
    sut.set('a', 'B');
    expect(sut.get('a')).toBe('B');
  });

  it('evicts the least recently used entry, counting reads as use', () => {
    const sut = new LruCache<number>({ maxEntries: 3, ttlMs: 1_000 });
    sut.set('a', 1);
    sut.set('b', 2);
    sut.set('c', 3);
    expect(sut.get('a')).toBe(1);
    sut.set('d', 4);
    expect(sut.get('b')).toBeUndefined();
    expect([sut.get('a'), sut.get('c'), sut.get('d')]).toEqual([1, 3, 4]);
    expect(sut.size).toBe(3);
  });

  it('never evicts an entry read since half of the cache was written', () => {
    const sut = new LruCache<number>({ maxEntries: 100, ttlMs: 60_000 });
    let next = 0;
    const hot = ['h1', 'h2', 'h3'];
    for (const k of hot) sut.set(k, next++);
    for (let round = 0; round < 50; round++) {
      // 40 new keys between reads of the hot ones: fewer than half of the cache each time.
      for (let i = 0; i < 40; i++) sut.set(`k${next}`, next++);
      for (const k of hot) expect(sut.get(k)).toBeDefined();
    }
    expect(sut.size).toBe(100);
    // A key that is never read again is evicted once 100 newer writes passed it.
    expect(sut.get('k3')).toBeUndefined();
  });

  it('restarts the time to live and the recency of a key set again', () => {
    const c = clock();
    const sut = new LruCache<string>({ maxEntries: 2, ttlMs: 100, now: c.now });
    sut.set('a', 'old');
    c.advance(80);
    sut.set('a', 'new');
    c.advance(80);
    expect(sut.get('a')).toBe('new');
  });

  it('keeps a value that fits a large weight bound, evicting what came before it to make room', () => {
    const sut = new LruCache<number>({ maxEntries: 100, ttlMs: 1_000, maxWeight: 10_000, weigh: (v) => v });
    sut.set('small', 200);
    sut.set('big', 9_900);
    expect([sut.get('small'), sut.get('big'), sut.size]).toEqual([undefined, 9_900, 1]);
    // Past the bound: the oldest go (a 64th below it), not the one just set.
    sut.set('a', 150);
    expect([sut.get('big'), sut.get('a'), sut.size]).toEqual([undefined, 150, 1]);
  });

  it('keeps the total weight within its bound, evicting the least recently used first', () => {
    const sut = new LruCache<number[]>({
      maxEntries: 100,
      ttlMs: 1_000,
      maxWeight: 10,
      weigh: (v) => v.length,
    });
    sut.set('a', [1, 2, 3, 4]);
    sut.set('b', [1, 2, 3, 4]);
    sut.set('c', [1, 2]);
    expect(sut.size).toBe(3);
    sut.set('d', [1]); // 11 > 10: a goes
    expect([sut.get('a'), sut.size]).toEqual([undefined, 3]);
    // Set again, a value is weighed again; deleted, its weight is freed.
    sut.set('b', [1]);
    sut.delete('c');
    sut.set('e', [1, 2, 3, 4, 5, 6, 7, 8]);
    expect(['b', 'd', 'e'].map((k) => sut.get(k)?.length)).toEqual([1, 1, 8]);
    // A value heavier than the whole bound is not kept, and pushes nothing out; set under a key
    // held, it replaces what the key held all the same.
    sut.set(
      'f',
      Array.from({ length: 11 }, () => 0),
    );
    expect([sut.get('f'), sut.size]).toEqual([undefined, 3]);
    sut.set(
      'b',
      Array.from({ length: 11 }, () => 0),
    );
    expect([sut.get('b'), sut.size]).toEqual([undefined, 2]);
  });

  it('keeps an entry read between writes when its weight bound holds far fewer than its entry bound', () => {
    const sut = new LruCache<number>({ maxEntries: 1_000, ttlMs: 60_000, maxWeight: 10, weigh: () => 1 });
    sut.set('hot', 0);
    for (let i = 1; i <= 100; i++) {
      expect({ i, hot: sut.get('hot') }).toEqual({ i, hot: 0 });
      sut.set(`k${i}`, i);
    }
    expect(sut.size).toBe(10);
  });

  it('keeps nothing when disabled by a zero size or time to live', () => {
    const off = new LruCache<string>({ maxEntries: 0, ttlMs: 1_000 });
    const noTtl = new LruCache<string>({ maxEntries: 10, ttlMs: 0 });
    off.set('a', 'A');
    noTtl.set('a', 'A');
    expect([off.get('a'), noTtl.get('a')]).toEqual([undefined, undefined]);
  });

  it('deletes single keys, matching keys and everything', () => {
    const sut = new LruCache<number>({ maxEntries: 10, ttlMs: 1_000 });
    for (const [i, k] of ['feed:1', 'feed:2', 'post:1', 'post:2'].entries()) sut.set(k, i);
    expect(sut.delete('post:1')).toBe(true);
    expect(sut.delete('post:1')).toBe(false);
    expect(sut.deleteWhere((k) => k.startsWith('feed:'))).toBe(2);
    expect([sut.get('feed:1'), sut.get('post:2')]).toEqual([undefined, 3]);
    sut.clear();
    expect(sut.size).toBe(0);
  });
});

describe(roughBytes.name, () => {
  it('weighs strings by their length and containers by what they hold', () => {
    expect(roughBytes('abcd')).toBe(24);
    expect(roughBytes(7)).toBe(16);
    expect(roughBytes(['ab', 'cd'])).toBe(32 + 20 + 20);
    expect(roughBytes({ a: 'x'.repeat(1000), b: [1, 2] })).toBe(32 + 2016 + 32 + 16 + 16);
    expect(roughBytes(new Map([[1, 'ab']]))).toBe(32 + 20);
    // Four levels deep at most: a value that holds itself ends.
    const loop: unknown[] = [];
    loop.push(loop);
    expect(roughBytes(loop)).toBe(32 * 4 + 16);
  });
});
