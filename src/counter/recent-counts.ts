import { LruCache } from '../platform/cache/lru.js';
import { SingleFlight } from '../platform/cache/single-flight.js';
import { ZERO_COUNTS, type Counts, type EntityRef } from './model.js';

export type CountsReader = (refs: readonly EntityRef[]) => Promise<Counts[]>;

export interface RecentCountsOptions {
  ttlMs: number;
  maxEntries: number;
  now?: () => number;
}

/**
 * Counts through a cache in this process that lives `ttlMs` (a fraction of a second): counts are
 * the same for every viewer, and snapshots change only when the flusher folds deltas (every second
 * by default), so a hot post is read from Redis a few times a second instead of once per request.
 * A change shows at most `ttlMs` later than it would without the cache. Concurrent misses of one
 * entity share one read. With `ttlMs` 0 it is `read` itself.
 */
export function recentCounts(read: CountsReader, options: RecentCountsOptions): CountsReader {
  if (options.ttlMs <= 0) return read;
  const cache = new LruCache<Counts>({
    ttlMs: options.ttlMs,
    maxEntries: options.maxEntries,
    ...(options.now ? { now: options.now } : {}),
  });
  const flights = new SingleFlight<Counts>();
  const keyOf = (r: EntityRef) => `${r.etype}:${r.eid}`;
  return async (refs) => {
    const found: (Counts | undefined)[] = refs.map((r) => cache.get(keyOf(r)));
    if (!found.includes(undefined)) return found as Counts[];
    const missing = new Map<string, EntityRef>();
    refs.forEach((r, i) => {
      if (found[i] === undefined) missing.set(keyOf(r), r);
    });
    const loaded = await flights.many([...missing.keys()], async (keys) => {
      const counts = await read(keys.map((k) => missing.get(k)!));
      const byKey = new Map<string, Counts>();
      keys.forEach((k, i) => {
        const c = counts[i];
        if (c) {
          cache.set(k, c);
          byKey.set(k, c);
        }
      });
      return byKey;
    });
    return refs.map((r, i) => found[i] ?? loaded.get(keyOf(r)) ?? ZERO_COUNTS);
  };
}
