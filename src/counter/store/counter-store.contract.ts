import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  entityKey,
  FIELD_INDEX,
  type CounterEvent,
  type Counts,
  type EntityRef,
  type FactMetric,
} from '../model.js';
import { encodeSnapshot } from '../snapshot.js';
import type { CounterStore, LoggedViews, ToggleResult } from './counter-store.js';

export interface CounterStoreFixture {
  sut: CounterStore;
  cleanup: () => Promise<void>;
}

const NOW = Date.parse('2030-01-01T00:00:00Z');
const SNOWFLAKE_BASE = 7_300_000_000_000_000_000n;

/** Posts with realistic 64-bit snowflake ids (beyond a double's exact range). */
const post = (n: number): EntityRef => ({
  etype: 'knowpost',
  eid: String(SNOWFLAKE_BASE + BigInt(n) * 4_194_304n),
});

/** Deterministic pseudo-random numbers, so a failing run can be repeated. */
function rng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

function eventsOf(results: readonly ToggleResult[]): CounterEvent[] {
  return results.flatMap((r) => (r.event ? [r.event] : []));
}

/** The snapshot of an entity whose only counts are its facts. */
function expected(facts: Record<FactMetric, number>): Counts {
  const counts: Counts = [0, 0, 0, 0, 0];
  counts[FIELD_INDEX.like] = facts.like;
  counts[FIELD_INDEX.fav] = facts.fav;
  return counts;
}

/**
 * The behaviour every `CounterStore` adapter must show (see the port's doc comment). The factory
 * returns an empty store of its own; tests only assume what the port promises, so an adapter that
 * publishes on toggle (embedded) and one that leaves publishing to the caller (cluster) both pass.
 */
