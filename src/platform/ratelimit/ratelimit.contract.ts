import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { RateLimiter } from './ratelimit.js';

export interface RateLimiterFixture {
  sut: RateLimiter;
  /** Moves the adapter's clock forward; without it the suite waits in real time. */
  advance?: (ms: number) => void;
  cleanup: () => Promise<void>;
}

/** The behaviour every `RateLimiter` adapter must show. */
export function defineRateLimiterContract(name: string, factory: () => Promise<RateLimiterFixture>): void {
  describe(`RateLimiter contract: ${name}`, () => {
    let fx: RateLimiterFixture;
    let rl: RateLimiter;
    const elapse = async (ms: number): Promise<void> => {
      if (fx.advance) fx.advance(ms);
      else await sleep(ms);
    };

    beforeEach(async () => {
      fx = await factory();
      rl = fx.sut;
    });
    afterEach(async () => {
      await fx.cleanup();
    });

    it('allows up to the limit, counting remaining down, then refuses', async () => {
      const decisions = [];
      for (let i = 0; i < 5; i++) decisions.push(await rl.hit('login:alice', 3, 60_000));
      expect(decisions.map((d) => d.allowed)).toEqual([true, true, true, false, false]);
      expect(decisions.map((d) => d.remaining)).toEqual([2, 1, 0, 0, 0]);
      expect(decisions.slice(0, 3).map((d) => d.retryAfterMs)).toEqual([0, 0, 0]);
    });

    it('allows exactly `limit` of 30 concurrent hits', async () => {
      const decisions = await Promise.all(Array.from({ length: 30 }, () => rl.hit('burst', 5, 60_000)));
      const allowed = decisions.filter((d) => d.allowed);
      expect(allowed).toHaveLength(5);
      expect(allowed.map((d) => d.remaining).sort()).toEqual([0, 1, 2, 3, 4]);
      for (const d of decisions.filter((x) => !x.allowed)) {
        expect(d.remaining).toBe(0);
        expect(d.retryAfterMs).toBeGreaterThan(0);
        expect(d.retryAfterMs).toBeLessThanOrEqual(60_000);
      }
    });

    it('allows all of fewer concurrent hits than the limit', async () => {
      const decisions = await Promise.all(Array.from({ length: 4 }, () => rl.hit('few', 10, 60_000)));
      expect(decisions.every((d) => d.allowed)).toBe(true);
      expect(decisions.map((d) => d.remaining).sort((a, b) => a - b)).toEqual([6, 7, 8, 9]);
    });

    it('reports retryAfterMs as the time left in the window', async () => {
      await rl.hit('k', 1, 10_000);
      const first = await rl.hit('k', 1, 10_000);
      expect(first.allowed).toBe(false);
      expect(first.retryAfterMs).toBeGreaterThan(9_000);
      expect(first.retryAfterMs).toBeLessThanOrEqual(10_000);
      await elapse(100);
      const later = await rl.hit('k', 1, 10_000);
      expect(later.allowed).toBe(false);
      expect(later.retryAfterMs).toBeLessThan(first.retryAfterMs);
      expect(later.retryAfterMs).toBeGreaterThan(0);
    });

    it('starts a fresh window once the current one has passed', async () => {
      expect((await rl.hit('w', 2, 200)).allowed).toBe(true);
      expect((await rl.hit('w', 2, 200)).allowed).toBe(true);
      const refused = await rl.hit('w', 2, 200);
      expect(refused.allowed).toBe(false);
      expect(refused.retryAfterMs).toBeLessThanOrEqual(200);
      await elapse(300);
      const fresh = await rl.hit('w', 2, 200);
      expect(fresh).toEqual({ allowed: true, remaining: 1, retryAfterMs: 0 });
    });

    it('forgets the window on reset', async () => {
      for (let i = 0; i < 3; i++) await rl.hit('r', 2, 60_000);
      expect((await rl.hit('r', 2, 60_000)).allowed).toBe(false);
      await rl.reset('r');
      expect(await rl.hit('r', 2, 60_000)).toEqual({ allowed: true, remaining: 1, retryAfterMs: 0 });
      await rl.reset('never-hit');
    });

    it('keeps keys independent', async () => {
      await rl.hit('a', 1, 60_000);
      expect((await rl.hit('a', 1, 60_000)).allowed).toBe(false);
      expect((await rl.hit('b', 1, 60_000)).allowed).toBe(true);
      await rl.reset('b');
      expect((await rl.hit('a', 1, 60_000)).allowed).toBe(false);
    });

    it('refuses everything with a limit of 0', async () => {
      const d = await rl.hit('zero', 0, 60_000);
      expect(d.allowed).toBe(false);
      expect(d.remaining).toBe(0);
      expect(d.retryAfterMs).toBeGreaterThan(0);
    });

    it('rejects invalid arguments', async () => {
      await expect(rl.hit('x', -1, 1_000)).rejects.toThrow(RangeError);
      await expect(rl.hit('x', 1.5, 1_000)).rejects.toThrow(RangeError);
      await expect(rl.hit('x', 1, 0)).rejects.toThrow(RangeError);
    });
  });
}
