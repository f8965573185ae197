import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { encodeSnapshot } from '../../counter/snapshot.js';
import { ZERO_USER_COUNTS, type UserCounterDelta, type UserCounts, type UserField } from '../model.js';
import { sequencedEventId, type UserCounterStore } from './user-counter-store.js';

export interface UserCounterStoreFixture {
  sut: UserCounterStore;
  /** Another store over the same data, as another process would have (its own connection where there is one). */
  another(): UserCounterStore;
  cleanup: () => Promise<void>;
}

export interface UserCounterStoreFactoryOptions {
  retentionMs?: number;
}

const NOW = Date.parse('2030-01-01T00:00:00Z');

const counts = (partial: Partial<UserCounts>): UserCounts => ({ ...ZERO_USER_COUNTS, ...partial });
const delta = (eventId: string, userId: number, field: UserField, d: number): UserCounterDelta => ({
  eventId,
  userId,
  field,
  delta: d,
});

/**
 * The behaviour every `UserCounterStore` adapter must show (see the port's doc comment). The factory
 * returns an empty store of its own.
 */
export function defineUserCounterStoreContract(
  name: string,
  factory: (options?: UserCounterStoreFactoryOptions) => Promise<UserCounterStoreFixture>,
): void {
  describe(`UserCounterStore contract: ${name}`, () => {
    let fx: UserCounterStoreFixture;
    let sut: UserCounterStore;
    const extra: UserCounterStoreFixture[] = [];

    beforeEach(async () => {
      fx = await factory();
      sut = fx.sut;
    });
    afterEach(async () => {
      for (const f of extra.splice(0)) await f.cleanup();
      await fx.cleanup();
    });

    it('reads many users in order, null for missing and malformed snapshots', async () => {
      expect(await sut.read([])).toEqual([]);
      await sut.write(7, counts({ posts: 3, followers: 4_000_000_000 }), {}, NOW);
      await sut.write(70_001, counts({ followings: 1, likesReceived: 9, favsReceived: 2 }), {}, NOW);
      await sut.writeRawSnapshot(8, Buffer.from('not twenty bytes'));
      expect(await sut.read([70_001, 8, 9, 7, 7])).toEqual([
        counts({ followings: 1, likesReceived: 9, favsReceived: 2 }),
        null,
        null,
        counts({ posts: 3, followers: 4_000_000_000 }),
        counts({ posts: 3, followers: 4_000_000_000 }),
      ]);
      await sut.remove([7]);
      expect(await sut.read([7, 70_001])).toEqual([
        null,
        counts({ followings: 1, likesReceived: 9, favsReceived: 2 }),
      ]);
      // All of them, versions kept.
      const version = (await sut.inspect(70_001)).version;
      expect(await sut.removeAll()).toBe(true);
      expect(await sut.read([7, 70_001, 8])).toEqual([null, null, null]);
      expect(await sut.removeAll()).toBe(false);
      expect((await sut.inspect(70_001)).version).toBe(version);
    });

    it('rejects ids that are not positive integers', async () => {
      await expect(sut.read([0])).rejects.toThrow(RangeError);
      await expect(sut.write(-1, counts({}), {}, NOW)).rejects.toThrow(RangeError);
      await expect(sut.apply([delta('e', 1.5, 'posts', 1)], NOW)).rejects.toThrow(RangeError);
      await expect(sut.apply([delta('e', 1, 'bogus' as UserField, 1)], NOW)).rejects.toThrow(RangeError);
    });

    it('applies deltas to snapshots and counts each event once per user', async () => {
      await sut.write(1, counts({ posts: 2 }), {}, NOW);
      await sut.write(2, counts({ followers: 5 }), {}, NOW);
      const batch = [
        delta('post:a:published', 1, 'posts', 1),
        delta('post:b:published', 1, 'posts', 1),
        delta('follow:1:2', 1, 'followings', 1),
        delta('follow:1:2', 2, 'followers', 1),
      ];
      expect(await sut.apply(batch, NOW)).toEqual({ applied: 4, skipped: 0 });
      expect(await sut.read([1, 2])).toEqual([counts({ posts: 4, followings: 1 }), counts({ followers: 6 })]);

      // Redelivered whole, in part, or twice within one batch: nothing moves again.
      expect(await sut.apply(batch, NOW + 1)).toEqual({ applied: 0, skipped: 4 });
      expect(await sut.apply([...batch.slice(1, 3), ...batch.slice(1, 3)], NOW + 2)).toEqual({
        applied: 0,
        skipped: 4,
      });
      const next = [delta('post:c:published', 1, 'posts', 1), delta('post:c:published', 1, 'posts', 1)];
      expect(await sut.apply([...next, batch[3]!], NOW + 3)).toEqual({ applied: 1, skipped: 2 });
      expect(await sut.read([1, 2])).toEqual([counts({ posts: 5, followings: 1 }), counts({ followers: 6 })]);
    });

    it('never goes below zero nor beyond 2^32 - 1', async () => {
      await sut.write(3, counts({ posts: 1, followers: 0xfffffffe }), {}, NOW);
      await sut.apply(
        [
          delta('x1', 3, 'posts', -1),
          delta('x2', 3, 'posts', -1),
          delta('x3', 3, 'posts', -5),
          delta('x4', 3, 'followers', 3),
          delta('x5', 3, 'favsReceived', -1),
        ],
        NOW,
      );
      expect(await sut.read([3])).toEqual([counts({ posts: 0, followers: 0xffffffff })]);
      await sut.apply([delta('x6', 3, 'posts', 1)], NOW);
      expect(await sut.read([3])).toEqual([counts({ posts: 1, followers: 0xffffffff })]);
    });

    it('records deltas for a user without a snapshot, raising its version but inventing no counts', async () => {
      expect(await sut.inspect(4)).toEqual({ counts: null, version: 0, applied: [] });
      expect(await sut.apply([delta('p1', 4, 'posts', 1), delta('p2', 4, 'posts', 1)], NOW)).toEqual({
        applied: 2,
        skipped: 0,
      });
      expect(await sut.read([4])).toEqual([null]);
      expect(await sut.inspect(4, ['p1', 'p2', 'p3'])).toEqual({
        counts: null,
        version: 2,
        applied: [true, true, false],
      });
      // The rebuild's counts include p1 and p2 (it read the database after them): they stay counted once.
      await sut.write(4, counts({ posts: 2 }), { ifAbsent: true, ifVersion: 2 }, NOW);
      expect(await sut.apply([delta('p1', 4, 'posts', 1), delta('p3', 4, 'posts', 1)], NOW)).toEqual({
        applied: 1,
        skipped: 1,
      });
      // Raised by the write and by p3.
      expect(await sut.inspect(4, ['p3'])).toEqual({
        counts: counts({ posts: 3 }),
        version: 4,
        applied: [true],
      });
    });

    it('writes conditionally: only if absent, only at an unchanged version, marking included events applied', async () => {
      await sut.apply([delta('before', 5, 'posts', 1)], NOW);
      const { version } = await sut.inspect(5);
      // A delta applied while the rebuild read the database: its write must not land.
      await sut.apply([delta('during', 5, 'posts', 1)], NOW);
      expect(await sut.write(5, counts({ posts: 1 }), { ifAbsent: true, ifVersion: version }, NOW)).toEqual({
        outcome: 'conflict',
        version: version + 1,
      });
      expect(await sut.read([5])).toEqual([null]);

      // The retry reads the database again (2 posts, and a third whose event is still on its way).
      const retry = await sut.inspect(5);
      expect(
        await sut.write(
          5,
          counts({ posts: 3 }),
          { ifAbsent: true, ifVersion: retry.version, markApplied: ['in-flight', 'in-flight'] },
          NOW,
        ),
      ).toEqual({ outcome: 'written' });
      expect(await sut.apply([delta('in-flight', 5, 'posts', 1)], NOW)).toEqual({ applied: 0, skipped: 1 });
      expect(await sut.read([5])).toEqual([counts({ posts: 3 })]);

      // Only if absent: the stored snapshot wins and is returned.
      expect(await sut.write(5, counts({ posts: 9 }), { ifAbsent: true }, NOW)).toEqual({
        outcome: 'present',
        counts: counts({ posts: 3 }),
      });
      // An overwrite at the current version replaces it; a malformed snapshot counts as absent.
      const now = await sut.inspect(5);
      expect(await sut.write(5, counts({ posts: 2 }), { ifVersion: now.version }, NOW)).toEqual({
        outcome: 'written',
      });
      await sut.writeRawSnapshot(5, Buffer.alloc(3));
      expect(await sut.write(5, counts({ posts: 4 }), { ifAbsent: true }, NOW)).toEqual({
        outcome: 'written',
      });
      expect(await sut.read([5])).toEqual([counts({ posts: 4 })]);
    });

    it('raises the version on every write, so of two rebuilds that read one version only the first lands', async () => {
      await sut.write(6, counts({ followers: 1 }), {}, NOW);
      // Rebuild A reads the version (then the database: 1 follower) and stalls.
      const a = await sut.inspect(6);
      // A follow commits; rebuild B reads the version and the database (2, the follow on its way).
      const b = await sut.inspect(6);
      expect(
        await sut.write(6, counts({ followers: 2 }), { ifVersion: b.version, markApplied: ['f'] }, NOW),
      ).toEqual({ outcome: 'written' });
      expect(await sut.write(6, counts({ followers: 1 }), { ifVersion: a.version }, NOW)).toEqual({
        outcome: 'conflict',
        version: a.version + 1,
      });
      expect(await sut.apply([delta('f', 6, 'followers', 1)], NOW)).toEqual({ applied: 0, skipped: 1 });
      expect(await sut.read([6])).toEqual([counts({ followers: 2 })]);
    });

    it('marks events applied for the written user only', async () => {
      await sut.write(10, counts({}), {}, NOW);
      await sut.write(11, counts({}), {}, NOW);
      await sut.write(10, counts({ followings: 1 }), { markApplied: ['follow:10:11'] }, NOW);
      expect(
        await sut.apply(
          [delta('follow:10:11', 10, 'followings', 1), delta('follow:10:11', 11, 'followers', 1)],
          NOW,
        ),
      ).toEqual({ applied: 1, skipped: 1 });
      expect(await sut.read([10, 11])).toEqual([counts({ followings: 1 }), counts({ followers: 1 })]);
    });

    it('counts every event once when duplicate batches are applied concurrently from several stores', async () => {
      const users = Array.from({ length: 40 }, (_, i) => 1_000 + i * 37);
      for (const u of users) await sut.write(u, counts({ posts: 50, followers: 50 }), {}, NOW);
      const stores = [sut, fx.another(), fx.another()];
      // High enough that no order of the concurrent applies ever clamps at zero.
      const expected = new Map(users.map((u) => [u, counts({ posts: 50, followers: 50 })]));
      const batches: UserCounterDelta[][] = [];
      for (let b = 0; b < 30; b++) {
        const batch: UserCounterDelta[] = [];
        for (let k = 0; k < 20; k++) {
          const u = users[(b * 7 + k * 3) % users.length]!;
          const field: UserField = k % 3 === 0 ? 'followers' : 'posts';
          const d = k % 4 === 3 ? -1 : 1;
          batch.push(delta(`ev-${b}-${k}`, u, field, d));
          const c = expected.get(u)!;
          c[field] = Math.max(0, c[field] + d);
        }
        batches.push(batch);
      }
      // Every batch delivered three times, concurrently, through different stores and splits.
      await Promise.all(
        batches.flatMap((batch, b) => [
          stores[b % 3]!.apply(batch, NOW),
          stores[(b + 1) % 3]!.apply(batch.slice(0, 10), NOW),
          stores[(b + 1) % 3]!.apply(batch.slice(10), NOW),
          stores[(b + 2) % 3]!.apply([...batch].reverse(), NOW),
        ]),
      );
      const read = await sut.read(users);
      expect(new Map(users.map((u, i) => [u, read[i]]))).toEqual(expected);
      const again = await Promise.all(batches.map((batch) => stores[1]!.apply(batch, NOW + 1)));
      expect(again.reduce((n, r) => n + r.applied, 0)).toBe(0);
      expect(again.reduce((n, r) => n + r.skipped, 0)).toBe(600);
    });

    it('remembers applied events for the retention, then forgets them (the documented bound)', async () => {
      const short = await factory({ retentionMs: 60_000 });
      extra.push(short);
      const store = short.sut;
      await store.write(20, counts({}), {}, NOW);
      await store.apply([delta('old', 20, 'posts', 1)], NOW);
      expect(await store.apply([delta('old', 20, 'posts', 1)], NOW + 59_999)).toEqual({
        applied: 0,
        skipped: 1,
      });
      expect((await store.inspect(20, ['old'])).applied).toEqual([true]);
      // A later apply trims what is older than the retention; the same event would now count again.
      await store.apply([delta('new', 20, 'followers', 1)], NOW + 60_001);
      expect((await store.inspect(20, ['old', 'new'])).applied).toEqual([false, true]);
      expect(await store.read([20])).toEqual([counts({ posts: 1, followers: 1 })]);
    });

    it('keeps one mark per (user, source) for sequenced ids: at or below it counts as applied, for ever', async () => {
      const short = await factory({ retentionMs: 60_000 });
      extra.push(short);
      const store = short.sut;
      const like = (seq: number, userId = 40, d = 1) =>
        delta(sequencedEventId('knowpost:77', seq), userId, 'likesReceived', d);
      await store.write(40, counts({}), {}, NOW);
      await store.write(41, counts({}), {}, NOW);
      expect(await store.apply([like(1), like(2), like(3, 40, -1), like(2), like(1, 41)], NOW)).toEqual({
        applied: 4,
        skipped: 1,
      });
      // Redelivered long after the retention: still applied, since marks are never trimmed.
      await store.apply([delta('unrelated', 40, 'posts', 1)], NOW + 3_600_000);
      expect(await store.apply([like(3, 40, -1), like(2)], NOW + 3_600_000)).toEqual({
        applied: 0,
        skipped: 2,
      });
      // A lower seq after a higher one is at or below the mark: skipped (the caller heals gaps).
      expect(await store.apply([like(5), like(4)], NOW + 3_600_000)).toEqual({ applied: 1, skipped: 1 });
      expect(await store.read([40, 41])).toEqual([
        counts({ likesReceived: 2, posts: 1 }),
        counts({ likesReceived: 1 }),
      ]);
      const ids = [1, 5, 6, 15].map((seq) => sequencedEventId('knowpost:77', seq));
      expect((await store.inspect(40, ids)).applied).toEqual([true, true, false, false]);
      expect((await store.inspect(41, ids)).applied).toEqual([true, false, false, false]);
      expect((await store.inspect(40, [sequencedEventId('knowpost:78', 1)])).applied).toEqual([false]);

      // A write raises the mark to the highest seq it includes and never lowers it.
      const v = (await store.inspect(40)).version;
      await store.write(
        40,
        counts({ likesReceived: 9 }),
        { ifVersion: v, markApplied: [sequencedEventId('knowpost:77', 123_456_789_012_345), ids[0]!] },
        NOW,
      );
      expect(
        (await store.inspect(40, [sequencedEventId('knowpost:77', 123_456_789_012_345)])).applied,
      ).toEqual([true]);
      expect(await store.apply([like(123_456_789_012_345), like(123_456_789_012_346)], NOW)).toEqual({
        applied: 1,
        skipped: 1,
      });
      expect(await store.read([40])).toEqual([counts({ likesReceived: 10 })]);
    });

    it('counts every sequenced event once when batches are applied concurrently from several stores', async () => {
      const users = [500, 501, 502];
      for (const u of users) await sut.write(u, counts({}), {}, NOW);
      const stores = [sut, fx.another(), fx.another()];
      // Each post's events in seq order; every batch is a prefix of the next one's events.
      const events = (post: number, upTo: number) =>
        Array.from({ length: upTo }, (_, i) =>
          delta(sequencedEventId(`knowpost:${post}`, i + 1), users[post % 3]!, 'likesReceived', 1),
        );
      await Promise.all(
        [10, 20, 30, 40, 50].flatMap((upTo, b) =>
          [0, 1, 2, 3, 4, 5].map((post) => stores[(b + post) % 3]!.apply(events(post, upTo), NOW)),
        ),
      );
      expect(await sut.read(users)).toEqual([
        counts({ likesReceived: 100 }),
        counts({ likesReceived: 100 }),
        counts({ likesReceived: 100 }),
      ]);
    });

    it('stores exactly the snapshot layout the codec defines', async () => {
      await sut.writeRawSnapshot(30, encodeSnapshot([1, 2, 3, 4, 5]));
      expect(await sut.read([30])).toEqual([
        { followings: 1, followers: 2, posts: 3, likesReceived: 4, favsReceived: 5 },
      ]);
    });
  });
}