export function defineCounterStoreContract(name: string, factory: () => Promise<CounterStoreFixture>): void {
  describe(`CounterStore contract: ${name}`, () => {
    let fx: CounterStoreFixture;
    let store: CounterStore;

    beforeEach(async () => {
      fx = await factory();
      store = fx.sut;
    });
    afterEach(async () => {
      await fx.cleanup();
    });

    const flushAll = async (): Promise<void> => {
      for (let i = 0; i < 1_000 && !(await store.isQuiet()); i++) await store.flush(64);
      expect(await store.isQuiet()).toBe(true);
    };

    const expectExact = async (refs: readonly EntityRef[]): Promise<void> => {
      const snapshots = await store.readSnapshots(refs);
      for (const [i, ref] of refs.entries()) {
        const facts = await store.factCounts(ref);
        expect({ ref: entityKey(ref), counts: snapshots[i]?.slice(1, 3) }).toEqual({
          ref: entityKey(ref),
          counts: [facts.like, facts.fav],
        });
      }
    };

    describe('toggle', () => {
      it('is idempotent: only a change yields an event, numbered by the entity’s seq', async () => {
        const ref = post(1);
        const first = await store.toggle(ref, 'like', 42, true, NOW);
        expect(first).toMatchObject({ changed: true, state: true });
        expect(first.event).toEqual({
          eventId: `knowpost:${ref.eid}:1`,
          entityType: 'knowpost',
          entityId: ref.eid,
          metric: 'like',
          idx: FIELD_INDEX.like,
          userId: 42,
          delta: 1,
          ts: NOW,
          seq: 1,
        });

        const again = await store.toggle(ref, 'like', 42, true, NOW + 1);
        expect(again).toMatchObject({ changed: false, state: true, event: null });

        const off = await store.toggle(ref, 'like', 42, false, NOW + 2);
        expect(off).toMatchObject({ changed: true, state: false });
        expect(off.event).toMatchObject({ eventId: `knowpost:${ref.eid}:2`, delta: -1, seq: 2, ts: NOW + 2 });

        const offAgain = await store.toggle(ref, 'like', 42, false, NOW + 3);
        expect(offAgain).toMatchObject({ changed: false, state: false, event: null });
        expect(await store.factCounts(ref)).toEqual({ like: 0, fav: 0 });
      });

      it('numbers changes per entity across metrics and users, and keeps the metrics apart', async () => {
        const [a, b] = [post(1), post(2)];
        expect((await store.toggle(a, 'like', 1, true, NOW)).event?.seq).toBe(1);
        expect((await store.toggle(a, 'fav', 1, true, NOW)).event).toMatchObject({
          seq: 2,
          metric: 'fav',
          idx: FIELD_INDEX.fav,
        });
        expect((await store.toggle(a, 'like', 2, true, NOW)).event?.seq).toBe(3);
        expect((await store.toggle(b, 'fav', 2, true, NOW)).event?.seq).toBe(1);
        expect(await store.factCounts(a)).toEqual({ like: 2, fav: 1 });
        expect(await store.factCounts(b)).toEqual({ like: 0, fav: 1 });
        expect(await store.flags(1, [a, b])).toEqual([
          { like: true, fav: true },
          { like: false, fav: false },
        ]);
      });

      it('stays consistent under 100 concurrent toggles of one user on one entity', async () => {
        const ref = post(3);
        const results = await Promise.all(
          Array.from({ length: 100 }, (_, i) => store.toggle(ref, 'like', 7, i % 3 !== 0, NOW + i)),
        );
        const changes = eventsOf(results).sort((x, y) => x.seq - y.seq);
        expect(changes.length).toBe(results.filter((r) => r.changed).length);
        expect(changes.map((e) => e.seq)).toEqual(Array.from({ length: changes.length }, (_, i) => i + 1));
        // Each change flips the fact, so the deltas in seq order alternate, starting with an add.
        changes.forEach((e, i) => expect(e.delta).toBe(i % 2 === 0 ? 1 : -1));
        for (const r of results) {
          if (r.event) expect(r.event.delta).toBe(r.state ? 1 : -1);
        }
        const held = changes.length % 2 === 1;
        expect(await store.factCounts(ref)).toEqual({ like: held ? 1 : 0, fav: 0 });
        expect(await store.flags(7, [ref])).toEqual([{ like: held, fav: false }]);
        expect((await store.inspect(ref)).seq).toBe(changes.length);
      });

      it('counts many users on one entity exactly, across their removals', async () => {
        const ref = post(4);
        const users = Array.from({ length: 600 }, (_, i) => i * 97 + 3);
        const liked = await Promise.all(users.map((u, i) => store.toggle(ref, 'like', u, true, NOW + i)));
        expect(liked.every((r) => r.changed)).toBe(true);
        expect(new Set(eventsOf(liked).map((e) => e.seq)).size).toBe(600);
        expect(await store.factCounts(ref)).toEqual({ like: 600, fav: 0 });

        const leaving = users.filter((_, i) => i % 3 === 0);
        const left = await Promise.all(leaving.map((u) => store.toggle(ref, 'like', u, false, NOW + 1_000)));
        expect(left.every((r) => r.changed)).toBe(true);
        expect(await store.factCounts(ref)).toEqual({ like: 400, fav: 0 });
        for (const [i, u] of users.entries()) {
          if (i % 25 !== 0 && i % 25 !== 1) continue;
          expect((await store.flags(u, [ref]))[0]).toEqual({ like: i % 3 !== 0, fav: false });
        }
        expect(await store.flags(users[1]! + 1, [ref])).toEqual([{ like: false, fav: false }]);
        expect((await store.inspect(ref)).seq).toBe(800);
      });
    });

    describe('reads', () => {
      it('returns the flags of a page of entities in order, unknown entities included', async () => {
        const refs = [post(10), post(11), post(12), post(13), post(14)];
        await store.toggle(refs[0]!, 'like', 5, true, NOW);
        await store.toggle(refs[1]!, 'fav', 5, true, NOW);
        await store.toggle(refs[2]!, 'like', 5, true, NOW);
        await store.toggle(refs[2]!, 'fav', 5, true, NOW);
        await store.toggle(refs[3]!, 'like', 6, true, NOW);
        const page = [...refs, post(99), refs[0]!];
        expect(await store.flags(5, page)).toEqual([
          { like: true, fav: false },
          { like: false, fav: true },
          { like: true, fav: true },
          { like: false, fav: false },
          { like: false, fav: false },
          { like: false, fav: false },
          { like: true, fav: false },
        ]);
        expect(await store.flags(5, [])).toEqual([]);
      });

      it('reports zero facts and no snapshot for an unknown entity', async () => {
        expect(await store.factCounts(post(98))).toEqual({ like: 0, fav: 0 });
        expect(await store.readSnapshots([post(98)])).toEqual([null]);
        expect(await store.readSnapshots([])).toEqual([]);
        expect(await store.inspect(post(98))).toEqual({
          seq: 0,
          applied: 0,
          pending: false,
          snapshot: null,
          facts: { like: 0, fav: 0 },
          sealed: true,
        });
      });

      it('reads snapshots in order, duplicates and missing ones included', async () => {
        await store.writeRawSnapshot(post(1), encodeSnapshot([1, 2, 3, 4, 5]));
        await store.writeRawSnapshot(post(2), encodeSnapshot([0, 4_000_000_000, 0, 0, 9]));
        expect(await store.readSnapshots([post(2), post(3), post(1), post(2)])).toEqual([
          [0, 4_000_000_000, 0, 0, 9],
          null,
          [1, 2, 3, 4, 5],
          [0, 4_000_000_000, 0, 0, 9],
        ]);
        await store.writeRawSnapshot(post(1), null);
        expect(await store.readSnapshots([post(1)])).toEqual([null]);
      });
    });

    describe('applyEvents and flush', () => {
      it('folds applied events into snapshots equal to the facts, and reports quiet after the flush', async () => {
        const refs = [post(20), post(21)];
        const results: ToggleResult[] = [];
        for (let u = 1; u <= 6; u++) results.push(await store.toggle(refs[0]!, 'like', u, true, NOW));
        results.push(await store.toggle(refs[0]!, 'fav', 3, true, NOW));
        results.push(await store.toggle(refs[0]!, 'like', 2, false, NOW));
        results.push(await store.toggle(refs[1]!, 'fav', 9, true, NOW));
        expect(await store.isQuiet()).toBe(true);

        expect(await store.applyEvents(eventsOf(results))).toEqual({ applied: 9, skipped: 0 });
        expect(await store.isQuiet()).toBe(false);
        const state = await store.inspect(refs[0]!);
        expect(state).toMatchObject({ seq: 8, applied: 8, pending: true, facts: { like: 5, fav: 1 } });

        expect(await store.flush(1_000)).toBeGreaterThan(0);
        await flushAll();
        expect(await store.flush(1_000)).toBe(0);
        expect(await store.readSnapshots(refs)).toEqual([
          [0, 5, 1, 0, 0],
          [0, 0, 1, 0, 0],
        ]);
        expect(await store.inspect(refs[0]!)).toEqual({
          seq: 8,
          applied: 8,
          pending: false,
          snapshot: [0, 5, 1, 0, 0],
          facts: { like: 5, fav: 1 },
          sealed: true,
        });
      });

      it('adds later runs to the existing snapshot, keeping its other fields', async () => {
        const ref = post(22);
        await store.toggle(ref, 'like', 1, true, NOW);
        await store.rebuild(ref);
        await store.writeRawSnapshot(ref, encodeSnapshot([50, 1, 0, 7, 2]));
        const later = eventsOf([
          await store.toggle(ref, 'like', 2, true, NOW),
          await store.toggle(ref, 'fav', 2, true, NOW),
          await store.toggle(ref, 'like', 3, true, NOW),
        ]);
        expect(await store.applyEvents(later)).toEqual({ applied: 3, skipped: 0 });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[50, 3, 1, 7, 2]]);
      });

      it('counts a redelivered batch once', async () => {
        const ref = post(23);
        const events = eventsOf(
          await Promise.all([1, 2, 3, 4].map((u) => store.toggle(ref, 'like', u, true, NOW))),
        );
        expect(await store.applyEvents(events)).toEqual({ applied: 4, skipped: 0 });
        expect(await store.applyEvents(events)).toEqual({ applied: 0, skipped: 4 });
        await flushAll();
        expect(await store.applyEvents(events)).toEqual({ applied: 0, skipped: 4 });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[0, 4, 0, 0, 0]]);
      });

      it('deduplicates a batch by seq and accepts its events in any order', async () => {
        const ref = post(24);
        const events = eventsOf([
          await store.toggle(ref, 'like', 1, true, NOW),
          await store.toggle(ref, 'like', 2, true, NOW),
          await store.toggle(ref, 'fav', 1, true, NOW),
        ]);
        const [e1, e2, e3] = events as [CounterEvent, CounterEvent, CounterEvent];
        expect(await store.applyEvents([e3, e1, e2, e1, e3])).toEqual({ applied: 3, skipped: 2 });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[0, 2, 1, 0, 0]]);
      });

      it('counts a superset batch that straddles the applied mark exactly once', async () => {
        const ref = post(25);
        await store.toggle(ref, 'like', 100, true, NOW);
        await store.rebuild(ref);
        const events: CounterEvent[] = [];
        for (let u = 1; u <= 5; u++) events.push((await store.toggle(ref, 'like', u, true, NOW)).event!);
        events.push((await store.toggle(ref, 'like', 2, false, NOW)).event!);
        expect(await store.applyEvents(events.slice(0, 3))).toEqual({ applied: 3, skipped: 0 });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[0, 4, 0, 0, 0]]);
        // Two of them were applied already: counted as skipped, though the entity is rebuilt.
        expect(await store.applyEvents(events.slice(1))).toEqual({ applied: 3, skipped: 2 });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[0, 5, 0, 0, 0]]);
        expect(await store.inspect(ref)).toMatchObject({ seq: 7, applied: 7, pending: false });
      });

      it('rebuilds on a gap, so a late event published out of order is not counted twice', async () => {
        const ref = post(26);
        const events = eventsOf(
          await Promise.all([1, 2, 3, 4].map((u) => store.toggle(ref, 'like', u, true, NOW))),
        ).sort((x, y) => x.seq - y.seq);
        const [e1, e2, e3, e4] = events as [CounterEvent, CounterEvent, CounterEvent, CounterEvent];
        await store.applyEvents([e1, e2]);
        await store.applyEvents([e4]);
        // The gap left the deltas unplaceable: the entity now matches its facts, seq 4 included.
        expect(await store.inspect(ref)).toMatchObject({ seq: 4, applied: 4, snapshot: [0, 4, 0, 0, 0] });
        expect(await store.applyEvents([e3])).toEqual({ applied: 0, skipped: 1 });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[0, 4, 0, 0, 0]]);
      });

      it('applies one batch spanning many entities, interleaved', async () => {
        const refs = Array.from({ length: 30 }, (_, i) => post(100 + i));
        const random = rng(7);
        const results: ToggleResult[] = [];
        for (let n = 0; n < 300; n++) {
          const ref = refs[Math.floor(random() * refs.length)]!;
          const metric: FactMetric = random() < 0.7 ? 'like' : 'fav';
          results.push(await store.toggle(ref, metric, Math.floor(random() * 8), random() < 0.75, NOW + n));
        }
        const events = eventsOf(results);
        expect(await store.applyEvents(events)).toEqual({ applied: events.length, skipped: 0 });
        await flushAll();
        await expectExact(refs);
      });

      it('rebuilds an entity from facts when its snapshot is missing at flush time', async () => {
        const ref = post(27);
        const first = eventsOf(
          await Promise.all([1, 2, 3].map((u) => store.toggle(ref, 'like', u, true, NOW))),
        );
        await store.applyEvents(first);
        await flushAll();
        await store.writeRawSnapshot(ref, encodeSnapshot([3, 1, 1, 1, 1]));
        await store.writeRawSnapshot(ref, null);
        const more = eventsOf([
          await store.toggle(ref, 'like', 4, true, NOW),
          await store.toggle(ref, 'fav', 4, true, NOW),
        ]);
        await store.applyEvents(more);
        expect(await store.readSnapshots([ref])).toEqual([null]);
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[0, 4, 1, 0, 0]]);
        expect(await store.inspect(ref)).toMatchObject({ seq: 5, applied: 5, pending: false });
      });

      it('reads a corrupt snapshot as missing; flush and rebuild replace it from facts', async () => {
        const [a, b] = [post(28), post(29)];
        for (const ref of [a, b]) {
          await store.applyEvents(eventsOf([await store.toggle(ref, 'like', 1, true, NOW)]));
          await flushAll();
          await store.writeRawSnapshot(ref, Buffer.from([1, 2, 3, 4, 5, 6, 7]));
        }
        expect(await store.readSnapshots([a, b])).toEqual([null, null]);
        expect((await store.inspect(a)).snapshot).toBeNull();

        expect(await store.rebuild(a)).toEqual([0, 1, 0, 0, 0]);
        expect(await store.readSnapshots([a])).toEqual([[0, 1, 0, 0, 0]]);

        await store.applyEvents(eventsOf([await store.toggle(b, 'fav', 1, true, NOW)]));
        await flushAll();
        expect(await store.readSnapshots([b])).toEqual([[0, 1, 1, 0, 0]]);
      });

      it('never folds a count below zero', async () => {
        const ref = post(30);
        await store.toggle(ref, 'like', 1, true, NOW);
        await store.rebuild(ref);
        await store.writeRawSnapshot(ref, encodeSnapshot([0, 0, 0, 0, 0]));
        await store.applyEvents(eventsOf([await store.toggle(ref, 'like', 1, false, NOW)]));
        const before = store.clampedFields;
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[0, 0, 0, 0, 0]]);
        expect(store.clampedFields - before).toBe(1);
      });

      it('ends exact when batches are applied concurrently, out of order, with several flushers', async () => {
        const refs = Array.from({ length: 8 }, (_, i) => post(200 + i));
        const random = rng(11);
        const results: ToggleResult[] = [];
        for (let n = 0; n < 400; n++) {
          const ref = refs[Math.floor(random() * refs.length)]!;
          results.push(
            await store.toggle(
              ref,
              random() < 0.6 ? 'like' : 'fav',
              Math.floor(random() * 12),
              random() < 0.7,
              NOW,
            ),
          );
        }
        const events = eventsOf(results);
        const batches: CounterEvent[][] = [];
        for (let i = 0; i < events.length; i += 25) batches.push(events.slice(i, i + 25));
        await Promise.all([
          ...batches.map((batch) => store.applyEvents(batch)),
          ...batches.slice(0, 6).map((batch) => store.applyEvents(batch)),
          store.flush(4),
          store.flush(4),
          store.flush(64),
        ]);
        await flushAll();
        await expectExact(refs);
      });
    });

    describe('rebuild', () => {
      it('skips old events still in flight after a rebuild', async () => {
        const ref = post(40);
        const events = eventsOf(
          await Promise.all([1, 2, 3].map((u) => store.toggle(ref, 'like', u, true, NOW))),
        );
        expect(await store.rebuild(ref)).toEqual([0, 3, 0, 0, 0]);
        expect(await store.inspect(ref)).toMatchObject({ seq: 3, applied: 3, pending: false });
        expect(await store.applyEvents(events)).toEqual({ applied: 0, skipped: 3 });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[0, 3, 0, 0, 0]]);

        const next = (await store.toggle(ref, 'like', 4, true, NOW)).event!;
        expect(await store.applyEvents([next])).toEqual({ applied: 1, skipped: 0 });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[0, 4, 0, 0, 0]]);
      });

      it('keeps the other fields of a readable snapshot and drops the pending deltas', async () => {
        const ref = post(41);
        await store.toggle(ref, 'like', 1, true, NOW);
        await store.rebuild(ref);
        await store.writeRawSnapshot(ref, encodeSnapshot([123, 9, 9, 4, 5]));
        const events = eventsOf([
          await store.toggle(ref, 'like', 2, true, NOW),
          await store.toggle(ref, 'fav', 2, true, NOW),
        ]);
        await store.applyEvents(events);
        expect((await store.inspect(ref)).pending).toBe(true);
        expect(await store.rebuild(ref)).toEqual([123, 2, 1, 4, 5]);
        expect(await store.inspect(ref)).toMatchObject({ seq: 3, applied: 3, pending: false });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[123, 2, 1, 4, 5]]);
      });

      it('gives concurrent rebuilds of one entity the same answer', async () => {
        const ref = post(42);
        await Promise.all([1, 2, 3, 4, 5].map((u) => store.toggle(ref, 'fav', u, true, NOW)));
        const answers = await Promise.all(Array.from({ length: 10 }, () => store.rebuild(ref)));
        for (const a of answers) expect(a).toEqual([0, 0, 5, 0, 0]);
        expect(await store.readSnapshots([ref])).toEqual([[0, 0, 5, 0, 0]]);
      });
    });

    describe('views', () => {
      it('sums concurrent addViews exactly, duplicates within a call included', async () => {
        const refs = Array.from({ length: 12 }, (_, i) => post(900 + i));
        for (const ref of refs) await store.writeRawSnapshot(ref, encodeSnapshot([0, 0, 0, 0, 0]));
        const random = rng(99);
        const want = new Map<string, number>();
        const calls = Array.from({ length: 40 }, () =>
          Array.from({ length: 1 + Math.floor(random() * 8) }, () => {
            const ref = refs[Math.floor(random() * refs.length)]!;
            const n = 1 + Math.floor(random() * 5);
            want.set(entityKey(ref), (want.get(entityKey(ref)) ?? 0) + n);
            return { ref, n };
          }),
        );
        await Promise.all(calls.map((entries) => store.addViews(entries)));
        const snapshots = await store.readSnapshots(refs);
        expect(snapshots.map((c) => c?.[0])).toEqual(refs.map((ref) => want.get(entityKey(ref)) ?? 0));
        expect(snapshots.every((c) => c?.slice(1).every((v) => v === 0))).toBe(true);
        await store.addViews([]);
        await store.addViews([{ ref: refs[0]!, n: 0 }]);
        expect((await store.readSnapshots([refs[0]!]))[0]?.[0]).toBe(want.get(entityKey(refs[0]!)) ?? 0);
      });

      it('touches only read: like, fav, the other fields, pending deltas, seq and applied stay', async () => {
        const ref = post(920);
        await store.toggle(ref, 'like', 1, true, NOW);
        await store.rebuild(ref);
        await store.writeRawSnapshot(ref, encodeSnapshot([10, 1, 0, 7, 8]));
        await store.applyEvents(
          eventsOf([
            await store.toggle(ref, 'like', 2, true, NOW),
            await store.toggle(ref, 'fav', 2, true, NOW),
          ]),
        );
        const before = await store.inspect(ref);
        expect(before).toMatchObject({ seq: 3, applied: 3, pending: true });
        await store.addViews([{ ref, n: 5 }]);
        expect(await store.inspect(ref)).toEqual({ ...before, snapshot: [15, 1, 0, 7, 8] });
        await flushAll();
        expect(await store.readSnapshots([ref])).toEqual([[15, 2, 1, 7, 8]]);
      });

      it('rebuilds a missing or malformed snapshot from facts first, then adds the views', async () => {
        const [missing, corrupt] = [post(921), post(922)];
        for (const ref of [missing, corrupt]) {
          await store.toggle(ref, 'like', 1, true, NOW);
          await store.toggle(ref, 'fav', 2, true, NOW);
          await store.toggle(ref, 'like', 3, true, NOW);
        }
        await store.writeRawSnapshot(corrupt, Buffer.from([9, 9, 9]));
        await store.addViews([
          { ref: missing, n: 3 },
          { ref: corrupt, n: 4 },
          { ref: missing, n: 1 },
        ]);
        expect(await store.readSnapshots([missing, corrupt])).toEqual([
          [4, 2, 1, 0, 0],
          [4, 2, 1, 0, 0],
        ]);
        // As a rebuild does: the events already issued are counted by it.
        expect(await store.inspect(missing)).toMatchObject({ seq: 3, applied: 3, pending: false });
      });

      it('keeps read through rebuild, toggles, applies and flushes running beside it', async () => {
        const refs = Array.from({ length: 6 }, (_, i) => post(930 + i));
        for (const ref of refs) await store.writeRawSnapshot(ref, encodeSnapshot([0, 0, 0, 0, 0]));
        const random = rng(5);
        const views = new Map<string, number>();
        const work: Promise<unknown>[] = [];
        for (let round = 0; round < 20; round++) {
          const toggles = await Promise.all(
            Array.from({ length: 10 }, () =>
              store.toggle(
                refs[Math.floor(random() * refs.length)]!,
                random() < 0.6 ? 'like' : 'fav',
                Math.floor(random() * 10),
                random() < 0.7,
                NOW,
              ),
            ),
          );
          const entries = Array.from({ length: 3 }, () => {
            const ref = refs[Math.floor(random() * refs.length)]!;
            views.set(entityKey(ref), (views.get(entityKey(ref)) ?? 0) + 2);
            return { ref, n: 2 };
          });
          work.push(store.addViews(entries), store.applyEvents(eventsOf(toggles)), store.flush(3));
          if (round % 5 === 4) work.push(store.rebuild(refs[round % refs.length]!));
        }
        await Promise.all(work);
        await flushAll();
        await expectExact(refs);
        const snapshots = await store.readSnapshots(refs);
        expect(snapshots.map((c) => c?.[0])).toEqual(refs.map((ref) => views.get(entityKey(ref)) ?? 0));
        expect(await store.rebuild(refs[0]!)).toEqual(snapshots[0]);
      });

      /** Records of two partitions of the views log, each with a few views of `refs`. */
      const loggedViews = (
        refs: readonly EntityRef[],
        count: number,
        seed: number,
        ts = NOW,
      ): LoggedViews[] => {
        const random = rng(seed);
        return Array.from({ length: count }, (_, i) => ({
          partition: i % 2,
          offset: BigInt(Math.floor(i / 2)),
          timestamp: ts + i,
          views: Array.from({ length: 1 + Math.floor(random() * 4) }, () => ({
            ref: refs[Math.floor(random() * refs.length)]!,
            n: 1 + Math.floor(random() * 3),
          })),
        }));
      };
      const viewsOf = (refs: readonly EntityRef[], records: readonly LoggedViews[]): number[] =>
        refs.map((ref) =>
          records
            .flatMap((r) => r.views)
            .filter((v) => entityKey(v.ref) === entityKey(ref))
            .reduce((sum, v) => sum + v.n, 0),
        );
      const total = (records: readonly LoggedViews[]): number =>
        records.flatMap((r) => r.views).reduce((sum, v) => sum + v.n, 0);

      it('adds each record of the views log once, however its batches are cut and handed again', async () => {
        const refs = Array.from({ length: 8 }, (_, i) => post(950 + i));
        const records = loggedViews(refs, 40, 7);
        expect(await store.addLoggedViews(records.slice(0, 10))).toBe(total(records.slice(0, 10)));
        // Handed again whole, then cut elsewhere (after a crash before the commit, or a rebalance).
        expect(await store.addLoggedViews(records.slice(0, 10))).toBe(0);
        expect(await store.addLoggedViews(records.slice(6, 24))).toBe(total(records.slice(10, 24)));
        expect(await store.addLoggedViews(records.slice(20, 40))).toBe(total(records.slice(24, 40)));
        expect(await store.addLoggedViews(records)).toBe(0);
        const reads = (await store.readSnapshots(refs)).map((c) => c?.[0] ?? 0);
        expect(reads).toEqual(viewsOf(refs, records));
        // A partition's mark is its own: the other partition's later records still count.
        const next = loggedViews(refs, 4, 8).map((r, i) => ({ ...r, offset: 20n + BigInt(i), partition: 1 }));
        expect(await store.addLoggedViews(next)).toBe(total(next));
        // And a call without records, or with only zero counts, adds nothing.
        expect(await store.addLoggedViews([])).toBe(0);
        expect(
          await store.addLoggedViews([
            { partition: 0, offset: 99n, timestamp: NOW, views: [{ ref: refs[0]!, n: 0 }] },
          ]),
        ).toBe(0);
        expect((await store.readSnapshots(refs)).map((c) => c?.[0] ?? 0)).toEqual(
          viewsOf(refs, [...records, ...next]),
        );
      });

      it('adds records handed by two members at once (one still handling a partition taken from it) once', async () => {
        const refs = Array.from({ length: 24 }, (_, i) => post(960 + i));
        const records = loggedViews(refs, 120, 11);
        const partition = (p: number) => records.filter((r) => r.partition === p);
        await store.addLoggedViews(records.slice(0, 20));
        // Every record below 10 of each partition was added and committed; the old member goes on
        // from where it was, the new one from the commit, in batches of other sizes.
        const member = async (batches: number[][], p: number): Promise<void> => {
          for (const [from, to] of batches) await store.addLoggedViews(partition(p).slice(from, to));
        };
        await Promise.all([
          member(
            [
              [10, 25],
              [25, 40],
              [40, 60],
            ],
            0,
          ),
          member(
            [
              [10, 17],
              [17, 33],
              [33, 51],
              [51, 60],
            ],
            0,
          ),
          member(
            [
              [10, 30],
              [30, 60],
            ],
            1,
          ),
          member(
            [
              [10, 12],
              [12, 45],
              [45, 60],
            ],
            1,
          ),
        ]);
        expect((await store.readSnapshots(refs)).map((c) => c?.[0] ?? 0)).toEqual(viewsOf(refs, records));
      });

      it('adds records that come out of order once: those fetched before a rebalance handed before the ones before them', async () => {
        const refs = Array.from({ length: 6 }, (_, i) => post(1000 + i));
        const records = loggedViews(refs, 60, 13).map((r, i) => ({ ...r, partition: 0, offset: BigInt(i) }));
        await store.addLoggedViews(records.slice(0, 10));
        // 10–29 never handled (dropped with the partition), 30–44 handed when it came back, then the
        // partition read again from the last commit (10), in batches cut elsewhere.
        expect(await store.addLoggedViews(records.slice(30, 45))).toBe(total(records.slice(30, 45)));
        expect(await store.addLoggedViews(records.slice(10, 25))).toBe(total(records.slice(10, 25)));
        expect(await store.addLoggedViews(records.slice(25, 40))).toBe(total(records.slice(25, 30)));
        expect(await store.addLoggedViews(records.slice(40, 60))).toBe(total(records.slice(45, 60)));
        expect(await store.addLoggedViews(records)).toBe(0);
        expect((await store.readSnapshots(refs)).map((c) => c?.[0] ?? 0)).toEqual(viewsOf(refs, records));
      });

      it('adds a record handed twice in one call once (its partition read again behind what the stream held)', async () => {
        const refs = Array.from({ length: 3 }, (_, i) => post(1020 + i));
        const records = loggedViews(refs, 8, 17).map((r, i) => ({ ...r, partition: 0, offset: BigInt(i) }));
        await store.addLoggedViews(records.slice(0, 2));
        const batch = [...records.slice(4, 8), ...records.slice(2, 8)];
        expect(await store.addLoggedViews(batch)).toBe(total(records.slice(2, 8)));
        expect((await store.readSnapshots(refs)).map((c) => c?.[0] ?? 0)).toEqual(viewsOf(refs, records));
      });

      it('names as added what a call covers beyond its own records, and keeps the latest time of all', async () => {
        const [seen, unseen] = [post(1010), post(1011)];
        const at = (offset: number, timestamp: number, ref: EntityRef): LoggedViews => ({
          partition: 4,
          offset: BigInt(offset),
          timestamp,
          views: [{ ref, n: 1 }],
        });
        // Record 7 (a later time than record 8) and record 8, each in its own call, the second
        // covering 7–8.
        await store.addLoggedViews([at(7, NOW + 5, seen)]);
        await store.addLoggedViews([at(8, NOW, seen)], new Map([[4, [[7n, 8n]] as const]]));
        // Handed again: both known, neither later than what was added.
        expect(await store.addLoggedViews([at(7, NOW + 5, seen), at(8, NOW, seen)])).toBe(0);
        // A record the covered ranges claim (6 was not, 9 is later) is refused outside them.
        await expect(
          store.addLoggedViews([at(9, NOW, unseen)], new Map([[4, [[10n, 11n]] as const]])),
        ).rejects.toThrow(RangeError);
        await expect(store.addLoggedViews([at(-1, NOW, unseen)])).rejects.toThrow(RangeError);
        expect(await store.addLoggedViews([at(6, NOW, unseen), at(9, NOW, unseen)])).toBe(2);
        expect((await store.readSnapshots([seen, unseen])).map((c) => c?.[0])).toEqual([2, 2]);
      });

      it('counts the records of a views topic made again, whose offsets restarted', async () => {
        const refs = Array.from({ length: 4 }, (_, i) => post(990 + i));
        const old = loggedViews(refs, 20, 3, NOW);
        await store.addLoggedViews(old);
        // Written later, at offsets the old topic had passed.
        const anew = loggedViews(refs, 6, 4, NOW + 60_000);
        expect(await store.addLoggedViews(anew.slice(0, 4))).toBe(total(anew.slice(0, 4)));
        expect(await store.addLoggedViews(anew)).toBe(total(anew.slice(4)));
        expect((await store.readSnapshots(refs)).map((c) => c?.[0] ?? 0)).toEqual(
          viewsOf(refs, [...old, ...anew]),
        );
      });

      it('forgets its view marks with the views on reset', async () => {
        const refs = Array.from({ length: 4 }, (_, i) => post(995 + i));
        const records = loggedViews(refs, 10, 5);
        await store.addLoggedViews(records);
        await store.reset();
        expect(await store.addLoggedViews(records)).toBe(total(records));
        expect((await store.readSnapshots(refs)).map((c) => c?.[0] ?? 0)).toEqual(viewsOf(refs, records));
      });

      it('rejects a negative or fractional count', async () => {
        await expect(store.addViews([{ ref: post(940), n: -1 }])).rejects.toThrow(RangeError);
        await expect(store.addViews([{ ref: post(940), n: 1.5 }])).rejects.toThrow(RangeError);
        const logged = (n: number): LoggedViews[] => [
          { partition: 0, offset: 0n, timestamp: NOW, views: [{ ref: post(941), n: 1 }] },
          { partition: 0, offset: 1n, timestamp: NOW, views: [{ ref: post(940), n }] },
        ];
        await expect(store.addLoggedViews(logged(-1))).rejects.toThrow(RangeError);
        await expect(store.addLoggedViews(logged(0.5))).rejects.toThrow(RangeError);
        for (const place of [{ partition: -1 }, { offset: -1n }, { timestamp: -1 }, { timestamp: 1.5 }]) {
          await expect(store.addLoggedViews([logged(1)[0]!, { ...logged(1)[1]!, ...place }])).rejects.toThrow(
            RangeError,
          );
        }
        expect(await store.readSnapshots([post(940), post(941)])).toEqual([null, null]);
        // No mark was left either: the records count when they come whole.
        expect(await store.addLoggedViews(logged(2))).toBe(3);
      });
    });

    describe('unpublished events', () => {
      it('finds stale unpublished events until they are marked published or dropped', async () => {
        const [a, b, c] = [post(50), post(51), post(52)];
        const ra = await store.toggle(a, 'like', 1, true, NOW);
        const rb = await store.toggle(b, 'like', 1, true, NOW + 10);
        const rc = await store.toggle(c, 'fav', 1, true, NOW + 20);
        if (ra.published) {
          // This adapter publishes with the toggle: nothing is ever left unpublished.
          expect(await store.staleUnpublished(NOW + 3_600_000, 1_000, 100)).toEqual([]);
          return;
        }
        expect(await store.staleUnpublished(NOW + 500, 1_000, 100)).toEqual([]);
        const stale = await store.staleUnpublished(NOW + 60_000, 1_000, 100);
        expect(stale.map((s) => entityKey(s.ref)).sort()).toEqual([a, b, c].map(entityKey).sort());
        expect(await store.staleUnpublished(NOW + 60_000, 1_000, 2)).toHaveLength(2);

        await store.markPublished([ra.event!, rb.event!]);
        const left = await store.staleUnpublished(NOW + 60_000, 1_000, 100);
        expect(left.map((s) => entityKey(s.ref))).toEqual([entityKey(c)]);
        expect(rc.event).not.toBeNull();

        await store.rebuild(c);
        await store.dropUnpublished(left);
        expect(await store.staleUnpublished(NOW + 60_000, 1_000, 100)).toEqual([]);
      });
    });

    describe('scan and sample', () => {
      it('pages through every entity with facts or a snapshot exactly once', async () => {
        const withFacts = Array.from({ length: 15 }, (_, i) => post(300 + i));
        const withSnapshot = Array.from({ length: 10 }, (_, i) => post(400 + i));
        for (const [i, ref] of withFacts.entries())
          await store.toggle(ref, i % 2 ? 'like' : 'fav', i, true, NOW);
        for (const ref of withSnapshot) await store.writeRawSnapshot(ref, encodeSnapshot([1, 0, 0, 0, 0]));

        const seen: string[] = [];
        let cursor: string | null = '';
        for (let pages = 0; cursor !== null; pages++) {
          expect(pages).toBeLessThan(100);
          const page: { refs: EntityRef[]; cursor: string | null } = await store.scanEntities(cursor, 4);
          expect(page.refs.length).toBeLessThanOrEqual(4);
          seen.push(...page.refs.map(entityKey));
          cursor = page.cursor;
        }
        expect(new Set(seen).size).toBe(seen.length);
        expect(seen.sort()).toEqual([...withFacts, ...withSnapshot].map(entityKey).sort());
      });

      it('samples distinct entities that have a snapshot', async () => {
        const snapshotted = Array.from({ length: 20 }, (_, i) => post(500 + i));
        for (const ref of snapshotted) await store.writeRawSnapshot(ref, encodeSnapshot([0, 1, 0, 0, 0]));
        await store.toggle(post(600), 'like', 1, true, NOW);
        const known = new Set(snapshotted.map(entityKey));

        const some = await store.sampleEntities(5);
        expect(some.length).toBeGreaterThan(0);
        expect(some.length).toBeLessThanOrEqual(5);
        expect(new Set(some.map(entityKey)).size).toBe(some.length);
        for (const ref of some) expect(known.has(entityKey(ref))).toBe(true);

        const all = await store.sampleEntities(100);
        expect(all.map(entityKey).sort()).toEqual([...known].sort());
      });
    });

    describe('reset and replay', () => {
      it('reproduces the facts from the events, and new changes number above the replayed ones', async () => {
        const refs = [post(700), post(701), post(702)];
        const random = rng(3);
        const results: ToggleResult[] = [];
        for (let n = 0; n < 200; n++) {
          const ref = refs[Math.floor(random() * refs.length)]!;
          results.push(
            await store.toggle(
              ref,
              random() < 0.5 ? 'like' : 'fav',
              Math.floor(random() * 30),
              random() < 0.7,
              NOW,
            ),
          );
        }
        const events = eventsOf(results);
        await store.applyEvents(events);
        await flushAll();
        const before = await Promise.all(refs.map((ref) => store.factCounts(ref)));
        const flagsBefore = await Promise.all([0, 5, 17, 29].map((u) => store.flags(u, refs)));
        const seqs = await Promise.all(refs.map(async (ref) => (await store.inspect(ref)).seq));

        await store.reset();
        for (const ref of refs) expect(await store.factCounts(ref)).toEqual({ like: 0, fav: 0 });
        expect(await store.readSnapshots(refs)).toEqual([null, null, null]);
        expect(await store.isQuiet()).toBe(true);
        expect((await store.scanEntities('', 100)).refs).toEqual([]);

        await store.replayFacts(events);
        expect(await Promise.all(refs.map((ref) => store.factCounts(ref)))).toEqual(before);
        expect(await Promise.all([0, 5, 17, 29].map((u) => store.flags(u, refs)))).toEqual(flagsBefore);
        for (const [i, ref] of refs.entries()) {
          expect((await store.inspect(ref)).seq).toBeGreaterThanOrEqual(seqs[i]!);
          const fresh = await store.toggle(ref, 'like', 1_000_000, true, NOW);
          expect(fresh.event!.seq).toBeGreaterThan(seqs[i]!);
        }
      });
    });

    describe('replay order', () => {
      it('lets the highest seq of each (entity, metric, user) decide, whatever the order of the events', async () => {
        const refs = [post(710), post(711)];
        const random = rng(17);
        const results: ToggleResult[] = [];
        for (let n = 0; n < 300; n++) {
          results.push(
            await store.toggle(
              refs[Math.floor(random() * refs.length)]!,
              random() < 0.5 ? 'like' : 'fav',
              Math.floor(random() * 12),
              random() < 0.6,
              NOW,
            ),
          );
        }
        const events = eventsOf(results);
        const facts = await Promise.all(refs.map((ref) => store.factCounts(ref)));
        const flags = await Promise.all(Array.from({ length: 12 }, (_, u) => store.flags(u, refs)));
        const shuffled = [...events].sort(() => random() - 0.5);
        await store.reset();
        await store.replayFacts(shuffled);
        expect(await Promise.all(refs.map((ref) => store.factCounts(ref)))).toEqual(facts);
        expect(await Promise.all(Array.from({ length: 12 }, (_, u) => store.flags(u, refs)))).toEqual(flags);
      });
    });

    describe('a long random run', () => {
      it('ends with every snapshot equal to its facts, through redeliveries and interleaved flushes', async () => {
        const refs = Array.from({ length: 20 }, (_, i) => post(800 + i));
        const random = rng(2024);
        const log: CounterEvent[] = [];
        let consumed = 0;
        let toggles = 0;
        let redeliveries = 0;
        while (toggles < 2_000 || consumed < log.length) {
          const roll = random();
          if (toggles < 2_000 && roll < 0.5) {
            // A burst of concurrent requests; the log keeps each entity's events in seq order.
            const burst = Math.min(2_000 - toggles, 1 + Math.floor(random() * 10));
            const results = await Promise.all(
              Array.from({ length: burst }, () =>
                store.toggle(
                  refs[Math.floor(random() * refs.length)]!,
                  random() < 0.6 ? 'like' : 'fav',
                  Math.floor(random() * 50),
                  random() < 0.6,
                  NOW,
                ),
              ),
            );
            toggles += burst;
            log.push(...eventsOf(results).sort((x, y) => x.seq - y.seq));
          } else if (roll < 0.85 && consumed < log.length) {
            let from = consumed;
            if (random() < 0.2 && consumed > 0) {
              from = Math.max(0, consumed - 1 - Math.floor(random() * 40));
              redeliveries++;
            }
            const to = Math.min(log.length, from + 1 + Math.floor(random() * 60));
            await store.applyEvents(log.slice(from, to));
            consumed = Math.max(consumed, to);
          } else {
            await store.flush(1 + Math.floor(random() * 8));
          }
        }
        expect(redeliveries).toBeGreaterThan(0);
        await flushAll();
        await expectExact(refs);
        for (const ref of refs) {
          const state = await store.inspect(ref);
          expect(state.applied).toBe(state.seq);
          expect(state.snapshot).toEqual(expected(state.facts));
        }
      });
    });
  });
}
