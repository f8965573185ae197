import { Registry } from 'prom-client';
import { describe, expect, it, vi } from 'vitest';
import type { Batch, EndOffsets, EventLog } from '../platform/eventlog/eventlog.js';
import { CounterMetrics } from './counter.metrics.js';
import {
  flushPending,
  LISTED,
  REPAIR_RETRY_MAX_MS,
  repairUnpublished,
  replayAll,
  verifyAll,
} from './maintenance.js';
import { turnCounter } from '../../test/rig/fakes.js';
import { ReplayFold } from './replay-fold.js';
import { COUNTER_TOPIC, entityKey, eventFor, type CounterEvent, type EntityRef } from './model.js';
import type { CounterStore, DeferredEvent, StaleEvent } from './store/counter-store.js';

/** A log of counter events in two partitions; `readRange` honours the end offsets it is given. */
class FakeLog {
  readonly partitions: CounterEvent[][] = [[], []];

  append(partition: number, events: CounterEvent[]): void {
    this.partitions[partition]!.push(...events);
  }

  endOffsets(): Promise<EndOffsets> {
    return Promise.resolve(new Map(this.partitions.map((p, i) => [i, BigInt(p.length)])));
  }

  complete = true;
  holdsEveryRecord(): Promise<boolean> {
    return Promise.resolve(this.complete);
  }

  async readRange(
    topic: string,
    until: EndOffsets,
    handler: (batch: Batch) => Promise<void>,
    maxBatch = 500,
    from?: EndOffsets,
  ): Promise<void> {
    for (const [partition, end] of until) {
      const start = Number(from?.get(partition) ?? 0n);
      const records = this.partitions[partition]!.slice(start, Number(end)).map((e, i) => ({
        topic,
        partition,
        offset: BigInt(start + i),
        key: entityKey({ etype: e.entityType, eid: e.entityId }),
        value: JSON.stringify(e),
        timestamp: e.ts,
      }));
      for (let i = 0; i < records.length; i += maxBatch)
        await handler({ topic, records: records.slice(i, i + maxBatch) });
    }
  }
}

/**
 * Records replayed facts and rebuilds. Earlier `replayFacts` calls take longer than later ones, so
 * concurrent calls finish in reverse order; a rebuild records how many of its entity's facts were there.
 */
class RecordingStore {
  readonly facts = new Map<string, CounterEvent>();
  readonly calls: number[] = [];
  readonly rebuiltWith = new Map<string, number>();
  inFlight = 0;
  maxInFlight = 0;
  resets = 0;

  /** Entities the store holds before the replay, with their seq. */
  readonly held = new Map<string, number>();

  async staleUnpublished(): Promise<StaleEvent[]> {
    return [];
  }

  /** Whether `sampleEntities` leaves out what the store holds (a sample that finds nothing). */
  sampleMisses = false;

  async scanEntities(): Promise<{ refs: EntityRef[]; cursor: string | null }> {
    return { refs: [...this.held.keys()].map((eid) => ({ etype: 'knowpost', eid })), cursor: null };
  }

  async sampleEntities(): Promise<EntityRef[]> {
    return this.sampleMisses ? [] : (await this.scanEntities()).refs;
  }

  async inspect(ref: EntityRef): Promise<{ seq: number }> {
    return { seq: this.held.get(ref.eid) ?? 0 };
  }

  /** Calls of `seal` and `unseal`, in order: `seal` with its groups ('all' without), `unseal`. */
  readonly sealing: (string | number[])[] = [];

  async seal(groups?: readonly number[]): Promise<void> {
    this.sealing.push(groups ? [...groups] : 'all');
  }

  async unseal(): Promise<number[]> {
    this.sealing.push('unseal');
    return [3, 5];
  }

  async claimForRestore(): Promise<void> {}

  async unsealedGroups(): Promise<number> {
    return 0;
  }

  async reset(): Promise<void> {
    this.resets++;
    this.facts.clear();
  }

  async replayFacts(events: readonly CounterEvent[]): Promise<void> {
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    this.calls.push(events.length);
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, 40 - 10 * this.calls.length)));
    for (const e of events) {
      const key = `${e.entityId}:${e.metric}:${e.userId}`;
      expect(this.facts.has(key)).toBe(false);
      this.facts.set(key, e);
    }
    this.inFlight--;
  }

  async rebuild(ref: EntityRef): Promise<[number, number, number, number, number]> {
    expect(this.rebuiltWith.has(ref.eid)).toBe(false);
    const present = [...this.facts.values()].filter((e) => e.entityId === ref.eid).length;
    this.rebuiltWith.set(ref.eid, present);
    return [0, 0, 0, 0, 0];
  }
}

