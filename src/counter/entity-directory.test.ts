import { describe, expect, it } from 'vitest';
import { CachedEntityDirectory, LOAD_BATCH, mayView, type Visibility } from './entity-directory.js';
import type { EntityRef } from './model.js';

const post = (eid: string): EntityRef => ({ etype: 'knowpost', eid });
const PUBLIC: Visibility = { authorId: 1, status: 'published', visible: 'public' };
const HIDDEN: Visibility = { authorId: 1, status: 'deleted', visible: 'public' };
const TTL = 1_000;
const AHEAD = 250;
const RETRY = 100;
const STALE = 10_000;

/**
 * A little real time and a turn of the event loop: the directory has started every load asked for
 * (lookups' at the next turn, background refreshes once their gathering time, 0 here by default, ran out).
 */
const turn = (): Promise<void> => new Promise((resolve) => setTimeout(() => setImmediate(resolve), 2));
/** Just one turn: what a lookup's load waits for, and less than a background refresh's gathering time. */
const oneTurn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

interface Call {
  keys: string[];
  resolve: (found: Map<string, Visibility>) => void;
  reject: (err: Error) => void;
}

/** A loader whose answers the test gives, one call at a time, and a clock the test moves. */
function rig(
  options: { ttl?: number; maxEntries?: number; gatherMs?: number; staleIfErrorMs?: number } = {},
) {
  const calls: Call[] = [];
  const clock = { now: 0 };
  const stale = { served: 0 };
  const sut = new CachedEntityDirectory(
    (refs) =>
      new Promise<Map<string, Visibility>>((resolve, reject) => {
        calls.push({ keys: refs.map((r) => `${r.etype}:${r.eid}`), resolve, reject });
      }),
    options.ttl ?? TTL,
    options.maxEntries ?? 100,
    () => clock.now,
    {
      refreshAheadMs: AHEAD,
      refreshGatherMs: options.gatherMs ?? 0,
      staleIfErrorMs: options.staleIfErrorMs ?? 0,
      staleRetryMs: RETRY,
      onStale: () => void stale.served++,
    },
  );
  /** Answers the last load: every key it asked for gets `value`. */
  const answer = async (value: Visibility | null, call = calls[calls.length - 1]): Promise<void> => {
    if (!call) throw new Error('no load to answer');
    const found = new Map<string, Visibility>();
    if (value) for (const key of call.keys) found.set(key, value);
    call.resolve(found);
    await turn();
  };
  /** A lookup that records whether it has settled, so a test can tell "answered at once" from "waits". */
  const lookup = (refs: EntityRef[], viewer: number | null = null) => {
    const state: { settled: boolean; value?: boolean[]; error?: unknown } = { settled: false };
    const promise = sut.visible(refs, viewer).then(
      (value) => Object.assign(state, { settled: true, value }),
      (error: unknown) => Object.assign(state, { settled: true, error }),
    );
    return { state, promise };
  };
  return { sut, calls, clock, stale, answer, lookup };
}

