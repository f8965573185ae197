/** What the counter workers report while they fail: the consumer lag of a batch that comes again, clamped fields. */
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import type { Batch, EventLog, SubscribeOptions } from '../platform/eventlog/eventlog.js';
import { CounterAggregator } from './aggregator.js';
import { CounterMetrics } from './counter.metrics.js';
import { flushPending } from './maintenance.js';
import type { CounterStore } from './store/counter-store.js';

describe(CounterAggregator.name, () => {
  it('shows the lag of a batch that fails and comes again growing, not the last one applied', async () => {
    let handler: SubscribeOptions['handler'] | undefined;
    const events = {
      subscribe: async (options: SubscribeOptions) => {
        handler = options.handler;
        return { close: async () => {} };
      },
    } as unknown as EventLog;
    let failing = true;
    const store = {
      applyEvents: async (list: unknown[]) => {
        if (failing) throw new Error('store unavailable');
        return { applied: list.length, skipped: 0 };
      },
    } as unknown as CounterStore;
    const registry = new Registry();
    const metrics = new CounterMetrics(registry);
    let now = 10_000;
    const sut = new CounterAggregator(
      events,
      store,
      metrics,
      () => {},
      { maxBatch: 10, maxWaitMs: 1 },
      () => now,
    );
    await sut.start();
    const event = { entityType: 'knowpost', entityId: '1', metric: 'like', delta: 1, seq: 1, userId: 2 };
    const batch: Batch = {
      topic: 'counter-events',
      records: [
        {
          topic: 'counter-events',
          partition: 0,
          offset: 0n,
          key: '1',
          value: JSON.stringify(event),
          timestamp: 9_000,
        },
      ],
    };
    const lag = async () =>
      (await registry.getSingleMetric('zg_counter_consumer_lag_ms')!.get()).values[0]?.value;

    await expect(handler!(batch)).rejects.toThrow('store unavailable');
    expect(await lag()).toBe(1_000);
    now = 25_000;
    await expect(handler!(batch)).rejects.toThrow('store unavailable');
    expect(await lag()).toBe(16_000);
    failing = false;
    now = 26_000;
    await handler!(batch);
    expect(await lag()).toBe(17_000);
  });
});

describe(flushPending.name, () => {
  it('exports the fields its folds clamped at zero, also when a round fails', async () => {
    const rounds = [
      { folded: 5, clamped: 1 },
      { folded: 2, clamped: 2 },
      { folded: 0, clamped: 0 },
    ];
    const store = {
      clampedFields: 0,
      async flush() {
        const round = rounds.shift();
        if (!round) throw new Error('store unavailable');
        this.clampedFields += round.clamped;
        return round.folded;
      },
    };
    const registry = new Registry();
    const metrics = new CounterMetrics(registry);
    const clamped = async () =>
      (await registry.getSingleMetric('zg_counter_clamped_fields_total')!.get()).values[0]?.value;
    expect(await flushPending(store as unknown as CounterStore, metrics)).toBe(7);
    expect(await clamped()).toBe(3);
    rounds.push({ folded: 1, clamped: 1 });
    await expect(flushPending(store as unknown as CounterStore, metrics)).rejects.toThrow(
      'store unavailable',
    );
    expect(await clamped()).toBe(4);
  });
});