describe(repairUnpublished.name, () => {
  /** Unpublished records, older than any bound, of a few entities; found in order until dropped or deferred. */
  function backlog(records: number, entities: number) {
    const waiting: StaleEvent[] = Array.from({ length: records }, (_, i) => {
      const ref: EntityRef = { etype: 'knowpost', eid: String(1 + (i % entities)) };
      return { ref, token: String(i), event: eventFor(ref, 'like', i, 1, i + 1, 0) };
    });
    const rebuilds: string[] = [];
    const deferred: DeferredEvent[] = [];
    let inFlight = 0;
    let maxInFlight = 0;
    const leave = (entries: readonly StaleEvent[]) => {
      const gone = new Set(entries.map((e) => e.token));
      waiting.splice(0, waiting.length, ...waiting.filter((e) => !gone.has(e.token)));
    };
    const store = {
      staleUnpublished: async (_now: number, _older: number, limit: number) => waiting.slice(0, limit),
      dropUnpublished: async (entries: readonly StaleEvent[]) => leave(entries),
      deferUnpublished: async (entries: readonly DeferredEvent[]) => {
        deferred.push(...entries);
        leave(entries);
      },
      rebuild: async (ref: EntityRef) => {
        maxInFlight = Math.max(maxInFlight, ++inFlight);
        await new Promise((resolve) => setTimeout(resolve, 1));
        inFlight--;
        rebuilds.push(entityKey(ref));
      },
    } as unknown as CounterStore;
    return { store, rebuilds, waiting, deferred, maxInFlight: () => maxInFlight };
  }

  it('asks a log that refused once no more that run, and rebuilds each entity once, a few at a time', async () => {
    const { store, rebuilds, waiting, maxInFlight } = backlog(2_600, 40);
    let publishes = 0;
    const events = {
      publish: async () => {
        publishes++;
        throw new Error('injected: log down');
      },
    } as unknown as EventLog;
    const report = await repairUnpublished(store, events, new CounterMetrics(new Registry()), 1_000, 100);
    expect(publishes).toBe(1);
    expect(report).toEqual({ republished: 0, rebuilt: 40 });
    expect(new Set(rebuilds).size).toBe(40);
    expect(rebuilds).toHaveLength(40);
    expect(maxInFlight()).toBeGreaterThan(1);
    expect(maxInFlight()).toBeLessThanOrEqual(8);
    expect(waiting).toEqual([]); // every record kept for a later attempt (deferred here)
  });

  it('tries a refused record again after as long as it waited so far, between olderThanMs and a minute', async () => {
    const { store, waiting, deferred } = backlog(3, 3);
    // Toggled 3.5 s, 20 s and 10 minutes before this run.
    const now = 1_000_000;
    const ages = [3_500, 20_000, 600_000];
    waiting.forEach((w, i) => (w.event!.ts = now - ages[i]!));
    const refusing = {
      publish: async () => Promise.reject(new Error('injected: log down')),
    } as unknown as EventLog;
    await repairUnpublished(store, refusing, new CounterMetrics(new Registry()), now, 3_000);
    // Found again `olderThanMs` after `at`: 3.5 s, 20 s and 60 s from now.
    expect(deferred.map((d) => d.at + 3_000 - now)).toEqual([3_500, 20_000, REPAIR_RETRY_MAX_MS]);
  });

  it('publishes every batch while the log takes them, rebuilding nothing', async () => {
    const { store, rebuilds } = backlog(1_200, 40);
    const published: number[] = [];
    const events = {
      publish: async (_topic: string, records: readonly unknown[]) => void published.push(records.length),
    } as unknown as EventLog;
    const report = await repairUnpublished(store, events, new CounterMetrics(new Registry()), 1_000, 100);
    expect(published).toEqual([500, 500, 200]);
    expect(report).toEqual({ republished: 1_200, rebuilt: 0 });
    expect(rebuilds).toEqual([]);
  });
});

