import { NotFoundError } from '../platform/errors/errors.js';
import { enforceLimit, type RateLimiter } from '../platform/ratelimit/ratelimit.js';
import type { EntityDirectory } from './entity-directory.js';
import type { CounterEventPublisher } from './event-publisher.js';
import type { CounterMetrics } from './counter.metrics.js';
import {
  POST_FIELDS,
  ZERO_COUNTS,
  type Counts,
  type EntityRef,
  type FactMetric,
  type PostField,
} from './model.js';
import type { CounterStore, Flags } from './store/counter-store.js';

export type CountsView = Partial<Record<PostField, number>>;

/** Likes, unlikes, favourites and unfavourites together, per user, counted by `limiter`. */
export interface ToggleLimit {
  limiter: RateLimiter;
  perMinute: number;
}

/** Each post field's position in the snapshot layout (`POST_FIELDS` order). */
const FIELD_POSITION: Readonly<Record<PostField, number>> = {
  read: 0,
  like: 1,
  fav: 2,
  comment: 3,
  repost: 4,
};

/** The requested fields of a snapshot, in layout order (`fields` is a subsequence of `POST_FIELDS`). */
function view(c: Counts, fields: readonly PostField[]): CountsView {
  if (fields.length === POST_FIELDS.length) {
    return { read: c[0], like: c[1], fav: c[2], comment: c[3], repost: c[4] };
  }
  const out: CountsView = {};
  for (const f of fields) out[f] = c[FIELD_POSITION[f]] ?? 0;
  return out;
}

/**
 * Likes, favourites and counts as users see them. A toggle is one atomic store call; its event goes
 * to the log off the request path. Reads parse snapshots and rebuild missing or malformed ones from
 * facts (all fields at once, never zeros while a rebuild runs: the reader waits for it).
 */
export class CounterService {
  /** Rebuilds in flight in this process, so concurrent readers of one entity share one. */
  private readonly rebuilding = new Map<string, Promise<Counts>>();

  constructor(
    private readonly store: CounterStore,
    private readonly directory: EntityDirectory,
    private readonly publisher: CounterEventPublisher | null,
    private readonly metrics: CounterMetrics,
    private readonly now: () => number = Date.now,
    private readonly toggleLimit: ToggleLimit | null = null,
  ) {}

  async toggle(
    ref: EntityRef,
    metric: FactMetric,
    userId: number,
    on: boolean,
  ): Promise<{ readonly changed: boolean; readonly state: boolean }> {
    if (this.toggleLimit) {
      const { limiter, perMinute } = this.toggleLimit;
      await enforceLimit(limiter, `toggle:${userId}`, perMinute, 60_000, 'likes and favourites');
    }
    await this.assertVisible([ref], userId);
    const result = await this.store.toggle(ref, metric, userId, on, this.now());
    this.metrics.toggles.inc({ metric, changed: result.changed ? 'true' : 'false' });
    if (result.event && !result.published) this.publisher?.enqueue(result.event);
    return result;
  }

  /** Counts of one entity; 404 when the caller may not see it. */
  async counts(
    ref: EntityRef,
    viewerId: number | null,
    fields: readonly PostField[] = POST_FIELDS,
  ): Promise<CountsView> {
    await this.assertVisible([ref], viewerId);
    const [counts] = await this.snapshots([ref]);
    return view(counts ?? ZERO_COUNTS, fields);
  }

  /** Counts of many entities in one round trip; null for those the caller may not see. */
  async countsMany(
    refs: readonly EntityRef[],
    viewerId: number | null,
    fields: readonly PostField[] = POST_FIELDS,
  ): Promise<(CountsView | null)[]> {
    const visible = await this.directory.visible(refs, viewerId);
    const shown = visible.every(Boolean) ? refs : refs.filter((_, i) => visible[i]);
    const counts = shown.length > 0 ? await this.snapshots(shown) : [];
    let next = 0;
    return visible.map((v) => (v ? view(counts[next++] ?? ZERO_COUNTS, fields) : null));
  }

  /** The caller's like and favourite flags for many entities; null for those the caller may not see. */
  async flags(refs: readonly EntityRef[], userId: number): Promise<(Flags | null)[]> {
    const visible = await this.directory.visible(refs, userId);
    const shown = refs.filter((_, i) => visible[i]);
    const flags = shown.length > 0 ? await this.store.flags(userId, shown) : [];
    let next = 0;
    return visible.map((v) => (v ? (flags[next++] ?? { like: false, fav: false }) : null));
  }

  /** Snapshots for the refs; missing or malformed ones are rebuilt from facts first. */
  async snapshots(refs: readonly EntityRef[]): Promise<Counts[]> {
    const found = await this.store.readSnapshots(refs);
    if (!found.includes(null)) return found as Counts[];
    return Promise.all(found.map(async (counts, i) => counts ?? this.rebuildOnce(refs[i]!)));
  }

  private rebuildOnce(ref: EntityRef): Promise<Counts> {
    const key = `${ref.etype}:${ref.eid}`;
    let pending = this.rebuilding.get(key);
    if (!pending) {
      this.metrics.rebuilds.inc({ reason: 'read' });
      pending = this.store.rebuild(ref).finally(() => this.rebuilding.delete(key));
      this.rebuilding.set(key, pending);
    }
    return pending;
  }

  private async assertVisible(refs: readonly EntityRef[], viewerId: number | null): Promise<void> {
    const visible = await this.directory.visible(refs, viewerId);
    if (visible.some((v) => !v)) throw new NotFoundError('No such entity');
  }
}
