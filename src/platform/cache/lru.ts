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
 */
export class LruCache<V> {
  private readonly entries = new Map<string, { value: V; expiresAt: number }>();
  private readonly now: () => number;

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
    this.entries.delete(key);
    this.entries.set(key, entry);
    return entry.value;
  }

  set(key: string, value: V): void {
    const { maxEntries, ttlMs } = this.options;
    if (maxEntries <= 0 || ttlMs <= 0) return;
    this.entries.delete(key);
    this.entries.set(key, { value, expiresAt: this.now() + ttlMs });
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
