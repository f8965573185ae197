/**
 * The counter restorer's decisions, against stand-ins: when it replays, how it backs off after a
 * failure, and what it says. The replay itself is proved against real stores in the pipeline test.
 */
import { describe, expect, it } from 'vitest';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import type { KeyValueStore } from '../platform/kv/kv.js';
import { CounterRestorer, REPLAY_LEASE, type RestoreParts } from './restore.js';
import type { CounterStore } from './store/counter-store.js';

/** Just what a lease needs. */
function memoryKv(): KeyValueStore & { values: Map<string, string> } {
  const values = new Map<string, string>();
  return {
    values,
    async setIfAbsent(key: string, value: string) {
      if (values.has(key)) return false;
      values.set(key, value);
      return true;
    },
    async expireIfEquals(key: string, value: string) {
      return values.get(key) === value;
    },
    async deleteIfEquals(key: string, value: string) {
      if (values.get(key) !== value) return false;
      values.delete(key);
      return true;
    },
  } as unknown as KeyValueStore & { values: Map<string, string> };
}

function setup() {
  const state = { unsealed: 3, logReads: 0, logHolds: false, clock: 0, told: [] as string[] };
  const store = {
    async unsealedGroups() {
      return state.unsealed;
    },
  } as unknown as CounterStore;
  // The replay's first step asks the log whether it holds every record; "no" refuses it.
  const events = {
    async holdsEveryRecord() {
      state.logReads++;
      return state.logHolds;
    },
  } as unknown as EventLog;
  const kv = memoryKv();
  const parts: RestoreParts = {
    store,
    events,
    kv,
    markRestored: async () => undefined,
    addViewsBack: async () => ({}),
  };
  const log = {
    warn: (_f: object, m: string) => void state.told.push(`warn ${m}`),
    error: (_f: object, m: string) => void state.told.push(`error ${m}`),
  };
  const restorer = new CounterRestorer(parts, log as never, 1_000, () => state.clock);
  return { state, kv, restorer };
}

describe('CounterRestorer', () => {
  it('does nothing while the store is sealed', async () => {
    const { state, restorer } = setup();
    state.unsealed = 0;
    expect(await restorer.runOnce()).toBe('sealed');
    expect(state.logReads).toBe(0);
  });

  it('waits while another replay holds the lease', async () => {
    const { state, kv, restorer } = setup();
    kv.values.set(REPLAY_LEASE, 'someone else');
    expect(await restorer.runOnce()).toBe('busy');
    expect(await restorer.runOnce()).toBe('busy');
    expect(state.logReads).toBe(0);
    // Said once, naming the claim that may only be lapsing.
    expect(state.told).toEqual([
      expect.stringMatching(/^warn .*another replay holds the deployment's claim/),
    ]);
  });

  it('says so when its worker stops a restore it had begun', async () => {
    const { state, restorer } = setup();
    const stop = new AbortController();
    const parts = (restorer as unknown as { parts: RestoreParts }).parts;
    state.logHolds = true;
    // Enough of a store and a log for the replay to begin reading, then the worker stops.
    Object.assign(parts.store, {
      sampleEntities: async () => [],
      staleUnpublished: async () => [],
      unseal: async () => [],
      seal: async () => undefined,
    });
    Object.assign(parts.events, {
      endOffsets: async () => new Map([[0, 1n]]),
      readRange: async (_topic: string, _until: unknown, handler: (batch: unknown) => Promise<void>) => {
        await handler({ topic: 'counter-events', records: [] });
        stop.abort();
        await handler({ topic: 'counter-events', records: [] });
      },
    });
    expect(await restorer.runOnce(stop.signal)).toBe('stopped');
    expect(state.told).toEqual([
      expect.stringMatching(
        /^warn the counter store refuses likes and favourites until its facts are whole again: replaying/,
      ),
      expect.stringMatching(/^warn the counter store restore stopped with this process/),
    ]);
  });

  it('reads the seals again once it holds the lease, and leaves a store restored meanwhile alone', async () => {
    const { state, kv, restorer } = setup();
    // Sealed by another process between the first look and the lease.
    const take = kv.setIfAbsent.bind(kv);
    kv.setIfAbsent = async (...args) => {
      state.unsealed = 0;
      return take(...args);
    };
    expect(await restorer.runOnce()).toBe('sealed');
    expect(state.logReads).toBe(0);
    expect(kv.values.has(REPLAY_LEASE)).toBe(false);
  });

  it('stops with its worker, without counting the stop as a failure to back off from', async () => {
    const { state, restorer } = setup();
    const stop = new AbortController();
    stop.abort();
    expect(await restorer.runOnce(stop.signal)).toBe('stopped');
    const reads = state.logReads;
    await restorer.runOnce().catch(() => undefined);
    expect(state.logReads).toBe(reads + 1);
  });

  it('backs off after a refused replay, doubling up to ten minutes, and tries at once again once the store is whole', async () => {
    const { state, kv, restorer } = setup();
    const attempts: number[] = [];
    for (let t = 0; t <= 30 * 60_000; t += 1_000) {
      state.clock = t;
      const reads = state.logReads;
      await restorer.runOnce().catch(() => undefined);
      if (state.logReads > reads) attempts.push(t / 1000);
    }
    // Looked at every second; the wait after a failure doubles from 10 s: 10, 20, 40, 80, 160, 320, then 600 s.
    expect(attempts.slice(0, 8)).toEqual([0, 10, 30, 70, 150, 310, 630, 1230]);
    expect(kv.values.has(REPLAY_LEASE)).toBe(false);
    state.unsealed = 0;
    expect(await restorer.runOnce()).toBe('sealed');
    state.unsealed = 1;
    const reads = state.logReads;
    await restorer.runOnce().catch(() => undefined);
    expect(state.logReads).toBe(reads + 1);
  });
});
