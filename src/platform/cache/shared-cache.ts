/**
 * A cache shared by every process of a deployment, the tier between each process's own memory and
 * the database (cluster: Redis; embedded: none, a single process needs only its in-process tier).
 *
 * Values live under *guards*. Each guard has a generation; `invalidate` moves it, which makes every
 * value stored under the guard unreadable at once (one guard may cover one value or a whole family,
 * such as every cached page of a feed). `fill` stores a value only if its guard still has the
 * generation the caller read with `get` before loading from the database, so a reader that loaded
 * the old state before a change cannot put it back after the change was announced:
 *
 *     get → miss (generation g) → load from the database → fill(g): stored only if nothing moved g.
 *
 * Semantics every adapter guarantees (proved by `shared-cache.contract.ts`):
 * - `get`, `fill` and `invalidate` are one round trip each, for any number of entries.
 * - `get` never returns a value stored under another key, stored under an older generation of its
 *   guard, or older than the `ttlMs` it was filled with. It may forget anything at any time (eviction,
 *   restart), and an adapter may keep nothing at all.
 * - A `fill` with a generation that is no longer current stores nothing.
 * - Failures reject; callers treat them as misses and read the database.
 */
export interface CacheSlot {
  key: string;
  guard: string;
}

export interface CacheRead {
  /** Null when missing, expired or stored under an older generation of the guard. */
  value: string | null;
  /** The guard's generation when read, to pass to `fill`. */
  gen: string;
}

export interface CacheFill extends CacheSlot {
  gen: string;
  value: string;
}

export interface SharedCache {
  get(slots: readonly CacheSlot[]): Promise<CacheRead[]>;
  fill(entries: readonly CacheFill[], ttlMs: number): Promise<void>;
  invalidate(guards: readonly string[]): Promise<void>;
}

/** The embedded profile's shared tier: one process has nothing to share, so it keeps nothing. */
export class NoSharedCache implements SharedCache {
  async get(slots: readonly CacheSlot[]): Promise<CacheRead[]> {
    return slots.map(() => ({ value: null, gen: '0' }));
  }

  async fill(): Promise<void> {}

  async invalidate(): Promise<void> {}
}
