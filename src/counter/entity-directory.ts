import { entityKey, type EntityRef } from './model.js';
import { trimOldest } from '../platform/cache/trim.js';

/**
 * Whether an entity exists and who may see it. Likes, favourites and counts are served only for
 * entities the caller may see; anything else is a 404, so the counter routes cannot be used to probe
 * for drafts or private posts.
 */
export interface EntityDirectory {
  /** For each ref, whether `viewerId` (null: anonymous) may see it. */
  visible(refs: readonly EntityRef[], viewerId: number | null): Promise<boolean[]>;
}

export interface Visibility {
  authorId: number;
  status: 'draft' | 'published' | 'deleted';
  visible: string;
}

/**
 * Counters exist for published posts only. Anyone may see a public one; any other (unlisted, for
 * followers, a school or its author alone) is shown to its author only, as its detail is.
 */
export function mayView(v: Visibility | null | undefined, viewerId: number | null): boolean {
  if (!v || v.status !== 'published') return false;
  return v.visible === 'public' || (viewerId !== null && v.authorId === viewerId);
}

type Value = Visibility | null;

interface Entry {
  value: Value;
  /** When the load that produced the value started: the value is at least this fresh. */
  at: number;
}

interface Pending {
  ref: EntityRef;
  flight: Promise<Value>;
  resolve: (value: Value) => void;
  reject: (err: unknown) => void;
  /** Whether a lookup waits for it (else it is a background refresh, which may wait to be batched). */
  urgent: boolean;
}

export interface CachedEntityDirectoryOptions {
  /** How long before `ttlMs` runs out a lookup starts a background refresh; default a quarter of `ttlMs`. */
  refreshAheadMs?: number;
  /** How long background refreshes are gathered into one load; default a quarter of `refreshAheadMs`, at most 100 ms. */
  refreshGatherMs?: number;
  /**
   * How long past `ttlMs` an answer is still served while loads fail (the database is out of
   * reach); default 0: never. Only an answer no change was heard of stays: `forget` drops it.
   */
  staleIfErrorMs?: number;
  /** While loads fail, a key's stale answer is loaded again at most this often; default 1000 ms. */
  staleRetryMs?: number;
  /** Told of every answer served past `ttlMs` because loads failed. */
  onStale?: () => void;
}

/** Keys one `load` call receives at most (it becomes one `IN (…)` query). */
export const LOAD_BATCH = 500;
// Kept from load time: a test that fakes the timers must not stall every lookup behind a clock it owns.
const nextTurn = setImmediate;
const later = setTimeout;

/**
 * Keeps what it learns of entities in process, so the like path runs no SQL for a post seen
 * recently, and keeps the SQL it does run off the request path and few:
 * - An answer is served for at most `ttlMs` after the load that produced it started. Once it is
 *   older than `ttlMs - refreshAheadMs` a lookup still gets it at once and starts a refresh in the
 *   background; past `ttlMs` a lookup waits for a load. A post that stops being visible therefore
 *   takes likes for at most `ttlMs` in processes that cached it (the post service calls `forget` in
 *   its own process on every change), however long the entry sat unused.
 * - Lookups of a key while its load is in flight share that load (single flight).
 * - Keys a lookup waits for are loaded at the next turn of the event loop, together with every other
 *   key asked for until then (all the requests read in one I/O phase): one `load` call, up to
 *   `LOAD_BATCH` keys each. Background refreshes are gathered for `refreshGatherMs` first (or until
 *   a waiting lookup's load takes them along), so hot entries are refreshed a batch at a time.
 * A failed load fails the lookups waiting for it and is not cached; a failed background refresh
 * leaves the entry as it was. With `staleIfErrorMs`, a lookup whose load failed gets the answer
 * known before instead, if it is younger than `ttlMs + staleIfErrorMs` and no change of the entity
 * was heard of since (`forget` dropped it); until a load succeeds again, lookups of such answers do
 * not wait for a load at all, and each key is loaded again at most every `staleRetryMs`. So likes of
 * posts read recently go on while the database is out of reach; a change cannot be made meanwhile.
 */
export class CachedEntityDirectory implements EntityDirectory {
  private readonly cache = new Map<string, Entry>();
  /**
   * Keys known to name nothing, apart and bounded at a tenth of `maxEntries`: lookups of made-up ids
   * (anyone may ask for counts) must not push the posts people read out of `cache`.
   */
  private readonly missing = new Map<string, Entry>();
  private readonly flights = new Map<string, Promise<Value>>();
  /** Loads asked for and not started yet. */
  private readonly waiting = new Map<string, Pending>();
  private turnScheduled = false;
  private gatherTimer: ReturnType<typeof setTimeout> | null = null;
  private readonly refreshAheadMs: number;
  private readonly refreshGatherMs: number;
  private readonly staleIfErrorMs: number;
  private readonly staleRetryMs: number;
  private readonly onStale: () => void;
  /** When the last load failed; null once a load succeeded since. */
  private failedAt: number | null = null;

  constructor(
    private readonly load: (refs: readonly EntityRef[]) => Promise<Map<string, Visibility>>,
    private readonly ttlMs: number,
    private readonly maxEntries = 100_000,
    private readonly now: () => number = Date.now,
    options: CachedEntityDirectoryOptions = {},
  ) {
    this.refreshAheadMs = Math.min(Math.max(0, options.refreshAheadMs ?? Math.floor(ttlMs / 4)), ttlMs);
    this.refreshGatherMs = Math.max(
      0,
      options.refreshGatherMs ?? Math.min(100, Math.floor(this.refreshAheadMs / 4)),
    );
    this.staleIfErrorMs = Math.max(0, options.staleIfErrorMs ?? 0);
    this.staleRetryMs = Math.max(0, options.staleRetryMs ?? 1_000);
    this.onStale = options.onStale ?? (() => undefined);
  }

