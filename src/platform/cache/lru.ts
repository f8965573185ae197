export interface LruOptions {
  /** Most entries kept; the least recently used one goes first. 0 disables the cache. */
  maxEntries: number;
  /** How long an entry lives after it was set. 0 disables the cache. */
  ttlMs: number;
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
  private readonly entries = new Map<string, { value: V; expiresAt: number; stamp: number }>();
  private readonly now: () => number;
  /** Counts writes and moves; an entry's stamp is the count when it last went to the back. */
  private clock = 0;

  constructor(private readonly options: LruOptions) {
    this.now = options.now ?? Date.now;
  }

  get size(): number {
    return this.entries.size;
  }

  get(key: string): V | undefined {
    const entry = this.entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAt <= this.now()) {
      this.entries.delete(key);
      return undefined;
    }
    // Map keeps insertion order: moving the key to the end makes the first key the least recently used.
    if (this.clock - entry.stamp >= this.options.maxEntries / 2) {
      this.entries.delete(key);
      entry.stamp = ++this.clock;
      this.entries.set(key, entry);
    }
    return entry.value;
  }

  set(key: string, value: V): void {
    const { maxEntries, ttlMs } = this.options;
    if (maxEntries <= 0 || ttlMs <= 0) return;
    this.entries.delete(key);
    this.entries.set(key, { value, expiresAt: this.now() + ttlMs, stamp: ++this.clock });
    while (this.entries.size > maxEntries) {
      const oldest = this.entries.keys().next();
      if (oldest.done) break;
      this.entries.delete(oldest.value);
    }
  }

  delete(key: string): boolean {
    return this.entries.delete(key);
  }

  /** Deletes every entry whose key matches; walks the whole cache. */
  deleteWhere(match: (key: string) => boolean): number {
    let deleted = 0;
    for (const key of [...this.entries.keys()]) {
      if (match(key)) {
        this.entries.delete(key);
        deleted++;
      }
    }
    return deleted;
  }

  clear(): void {
    this.entries.clear();
  }
}
