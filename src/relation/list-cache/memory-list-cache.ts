import { LruCache } from '../../platform/cache/lru.js';
import { compareEntries, slicePage, type ListEntry, type ListPosition } from '../model.js';
import {
  listKey,
  type ListCache,
  type ListCacheOptions,
  type ListChange,
  type ListPage,
  type ListRef,
  type ListWatch,
} from './list-cache.js';

export interface MemoryListCacheOptions extends ListCacheOptions {
  /** Most lists kept; the least recently used goes first. */
  maxLists: number;
  /**
   * Most entries kept over all lists, each list counted as filled (changes applied since are not
   * weighed again, and move it by at most `maxEntries`); the least recently used go first.
   */
  maxTotalEntries?: number;
  now?: () => number;
}

/** A fill in progress or a watch; a change to its list meanwhile makes it `stale`. */
interface Build {
  stale: boolean;
}

/** The lists' builds, registered until released. */
class MemoryListWatch implements ListWatch {
  constructor(
    readonly builds: ReadonlyMap<string, Build>,
    readonly release: () => void,
  ) {}
}

/**
 * `ListCache` in process, for the embedded profile (one process serves and consumes). Lists are
 * sorted arrays; a change is a binary-search insert or removal in a cached array.
 */
export class MemoryListCache implements ListCache {
  private readonly lists: LruCache<ListEntry[]>;
  private readonly builds = new Map<string, Set<Build>>();

  constructor(private readonly options: MemoryListCacheOptions) {
    this.lists = new LruCache<ListEntry[]>({
      maxEntries: options.maxLists,
      ttlMs: options.ttlMs,
      maxWeight: options.maxTotalEntries ?? Infinity,
      weigh: (entries) => entries.length + 1,
      ...(options.now ? { now: options.now } : {}),
    });
  }

  async page(list: ListRef, position: ListPosition, limit: number): Promise<ListPage | null> {
    const entries = this.lists.get(listKey(list));
    return entries ? slicePage(entries, position, limit) : null;
  }

  async all(list: ListRef): Promise<ListEntry[] | null> {
    const entries = this.lists.get(listKey(list));
    return entries ? [...entries] : null;
  }

  async fill(
    list: ListRef,
    load: () => Promise<ListEntry[]>,
  ): Promise<{ entries: ListEntry[]; cached: boolean }> {
    const key = listKey(list);
    const build = this.register(key);
    try {
      const entries = await load();
      const cached = !build.stale && entries.length <= this.options.maxEntries;
      if (cached) this.lists.set(key, [...entries].sort(compareEntries));
      return { entries, cached };
    } finally {
      this.unregister(key, build);
    }
  }

  async watch(lists: readonly ListRef[]): Promise<ListWatch> {
    const builds = new Map<string, Build>();
    for (const list of lists) {
      const key = listKey(list);
      if (!builds.has(key)) builds.set(key, this.register(key));
    }
    let released = false;
    return new MemoryListWatch(builds, () => {
      if (released) return;
      released = true;
      for (const [key, build] of builds) this.unregister(key, build);
    });
  }

  async apply(changes: readonly ListChange[], watch?: ListWatch): Promise<void> {
    const watched = watch instanceof MemoryListWatch ? watch : undefined;
    // A list touched since it was watched is dropped: what touched it may be newer than the changes.
    const stale = new Set<string>();
    if (watched)
      for (const change of changes)
        if (watched.builds.get(listKey(change))?.stale) stale.add(listKey(change));
    watched?.release();
    for (const change of changes) {
      const key = listKey(change);
      this.touched(key);
      if (stale.has(key)) {
        this.lists.delete(key);
        continue;
      }
      const entries = this.lists.get(key);
      if (!entries) continue;
      const at = entries.findIndex((e) => e.userId === change.userId);
      if (at >= 0) entries.splice(at, 1);
      if (change.createdAt === null) continue;
      const entry = { userId: change.userId, createdAt: change.createdAt };
      let lo = 0;
      let hi = entries.length;
      while (lo < hi) {
        const mid = (lo + hi) >>> 1;
        if (compareEntries(entries[mid]!, entry) < 0) lo = mid + 1;
        else hi = mid;
      }
      entries.splice(lo, 0, entry);
      if (entries.length > this.options.maxEntries) this.lists.delete(key);
    }
  }

  async invalidate(lists: readonly ListRef[]): Promise<void> {
    for (const list of lists) {
      const key = listKey(list);
      this.touched(key);
      this.lists.delete(key);
    }
  }

  async close(): Promise<void> {
    this.lists.clear();
  }

  private register(key: string): Build {
    const build: Build = { stale: false };
    let set = this.builds.get(key);
    if (!set) this.builds.set(key, (set = new Set()));
    set.add(build);
    return build;
  }

  private unregister(key: string, build: Build): void {
    const set = this.builds.get(key);
    if (!set) return;
    set.delete(build);
    if (set.size === 0) this.builds.delete(key);
  }

  private touched(key: string): void {
    for (const build of this.builds.get(key) ?? []) build.stale = true;
  }
}
