import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { KeyValueStore } from './kv.js';

export interface KeyValueStoreFixture {
  sut: KeyValueStore;
  /** Moves the adapter's clock forward; without it the suite waits in real time. */
  advance?: (ms: number) => void;
  cleanup: () => Promise<void>;
}

/**
 * The behaviour every `KeyValueStore` adapter must show. TTLs are short enough to wait out in real
 * time when the adapter's clock cannot be advanced, and long enough that a loaded machine does not
 * expire a key before the assertion that expects it present.
 */
export function defineKeyValueStoreContract(
  name: string,
  factory: () => Promise<KeyValueStoreFixture>,
): void {
  describe(`KeyValueStore contract: ${name}`, () => {
    let fx: KeyValueStoreFixture;
    let kv: KeyValueStore;
    const elapse = async (ms: number): Promise<void> => {
      if (fx.advance) fx.advance(ms);
      else await sleep(ms);
    };

    beforeEach(async () => {
      fx = await factory();
      kv = fx.sut;
    });
    afterEach(async () => {
      await fx.cleanup();
    });

    describe('get / set', () => {
      it('returns null for a missing key and the value for a present one', async () => {
        expect(await kv.get('absent')).toBeNull();
        await kv.set('a', 'alpha');
        expect(await kv.get('a')).toBe('alpha');
      });

      it('stores strings verbatim, including empty and non-ASCII ones', async () => {
        await kv.set('empty', '');
        await kv.set('text', '知光 ✓ "quoted" \n line');
        expect(await kv.get('empty')).toBe('');
        expect(await kv.get('text')).toBe('知光 ✓ "quoted" \n line');
      });

      it('replaces the value and the expiry', async () => {
        await kv.set('a', 'one', 10_000);
        await kv.set('a', 'two');
        expect(await kv.get('a')).toBe('two');
        expect(await kv.ttl('a')).toBe(-1);
        await kv.set('a', 'three', 5_000);
        const ttl = await kv.ttl('a');
        expect(ttl).toBeGreaterThan(4_000);
        expect(ttl).toBeLessThanOrEqual(5_000);
      });

      it('makes a key with a passed TTL behave as missing', async () => {
        await kv.set('short', 'v', 150);
        await kv.set('long', 'v', 60_000);
        expect(await kv.get('short')).toBe('v');
        await elapse(250);
        expect(await kv.get('short')).toBeNull();
        expect(await kv.ttl('short')).toBeNull();
        expect(await kv.get('long')).toBe('v');
      });

      it('rejects a non-positive TTL', async () => {
        await expect(kv.set('a', 'v', 0)).rejects.toThrow(RangeError);
        await expect(kv.set('a', 'v', -5)).rejects.toThrow(RangeError);
        await expect(kv.setIfAbsent('a', 'v', Number.NaN)).rejects.toThrow(RangeError);
        expect(await kv.get('a')).toBeNull();
      });
    });

    describe('mget', () => {
      it('returns values in the order asked, null where missing or expired', async () => {
        await kv.set('m1', 'one');
        await kv.set('m2', 'two');
        await kv.set('gone', 'x', 100);
        await elapse(200);
        expect(await kv.mget(['m2', 'nope', 'm1', 'gone', 'm2'])).toEqual(['two', null, 'one', null, 'two']);
      });

      it('returns an empty list for no keys', async () => {
        expect(await kv.mget([])).toEqual([]);
      });

      it('handles many keys in one call', async () => {
        const keys = Array.from({ length: 1_200 }, (_, i) => `bulk:${i}`);
        await Promise.all(keys.filter((_, i) => i % 3 === 0).map((k) => kv.set(k, k.toUpperCase())));
        const values = await kv.mget(keys);
        expect(values).toHaveLength(keys.length);
        values.forEach((v, i) => expect(v).toBe(i % 3 === 0 ? `BULK:${i}` : null));
      });
    });

    describe('setIfAbsent', () => {
      it('sets a missing key and refuses a present one', async () => {
        expect(await kv.setIfAbsent('once', 'first')).toBe(true);
        expect(await kv.setIfAbsent('once', 'second')).toBe(false);
        expect(await kv.get('once')).toBe('first');
        expect(await kv.ttl('once')).toBe(-1);
      });

      it('applies the TTL when it sets, and treats an expired key as missing', async () => {
        expect(await kv.setIfAbsent('lease', 'a', 150)).toBe(true);
        expect(await kv.setIfAbsent('lease', 'b', 150)).toBe(false);
        const ttl = await kv.ttl('lease');
        expect(ttl).toBeGreaterThan(0);
        expect(ttl).toBeLessThanOrEqual(150);
        await elapse(250);
        expect(await kv.setIfAbsent('lease', 'c', 60_000)).toBe(true);
        expect(await kv.get('lease')).toBe('c');
        expect(await kv.ttl('lease')).toBeGreaterThan(50_000);
      });

      it('has exactly one winner among 50 concurrent callers', async () => {
        const results = await Promise.all(
          Array.from({ length: 50 }, (_, i) => kv.setIfAbsent('race', `caller-${i}`, 60_000)),
        );
        const winners = results.flatMap((won, i) => (won ? [i] : []));
        expect(winners).toHaveLength(1);
        expect(await kv.get('race')).toBe(`caller-${winners[0]}`);
      });
    });

    describe('getDel', () => {
      it('returns the value and removes the key; null when missing or expired', async () => {
        await kv.set('token', 'secret');
        expect(await kv.getDel('token')).toBe('secret');
        expect(await kv.get('token')).toBeNull();
        expect(await kv.getDel('token')).toBeNull();
        await kv.set('stale', 'old', 100);
        await elapse(200);
        expect(await kv.getDel('stale')).toBeNull();
      });

      it('hands the value to exactly one of 50 concurrent callers', async () => {
        await kv.set('code', '123456', 60_000);
        const results = await Promise.all(Array.from({ length: 50 }, () => kv.getDel('code')));
        expect(results.filter((r) => r !== null)).toEqual(['123456']);
        expect(await kv.get('code')).toBeNull();
      });
    });

    describe('delete', () => {
      it('says whether the key existed', async () => {
        await kv.set('d', 'v');
        expect(await kv.delete('d')).toBe(true);
        expect(await kv.get('d')).toBeNull();
        expect(await kv.delete('d')).toBe(false);
        expect(await kv.delete('never')).toBe(false);
      });

      it('reports an expired key as not existing', async () => {
        await kv.set('d', 'v', 100);
        await elapse(200);
        expect(await kv.delete('d')).toBe(false);
      });
    });

    describe('expire', () => {
      it('gives a live key a new lifetime and keeps its value', async () => {
        await kv.set('e', 'v', 100);
        expect(await kv.expire('e', 60_000)).toBe(true);
        await elapse(200);
        expect(await kv.get('e')).toBe('v');
        expect(await kv.ttl('e')).toBeGreaterThan(50_000);
        await kv.set('f', 'w');
        expect(await kv.expire('f', 100)).toBe(true);
        await elapse(200);
        expect(await kv.get('f')).toBeNull();
      });

      it('creates nothing for a missing or expired key', async () => {
        expect(await kv.expire('never', 60_000)).toBe(false);
        expect(await kv.get('never')).toBeNull();
        await kv.set('gone', 'v', 100);
        await elapse(200);
        expect(await kv.expire('gone', 60_000)).toBe(false);
        expect(await kv.get('gone')).toBeNull();
      });

      it('rejects a non-positive TTL', async () => {
        await kv.set('t', 'v');
        await expect(kv.expire('t', 0)).rejects.toThrow(RangeError);
        expect(await kv.ttl('t')).toBe(-1);
      });
    });

    describe('expireIfEquals and deleteIfEquals', () => {
      it('renew or delete a live key only while it holds the value compared', async () => {
        await kv.set('lock', 'mine', 100);
        expect(await kv.expireIfEquals('lock', 'theirs', 60_000)).toBe(false);
        expect(await kv.deleteIfEquals('lock', 'theirs')).toBe(false);
        expect(await kv.expireIfEquals('lock', 'mine', 60_000)).toBe(true);
        await elapse(200);
        expect(await kv.get('lock')).toBe('mine');
        expect(await kv.ttl('lock')).toBeGreaterThan(50_000);
        expect(await kv.deleteIfEquals('lock', 'min')).toBe(false);
        expect(await kv.deleteIfEquals('lock', 'mine')).toBe(true);
        expect(await kv.get('lock')).toBeNull();
        expect(await kv.deleteIfEquals('lock', 'mine')).toBe(false);
      });

      it('make nothing of a missing or expired key', async () => {
        expect(await kv.expireIfEquals('never', 'v', 60_000)).toBe(false);
        expect(await kv.get('never')).toBeNull();
        await kv.set('gone', 'v', 100);
        await elapse(200);
        expect(await kv.expireIfEquals('gone', 'v', 60_000)).toBe(false);
        expect(await kv.deleteIfEquals('gone', 'v')).toBe(false);
        expect(await kv.get('gone')).toBeNull();
        expect(await kv.setIfAbsent('gone', 'w')).toBe(true);
      });

      it('compare whole values, not numbers or prefixes', async () => {
        await kv.set('n', '10');
        expect(await kv.deleteIfEquals('n', '10.0')).toBe(false);
        expect(await kv.deleteIfEquals('n', '1')).toBe(false);
        expect(await kv.get('n')).toBe('10');
      });

      it('reject a non-positive TTL and leave the key alone', async () => {
        await kv.set('t', 'v');
        await expect(kv.expireIfEquals('t', 'v', 0)).rejects.toThrow(RangeError);
        expect(await kv.ttl('t')).toBe(-1);
      });
    });

    describe('incr', () => {
      it('counts from 0 for a missing key and adds `by`, including negative steps', async () => {
        expect(await kv.incr('n')).toBe(1);
        expect(await kv.incr('n')).toBe(2);
        expect(await kv.incr('n', 10)).toBe(12);
        expect(await kv.incr('n', -15)).toBe(-3);
        expect(await kv.get('n')).toBe('-3');
        expect(await kv.incr('fresh', 7)).toBe(7);
      });

      it('counts on top of a value written by set', async () => {
        await kv.set('n', '41');
        expect(await kv.incr('n')).toBe(42);
        expect(await kv.get('n')).toBe('42');
      });

      it('rejects a value that is not an integer and leaves it alone', async () => {
        await kv.set('s', 'abc');
        await expect(kv.incr('s')).rejects.toThrow();
        expect(await kv.get('s')).toBe('abc');
        await kv.set('f', '1.5');
        await expect(kv.incr('f')).rejects.toThrow();
        expect(await kv.get('f')).toBe('1.5');
      });

      it('rejects a non-integer step', async () => {
        await expect(kv.incr('n', 1.5)).rejects.toThrow(RangeError);
        expect(await kv.get('n')).toBeNull();
      });

      it('loses nothing among 200 concurrent increments', async () => {
        const results = await Promise.all(Array.from({ length: 200 }, () => kv.incr('hits', 1, 60_000)));
        expect(await kv.get('hits')).toBe('200');
        expect([...results].sort((a, b) => a - b)).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
      });

      it('applies the TTL only when it creates the key', async () => {
        expect(await kv.incr('c', 1, 10_000)).toBe(1);
        expect(await kv.incr('c', 1, 60_000)).toBe(2);
        expect(await kv.incr('c')).toBe(3);
        const ttl = await kv.ttl('c');
        expect(ttl).toBeGreaterThan(5_000);
        expect(ttl).toBeLessThanOrEqual(10_000);
      });

      it('does not add an expiry to an existing key that has none', async () => {
        await kv.set('p', '5');
        expect(await kv.incr('p', 1, 100)).toBe(6);
        expect(await kv.ttl('p')).toBe(-1);
        await elapse(200);
        expect(await kv.get('p')).toBe('6');
      });

      it('keeps the original expiry, then starts over once it has passed', async () => {
        expect(await kv.incr('w', 1, 300)).toBe(1);
        await elapse(100);
        expect(await kv.incr('w', 1, 60_000)).toBe(2);
        const ttl = await kv.ttl('w');
        expect(ttl).not.toBeNull();
        expect(ttl).toBeLessThanOrEqual(200);
        await elapse(250);
        expect(await kv.get('w')).toBeNull();
        expect(await kv.incr('w', 5, 60_000)).toBe(5);
        expect(await kv.ttl('w')).toBeGreaterThan(50_000);
      });
    });

    describe('ttl', () => {
      it('is null when missing, -1 without expiry, and the remaining ms otherwise', async () => {
        expect(await kv.ttl('none')).toBeNull();
        await kv.set('forever', 'v');
        expect(await kv.ttl('forever')).toBe(-1);
        await kv.set('timed', 'v', 10_000);
        const first = await kv.ttl('timed');
        expect(first).toBeGreaterThan(9_000);
        expect(first).toBeLessThanOrEqual(10_000);
        await elapse(100);
        const second = await kv.ttl('timed');
        expect(second).toBeLessThan(first ?? 0);
        expect(second).toBeGreaterThan(0);
      });
    });
  });
}
