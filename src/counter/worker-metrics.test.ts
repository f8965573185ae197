/** What the counter workers report while they fail: the consumer lag of a batch that comes again, clamped fields. */
import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { handedLog, metricOf, oneRecord } from '../../test/rig/fakes.js';
import { CounterAggregator } from './aggregator.js';
import { CounterMetrics } from './counter.metrics.js';
import { flushPending } from './maintenance.js';
import type { CounterStore } from './store/counter-store.js';

describe(CounterAggregator.name, () => {
  it('shows the lag of a batch that fails and comes again growing, not the last one applied', async () => {
    const log = handedLog();
    let failing = true;
    const store = {
      applyEvents: async (list: unknown[]) => {
        if (failing) throw new Error('store unavailable');
        return { applied: list.length, skipped: 0 };
      },
    } as unknown as CounterStore;
    const registry = new Registry();
    let now = 10_000;
    const sut = new CounterAggregator(
      log.events,
      store,
      new CounterMetrics(registry),
      () => {},
      { maxBatch: 10, maxWaitMs: 1 },
      () => now,
    );
    await sut.start();
    const event = { entityType: 'knowpost', entityId: '1', metric: 'like', delta: 1, seq: 1, userId: 2 };
    const batch = oneRecord('counter-events', JSON.stringify(event), 9_000);
    const lag = () => metricOf(registry, 'zg_counter_consumer_lag_ms');

    await expect(log.deliver(batch)).rejects.toThrow('store unavailable');
    expect(await lag()).toBe(1_000);
    now = 25_000;
    await expect(log.deliver(batch)).rejects.toThrow('store unavailable');
    expect(await lag()).toBe(16_000);
    failing = false;
    now = 26_000;
    await log.deliver(batch);
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
    const clamped = () => metricOf(registry, 'zg_counter_clamped_fields_total');
    expect(await flushPending(store as unknown as CounterStore, metrics)).toBe(7);
    expect(await clamped()).toBe(3);
    rounds.push({ folded: 1, clamped: 1 });
    await expect(flushPending(store as unknown as CounterStore, metrics)).rejects.toThrow(
      'store unavailable',
    );
    expect(await clamped()).toBe(4);
  });
});
