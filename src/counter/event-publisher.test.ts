import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import { CounterMetrics } from './counter.metrics.js';
import { CounterEventPublisher } from './event-publisher.js';
import { eventFor, type CounterEvent } from './model.js';
import type { CounterStore } from './store/counter-store.js';

const ref = { etype: 'knowpost' as const, eid: '42' };
const event = (seq: number): CounterEvent => eventFor(ref, 'like', seq, 1, seq, 1_000 + seq);

function fakes(publish: () => Promise<void>) {
  const marked: CounterEvent[] = [];
  const events = { publish } as unknown as EventLog;
  const store = {
    markPublished: async (batch: readonly CounterEvent[]) => {
      marked.push(...batch);
    },
  } as unknown as CounterStore;
  return { events, store, marked };
}

describe(CounterEventPublisher.name, () => {
  it('counts the events it lets go of past its buffer, and shows what waits as a gauge', async () => {
    const { events, store } = fakes(async () => {
      throw new Error('injected: log down');
    });
    const registry = new Registry();
    const metrics = new CounterMetrics(registry);
    const publisher = new CounterEventPublisher(
      events,
      store,
      { onDropped: (n) => metrics.eventsDropped.inc(n) },
      { lingerMs: 1_000, maxBatch: 1_000, maxBuffered: 5, maxBackoffMs: 1_000 },
    );
    metrics.buffered = () => publisher.buffered;
    for (let seq = 1; seq <= 8; seq++) publisher.enqueue(event(seq));
    expect(publisher.buffered).toBe(5);
    expect((await metrics.eventsDropped.get()).values[0]?.value).toBe(3);
    expect((await metrics.publishBuffered.get()).values[0]?.value).toBe(5);
    await publisher.close(50);
  });

  it('gives up sending on close after its deadline when the log does not answer, and says what it let go of', async () => {
    const { events, store, marked } = fakes(() => new Promise<void>(() => undefined));
    let dropped = 0;
    const publisher = new CounterEventPublisher(
      events,
      store,
      { onDropped: (n) => (dropped += n) },
      { lingerMs: 0, maxBatch: 2, maxBuffered: 100, maxBackoffMs: 1_000 },
    );
    for (let seq = 1; seq <= 5; seq++) publisher.enqueue(event(seq));
    const started = Date.now();
    await publisher.close(200);
    expect(Date.now() - started).toBeLessThan(1_000);
    expect(marked).toEqual([]);
    // The batch on its way may still land; the three behind it are the repair job's.
    expect(dropped).toBe(3);
    // A toggle that finishes after the close.
    publisher.enqueue(event(6));
    expect(dropped).toBe(4);
  });

  it('lets go of a batch that fails while closing, also once close gave up waiting for it', async () => {
    let fail!: (err: Error) => void;
    const { events, store } = fakes(() => new Promise<void>((_resolve, reject) => (fail = reject)));
    let dropped = 0;
    const publisher = new CounterEventPublisher(events, store, { onDropped: (n) => (dropped += n) });
    publisher.enqueue(event(1));
    publisher.enqueue(event(2));
    await publisher.close(100);
    expect([dropped, publisher.buffered]).toEqual([0, 0]);
    fail(new Error('injected: log down'));
    await new Promise((resolve) => setImmediate(resolve));
    expect([dropped, publisher.buffered]).toEqual([2, 0]);
  });

  it('sends what is queued on close when the log answers', async () => {
    const sent: number[] = [];
    const { events, store, marked } = fakes(async () => {
      sent.push(1);
    });
    const publisher = new CounterEventPublisher(events, store);
    publisher.enqueue(event(1));
    publisher.enqueue(event(2));
    await publisher.close();
    expect(sent).toHaveLength(1);
    expect(marked.map((e) => e.seq)).toEqual([1, 2]);
  });
});
