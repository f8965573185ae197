/**
 * Key-value store with per-key expiry and atomic counters, shared by every process of a deployment
 * (SQLite table on embedded, Redis on cluster).
 *
 * Semantics every adapter guarantees (proved by `kv.contract.ts`):
 * - Values are strings. A key whose TTL has passed behaves exactly like a missing key for every
 *   operation, including `incr` and `setIfAbsent`.
 * - Each method is atomic with respect to every other call on the same key from any process:
 *   `setIfAbsent` has exactly one winner among concurrent callers, `getDel` hands a value to exactly
 *   one caller, `incr` never loses an increment, `expireIfEquals` and `deleteIfEquals` act only on
 *   the value they compare (so a holder of a lock can renew or free it, never another's).
 * - `ttlMs` is a positive number of milliseconds; omitted means no expiry. `set` replaces the value
 *   and the expiry. `incr` keeps an existing expiry and applies `ttlMs` only when it creates the key.
 * - Invalid arguments (a non-positive `ttlMs`, a non-integer `by`) throw `RangeError`; `incr` on a value
 *   that is not an integer rejects and leaves the value alone.
 * - Keys are used as given; an adapter may add a deployment prefix, invisible to callers.
 */
export interface KeyValueStore {
  get(key: string): Promise<string | null>;
  /** Values in the order of `keys`, null where missing; one round trip. */
  mget(keys: readonly string[]): Promise<(string | null)[]>;
  set(key: string, value: string, ttlMs?: number): Promise<void>;
  /** Sets only when the key is missing; true when this call set it. */
  setIfAbsent(key: string, value: string, ttlMs?: number): Promise<boolean>;
  /** Returns the value and deletes the key in one step; null when missing. */
  getDel(key: string): Promise<string | null>;
  /** True when the key existed. */
  delete(key: string): Promise<boolean>;
  /** Adds `by` (default 1) to an integer value (missing counts as 0) and returns the new value. */
  incr(key: string, by?: number, ttlMs?: number): Promise<number>;
  /** Remaining lifetime in ms; null when missing, -1 when the key has no expiry. */
  ttl(key: string): Promise<number | null>;
  /** Gives a live key `ttlMs` to live from now, keeping its value; false (and no key made) when missing. */
  expire(key: string, ttlMs: number): Promise<boolean>;
  /** `expire`, only while the key holds exactly `value`, in one step; false otherwise. */
  expireIfEquals(key: string, value: string, ttlMs: number): Promise<boolean>;
  /** Deletes the key only while it holds exactly `value`, in one step; true when it did. */
  deleteIfEquals(key: string, value: string): Promise<boolean>;
}

// Argument checks shared by the adapters, so every adapter rejects exactly the same inputs.

/** Throws unless `ttlMs` is a positive finite number; fractional ms round up so a TTL never shortens. */
export function checkTtl(ttlMs: number | undefined): number | undefined {
  if (ttlMs === undefined) return undefined;
  if (!Number.isFinite(ttlMs) || ttlMs <= 0) {
    throw new RangeError(`ttlMs must be a positive number, got ${ttlMs}`);
  }
  return Math.ceil(ttlMs);
}

export function checkIncrement(by: number): number {
  if (!Number.isSafeInteger(by)) throw new RangeError(`incr needs a safe integer, got ${by}`);
  return by;
}
