import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { compareEntries, type ListEntry } from '../model.js';
import type { ListCache, ListRef } from './list-cache.js';

export interface ListCacheFixture {
  sut: ListCache;
  /** The adapter was built with these; the suite's lists stay within them. */
  ttlMs: number;
  maxEntries: number;
  /** Moves the adapter's clock forward; without it the suite waits in real time. */
  advance?: (ms: number) => void;
  cleanup: () => Promise<void>;
}

const sorted = (entries: ListEntry[]) => [...entries].sort(compareEntries);

/** The behaviour every `ListCache` adapter must show (see list-cache.ts). */
export function defineListCacheContract(name: string, factory: () => Promise<ListCacheFixture>): void {
  describe(`ListCache contract: ${name}`, () => {
    let fx: ListCacheFixture;
    let sut: ListCache;
    let nextOwner = 1;
    const list = (kind: ListRef['kind'] = 'followers'): ListRef => ({ owner: nextOwner++, kind });

    beforeEach(async () => {
      fx = await factory();
      sut = fx.sut;
    });
    afterEach(async () => {
      await fx.cleanup();
    });

    it('answers null for a list that is not cached, and an empty page for a cached empty list', async () => {
      const l = list();
      expect(await sut.page(l, { offset: 0 }, 10)).toBeNull();
      expect(await sut.fill(l, async () => [])).toEqual({ entries: [], cached: true });
      expect(await sut.page(l, { offset: 0 }, 10)).toEqual({ entries: [], more: false });
      expect(await sut.all(l)).toEqual([]);
    });

    it('never creates a list from a change: changes to an uncached list leave it uncached', async () => {
      const l = list('following');
      await sut.apply([{ ...l, userId: 7, createdAt: 1000 }]);
      expect(await sut.page(l, { offset: 0 }, 10)).toBeNull();
      expect(await sut.all(l)).toBeNull();
    });

    it('pages newest first with ties broken by id, by offset and by exclusive cursor', async () => {
      const l = list();
      const entries = [
        { userId: 5, createdAt: 100 },
        { userId: 9, createdAt: 300 },
        { userId: 12, createdAt: 200 },
        { userId: 3, createdAt: 200 },
        { userId: 1_000_000_007, createdAt: 200 },
        { userId: 8, createdAt: 50 },
      ];
      await sut.fill(l, async () => entries);
      const order = sorted(entries);
      expect(order.map((e) => e.userId)).toEqual([9, 1_000_000_007, 12, 3, 5, 8]);
      expect(await sut.page(l, { offset: 0 }, 2)).toEqual({ entries: order.slice(0, 2), more: true });
      expect(await sut.page(l, { offset: 4 }, 2)).toEqual({ entries: order.slice(4), more: false });
      expect(await sut.page(l, { offset: 6 }, 2)).toEqual({ entries: [], more: false });
      expect(await sut.page(l, { offset: 0 }, 100)).toEqual({ entries: order, more: false });

      // Walk by cursor two at a time: every entry once, in order.
      const seen: ListEntry[] = [];
      let page = await sut.page(l, { offset: 0 }, 2);
      seen.push(...page!.entries);
      while (page!.more) {
        page = await sut.page(l, { after: seen[seen.length - 1]! }, 2);
        seen.push(...page!.entries);
      }
      expect(seen).toEqual(order);
      // A cursor on a tie starts after it, not at the tie's score.
      expect((await sut.page(l, { after: { userId: 12, createdAt: 200 } }, 10))!.entries).toEqual(
        order.slice(3),
      );
    });

    it('starts after a cursor whose entry has left the list', async () => {
      const l = list();
      const entries = [
        { userId: 1, createdAt: 10 },
        { userId: 2, createdAt: 20 },
        { userId: 4, createdAt: 20 },
        { userId: 3, createdAt: 30 },
      ];
      await sut.fill(l, async () => entries);
      await sut.apply([{ ...l, userId: 4, createdAt: null }]);
      expect((await sut.page(l, { after: { userId: 4, createdAt: 20 } }, 10))!.entries).toEqual([
        { userId: 2, createdAt: 20 },
        { userId: 1, createdAt: 10 },
      ]);
      // A cursor between two existing entries (no entry of its own) works the same way.
      expect((await sut.page(l, { after: { userId: 3, createdAt: 25 } }, 10))!.entries).toEqual([
        { userId: 2, createdAt: 20 },
        { userId: 1, createdAt: 10 },
      ]);
    });

    it('applies changes to a cached list idempotently: add, move, remove', async () => {
      const l = list('following');
      await sut.fill(l, async () => [
        { userId: 1, createdAt: 10 },
        { userId: 2, createdAt: 20 },
      ]);
      await sut.apply([
        { ...l, userId: 3, createdAt: 30 },
        { ...l, userId: 3, createdAt: 30 },
        { ...l, userId: 1, createdAt: null },
        { ...l, userId: 1, createdAt: null },
        { ...l, userId: 2, createdAt: 40 },
      ]);
      expect(await sut.all(l)).toEqual([
        { userId: 2, createdAt: 40 },
        { userId: 3, createdAt: 30 },
      ]);
      await sut.apply([
        { ...l, userId: 2, createdAt: null },
        { ...l, userId: 3, createdAt: null },
      ]);
      expect(await sut.page(l, { offset: 0 }, 10)).toEqual({ entries: [], more: false });
    });

    it('keeps lists of different owners and kinds apart', async () => {
      const a: ListRef = { owner: nextOwner, kind: 'following' };
      const b: ListRef = { owner: nextOwner++, kind: 'followers' };
      const c = list('following');
      await sut.fill(a, async () => [{ userId: 1, createdAt: 1 }]);
      await sut.fill(b, async () => [{ userId: 2, createdAt: 2 }]);
      await sut.apply([{ ...c, userId: 3, createdAt: 3 }]);
      expect(await sut.all(a)).toEqual([{ userId: 1, createdAt: 1 }]);
      expect(await sut.all(b)).toEqual([{ userId: 2, createdAt: 2 }]);
      expect(await sut.all(c)).toBeNull();
    });

    it('does not install a fill when the list changed while it was loading', async () => {
      const l = list();
      const result = await sut.fill(l, async () => {
        const loaded = [{ userId: 1, createdAt: 10 }];
        // The change lands after the load read the database: the load is stale.
        await sut.apply([{ ...l, userId: 2, createdAt: 20 }]);
        return loaded;
      });
      expect(result).toEqual({ entries: [{ userId: 1, createdAt: 10 }], cached: false });
      expect(await sut.page(l, { offset: 0 }, 10)).toBeNull();

      const invalidated = await sut.fill(l, async () => {
        await sut.invalidate([l]);
        return [];
      });
      expect(invalidated.cached).toBe(false);
      expect(await sut.all(l)).toBeNull();

      // A later fill with nothing in between is installed.
      expect((await sut.fill(l, async () => [{ userId: 2, createdAt: 20 }])).cached).toBe(true);
      expect(await sut.all(l)).toEqual([{ userId: 2, createdAt: 20 }]);
    });

    it('applies watched changes to a list nothing touched since the watch, several of one list at once', async () => {
      const l = list('following');
      const other = list('followers');
      await sut.fill(l, async () => [{ userId: 1, createdAt: 10 }]);
      await sut.fill(other, async () => []);
      const watch = await sut.watch([l, other, l]);
      await sut.apply(
        [
          { ...l, userId: 2, createdAt: 20 },
          { ...l, userId: 1, createdAt: null },
          { ...l, userId: 3, createdAt: 30 },
          { ...other, userId: 4, createdAt: 40 },
        ],
        watch,
      );
      expect(await sut.all(l)).toEqual([
        { userId: 3, createdAt: 30 },
        { userId: 2, createdAt: 20 },
      ]);
      expect(await sut.all(other)).toEqual([{ userId: 4, createdAt: 40 }]);
    });

    it('drops, instead of changing, a list touched after the changes were watched', async () => {
      // Another consumer's change lands between the watch and this one's.
      const changed = list('following');
      await sut.fill(changed, async () => [{ userId: 1, createdAt: 10 }]);
      const first = await sut.watch([changed]);
      await sut.apply([{ ...changed, userId: 1, createdAt: null }]);
      await sut.apply([{ ...changed, userId: 2, createdAt: 20 }], first);
      expect(await sut.all(changed)).toBeNull();

      // A follow's invalidation, then a fill from the database, land between them: the fill is
      // newer than what the watched changes were read from.
      const refilled = list('followers');
      const second = await sut.watch([refilled]);
      await sut.invalidate([refilled]);
      await sut.fill(refilled, async () => []);
      expect(await sut.all(refilled)).toEqual([]);
      await sut.apply([{ ...refilled, userId: 5, createdAt: 50 }], second);
      expect(await sut.all(refilled)).toBeNull();

      // A watch released unused leaves nothing behind: later changes apply as usual.
      const untouched = list();
      await sut.fill(untouched, async () => []);
      (await sut.watch([untouched])).release();
      await sut.apply([{ ...untouched, userId: 6, createdAt: 60 }]);
      expect(await sut.all(untouched)).toEqual([{ userId: 6, createdAt: 60 }]);
    });

    it('does not cache a list longer than maxEntries, and drops one that grows past it', async () => {
      const l = list();
      const tooMany = Array.from({ length: fx.maxEntries + 1 }, (_, i) => ({ userId: i + 1, createdAt: i }));
      expect(await sut.fill(l, async () => tooMany)).toEqual({ entries: tooMany, cached: false });
      expect(await sut.all(l)).toBeNull();

      const full = tooMany.slice(0, fx.maxEntries);
      expect((await sut.fill(l, async () => full)).cached).toBe(true);
      expect(await sut.all(l)).toHaveLength(fx.maxEntries);
      await sut.apply([{ ...l, userId: 99_999, createdAt: 1 }]);
      expect(await sut.all(l)).toBeNull();
    });

    it('invalidate drops a cached list', async () => {
      const l = list();
      await sut.fill(l, async () => [{ userId: 1, createdAt: 1 }]);
      await sut.invalidate([l]);
      expect(await sut.page(l, { offset: 0 }, 5)).toBeNull();
    });

    it('expires a list ttlMs after it was built, whatever changed since', async () => {
      const l = list();
      await sut.fill(l, async () => [{ userId: 1, createdAt: 1 }]);
      const half = Math.ceil(fx.ttlMs / 2);
      if (fx.advance) fx.advance(half);
      else await sleep(half);
      await sut.apply([{ ...l, userId: 2, createdAt: 2 }]);
      expect(await sut.all(l)).toHaveLength(2);
      if (fx.advance) fx.advance(fx.ttlMs);
      else await sleep(fx.ttlMs + 50);
      expect(await sut.page(l, { offset: 0 }, 5)).toBeNull();
    });
  });
}
