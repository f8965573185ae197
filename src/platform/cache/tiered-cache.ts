import { LruCache, type LruOptions } from './lru.js';
import type { CacheFill, CacheSlot, SharedCache } from './shared-cache.js';
import { SingleFlight } from './single-flight.js';

export interface TieredCacheOptions<V> {
  /** The in-process tier: short-lived, bounded. */
  local: LruOptions<V>;
  /** The deployment-wide tier (a no-op on the embedded profile). */
  shared: SharedCache;
  sharedTtlMs: number;
  encode: (value: V) => string;
  /** Null for text that is not a value of this cache (e.g. written by another version): a miss. */
  decode: (text: string) => V | null;
  /** The guard a key is stored under (see `SharedCache`); by default each key is its own guard. */
  guardOf?: (key: string) => string;
  /** Only values for which this holds are stored, in either tier; the others are loaded every time. */
  cacheable?: (value: V) => boolean;
  /** A failing shared tier is reported here and read past (the database answers instead). */
  onSharedError?: (err: unknown) => void;
}

/** Guards of failed shared invalidations remembered at most (the values of others may be read again). */
const MAX_UNSETTLED = 10_000;

interface Load {
  keys: readonly string[];
  guards: ReadonlySet<string>;
  stale: boolean;
}

/**
 * Read-through cache in two tiers: this process's LRU, then the shared tier, then the loader (the
 * database). Concurrent misses of a key share one load; a load for many keys is one call of the
 * loader and one round trip to each tier.
 *
 * Invalidation is exact in both tiers: `invalidateLocal` drops the values of the given guards from
 * this process at once and marks loads in flight for them, which then neither fill the cache nor take
 * new callers (a reader that arrives after the change never receives a value read before it);
 * `invalidateShared` moves the guards' generations, so no process can read or fill old values there.
 */
export class TieredCache<V> {
  private readonly lru: LruCache<V>;
  private readonly flights = new SingleFlight<V>();
  private readonly loads = new Set<Load>();
  private readonly guardOf: (key: string) => string;
  private readonly ownGuards: boolean;
  private readonly cacheable: (value: V) => boolean;
  private readonly onSharedError: (err: unknown) => void;
  /**
   * Guards whose shared invalidation this process has sent and not yet seen settle, with how many
   * are in flight: until then the shared tier may still hold what was current before the change.
   */
  private readonly invalidating = new Map<string, number>();
  /**
   * Guards whose shared invalidation failed, with until when (`performance.now()`) the shared tier
   * may still hold what was current before the change: its values live `sharedTtlMs` at most.
   */
  private readonly unsettled = new Map<string, number>();

  constructor(private readonly options: TieredCacheOptions<V>) {
    this.lru = new LruCache<V>(options.local);
    this.ownGuards = options.guardOf === undefined;
    this.guardOf = options.guardOf ?? ((key) => key);
    this.cacheable = options.cacheable ?? (() => true);
    this.onSharedError = options.onSharedError ?? (() => {});
  }

  async get(key: string, load: (keys: readonly string[]) => Promise<Map<string, V>>): Promise<V | undefined> {
    return (await this.getMany([key], load)).get(key);
  }

  /** Values for the keys found in a tier or by `load`; keys neither has are absent from the map. */
  async getMany(
    keys: readonly string[],
    load: (keys: readonly string[]) => Promise<Map<string, V>>,
  ): Promise<Map<string, V>> {
    const found = new Map<string, V>();
    const missing: string[] = [];
    for (const key of keys) {
      if (found.has(key)) continue;
      const hit = this.lru.get(key);
      if (hit !== undefined) found.set(key, hit);
      else missing.push(key);
    }
    if (missing.length > 0) {
      const loaded = await this.flights.many(missing, (fresh) => this.readThrough(fresh, load));
      for (const [key, value] of loaded) found.set(key, value);
    }
    return found;
  }

