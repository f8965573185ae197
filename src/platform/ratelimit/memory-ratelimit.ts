import { checkWindow, decide, type RateLimitDecision, type RateLimiter } from './ratelimit.js';

export interface MemoryRateLimiterOptions {
  now?: () => number;
  /** Most keys kept; past it, ended windows go first, then the oldest ones. */
  maxKeys?: number;
}

interface Window {
  count: number;
  endsAt: number;
}

/**
 * Fixed-window `RateLimiter` in this process's memory, for limits on hot request paths where a
 * shared store would cost a round trip per request. Every process counts apart, so behind a load
 * balancer over N processes a key gets up to N times the limit. At `maxKeys`, a new key first drops
 * every ended window and then, while more than three quarters of `maxKeys` are left, the oldest
 * keys (which start again).
 */
export class MemoryRateLimiter implements RateLimiter {
  private readonly windows = new Map<string, Window>();
  private readonly now: () => number;
  private readonly maxKeys: number;

  constructor(options: MemoryRateLimiterOptions = {}) {
    this.now = options.now ?? Date.now;
    this.maxKeys = options.maxKeys ?? 100_000;
    if (!Number.isSafeInteger(this.maxKeys) || this.maxKeys < 1) {
      throw new RangeError(`maxKeys must be a positive integer, got ${this.maxKeys}`);
    }
  }

  /** Keys currently held. */
  get size(): number {
    return this.windows.size;
  }

  async hit(key: string, limit: number, windowMs: number): Promise<RateLimitDecision> {
    return this.hitNow(key, limit, windowMs);
  }

  reset(key: string): Promise<void> {
    this.windows.delete(key);
    return Promise.resolve();
  }

  private hitNow(key: string, limit: number, windowMs: number): RateLimitDecision {
    const length = checkWindow(limit, windowMs);
    const now = this.now();
    let window = this.windows.get(key);
    if (!window || window.endsAt <= now) {
      if (window) this.windows.delete(key);
      else if (this.windows.size >= this.maxKeys) this.makeRoom(now);
      window = { count: 0, endsAt: now + length };
      // Insertion order is the order windows opened in, which `makeRoom` relies on.
      this.windows.set(key, window);
    }
    window.count += 1;
    return decide(window.count, limit, window.endsAt - now);
  }

  /**
   * Frees a quarter of the room at least, so that the walk over every window this costs comes once
   * per `maxKeys / 4` new keys, not for each one when only a few windows ended since the last.
   */
  private makeRoom(now: number): void {
    for (const [key, window] of this.windows) if (window.endsAt <= now) this.windows.delete(key);
    const keep = this.maxKeys - Math.max(1, Math.floor(this.maxKeys / 4));
    for (const key of this.windows.keys()) {
      if (this.windows.size <= keep) break;
      this.windows.delete(key);
    }
  }
}
