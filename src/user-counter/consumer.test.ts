import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { postChangedEvent, postEvent, POST_TOPIC } from '../knowpost/post-events.js';
import { handedLog, metricOf, oneRecord } from '../../test/rig/fakes.js';
import { postEventsFeed, UserCounterConsumer } from './consumer.js';
import type { UserCounterStore } from './store/user-counter-store.js';
import { UserCounterMetrics } from './user-counter.metrics.js';

describe('post-events as user counter deltas', () => {
  it('moves the author’s posts on transitions only', () => {
    const value = (event: object) => JSON.stringify(event);
    expect(postEventsFeed.toDeltas(value(postEvent('published', '42', 7, 1, 3)))).toEqual([
      { eventId: 'knowpost:42:entered:3', userId: 7, field: 'posts', delta: 1 },
    ]);
    expect(postEventsFeed.toDeltas(value(postEvent('unpublished', '42', 7, 2, 3)))).toEqual([
      { eventId: 'knowpost:42:left:3', userId: 7, field: 'posts', delta: -1 },
    ]);
    // Events an earlier release wrote, still on their way, count as they did.
    const earlier = { eventId: 'knowpost:42:published', type: 'published', postId: '42', authorId: 7, ts: 1 };
    expect(postEventsFeed.toDeltas(value(earlier))).toEqual([
      { eventId: 'knowpost:42:published', userId: 7, field: 'posts', delta: 1 },
    ]);
    expect(postEventsFeed.toDeltas(value(postChangedEvent('42', 7, 3, '99')))).toEqual([]);
    expect(
      postEventsFeed.toDeltas(value({ ...postEvent('published', '42', 7, 1, 1), type: 'edited' })),
    ).toBeNull();
    expect(postEventsFeed.toDeltas('not json')).toBeNull();
    // Without an id it could not be applied once: malformed, not a batch that fails for ever.
    expect(
      postEventsFeed.toDeltas(value({ ...postEvent('published', '42', 7, 1, 1), eventId: '' })),
    ).toBeNull();
  });
});

describe(UserCounterConsumer.name, () => {
  it('shows the lag of a batch that fails and comes again growing', async () => {
    const log = handedLog();
    let failing = true;
    const store = {
      apply: async (deltas: unknown[]) => {
        if (failing) throw new Error('redis unavailable');
        return { applied: deltas.length, skipped: 0 };
      },
    } as unknown as UserCounterStore;
    const registry = new Registry();
    let now = 10_000;
    const sut = new UserCounterConsumer(
      log.events,
      store,
      [postEventsFeed],
      new UserCounterMetrics(registry),
      {
        maxBatch: 10,
        maxWaitMs: 1,
        onMalformed: () => {},
        onError: () => {},
        now: () => now,
      },
    );
    await sut.start();
    const batch = oneRecord(POST_TOPIC, JSON.stringify(postEvent('published', '42', 7, 9_000, 1)), 9_000);
    const lag = () => metricOf(registry, 'zg_user_counter_consumer_lag_ms');
    await expect(log.deliver(batch)).rejects.toThrow('redis unavailable');
    expect(await lag()).toBe(1_000);
    now = 30_000;
    await expect(log.deliver(batch)).rejects.toThrow('redis unavailable');
    expect(await lag()).toBe(21_000);
    failing = false;
    await log.deliver(batch);
    expect(await lag()).toBe(21_000);
  });
});