describe(CachedEntityDirectory.name, () => {
  describe('serving while refreshing', () => {
    it('answers from an entry due for refresh at once and refreshes it in the background', async () => {
      const { calls, clock, answer, lookup } = rig();
      const first = lookup([post('1')]);
      await turn();
      await answer(PUBLIC);
      expect(first.state.value).toEqual([true]);

      clock.now = TTL - AHEAD - 1;
      const fresh = lookup([post('1')]);
      await turn();
      expect(fresh.state.value).toEqual([true]);
      expect(calls).toHaveLength(1);

      // Due for refresh: answered from the entry, not from the load it starts.
      clock.now = TTL - AHEAD;
      const due = lookup([post('1')]);
      await turn();
      expect(due.state.value).toEqual([true]);
      expect(calls).toHaveLength(2);
      expect(calls[1]!.keys).toEqual(['knowpost:1']);

      // The refresh learns the post was hidden; from then on lookups see it, without another load.
      await answer(HIDDEN);
      clock.now = TTL + 100;
      const after = lookup([post('1')]);
      await turn();
      expect(after.state.value).toEqual([false]);
      expect(calls).toHaveLength(2);
    });

    it('never answers from an entry older than the TTL: a lookup then waits for the load', async () => {
      const { calls, clock, answer, lookup } = rig();
      lookup([post('1')]);
      await turn();
      await answer(PUBLIC);

      // Unused for a long time: the old answer must not let a hidden post take likes.
      clock.now = TTL + 60_000;
      const late = lookup([post('1')]);
      await turn();
      await turn();
      expect(late.state.settled).toBe(false);
      expect(calls).toHaveLength(2);
      await answer(HIDDEN);
      expect(late.state.value).toEqual([false]);
    });

    it('loads again when the clock was stepped back past an entry', async () => {
      const { calls, clock, answer, lookup } = rig();
      clock.now = 3_600_000;
      lookup([post('1')]);
      await turn();
      await answer(PUBLIC);
      // An hour back: the entry's age is unknown, so it is not taken as fresh for an hour more.
      clock.now = 0;
      const after = lookup([post('1')]);
      await turn();
      expect(after.state.settled).toBe(false);
      expect(calls).toHaveLength(2);
      await answer(HIDDEN);
      expect(after.state.value).toEqual([false]);
    });

    it('keeps the entry when a background refresh fails, and still stops serving it at the TTL', async () => {
      const { calls, clock, answer, lookup } = rig();
      lookup([post('1')]);
      await turn();
      await answer(PUBLIC);
      clock.now = TTL - 1;
      expect((await lookup([post('1')]).promise).value).toEqual([true]);
      await turn();
      calls[1]!.reject(new Error('database down'));
      await turn();
      expect((await lookup([post('1')]).promise).value).toEqual([true]);

      clock.now = TTL;
      const expired = lookup([post('1')]);
      await turn();
      calls[calls.length - 1]!.reject(new Error('database down'));
      await expired.promise;
      expect(String(expired.state.error)).toMatch(/database down/);
    });
  });

  describe('single flight', () => {
    it('lets concurrent lookups of one key share one load', async () => {
      const { calls, answer, lookup } = rig();
      const a = lookup([post('1')]);
      await turn();
      // The load is in flight; later lookups, alone or among other keys, join it.
      const b = lookup([post('1')]);
      const c = lookup([post('1'), post('1')], 1);
      await turn();
      expect(calls).toHaveLength(1);
      expect(calls[0]!.keys).toEqual(['knowpost:1']);
      expect([a, b, c].some((l) => l.state.settled)).toBe(false);
      await answer(PUBLIC);
      expect([a.state.value, b.state.value, c.state.value]).toEqual([[true], [true], [true, true]]);
    });

    it('shares a background refresh with a lookup that finds the entry expired', async () => {
      const { calls, clock, answer, lookup } = rig();
      lookup([post('1')]);
      await turn();
      await answer(PUBLIC);
      clock.now = TTL - 1;
      await lookup([post('1')]).promise;
      await turn();
      expect(calls).toHaveLength(2);
      clock.now = TTL + 1;
      const expired = lookup([post('1')]);
      await turn();
      expect(calls).toHaveLength(2);
      await answer(HIDDEN);
      expect(expired.state.value).toEqual([false]);
    });

    it('starts afresh after a failed load', async () => {
      const { calls, answer, lookup } = rig();
      const a = lookup([post('1')]);
      await turn();
      calls[0]!.reject(new Error('timeout'));
      await a.promise;
      expect(String(a.state.error)).toMatch(/timeout/);
      const b = lookup([post('1')]);
      await turn();
      expect(calls).toHaveLength(2);
      await answer(PUBLIC);
      expect(b.state.value).toEqual([true]);
    });
  });

  describe('batching', () => {
    it('loads the keys missed within one turn with one call', async () => {
      const { calls, answer, lookup } = rig();
      const lookups = [
        lookup([post('1')]),
        lookup([post('2'), post('3')]),
        lookup([post('3'), post('1'), post('4')], 1),
      ];
      await turn();
      expect(calls).toHaveLength(1);
      expect([...calls[0]!.keys].sort()).toEqual(['knowpost:1', 'knowpost:2', 'knowpost:3', 'knowpost:4']);
      await answer(PUBLIC);
      expect(lookups.map((l) => l.state.value)).toEqual([[true], [true, true], [true, true, true]]);

      // A later turn is a new batch, for the keys it misses only.
      const next = lookup([post('1'), post('5')]);
      await turn();
      expect(calls).toHaveLength(2);
      expect(calls[1]!.keys).toEqual(['knowpost:5']);
      await answer(null);
      expect(next.state.value).toEqual([true, false]);
    });

    it(`splits a batch into loads of at most ${LOAD_BATCH} keys`, async () => {
      const { calls, answer, lookup } = rig({ maxEntries: 10_000 });
      const refs = Array.from({ length: LOAD_BATCH + 10 }, (_, i) => post(String(i + 1)));
      const all = lookup(refs);
      await turn();
      expect(calls.map((c) => c.keys.length)).toEqual([LOAD_BATCH, 10]);
      await answer(PUBLIC, calls[0]);
      expect(all.state.settled).toBe(false);
      await answer(PUBLIC, calls[1]);
      expect(all.state.value?.every(Boolean)).toBe(true);
    });
  });

  describe('gathering background refreshes', () => {
    const loaded = async (r: ReturnType<typeof rig>, eids: string[]): Promise<void> => {
      r.lookup(eids.map(post));
      await turn();
      await r.answer(PUBLIC);
    };

    it('refreshes entries due within the gathering time with one load', async () => {
      const r = rig({ gatherMs: 40 });
      await loaded(r, ['1', '2', '3']);
      r.clock.now = TTL - AHEAD;
      expect(r.lookup([post('1')]).state.value).toBeUndefined();
      await oneTurn();
      r.lookup([post('2')]);
      await oneTurn();
      r.lookup([post('3'), post('1')]);
      await oneTurn();
      expect(r.calls).toHaveLength(1);
      await new Promise((resolve) => setTimeout(resolve, 60));
      expect(r.calls).toHaveLength(2);
      expect([...r.calls[1]!.keys].sort()).toEqual(['knowpost:1', 'knowpost:2', 'knowpost:3']);
    });

    it('starts waiting refreshes at the next turn when a lookup must wait, in the same load', async () => {
      const r = rig({ gatherMs: 10_000 });
      await loaded(r, ['1', '2']);
      r.clock.now = TTL - AHEAD;
      r.lookup([post('1')]);
      await oneTurn();
      expect(r.calls).toHaveLength(1);
      // Entry 2 expired meanwhile: its lookup waits, so the load starts now and takes entry 1 along.
      r.clock.now = TTL + 1;
      const expired = r.lookup([post('2')]);
      await oneTurn();
      expect(r.calls).toHaveLength(2);
      expect([...r.calls[1]!.keys].sort()).toEqual(['knowpost:1', 'knowpost:2']);
      await r.answer(HIDDEN);
      expect(expired.state.value).toEqual([false]);
    });

    it('does not leave a lookup waiting for a refresh that was still gathering', async () => {
      const r = rig({ gatherMs: 10_000 });
      await loaded(r, ['1']);
      r.clock.now = TTL - 1;
      r.lookup([post('1')]);
      await oneTurn();
      // Expired, or forgotten: the lookup waits, and joins the refresh instead of its gathering time.
      r.clock.now = TTL;
      const expired = r.lookup([post('1')]);
      await oneTurn();
      expect(r.calls).toHaveLength(2);
      await r.answer(PUBLIC);
      expect(expired.state.value).toEqual([true]);

      r.clock.now = 2 * TTL - 1;
      r.lookup([post('1')]);
      await oneTurn();
      r.sut.forget(post('1'));
      const forgotten = r.lookup([post('1')]);
      await oneTurn();
      expect(r.calls).toHaveLength(3);
      await r.answer(HIDDEN);
      expect(forgotten.state.value).toEqual([false]);
    });
  });

  describe('serving while loads fail', () => {
    /** A directory that knows post 1 (public) from a load at time 0, now expired, and whose loads fail. */
    async function failing() {
      const r = rig({ staleIfErrorMs: STALE });
      r.lookup([post('1')]);
      await turn();
      await r.answer(PUBLIC);
      r.clock.now = TTL + 1;
      return r;
    }
    const fail = async (calls: Call[]): Promise<void> => {
      calls[calls.length - 1]!.reject(new Error('database down'));
      await turn();
    };

    it('answers from the entry known before when its load fails, then without waiting for loads', async () => {
      const { calls, clock, stale, lookup } = await failing();
      const a = lookup([post('1')]);
      await turn();
      expect(a.state.settled).toBe(false);
      expect(calls).toHaveLength(2);
      await fail(calls);
      expect(a.state.value).toEqual([true]);
      expect(stale.served).toBe(1);

      // Until a load succeeds: answered at once, and the key is loaded again once per RETRY.
      const b = lookup([post('1')]);
      await turn();
      expect(b.state.value).toEqual([true]);
      expect(calls).toHaveLength(2);
      clock.now += RETRY;
      const c = lookup([post('1')]);
      await turn();
      expect(c.state.value).toEqual([true]);
      expect(calls).toHaveLength(3);
      lookup([post('1')]);
      await turn();
      expect(calls).toHaveLength(3);
      expect(stale.served).toBe(4);

      // The database is back: the answer it gives is kept and served fresh.
      calls[2]!.resolve(new Map([['knowpost:1', HIDDEN]]));
      await turn();
      const d = lookup([post('1')]);
      await turn();
      expect(d.state.value).toEqual([false]);
      expect(calls).toHaveLength(3);
      expect(stale.served).toBe(4);
    });

    it('waits for a load again once one succeeded, and falls back only on its failure', async () => {
      const { calls, clock, answer, lookup } = await failing();
      lookup([post('1')]);
      await turn();
      await fail(calls);
      // Another post loads fine: loads work again, so the next lookup of post 1 waits for its own.
      lookup([post('2')]);
      await turn();
      await answer(PUBLIC);
      clock.now += 1;
      const a = lookup([post('1')]);
      await turn();
      expect(a.state.settled).toBe(false);
      expect(calls).toHaveLength(4);
      await answer(HIDDEN);
      expect(a.state.value).toEqual([false]);
    });

    it('refuses an answer older than ttl + staleIfErrorMs, one forgotten since, and a key never loaded', async () => {
      const old = await failing();
      old.clock.now = TTL + STALE;
      const a = old.lookup([post('1')]);
      await turn();
      await fail(old.calls);
      expect(a.state.error).toBeInstanceOf(Error);

      const forgotten = await failing();
      forgotten.sut.forget(post('1'));
      const b = forgotten.lookup([post('1')]);
      await turn();
      await fail(forgotten.calls);
      expect(b.state.error).toBeInstanceOf(Error);
      // A change heard of while the load was in flight drops the answer too.
      const c = forgotten.lookup([post('1')]);
      await turn();
      forgotten.sut.forgetAll();
      await fail(forgotten.calls);
      expect(c.state.error).toBeInstanceOf(Error);

      const unknown = await failing();
      const d = unknown.lookup([post('2')]);
      await turn();
      await fail(unknown.calls);
      expect(d.state.error).toBeInstanceOf(Error);
      expect(old.stale.served + forgotten.stale.served + unknown.stale.served).toBe(0);
    });

    it('serves nothing stale by default', async () => {
      const { calls, clock, answer, lookup } = rig();
      lookup([post('1')]);
      await turn();
      await answer(PUBLIC);
      clock.now = TTL + 1;
      const a = lookup([post('1')]);
      await turn();
      await fail(calls);
      expect(a.state.error).toBeInstanceOf(Error);
    });
  });

  describe('forget and bounds', () => {
    it('forgets an entry, and does not keep the answer of a load started before the change', async () => {
      const { sut, calls, answer, lookup } = rig();
      lookup([post('1')]);
      await turn();
      await answer(PUBLIC);
      sut.forget(post('1'));
      const a = lookup([post('1')]);
      await turn();
      expect(calls).toHaveLength(2);
      // The post changes while that load is in flight.
      sut.forget(post('1'));
      await answer(PUBLIC);
      expect(a.state.value).toEqual([true]);
      const b = lookup([post('1')]);
      await turn();
      expect(calls).toHaveLength(3);
      await answer(HIDDEN);
      expect(b.state.value).toEqual([false]);
    });

    it('forgets everything at once, loads in flight included', async () => {
      const { sut, calls, answer, lookup } = rig();
      lookup([post('1'), post('2')]);
      await turn();
      await answer(PUBLIC);
      const a = lookup([post('3')]);
      await turn();
      expect(calls).toHaveLength(2);
      sut.forgetAll();
      await answer(PUBLIC);
      expect(a.state.value).toEqual([true]);
      const b = lookup([post('1'), post('2'), post('3')]);
      await turn();
      expect(calls).toHaveLength(3);
      await answer(HIDDEN);
      expect(b.state.value).toEqual([false, false, false]);
    });

    it('keeps at most maxEntries entries, dropping the least recently loaded', async () => {
      const { calls, answer, lookup } = rig({ maxEntries: 2 });
      for (const eid of ['1', '2', '3']) {
        lookup([post(eid)]);
        await turn();
        await answer(PUBLIC);
      }
      lookup([post('2'), post('3')]);
      await turn();
      expect(calls).toHaveLength(3);
      lookup([post('1')]);
      await turn();
      expect(calls).toHaveLength(4);
    });

    it('keeps ids that name nothing apart, so looking up made-up ids pushes no post out', async () => {
      const { calls, answer, lookup } = rig({ maxEntries: 20 });
      lookup([post('1')]);
      await turn();
      await answer(PUBLIC);
      for (let i = 0; i < 50; i++) {
        lookup([post(String(1000 + i))]);
        await turn();
        await answer(null);
      }
      expect(calls).toHaveLength(51);
      const hot = lookup([post('1')]);
      await turn();
      expect(calls).toHaveLength(51);
      await hot.promise;
      expect(hot.state.value).toEqual([true]);
      // The missing ones are bounded (a tenth of maxEntries): the latest two are still known.
      lookup([post('1049'), post('1048')]);
      await turn();
      expect(calls).toHaveLength(51);
      lookup([post('1047')]);
      await turn();
      expect(calls).toHaveLength(52);
    });

    it('applies the viewer rules to cached answers', async () => {
      const { answer, lookup } = rig();
      const own: Visibility = { authorId: 7, status: 'published', visible: 'private' };
      const a = lookup([post('1')], 7);
      await turn();
      await answer(own);
      expect(a.state.value).toEqual([true]);
      expect((await lookup([post('1')], 8).promise).value).toEqual([false]);
      expect((await lookup([post('1')], null).promise).value).toEqual([false]);
      expect(mayView({ ...own, visible: 'unlisted' }, null)).toBe(false);
      expect(mayView({ ...own, visible: 'unlisted' }, 7)).toBe(true);
      expect(mayView({ ...PUBLIC, status: 'draft' }, 1)).toBe(false);
    });
  });
});