describe(replayAll.name, () => {
  const post = (n: number): EntityRef => ({ etype: 'knowpost', eid: String(1000 + n) });

  it('replays the surviving fact of every (entity, metric, user) once and rebuilds each entity after all of its facts', async () => {
    const log = new FakeLog();
    const want = new Map<string, number>();
    // 300 small entities, a few events each; the later event of a user decides
    for (let n = 0; n < 300; n++) {
      const ref = post(n);
      const events = [
        eventFor(ref, 'like', 1, 1, 1, 0),
        eventFor(ref, 'like', 2, 1, 2, 0),
        eventFor(ref, 'fav', 1, 1, 3, 0),
        eventFor(ref, 'like', 1, -1, 4, 0),
      ];
      // out of seq order across partitions: seq 4 before seq 1
      log.append(n % 2, [events[3]!, events[1]!]);
      log.append((n + 1) % 2, [events[0]!, events[2]!]);
      want.set(ref.eid, 3);
    }
    // one entity with more facts than one replay call takes
    const big = post(9999);
    const bigEvents = Array.from({ length: 12_345 }, (_, i) => eventFor(big, 'like', i + 1, 1, i + 1, 0));
    log.append(0, bigEvents.slice(0, 6000));
    log.append(1, bigEvents.slice(6000));
    want.set(big.eid, bigEvents.length);
    // published after the end offsets are captured: must not be read
    const end = await log.endOffsets();
    const late = eventFor(post(1), 'fav', 77, 1, 99, 0);
    const sutLog = {
      holdsEveryRecord: () => log.holdsEveryRecord(),
      endOffsets: () => Promise.resolve(end),
      readRange: async (...args: Parameters<EventLog['readRange']>) => {
        log.append(0, [late]);
        await log.readRange(...args);
      },
    } as unknown as EventLog;

    const store = new RecordingStore();
    const report = await replayAll(store as unknown as CounterStore, sutLog, () => undefined);

    expect(store.resets).toBe(1);
    expect(report).toEqual({
      published: 0,
      events: 300 * 4 + bigEvents.length,
      malformed: 0,
      facts: 300 * 3 + bigEvents.length,
      entities: 301,
    });
    expect(store.facts.size).toBe(report.facts);
    // the highest seq decided each (entity, metric, user): user 1 unliked every small post
    expect(store.facts.get(`${post(7).eid}:like:1`)?.delta).toBe(-1);
    expect(store.facts.get(`${post(7).eid}:like:2`)?.delta).toBe(1);
    expect(store.facts.has(`${post(1).eid}:fav:77`)).toBe(false);
    // every entity rebuilt once, with all of its facts already replayed
    expect(Object.fromEntries(store.rebuiltWith)).toEqual(Object.fromEntries(want));
    // in bounded chunks, several at a time
    expect(Math.max(...store.calls)).toBeLessThanOrEqual(5_000);
    expect(store.maxInFlight).toBeGreaterThan(1);
    expect(store.maxInFlight).toBeLessThanOrEqual(4);
  });

  it('counts malformed records and replays nothing for them', async () => {
    const store = new RecordingStore();
    const log = {
      holdsEveryRecord: () => Promise.resolve(true),
      endOffsets: () => Promise.resolve(new Map([[0, 2n]])),
      readRange: async (
        _t: string,
        _u: EndOffsets,
        handler: (b: Batch) => Promise<void>,
        _max?: number,
        from?: EndOffsets,
      ) => {
        // Nothing was published after the end first read.
        if (from) return;
        const record = (value: string, offset: bigint) => ({
          topic: COUNTER_TOPIC,
          partition: 0,
          offset,
          key: 'k',
          value,
          timestamp: 0,
        });
        await handler({
          topic: COUNTER_TOPIC,
          records: [
            record('{not json', 0n),
            record(JSON.stringify(eventFor(post(1), 'like', 5, 1, 1, 0)), 1n),
            // JSON the store would refuse once emptied: malformed before anything is touched.
            record(JSON.stringify({ ...eventFor(post(2), 'like', 6, 1, 1, 0), userId: -1 }), 2n),
          ],
        });
      },
    } as unknown as EventLog;
    const report = await replayAll(store as unknown as CounterStore, log, () => undefined);
    expect(report).toEqual({ published: 0, events: 1, malformed: 2, facts: 1, entities: 1 });
    expect(store.rebuiltWith.get(post(1).eid)).toBe(1);
  });

  it('refuses, leaving the store as it is, when the store holds changes the log does not, unless forced', async () => {
    const log = new FakeLog();
    log.append(0, [eventFor(post(1), 'like', 5, 1, 1, 0), eventFor(post(1), 'like', 6, 1, 2, 0)]);
    const store = new RecordingStore();
    // post 1 as far as the log (and one change behind it: a restored backup); post 2 unknown to it.
    store.held.set(post(1).eid, 2);
    store.held.set(post(3).eid, 1);
    store.facts.set('kept', eventFor(post(2), 'like', 6, 1, 1, 0));
    store.held.set(post(2).eid, 4);
    await expect(
      replayAll(store as unknown as CounterStore, log as unknown as EventLog, () => undefined),
    ).rejects.toThrow(
      /2 entities have a higher seq than the log holds \(knowpost:1003 at seq 1, the log up to 0, knowpost:1002 at seq 4, the log up to 0\)/,
    );
    expect(store.resets).toBe(0);
    expect([...store.facts.keys()]).toEqual(['kept']);
    // Told by the sample, before toggles were ever refused.
    expect(store.sealing).toEqual([]);
    // Told by the whole store once toggles are refused (the sample missed): taken again where they were.
    store.sampleMisses = true;
    await expect(
      replayAll(store as unknown as CounterStore, log as unknown as EventLog, () => undefined),
    ).rejects.toThrow(/2 entities have a higher seq than the log holds/);
    expect([store.resets, store.sealing]).toEqual([0, ['unseal', [3, 5]]]);
    // Stopped (Ctrl-C) after toggles were refused and before the reset: likewise.
    const stop = new AbortController();
    store.held.delete(post(2).eid);
    store.held.delete(post(3).eid);
    store.sealing.length = 0;
    const stopping = { ...store, unseal: async () => (stop.abort(), store.unseal()) };
    Object.setPrototypeOf(stopping, RecordingStore.prototype);
    await expect(
      replayAll(stopping as unknown as CounterStore, log as unknown as EventLog, () => undefined, {
        signal: stop.signal,
      }),
    ).rejects.toThrow(/abort/i);
    expect([store.resets, store.sealing]).toEqual([0, ['unseal', [3, 5]]]);
    store.sealing.length = 0;

    // As far as the log, or behind it: replayed.
    store.held.delete(post(2).eid);
    store.held.delete(post(3).eid);
    store.held.set(post(1).eid, 1);
    expect(
      await replayAll(store as unknown as CounterStore, log as unknown as EventLog, () => undefined),
    ).toMatchObject({ events: 2, facts: 2 });
    // Refused from before the last of the log was read until the facts were whole again: then taken everywhere.
    expect(store.sealing).toEqual(['unseal', 'all']);

    // A toggle made while the log is read (toggles are still taken then): its event comes after the
    // end first captured, and the store's seq is above the log's as first read. Not a stray.
    const live = new RecordingStore();
    live.held.set(post(1).eid, 2);
    let reads = 0;
    const readingLog = Object.assign(Object.create(log) as FakeLog, {
      readRange: async (...args: Parameters<EventLog['readRange']>) => {
        if (reads++ === 0) {
          log.append(0, [eventFor(post(1), 'like', 7, 1, 3, 0)]);
          live.held.set(post(1).eid, 3);
        }
        await log.readRange(...args);
      },
    });
    expect(
      await replayAll(live as unknown as CounterStore, readingLog as unknown as EventLog, () => undefined),
    ).toMatchObject({ events: 3, facts: 3 });
    expect([reads, live.resets]).toEqual([2, 1]);

    // Forced: replayed all the same.
    const forced = new RecordingStore();
    forced.held.set(post(2).eid, 4);
    const report = await replayAll(
      forced as unknown as CounterStore,
      log as unknown as EventLog,
      () => undefined,
      { force: true },
    );
    expect([forced.resets, report.facts]).toEqual([1, 3]);
  });

  it('closes its fold whether the replay completes, is refused or fails', async () => {
    const closed = vi.spyOn(ReplayFold.prototype, 'close');
    try {
      const log = new FakeLog();
      log.append(0, [eventFor(post(1), 'like', 5, 1, 1, 0), eventFor(post(2), 'fav', 6, 1, 1, 0)]);
      const replay = (s: RecordingStore) =>
        replayAll(s as unknown as CounterStore, log as unknown as EventLog, () => undefined);

      expect(await replay(new RecordingStore())).toMatchObject({ events: 2, facts: 2, entities: 2 });
      expect(closed).toHaveBeenCalledTimes(1);

      // Refused before the reset (the store holds changes the log does not).
      const ahead = new RecordingStore();
      ahead.held.set(post(3).eid, 1);
      await expect(replay(ahead)).rejects.toThrow(/higher seq than the log holds/);
      expect(closed).toHaveBeenCalledTimes(2);

      // Failing after the reset, while the facts are replayed.
      const failing = new RecordingStore();
      failing.replayFacts = () => Promise.reject(new Error('injected: store down'));
      await expect(replay(failing)).rejects.toThrow(/injected: store down/);
      expect([failing.resets, closed.mock.calls.length]).toEqual([1, 3]);
    } finally {
      closed.mockRestore();
    }
  });

  it('refuses, leaving the store as it is, when the log no longer holds its earliest events', async () => {
    const log = new FakeLog();
    log.append(0, [eventFor(post(1), 'like', 5, 1, 1, 0)]);
    log.complete = false;
    const store = new RecordingStore();
    store.facts.set('kept', eventFor(post(2), 'like', 6, 1, 1, 0));
    await expect(
      replayAll(store as unknown as CounterStore, log as unknown as EventLog, () => undefined),
    ).rejects.toThrow(/no longer holds/);
    expect(store.resets).toBe(0);
    expect([...store.facts.keys()]).toEqual(['kept']);
  });
});

