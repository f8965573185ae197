import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { LocalInvalidationBus, LocalInvalidationHub } from '../cache/local-invalidation-bus.js';
import { OUTBOX_WAKE_SCOPE, OutboxWakeSender, wakeOnAnnouncements } from './wake.js';

/** A bus whose publishes stay in flight until the test settles them. */
function heldBus() {
  const sent: { at: number; settle: (err?: Error) => void }[] = [];
  return {
    sent,
    publish: vi.fn((scope: string, keys: readonly string[]) => {
      expect(scope).toBe(OUTBOX_WAKE_SCOPE);
      expect(keys).toEqual([]);
      return new Promise<void>((ok, fail) => {
        sent.push({ at: Date.now(), settle: (err) => (err ? fail(err) : ok()) });
      });
    }),
  };
}

describe('OutboxWakeSender', () => {
  beforeEach(() => {
    vi.useFakeTimers();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  it('announces the first commit at once and folds the commits that follow into one more message', async () => {
    const bus = heldBus();
    const sender = new OutboxWakeSender(bus, () => {}, 10);
    sender.committed();
    expect(bus.publish).toHaveBeenCalledTimes(1);
    for (let i = 0; i < 50; i++) sender.committed();
    expect(bus.publish).toHaveBeenCalledTimes(1);
    bus.sent[0]!.settle();
    await vi.advanceTimersByTimeAsync(10);
    // The commits made while the first message was on its way get a message of their own.
    expect(bus.publish).toHaveBeenCalledTimes(2);
    bus.sent[1]!.settle();
    await vi.advanceTimersByTimeAsync(100);
    expect(bus.publish).toHaveBeenCalledTimes(2);
  });

  it('sends at most one message per interval, and never drops the last commit', async () => {
    const bus = heldBus();
    const sender = new OutboxWakeSender(bus, () => {}, 10);
    sender.committed();
    bus.sent[0]!.settle();
    await vi.advanceTimersByTimeAsync(1);
    sender.committed();
    expect(bus.publish).toHaveBeenCalledTimes(1);
    await vi.advanceTimersByTimeAsync(8);
    expect(bus.publish).toHaveBeenCalledTimes(1);
    await vi.advanceTimersByTimeAsync(1);
    expect(bus.publish).toHaveBeenCalledTimes(2);
    expect(bus.sent[1]!.at - bus.sent[0]!.at).toBeGreaterThanOrEqual(10);
  });

  it('reports a failed announcement and keeps announcing later commits', async () => {
    const bus = heldBus();
    const errors: unknown[] = [];
    const sender = new OutboxWakeSender(bus, (err) => errors.push(err), 10);
    sender.committed();
    bus.sent[0]!.settle(new Error('redis down'));
    await vi.advanceTimersByTimeAsync(20);
    expect(errors).toHaveLength(1);
    sender.committed();
    expect(bus.publish).toHaveBeenCalledTimes(2);
  });

  it('announces nothing after close', async () => {
    const bus = heldBus();
    const sender = new OutboxWakeSender(bus, () => {}, 10);
    sender.committed();
    sender.committed();
    sender.close();
    bus.sent[0]!.settle();
    await vi.advanceTimersByTimeAsync(50);
    sender.committed();
    expect(bus.publish).toHaveBeenCalledTimes(1);
  });
});

describe('wakeOnAnnouncements', () => {
  it("wakes the relay on another process's announcements, not on other scopes, until unsubscribed", async () => {
    const hub = new LocalInvalidationHub();
    const apiBus = new LocalInvalidationBus(hub);
    const workerBus = new LocalInvalidationBus(hub);
    const relay = { notify: vi.fn() };
    const stop = wakeOnAnnouncements(workerBus, relay);

    const sender = new OutboxWakeSender(apiBus, (err) => {
      throw err;
    });
    sender.committed();
    expect(relay.notify).toHaveBeenCalledTimes(1);
    await apiBus.publish('knowpost', ['1']);
    expect(relay.notify).toHaveBeenCalledTimes(1);

    stop();
    await apiBus.publish(OUTBOX_WAKE_SCOPE, []);
    expect(relay.notify).toHaveBeenCalledTimes(1);
    sender.close();
  });

  it('wakes the relay after the bus may have missed announcements', () => {
    let gap: (() => void) | undefined;
    const bus = {
      subscribe: () => () => {},
      onGap: (handler: () => void) => {
        gap = handler;
        return () => (gap = undefined);
      },
    };
    const relay = { notify: vi.fn() };
    const stop = wakeOnAnnouncements(bus, relay);
    gap?.();
    expect(relay.notify).toHaveBeenCalledTimes(1);
    stop();
    expect(gap).toBeUndefined();
  });
});
