import { describe, expect, it } from 'vitest';
import { MemoryRateLimiter } from './memory-ratelimit.js';
import { defineRateLimiterContract } from './ratelimit.contract.js';

defineRateLimiterContract('memory (advanced clock)', async () => {
  let now = Date.parse('2030-01-01T00:00:00Z');
  return {
    sut: new MemoryRateLimiter({ now: () => now }),
    advance: (ms) => {
      now += ms;
    },
    cleanup: async () => {},
  };
});

defineRateLimiterContract('memory (real clock)', async () => ({
  sut: new MemoryRateLimiter(),
  cleanup: async () => {},
}));

describe('MemoryRateLimiter bounds', () => {
  it('drops ended windows first when full, keeping live ones', async () => {
    let now = 0;
    const rl = new MemoryRateLimiter({ now: () => now, maxKeys: 4 });
    await rl.hit('live', 1, 60_000);
    for (const key of ['a', 'b', 'c']) await rl.hit(key, 5, 1_000);
    now = 2_000;
    await rl.hit('new', 5, 1_000);
    expect(rl.size).toBe(2);
    expect((await rl.hit('live', 1, 60_000)).allowed).toBe(false);
  });

  it('drops the oldest quarter when every window is live, and never grows past its bound', async () => {
    const rl = new MemoryRateLimiter({ now: () => 0, maxKeys: 8 });
    for (let i = 0; i < 100; i++) {
      await rl.hit(`k${i}`, 1, 60_000);
      expect(rl.size).toBeLessThanOrEqual(8);
    }
    // The newest keys are still limited; the oldest were forgotten and start again.
    expect((await rl.hit('k99', 1, 60_000)).allowed).toBe(false);
    expect((await rl.hit('k0', 1, 60_000)).allowed).toBe(true);
  });

  it('frees a quarter of its room when full, however few windows ended since it last did', async () => {
    let now = 0;
    const rl = new MemoryRateLimiter({ now: () => now, maxKeys: 8 });
    // A window opens every second and lasts a minute: one has ended each time a new key comes.
    for (let i = 0; i < 8; i++, now += 1_000) await rl.hit(`k${i}`, 5, 60_000);
    now = 60_000;
    await rl.hit('new', 5, 60_000);
    // k0 ended and k1 went too: the next new key finds room without a walk.
    expect(rl.size).toBe(7);
    expect((await rl.hit('k1', 1, 60_000)).allowed).toBe(true);
    expect((await rl.hit('k7', 1, 60_000)).allowed).toBe(false);
  });

  it('refuses a bound below 1', () => {
    expect(() => new MemoryRateLimiter({ maxKeys: 0 })).toThrow(RangeError);
  });
});