describe(verifyAll.name, () => {
  const ref = (n: number): EntityRef => ({ etype: 'knowpost', eid: String(n) });
  /** Entity n is busy for its first `busyFor[n]` inspections; entity 3 has drifted. */
  function storeWith(busyFor: Record<number, number>) {
    const seen = new Map<string, number>();
    const rebuilt: string[] = [];
    const store = {
      scanEntities: async (cursor: string) =>
        cursor === '' ? { refs: [1, 2, 3, 4].map(ref), cursor: null } : { refs: [], cursor: null },
      inspect: async (r: EntityRef) => {
        const n = (seen.get(r.eid) ?? 0) + 1;
        seen.set(r.eid, n);
        const busy = n <= (busyFor[Number(r.eid)] ?? 0);
        const likes = r.eid === '3' && !rebuilt.includes('3') ? 2 : 1;
        return {
          seq: 5,
          applied: busy ? 4 : 5,
          pending: busy,
          snapshot: [0, likes, 0, 0, 0],
          facts: { like: 1, fav: 0 },
        };
      },
      rebuild: async (r: EntityRef) => {
        rebuilt.push(r.eid);
        return [0, 1, 0, 0, 0];
      },
    };
    return { store: store as unknown as CounterStore, rebuilt };
  }

  it('checks busy entities again after a pause and reports only those still busy', async () => {
    const { store, rebuilt } = storeWith({ 1: 1, 3: 2, 4: 99 });
    const report = await verifyAll(store, true, () => undefined, 5);
    expect(report).toMatchObject({ checked: 4, busy: 1, fixed: 1 });
    expect(report.drifted.map((r) => r.eid)).toEqual(['3']);
    expect(report.driftedEntities).toBe(1);
    expect(rebuilt).toEqual(['3']);
  });

  it('counts every drifted entity and lists only the first ones', async () => {
    const entities = LISTED + 234;
    const store = {
      scanEntities: async (cursor: string) => {
        const from = Number(cursor || '0');
        const refs = Array.from({ length: Math.min(500, entities - from) }, (_, i) => ref(from + i + 1));
        return { refs, cursor: from + refs.length < entities ? String(from + refs.length) : null };
      },
      inspect: async () => ({
        seq: 1,
        applied: 1,
        pending: false,
        snapshot: [0, 2, 0, 0, 0],
        facts: { like: 1, fav: 0 },
      }),
    } as unknown as CounterStore;
    const report = await verifyAll(store, false, () => undefined, 5);
    expect(report).toMatchObject({ checked: entities, busy: 0, driftedEntities: entities, fixed: 0 });
    expect(report.drifted).toHaveLength(LISTED);
    expect(report.drifted.at(-1)).toEqual(ref(LISTED));
  });
});

describe(flushPending.name, () => {
  it('gives the event loop a turn between rounds, as a store that folds synchronously needs', async () => {
    const loop = turnCounter();
    const seen: number[] = [];
    const store = {
      clampedFields: 0,
      flush: async () => {
        seen.push(loop.turns);
        return seen.length <= 3 ? 512 : 0;
      },
    } as unknown as CounterStore;
    expect(await flushPending(store, new CounterMetrics(new Registry()))).toBe(3 * 512);
    loop.stop();
    for (let i = 1; i < seen.length; i++) expect(seen[i]).toBeGreaterThan(seen[i - 1]!);
  });
});