  private async readThrough(
    keys: readonly string[],
    load: (keys: readonly string[]) => Promise<Map<string, V>>,
  ): Promise<Map<string, V>> {
    const track: Load = { keys, guards: new Set(keys.map(this.guardOf)), stale: false };
    // A change this process made whose shared invalidation is still on its way: the shared tier's
    // value may be from before it, so the database answers. What it answers is kept in this
    // process (unless another change comes meanwhile), not in the shared tier: a fill there now
    // would be under the generation the invalidation is moving.
    const passShared = [...track.guards].some(
      (guard) => this.invalidating.has(guard) || this.isUnsettled(guard),
    );
    this.loads.add(track);
    try {
      const slots: CacheSlot[] = keys.map((key) => ({ key, guard: this.guardOf(key) }));
      const reads = passShared
        ? null
        : await this.options.shared.get(slots).catch((err: unknown) => {
            this.onSharedError(err);
            return null;
          });
      const found = new Map<string, V>();
      const rest: (CacheSlot & { gen: string | undefined })[] = [];
      slots.forEach((slot, i) => {
        const read = reads?.[i];
        const value = read?.value != null ? this.options.decode(read.value) : null;
        if (value !== null && this.cacheable(value)) found.set(slot.key, value);
        else rest.push({ ...slot, gen: read?.gen });
      });
      if (rest.length > 0) {
        const loaded = await load(rest.map((s) => s.key));
        const fills: CacheFill[] = [];
        for (const slot of rest) {
          const value = loaded.get(slot.key);
          if (value === undefined) continue;
          found.set(slot.key, value);
          if (slot.gen !== undefined && this.cacheable(value))
            fills.push({
              key: slot.key,
              guard: slot.guard,
              gen: slot.gen,
              value: this.options.encode(value),
            });
        }
        if (fills.length > 0 && !track.stale && !passShared) {
          await this.options.shared.fill(fills, this.options.sharedTtlMs).catch((err: unknown) => {
            this.onSharedError(err);
          });
        }
      }
      if (!track.stale) {
        for (const [key, value] of found) if (this.cacheable(value)) this.lru.set(key, value);
      }
      return found;
    } finally {
      this.loads.delete(track);
    }
  }

  /** Drops this process's values under the guards, at once (see the class comment). */
  invalidateLocal(guards: readonly string[]): void {
    if (guards.length === 0) return;
    const set = new Set(guards);
    if (this.ownGuards) for (const guard of set) this.lru.delete(guard);
    else this.lru.deleteWhere((key) => set.has(this.guardOf(key)));
    for (const track of this.loads) {
      if (track.stale || ![...track.guards].some((g) => set.has(g))) continue;
      track.stale = true;
      for (const key of track.keys) this.flights.forget(key);
    }
  }

  /**
   * Makes the guards' values unreadable in the shared tier, for every process. Until that is done,
   * this process's loads for them read past the shared tier (see `readThrough`): after
   * `invalidateLocal`, a read here cannot be given the value from before the change. When it fails
   * (rejecting), they go on reading past it until the values there have expired, or until an
   * invalidation of theirs started after the failure succeeds.
   */
  async invalidateShared(guards: readonly string[]): Promise<void> {
    const unique = [...new Set(guards)];
    for (const guard of unique) this.invalidating.set(guard, (this.invalidating.get(guard) ?? 0) + 1);
    const startedAt = performance.now();
    try {
      await this.options.shared.invalidate(guards);
      // Done after a failed one was recorded (a retry, or the next change): what the failure left
      // readable there is no longer, so loads may read the shared tier again. One that started
      // before may have run before the change whose invalidation failed.
      for (const guard of unique) {
        const until = this.unsettled.get(guard);
        if (until !== undefined && startedAt >= until - this.options.sharedTtlMs)
          this.unsettled.delete(guard);
      }
    } catch (err) {
      // The old values may stay readable there until they expire: this process reads past them.
      const until = performance.now() + this.options.sharedTtlMs;
      if (this.unsettled.size >= MAX_UNSETTLED) this.forgetSettled();
      for (const guard of unique) this.unsettled.set(guard, until);
      throw err;
    } finally {
      for (const guard of unique) {
        const left = (this.invalidating.get(guard) ?? 1) - 1;
        if (left > 0) this.invalidating.set(guard, left);
        else this.invalidating.delete(guard);
      }
    }
  }

  private isUnsettled(guard: string): boolean {
    const until = this.unsettled.get(guard);
    if (until === undefined) return false;
    if (performance.now() < until) return true;
    this.unsettled.delete(guard);
    return false;
  }

  /** Drops the guards whose old shared values have expired; the oldest half when none has. */
  private forgetSettled(): void {
    const now = performance.now();
    for (const [guard, until] of this.unsettled) if (until <= now) this.unsettled.delete(guard);
    if (this.unsettled.size < MAX_UNSETTLED) return;
    let drop = this.unsettled.size / 2;
    for (const guard of this.unsettled.keys()) {
      if (drop-- <= 0) break;
      this.unsettled.delete(guard);
    }
  }

  /** Drops everything this process holds (not the shared tier). */
  clearLocal(): void {
    this.lru.clear();
    for (const track of this.loads) {
      track.stale = true;
      for (const key of track.keys) this.flights.forget(key);
    }
  }
}
