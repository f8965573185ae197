import { trimOldest } from './trim.js';

export interface LruOptions<V = unknown> {
  /** Most entries kept; the least recently used one goes first. 0 disables the cache. */
  maxEntries: number;
  /** How long an entry lives after it was set. 0 disables the cache. */
  ttlMs: number;
  /**
   * With `weigh`: the most total weight kept (each value weighed when it is set); the least
   * recently used go first until the rest fits.
   */
  maxWeight?: number;
  weigh?: (value: V) => number;
  now?: () => number;
}

/**
 * A bounded in-process cache: at most `maxEntries` entries, each readable for `ttlMs` after it was
 * set, the least recently read or written evicted first. Values are shared by every caller in the
 * process, so only data every caller may see belongs here.
 *
 * Recency is kept by the Map's insertion order. Moving an entry to the back costs a delete and an
 * insert, which on a hot page (dozens of reads per request) showed up in profiles, so a read moves
 * an entry only when more than half of the cache was written or moved since the entry was last:
 * an entry in the newer half stays put, and is still far from the front where eviction happens.
 */
export class LruCache<V> {
  private readonly entries = new Map<
    string,
    { value: V; expiresAt: number; stamp: number; weight: number }
  >();
  /** The sum of the weights of the entries held (0 without `weigh`). */
  private weight = 0;
  private readonly now: () => number;
  /** Counts writes and moves; an entry's stamp is the count when it last went to the back. */
  private clock = 0;

  constructor(private readonly options: LruOptions<V>) {
    this.now = options.now ?? Date.now;
  }

  get size(): number {
    return this.entries.size;
  }

  get(key: string): V | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    const now = this.now();
    // Set later than now: the clock was stepped back, and the entry's age is unknown.
    if (entry.expiresAt <= now || entry.expiresAt - this.options.ttlMs > now) {
      this.delete(key);
      return undefined;
    }
    // Map keeps insertion order: moving the key to the end makes the first key the least recently used.
    // Half of what it holds, not of what it may hold: with a weight bound far fewer entries fit.
    if (this.clock - entry.stamp >= this.entries.size / 2) {
      this.entries.delete(key);
      entry.stamp = ++this.clock;
      this.entries.set(key, entry);
    }
    return entry.value;
  }

  set(key: string, value: V): void {
    const { maxEntries, ttlMs } = this.options;
    if (maxEntries <= 0 || ttlMs <= 0) return;
    this.delete(key);
    const weight = this.options.weigh?.(value) ?? 0;
    const maxWeight = this.options.maxWeight ?? Infinity;
    // Heavier than the whole bound: kept, it would push out everything else and then itself.
    if (weight > maxWeight) return;
    this.entries.set(key, { value, expiresAt: this.now() + ttlMs, stamp: ++this.clock, weight });
    this.weight += weight;
    // Evicted in walks from the front, not a new iterator per entry (see `trimOldest`).
    trimOldest(this.entries, maxEntries, (key) => this.delete(key));
    if (this.weight > maxWeight) {
      const keep = maxWeight < 1_024 ? maxWeight : maxWeight - maxWeight / 64;
      // Never past the entry just set: alone it fits the bound (checked above), if not `keep`.
      for (const oldest of this.entries.keys()) {
        if (this.weight <= keep || oldest === key) break;
        this.delete(oldest);
      }
    }
  }

  delete(key: string): boolean {
    const entry = this.entries.get(key);
    if (entry === undefined) return false;
    this.weight -= entry.weight;
    return this.entries.delete(key);
  }

  /** Deletes every entry whose key matches; walks the whole cache. */
  deleteWhere(match: (key: string) => boolean): number {
    let deleted = 0;
    for (const key of [...this.entries.keys()]) {
      if (match(key)) {
        this.delete(key);
        deleted++;
      }
    }
    return deleted;
  }

  clear(): void {
    this.entries.clear();
    this.weight = 0;
  }
}

/**
 * About how many bytes a plain value holds in memory, for `weigh`: strings at two bytes a character,
 * 16 bytes for anything else, arrays, plain objects and Maps by what they hold (four levels deep).
 */
export function roughBytes(value: unknown, depth = 0): number {
  if (typeof value === 'string') return 16 + 2 * value.length;
  if (value === null || typeof value !== 'object' || depth >= 4) return 16;
  let total = 32;
  const items = Array.isArray(value)
    ? value
    : value instanceof Map
      ? [...value.values()]
      : Object.values(value);
  for (const item of items) total += roughBytes(item, depth + 1);
  return total;
}
