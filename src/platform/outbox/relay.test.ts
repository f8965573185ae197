import { describe, expect, it } from 'vitest';
import type { EventLog } from '../eventlog/eventlog.js';
import type { OutboxRow, OutboxStore } from './outbox.js';
import { OutboxRelay } from './relay.js';
import { turnCounter } from '../../../test/rig/fakes.js';

const row = (id: number, topic: string, createdAt: number): OutboxRow => ({
  id,
  topic,
  key: String(id),
  payload: '{}',
  createdAt,
});

describe(OutboxRelay.name, () => {
  it('counts rows published only once they are deleted, and ages a round by the rows it published', async () => {
    const rows = [row(1, 'a', 900), row(2, 'b', 100), row(3, 'b', 150)];
    let deletes = 0;
    const store: OutboxStore = {
      claim: async (_limit: number, work: (rows: OutboxRow[]) => Promise<number[]>) => {
        const done = await work(rows);
        // The first delete fails (a lost connection): the rows stay, and are published again.
        if (deletes++ === 0) throw new Error('delete failed');
        return { handed: done.length, full: false };
      },
    };
    const events = {
      // Topic b's publish fails: its rows (the older ones) wait for a later round.
      publish: async (topic: string) => {
        if (topic === 'b') throw new Error('log down');
      },
    } as unknown as EventLog;
    const reported: [number, number][] = [];
    const relay = new OutboxRelay({
      store,
      events,
      now: () => 1_000,
      onPublished: (n, age) => reported.push([n, age]),
    });
    await expect(relay.runOnce()).rejects.toThrow('delete failed');
    expect([reported, relay.stats.published]).toEqual([[], 0]);
    await relay.runOnce().catch(() => undefined);
    expect([reported, relay.stats.published]).toEqual([[[1, 100]], 1]);
  });

  it('gives the event loop a turn between full rounds of a backlog', async () => {
    const loop = turnCounter();
    // Four full claims answered synchronously (as the embedded store does), then none.
    const seen: number[] = [];
    const store: OutboxStore = {
      claim: async (_limit: number, work: (rows: OutboxRow[]) => Promise<number[]>) => {
        if (seen.length >= 4) return { handed: 0, full: false };
        seen.push(loop.turns);
        await work([row(seen.length, 'a', 0)]);
        return { handed: 1, full: true };
      },
    };
    const events = { publish: async () => undefined } as unknown as EventLog;
    const relay = new OutboxRelay({ store, events, pollIntervalMs: 60_000 });
    relay.start();
    const deadline = Date.now() + 5_000;
    while (seen.length < 4 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 5));
    loop.stop();
    await relay.stop();
    expect(seen).toHaveLength(4);
    for (let i = 1; i < seen.length; i++) expect(seen[i]).toBeGreaterThan(seen[i - 1]!);
  });
});
