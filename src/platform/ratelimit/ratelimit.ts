import { RateLimitedError } from '../errors/errors.js';

/**
 * Fixed-window rate limiter shared by every process of a deployment.
 *
 * `hit` counts one attempt against `key` in the current window of `windowMs` and says whether it is
 * within `limit`. Counting is atomic across processes: of N concurrent hits on a fresh window exactly
 * `min(N, limit)` are allowed. A window's state expires by itself (no unbounded key growth).
 * `retryAfterMs` is the time until the window resets (0 when allowed).
 *
 * A window opens at the key's first hit rather than on clock boundaries, so `reset` needs only the
 * key. Use one `limit`/`windowMs` pair per key: a window's length is fixed by the hit that opened
 * it. Refused hits still count within their window.
 */
export interface RateLimitDecision {
  allowed: boolean;
  remaining: number;
  retryAfterMs: number;
}

export interface RateLimiter {
  hit(key: string, limit: number, windowMs: number): Promise<RateLimitDecision>;
  /** Forgets the key's current window (e.g. after a successful login). */
  reset(key: string): Promise<void>;
}

/** Counts one hit on `key`; past `limit` in the window, a 429 saying "Too many {what}; try again later". */
export async function enforceLimit(
  limiter: RateLimiter,
  key: string,
  limit: number,
  windowMs: number,
  what: string,
): Promise<void> {
  const decision = await limiter.hit(key, limit, windowMs);
  if (!decision.allowed) {
    throw new RateLimitedError(`Too many ${what}; try again later`, decision.retryAfterMs / 1000);
  }
}

// Shared by the adapters, so every adapter validates and decides identically.

/** Validates `hit` arguments; returns the window length rounded up to whole ms. */
export function checkWindow(limit: number, windowMs: number): number {
  if (!Number.isSafeInteger(limit) || limit < 0) {
    throw new RangeError(`limit must be an integer >= 0, got ${limit}`);
  }
  if (!Number.isFinite(windowMs) || windowMs <= 0) {
    throw new RangeError(`windowMs must be a positive number, got ${windowMs}`);
  }
  return Math.ceil(windowMs);
}

/** Turns the window's hit count (this hit included) and its remaining lifetime into a decision. */
export function decide(count: number, limit: number, windowLeftMs: number): RateLimitDecision {
  const allowed = count <= limit;
  return {
    allowed,
    remaining: Math.max(0, limit - count),
    retryAfterMs: allowed ? 0 : Math.max(1, windowLeftMs),
  };
}
