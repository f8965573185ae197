/**
 * The relation projector's list-cache step against a stalled consumer: the state it read from the
 * database must not land in a list after a newer change (and a reader's fill) touched it.
 */
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { LocalInvalidationBus } from '../platform/cache/local-invalidation-bus.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import type { UserCounterStore } from '../user-counter/store/user-counter-store.js';
import { MemoryListCache } from './list-cache/memory-list-cache.js';
import type { RelationEvent } from './model.js';
import { RelationProjector } from './projector.js';
import { RelationMetrics } from './relation.metrics.js';
import type { PairSync, RelationRepository } from './relation.repository.js';

const A = 1;
const B = 2;

describe(RelationProjector.name, () => {
  it('drops, rather than writes, a list changed after the batch read the pair (a stalled consumer)', async () => {
    // The `following` table: when A follows B, since when.
    const table = { since: 1000 as number | null };
    const lists = new MemoryListCache({ ttlMs: 60_000, maxEntries: 10, maxLists: 10 });
    let release!: () => void;
    const stalled = new Promise<void>((r) => (release = r));
    let stallNext = true;
    const projector = () =>
      new RelationProjector({
        events: {} as EventLog,
        repo: {
          syncPairs: async (pairs: readonly RelationEvent[]): Promise<PairSync[]> =>
            pairs.map((p) => ({ ...p, createdAt: table.since, changed: true })),
          markApplied: async () => undefined,
        } as unknown as RelationRepository,
        counters: {
          apply: async () => {
            if (stallNext) {
              stallNext = false;
              await stalled;
            }
            return { skipped: 0 };
          },
        } as unknown as UserCounterStore,
        lists,
        bus: new LocalInvalidationBus(),
        metrics: new RelationMetrics(new Registry()),
        onError: () => undefined,
      });
    const follow: RelationEvent = { eventId: 'e1', type: 'follow', fromUserId: A, toUserId: B, ts: 1000 };
    const unfollow: RelationEvent = { eventId: 'e2', type: 'unfollow', fromUserId: A, toUserId: B, ts: 2000 };
    const following = { owner: A, kind: 'following' as const };
    await lists.fill(following, async () => [{ userId: B, createdAt: 1000 }]);

    // Consumer 1 reads "A follows B" and stalls before its list step.
    const slow = projector().apply([follow]);
    await new Promise((r) => setTimeout(r, 5));
    // A unfollows B: the table changes and the API drops both lists.
    table.since = null;
    await lists.invalidate([following, { owner: B, kind: 'followers' }]);
    // Consumer 2 (the partition moved) applies both events; a reader caches the list as it is.
    await projector().apply([follow, unfollow]);
    await lists.fill(following, async () => []);
    expect(await lists.all(following)).toEqual([]);

    release();
    await slow;
    expect((await lists.all(following)) ?? []).toEqual([]);
  });
});