  async visible(refs: readonly EntityRef[], viewerId: number | null): Promise<boolean[]> {
    const now = this.now();
    const out = new Array<boolean>(refs.length);
    let waits: Promise<void>[] | undefined;
    refs.forEach((ref, i) => {
      const key = entityKey(ref);
      const hit = this.cache.get(key) ?? this.missing.get(key);
      const age = hit ? now - hit.at : Infinity;
      // A negative age: the clock was stepped back, and how old the answer is is unknown.
      if (hit && age >= 0 && age < this.ttlMs) {
        if (age >= this.ttlMs - this.refreshAheadMs) this.fetch(key, ref, false).catch(() => undefined);
        out[i] = mayView(hit.value, viewerId);
      } else if (hit && this.failedAt !== null && this.servesStale(hit, now)) {
        // Loads fail: no lookup waits for one, and the key is tried again now and then.
        if (now - this.failedAt >= this.staleRetryMs || now < this.failedAt)
          this.fetch(key, ref, false).catch(() => undefined);
        this.onStale();
        out[i] = mayView(hit.value, viewerId);
      } else {
        const wait = this.fetch(key, ref, true).then(
          (value) => void (out[i] = mayView(value, viewerId)),
          (err: unknown) => {
            // The answer known before, unless a change was heard of meanwhile (`forget`).
            const known = this.cache.get(key) ?? this.missing.get(key);
            if (!known || !this.servesStale(known, this.now())) throw err;
            this.onStale();
            out[i] = mayView(known.value, viewerId);
          },
        );
        (waits ??= []).push(wait);
      }
    });
    if (waits) await Promise.all(waits);
    return out;
  }

  /** Whether `entry` may answer while loads fail: not older than `ttlMs + staleIfErrorMs`. */
  private servesStale(entry: Entry, now: number): boolean {
    const age = now - entry.at;
    return age >= 0 && age < this.ttlMs + this.staleIfErrorMs;
  }

  /**
   * Drops what is known of the entity. A load already started is detached (its callers still get
   * its answer, which is not kept); one not started yet will read after the change and stays.
   */
  forget(ref: EntityRef): void {
    const key = entityKey(ref);
    this.cache.delete(key);
    this.missing.delete(key);
    if (!this.waiting.has(key)) this.flights.delete(key);
  }

  /** Drops everything known (this process may have missed changes); loads detach as in `forget`. */
  forgetAll(): void {
    this.cache.clear();
    this.missing.clear();
    for (const key of [...this.flights.keys()]) if (!this.waiting.has(key)) this.flights.delete(key);
  }

  /** The key's load in flight or waiting to start, else a new one. */
  private fetch(key: string, ref: EntityRef, urgent: boolean): Promise<Value> {
    const flying = this.flights.get(key);
    if (flying) {
      const waiting = this.waiting.get(key);
      if (urgent && waiting && !waiting.urgent) {
        waiting.urgent = true;
        this.scheduleTurn();
      }
      return flying;
    }
    let resolve!: (value: Value) => void;
    let reject!: (err: unknown) => void;
    const flight = new Promise<Value>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    this.waiting.set(key, { ref, flight, resolve, reject, urgent });
    this.flights.set(key, flight);
    if (urgent || this.waiting.size >= LOAD_BATCH) this.scheduleTurn();
    else this.gatherTimer ??= later(() => this.startWaiting(), this.refreshGatherMs).unref();
    return flight;
  }

  private scheduleTurn(): void {
    if (this.turnScheduled) return;
    this.turnScheduled = true;
    nextTurn(() => {
      this.turnScheduled = false;
      this.startWaiting();
    });
  }

  /** Starts every waiting load, urgent or not: a refresh rides along with a query made anyway. */
  private startWaiting(): void {
    if (this.gatherTimer) {
      clearTimeout(this.gatherTimer);
      this.gatherTimer = null;
    }
    if (this.waiting.size === 0) return;
    const entries = [...this.waiting];
    this.waiting.clear();
    for (let i = 0; i < entries.length; i += LOAD_BATCH) this.loadChunk(entries.slice(i, i + LOAD_BATCH));
  }

  private loadChunk(entries: readonly [string, Pending][]): void {
    const startedAt = this.now();
    // Through an async function, so a loader that throws instead of rejecting fails the same way.
    const loading = (async () => this.load(entries.map(([, p]) => p.ref)))();
    loading.then(
      (found) => {
        this.failedAt = null;
        for (const [key, p] of entries) {
          const value = found.get(key) ?? null;
          // A key forgotten meanwhile keeps no answer read before its change.
          if (this.flights.get(key) === p.flight) {
            this.flights.delete(key);
            this.remember(key, value, startedAt);
          }
          p.resolve(value);
        }
      },
      (err: unknown) => {
        this.failedAt = this.now();
        for (const [key, p] of entries) {
          if (this.flights.get(key) === p.flight) this.flights.delete(key);
          p.reject(err);
        }
      },
    );
  }

  private remember(key: string, value: Value, at: number): void {
    this.cache.delete(key);
    this.missing.delete(key);
    const [map, max] =
      value === null
        ? [this.missing, Math.max(1, Math.floor(this.maxEntries / 10))]
        : [this.cache, this.maxEntries];
    map.set(key, { value, at });
    trimOldest(map, max);
  }
}
