import type { InvalidationBus } from '../platform/cache/invalidation-bus.js';
import {
  IDEMPOTENT_COMMIT_INTERVAL_MS,
  type EventLog,
  type Subscription,
} from '../platform/eventlog/eventlog.js';
import type { UserCounterDelta } from '../user-counter/model.js';
import type { UserCounterStore } from '../user-counter/store/user-counter-store.js';
import type { ListCache, ListChange } from './list-cache/list-cache.js';
import { parseRelationEvent, RELATION_TOPIC, type RelationEvent } from './model.js';
import type { RelationMetrics } from './relation.metrics.js';
import type { RelationRepository } from './relation.repository.js';
import { FIRST_PAGE_SCOPE } from './relation.service.js';

export const RELATION_GROUP = 'relation-proj';

export interface RelationProjectorDeps {
  events: EventLog;
  repo: RelationRepository;
  counters: UserCounterStore;
  lists: ListCache;
  bus: InvalidationBus;
  metrics: RelationMetrics;
  onError: (err: unknown) => void;
  /** Told which users a batch touched (the reconciler samples them). */
  onApplied?: (userIds: number[]) => void;
  maxBatch?: number;
  maxWaitMs?: number;
  now?: () => number;
}

/**
 * The `relation-proj` consumer. For each batch of relation events, in this order:
 *
 * 1. the `follower` projection: every pair the batch names is made to mirror `following` as it is
 *    now (not as the event says), in one transaction. Whatever was delivered twice, skipped ahead or
 *    arrived late, the projection ends equal to the truth once the last event of a pair is handled,
 *    and the last change of a pair always has an event that comes after it;
 * 2. the user counters: each event's ±1 to the follower's `followings` and the followed user's
 *    `followers`, applied by event id (a redelivered event moves nothing); then the events' unapplied
 *    marks are deleted (a counter rebuild counts them as applied until then);
 * 3. the list caches of both users (changed only where cached, so never partial; a list a change
 *    or another consumer touched after the batch began is dropped instead, see `ListCache.watch`),
 *    and every process's first-page cache of the followed users.
 *
 * The batch's offsets are committed only when all of it succeeded; any failure redelivers the batch,
 * and every step above is idempotent.
 */
export class RelationProjector {
  private subscription: Subscription | undefined;
  private readonly now: () => number;

  constructor(private readonly deps: RelationProjectorDeps) {
    this.now = deps.now ?? Date.now;
  }

  async start(): Promise<void> {
    this.subscription = await this.deps.events.subscribe({
      group: RELATION_GROUP,
      topics: [RELATION_TOPIC],
      maxBatch: this.deps.maxBatch ?? 1000,
      maxWaitMs: this.deps.maxWaitMs ?? 20,
      commitIntervalMs: IDEMPOTENT_COMMIT_INTERVAL_MS,
      handler: async (batch) => {
        const events: RelationEvent[] = [];
        for (const record of batch.records) {
          const event = parseRelationEvent(record.value);
          if (event) events.push(event);
          else {
            this.deps.metrics.eventsConsumed.inc({ outcome: 'malformed' });
            this.deps.onError(
              new Error(`skipping a malformed relation event at ${record.partition}:${record.offset}`),
            );
          }
        }
        await this.apply(events);
      },
      onError: this.deps.onError,
    });
  }

  async stop(): Promise<void> {
    await this.subscription?.close();
    this.subscription = undefined;
  }

  /** Applies a batch of events; idempotent (exported for the maintenance jobs and tests). */
  async apply(events: readonly RelationEvent[]): Promise<void> {
    if (events.length === 0) return;
    const { repo, counters, lists, metrics } = this.deps;

    // Watched before the pairs are read: a list a follow or unfollow (or another consumer) touches
    // after that is dropped rather than given the state read here, which may be older by then.
    const watch = await lists.watch(
      events.flatMap((e) => [
        { owner: e.fromUserId, kind: 'following' as const },
        { owner: e.toUserId, kind: 'followers' as const },
      ]),
    );
    let skipped: number;
    try {
      const synced = await repo.syncPairs(events);

      const deltas: UserCounterDelta[] = [];
      for (const e of events) {
        const delta = e.type === 'follow' ? 1 : -1;
        deltas.push({ eventId: e.eventId, userId: e.fromUserId, field: 'followings', delta });
        deltas.push({ eventId: e.eventId, userId: e.toUserId, field: 'followers', delta });
      }
      ({ skipped } = await counters.apply(deltas, this.now()));
      await repo.markApplied(events.map((e) => e.eventId));

      const changes: ListChange[] = [];
      for (const s of synced) {
        changes.push({ owner: s.fromUserId, kind: 'following', userId: s.toUserId, createdAt: s.createdAt });
        changes.push({ owner: s.toUserId, kind: 'followers', userId: s.fromUserId, createdAt: s.createdAt });
      }
      await lists.apply(changes, watch);
    } finally {
      watch.release();
    }
    // Told, or the batch fails and comes again (every step above is idempotent): a process whose
    // bus stayed connected (so no gap makes it drop its pages) would keep a big account's first
    // followers page without the change for as long as the page is kept.
    const followed = [...new Set(events.map((e) => String(e.toUserId)))];
    await this.deps.bus.publish(FIRST_PAGE_SCOPE, followed);

    // Two deltas an event; an event counts as redelivered when its deltas were skipped.
    const redelivered = Math.min(events.length, Math.round(skipped / 2));
    metrics.eventsConsumed.inc({ outcome: 'applied' }, events.length - redelivered);
    if (redelivered > 0) metrics.eventsConsumed.inc({ outcome: 'redelivered' }, redelivered);
    const now = this.now();
    for (const e of events) metrics.projectionLag.observe(Math.max(0, now - e.ts) / 1000);
    this.deps.onApplied?.([...new Set(events.flatMap((e) => [e.fromUserId, e.toUserId]))]);
  }
}
