import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { CacheRead, SharedCache } from './shared-cache.js';

export interface SharedCacheFixture {
  sut: SharedCache;
  /** Whether the adapter keeps values at all (the embedded one keeps nothing). */
  remembers: boolean;
  cleanup: () => Promise<void>;
}

/** The behaviour every `SharedCache` adapter must show. */
export function defineSharedCacheContract(name: string, factory: () => Promise<SharedCacheFixture>): void {
  describe(`SharedCache contract: ${name}`, () => {
    let fx: SharedCacheFixture;
    let cache: SharedCache;
    /** What a `get` must return for a value that was filled: the value, or nothing at all. */
    const kept = (value: string) => (fx.remembers ? value : null);
    const values = (reads: CacheRead[]) => reads.map((r) => r.value);

    beforeEach(async () => {
      fx = await factory();
      cache = fx.sut;
    });
    afterEach(async () => {
      await fx.cleanup();
    });

    it('answers one read per slot, in order, null for what was never filled', async () => {
      const reads = await cache.get([
        { key: 'a', guard: 'a' },
        { key: 'b', guard: 'g' },
      ]);
      expect(reads).toHaveLength(2);
      expect(values(reads)).toEqual([null, null]);
      for (const r of reads) expect(typeof r.gen).toBe('string');
      expect(await cache.get([])).toEqual([]);
    });

    it('returns a filled value under its own key only, verbatim', async () => {
      const [a] = await cache.get([{ key: 'a', guard: 'a' }]);
      const text = '知光 | "x" |0|';
      await cache.fill([{ key: 'a', guard: 'a', gen: a!.gen, value: text }], 10_000);
      const reads = await cache.get([
        { key: 'b', guard: 'b' },
        { key: 'a', guard: 'a' },
        { key: 'a', guard: 'other' },
      ]);
      expect(values(reads)).toEqual([null, kept(text), null]);
      const [e] = await cache.get([{ key: 'e', guard: 'e' }]);
      await cache.fill([{ key: 'e', guard: 'e', gen: e!.gen, value: '' }], 10_000);
      expect(values(await cache.get([{ key: 'e', guard: 'e' }]))).toEqual([kept('')]);
    });

    it('hides every value under a guard once it is invalidated, and only those', async () => {
      const slots = [
        { key: 'feed:1', guard: 'feed' },
        { key: 'feed:2', guard: 'feed' },
        { key: 'post:1', guard: 'post:1' },
      ];
      // Guards a change has made (a fill under a guard nobody made yet may be the only one kept).
      await cache.invalidate(['feed', 'post:1']);
      const reads = await cache.get(slots);
      await cache.fill(
        slots.map((s, i) => ({ ...s, gen: reads[i]!.gen, value: `v${i}` })),
        10_000,
      );
      expect(values(await cache.get(slots))).toEqual([kept('v0'), kept('v1'), kept('v2')]);
      await cache.invalidate(['feed']);
      expect(values(await cache.get(slots))).toEqual([null, null, kept('v2')]);
    });

    it('refuses a fill based on a generation read before an invalidation', async () => {
      const slot = { key: 'post:7', guard: 'post:7' };
      const [before] = await cache.get([slot]);
      await cache.invalidate([slot.guard]);
      await cache.fill([{ ...slot, gen: before!.gen, value: 'old' }], 10_000);
      const [after] = await cache.get([slot]);
      expect(after!.value).toBeNull();
      if (fx.remembers) expect(after!.gen).not.toBe(before!.gen);
      await cache.fill([{ ...slot, gen: after!.gen, value: 'new' }], 10_000);
      expect(values(await cache.get([slot]))).toEqual([kept('new')]);
    });

    it('forgets a value once its time to live has passed', async () => {
      const slot = { key: 'short', guard: 'short' };
      const [r] = await cache.get([slot]);
      await cache.fill([{ ...slot, gen: r!.gen, value: 'v' }], 300);
      expect(values(await cache.get([slot]))).toEqual([kept('v')]);
      await sleep(700);
      expect(values(await cache.get([slot]))).toEqual([null]);
    });
  });
}
