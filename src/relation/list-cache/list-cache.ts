import type { ListEntry, ListKind, ListPosition } from '../model.js';

/** One list of one user. */
export interface ListRef {
  owner: number;
  kind: ListKind;
}

/** What a list should now hold for one other user: `createdAt` null means "not in the list". */
export interface ListChange extends ListRef {
  userId: number;
  createdAt: number | null;
}

export interface ListPage {
  entries: ListEntry[];
  /** More entries follow the page. */
  more: boolean;
}

export interface ListCacheOptions {
  /** How long a cached list lives after it was built; changes do not extend it. */
  ttlMs: number;
  /** Longest list kept; a longer one is not cached, and a cached one that grows past it is dropped. */
  maxEntries: number;
}

/**
 * Cached following/followers lists (cluster: one Redis sorted set per list; embedded: in process).
 *
 * Semantics every adapter guarantees (proved by `list-cache.contract.ts`):
 * - **Complete or absent.** A list is only ever cached whole. `page` answers null when the list is
 *   not cached (the caller reads the database); an empty list that is cached answers an empty page.
 *   A change to a list that is not cached is not recorded in it: nothing ever creates a list from a
 *   single change.
 * - **Order.** Entries are ordered newest first (`createdAt` descending, then `userId` descending); a
 *   cursor position is exclusive (the page starts after it), also when the entry named by the
 *   cursor has left the list since.
 * - **No stale fills.** `fill` reads the list's change mark, calls `load` (the database) and
 *   installs what it loaded only if no `apply` or `invalidate` touched the list in between, so a
 *   reader that loaded the state before a change cannot put that state back after the change.
 * - `apply` sets each entry of a cached list to what the change says (idempotent, order-independent
 *   per user) and marks every touched list changed. `invalidate` drops lists and marks them changed.
 * - **No stale changes.** `apply` with a `watch` taken before the state was read drops, instead of
 *   changing, a list another `apply` or an `invalidate` touched after the watch.
 * - Every cached list expires `ttlMs` after it was built. Failures reject; callers read the database.
 */
export interface ListCache {
  page(list: ListRef, position: ListPosition, limit: number): Promise<ListPage | null>;
  /** The whole cached list, or null when it is not cached (for checks). */
  all(list: ListRef): Promise<ListEntry[] | null>;
  /**
   * Loads the list with `load` and caches it unless it changed meanwhile or is longer than
   * `maxEntries`. Resolves with what `load` returned and whether it was cached.
   */
  fill(list: ListRef, load: () => Promise<ListEntry[]>): Promise<{ entries: ListEntry[]; cached: boolean }>;
  /**
   * Notes where the lists stand, before the caller reads from the database the state it will
   * `apply`: `apply` with the watch then drops each list touched since (by `apply` or `invalidate`)
   * instead of writing into it a state that may be older than what touched it. `release` it when
   * it is not passed to `apply` (which releases it).
   */
  watch(lists: readonly ListRef[]): Promise<ListWatch>;
  apply(changes: readonly ListChange[], watch?: ListWatch): Promise<void>;
  invalidate(lists: readonly ListRef[]): Promise<void>;
  close(): Promise<void>;
}

/** See `ListCache.watch`; what it holds is the adapter's. */
export interface ListWatch {
  release(): void;
}

export function listKey(list: ListRef): string {
  return `${list.kind}:${list.owner}`;
}
