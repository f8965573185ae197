import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { deleteByPrefix, services, testKafkaLog, uniqueName } from '../../test/rig/resources.js';
import type { EntityRef } from '../counter/model.js';
import type { CounterStore } from '../counter/store/counter-store.js';
import { RedisCounterStore } from '../counter/store/redis-counter-store.js';
import { SqliteCounterStore } from '../counter/store/sqlite-counter-store.js';
import { migrate, openSqlite } from '../platform/db/database.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import { SqliteEventLog } from '../platform/eventlog/sqlite-eventlog.js';
import { VIEW_GROUP, VIEW_TOPIC, ViewAggregator, ViewMetrics, ViewRecorder, replayViews } from './views.js';

type Profile = 'embedded' | 'cluster';

/** A topic beside the views log (on SQLite its rows take offsets between view records'). */
const OTHER_TOPIC = 'other-events';

async function openRig(
  profile: Profile,
): Promise<{ events: EventLog; store: CounterStore; redis?: Redis; cleanup(): Promise<void> }> {
  if (profile === 'embedded') {
    const dir = mkdtempSync(join(tmpdir(), 'zg-views-'));
    const db = openSqlite(join(dir, 'zhiguang.db'));
    await migrate(db);
    const events = new SqliteEventLog(db, { idlePollMs: 10 });
    return {
      events,
      store: new SqliteCounterStore(db),
      cleanup: async () => {
        await events.close();
        await db.close();
        rmSync(dir, { recursive: true, force: true });
      },
    };
  }
  const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
  const keyPrefix = `${uniqueName('views')}:`;
  const events = testKafkaLog('zg-views', `${uniqueName('views')}.`);
  return {
    events,
    redis,
    // As deployments make it: views wait while a group is unsealed (sealed below, as at a first start).
    store: new RedisCounterStore(redis, { prefix: keyPrefix, groups: 16, requireSeal: true }),
    cleanup: async () => {
      await events.deleteGroups([VIEW_GROUP]).catch(() => undefined);
      await events.deleteTopics([VIEW_TOPIC, OTHER_TOPIC]).catch(() => undefined);
      await events.close();
      await deleteByPrefix(redis, keyPrefix);
      await redis.quit();
    },
  };
}

const ref = (n: number): EntityRef => ({
  etype: 'knowpost',
  eid: String(7_500_000_000_000_000_000n + BigInt(n)),
});

describe.each<Profile>(['embedded', 'cluster'])('views pipeline (%s)', (profile) => {
  let rig: Awaited<ReturnType<typeof openRig>>;
  let aggregator: ViewAggregator;
  let registry: Registry;
  let metrics: ViewMetrics;
  const errors: unknown[] = [];

  beforeEach(async () => {
    rig = await openRig(profile);
    await rig.store.seal();
    await rig.events.ensureTopics([VIEW_TOPIC, OTHER_TOPIC]);
    registry = new Registry();
    metrics = new ViewMetrics(registry);
    aggregator = new ViewAggregator(rig.events, rig.store, metrics, (err) => errors.push(err), {
      maxBatch: 500,
      maxWaitMs: 20,
    });
    await aggregator.start();
  });
  afterEach(async () => {
    await aggregator.stop();
    await rig.cleanup();
  });

  const reads = async (refs: EntityRef[]) => (await rig.store.readSnapshots(refs)).map((c) => c?.[0] ?? null);

  async function until(check: () => Promise<boolean>, ms = 10_000): Promise<void> {
    const deadline = Date.now() + ms;
    while (!(await check())) {
      if (Date.now() > deadline) throw new Error('not reached in time');
      await new Promise((r) => setTimeout(r, 25));
    }
  }

  it('adds recorded views to the snapshots’ read field, leaving likes alone', async () => {
    const posts = [ref(1), ref(2), ref(3)];
    await rig.store.toggle(posts[0]!, 'like', 5, true, Date.now());
    await rig.store.rebuild(posts[0]!);
    const recorder = new ViewRecorder(rig.events, metrics, { maxItems: 7, flushMs: 50 });
    const plan = [5, 1, 12];
    for (let round = 0; round < 12; round++)
      plan.forEach((n, i) => {
        if (round < n) recorder.record(posts[i]!.eid);
      });
    await recorder.close();
    await until(async () => JSON.stringify(await reads(posts)) === JSON.stringify(plan));
    const [first] = await rig.store.readSnapshots([posts[0]!]);
    expect(first).toEqual([5, 1, 0, 0, 0]);
    const applied = await registry.getSingleMetric('zg_views_applied_total')?.get();
    expect(applied?.values[0]?.value).toBe(18);
  });

  it('adds a batch once when its answer was lost after the store applied it and it is handed again', async () => {
    await aggregator.stop();
    let lose = true;
    const store: Pick<CounterStore, 'addLoggedViews'> = {
      addLoggedViews: async (records) => {
        const added = await rig.store.addLoggedViews(records);
        if (lose) {
          lose = false;
          throw new Error('injected: the answer was lost');
        }
        return added;
      },
    };
    aggregator = new ViewAggregator(rig.events, store, metrics, (err) => errors.push(err), {
      maxBatch: 500,
      maxWaitMs: 20,
    });
    await aggregator.start();
    const posts = [ref(31), ref(32), ref(33)];
    const recorder = new ViewRecorder(rig.events, metrics, { maxItems: 100, flushMs: 20 });
    for (const [i, post] of posts.entries()) for (let n = 0; n <= i; n++) recorder.record(post.eid);
    await recorder.close();
    await until(async () => !lose && JSON.stringify(await reads(posts)) === '[1,2,3]');
    // Handed again after a back-off: found added, and skipped.
    const metric = async (name: string) => (await registry.getSingleMetric(name)?.get())?.values[0]?.value;
    await until(async () => (await metric('zg_views_skipped_total')) === 6);
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(await reads(posts)).toEqual([1, 2, 3]);
    expect(await metric('zg_views_applied_total')).toBe(0);
    expect(errors.some((e) => /injected: the answer was lost/.test(String(e)))).toBe(true);
  });

  it('adds the records of a consumer that stopped between adding and committing once, when they come again in other batches', async () => {
    await aggregator.stop();
    const posts = Array.from({ length: 6 }, (_, i) => ref(40 + i));
    // Twelve records, each with the views of one post, there before the consumer starts.
    await rig.events.publish(
      VIEW_TOPIC,
      Array.from({ length: 12 }, (_, i) => ({
        key: `k${i}`,
        value: JSON.stringify({ etype: 'knowpost', views: [[posts[i % 6]!.eid, 1 + (i % 3)]], ts: 1 }),
      })),
    );
    const want = posts.map((_, p) => [0, 1].reduce((sum, round) => sum + 1 + ((round * 6 + p) % 3), 0));
    let firstBatch = 0;
    const store: Pick<CounterStore, 'addLoggedViews'> = {
      addLoggedViews: async (records) => {
        await rig.store.addLoggedViews(records);
        firstBatch ||= records.length;
        // Never committed: as a consumer killed between adding and committing.
        throw new Error('injected: stopped before its commit');
      },
    };
    const first = new ViewAggregator(rig.events, store, metrics, (err) => errors.push(err), {
      maxBatch: 500,
      maxWaitMs: 200,
    });
    await first.start();
    await until(async () => firstBatch > 0);
    await first.stop();
    expect(firstBatch).toBeGreaterThan(1);
    // Handed again one record at a time, from the last commit (none): each record once.
    aggregator = new ViewAggregator(rig.events, rig.store, metrics, (err) => errors.push(err), {
      maxBatch: 1,
      maxWaitMs: 20,
    });
    await aggregator.start();
    const end = await rig.events.endOffsets(VIEW_TOPIC);
    await until(async () => {
      const committed = await rig.events.committedOffsets(VIEW_GROUP, VIEW_TOPIC);
      return [...end].every(([p, offset]) => offset === 0n || committed.get(p) === offset);
    });
    expect(await reads(posts)).toEqual(want);
  });

  it.runIf(profile === 'cluster')(
    'names the runs it handled with each call, so a group’s view mark is one range while one consumer reads',
    async () => {
      await aggregator.stop();
      const posts = Array.from({ length: 24 }, (_, i) => ref(60 + i));
      // One partition (one key), a post per record, three records a batch: each group of the store
      // sees records at scattered offsets.
      await rig.events.publish(
        VIEW_TOPIC,
        posts.map((post) => ({
          key: 'one',
          value: JSON.stringify({ etype: 'knowpost', views: [[post.eid, 1]], ts: 1 }),
        })),
      );
      aggregator = new ViewAggregator(rig.events, rig.store, metrics, (err) => errors.push(err), {
        maxBatch: 3,
        maxWaitMs: 20,
      });
      await aggregator.start();
      await until(async () => (await reads(posts)).every((n) => n === 1));
      const store = rig.store as RedisCounterStore;
      const groups = [...new Set(posts.map((post) => store.groupOf(post)))];
      expect(groups.length).toBeGreaterThan(8);
      for (const group of groups) {
        const marks = Object.entries(await rig.redis!.hgetall(store.groupKey('vm', group)));
        expect(marks).toHaveLength(1);
        expect({ group, mark: marks[0]![1] }).toEqual({
          group,
          mark: expect.stringMatching(/^\d+:\d+-\d+$/),
        });
      }
    },
  );

  it('skips malformed records and still applies the rest of the batch, in either form', async () => {
    const packed = (views: [string, number][]) => JSON.stringify({ etype: 'knowpost', views, ts: 1 });
    const before = errors.length;
    await rig.events.publish(VIEW_TOPIC, [
      { key: 'x', value: 'not json' },
      {
        key: `knowpost:${ref(9).eid}`,
        value: JSON.stringify({ etype: 'knowpost', eid: ref(9).eid, n: 4, ts: 1 }),
      },
      { key: 'y', value: JSON.stringify({ etype: 'knowpost', eid: 'abc', n: 4 }) },
      {
        key: 'z',
        value: packed([
          [ref(12).eid, 5],
          [ref(9).eid, 0],
        ]),
      },
      {
        key: `knowpost:${ref(10).eid}`,
        value: packed([
          [ref(10).eid, 2],
          [ref(11).eid, 3],
          [ref(9).eid, 1],
        ]),
      },
    ]);
    // Records of different keys may be consumed in any order; the three malformed ones are each reported.
    await until(
      async () =>
        errors.length - before >= 3 && JSON.stringify(await reads([ref(9), ref(10), ref(11)])) === '[5,2,3]',
    );
    expect(errors.length - before).toBe(3);
    expect(await reads([ref(12)])).toEqual([null]);
  });

  it('adds back every record’s views once after a reset, with view-agg refused until the store is sealed, whatever it handled before', async () => {
    const [a, b] = [ref(21), ref(22)];
    await rig.events.publish(VIEW_TOPIC, [{ key: 'x', value: 'not json' }]);
    // Before the loss: 600 records of one view of a each, handled by view-agg, with rows of another
    // topic between them (on SQLite those break the consumer's runs of offsets).
    const one = (post: EntityRef) => ({
      key: 'k',
      value: JSON.stringify({ etype: 'knowpost', views: [[post.eid, 1]], ts: Date.now() }),
    });
    for (let i = 0; i < 600; i++) {
      await rig.events.publish(VIEW_TOPIC, [one(a)]);
      if (profile === 'embedded') await rig.events.publish(OTHER_TOPIC, [{ key: 'o', value: '{}' }]);
    }
    await until(async () => (await reads([a]))[0] === 600, 30_000);

    // The replay: the store unsealed and emptied, views and marks with it.
    const sealed = await rig.store.unseal();
    await rig.store.reset();
    // Views of b keep coming while it refills the store, one record at a time: view-agg is refused.
    for (let i = 0; i < 20; i++) {
      await rig.events.publish(VIEW_TOPIC, [one(b)]);
      if (profile === 'embedded') await rig.events.publish(OTHER_TOPIC, [{ key: 'o', value: '{}' }]);
      await new Promise((r) => setTimeout(r, 10));
    }
    await until(async () => errors.some((e) => /being restored/.test(String(e))));
    expect(await rig.store.readSnapshots([a, b])).toEqual([null, null]);
    const report = await replayViews(rig.events, rig.store, () => {});
    expect(report).toMatchObject({ views: 620, viewsAddedBeside: 0, malformedViewRecords: 1 });
    await rig.store.seal(sealed);
    // Sealed, view-agg goes on from where it was refused and finds those records added.
    const end = await rig.events.endOffsets(VIEW_TOPIC);
    await until(async () => {
      const committed = await rig.events.committedOffsets(VIEW_GROUP, VIEW_TOPIC);
      return [...end].every(([p, offset]) => offset === 0n || committed.get(p) === offset);
    }, 20_000);
    expect(await reads([a, b])).toEqual([600, 20]);
    // And adds new records once.
    const later = new ViewRecorder(rig.events, metrics, { maxItems: 100, flushMs: 20 });
    for (let i = 0; i < 3; i++) later.record(b.eid);
    await later.close();
    await until(async () => (await reads([b]))[0] === 23);
    await new Promise((r) => setTimeout(r, 200));
    expect(await reads([a, b])).toEqual([600, 23]);
  }, 90_000);

  it('adds back views no view-agg had handled, which view-agg then finds added', async () => {
    await aggregator.stop();
    const recorder = new ViewRecorder(rig.events, metrics, { maxItems: 100, flushMs: 20 });
    for (let i = 0; i < 3; i++) recorder.record(ref(31).eid);
    await recorder.close();
    expect(await replayViews(rig.events, rig.store, () => {})).toMatchObject({
      views: 3,
      viewsAddedBeside: 0,
    });
    // A second replay beside no reset finds them all added.
    expect(await replayViews(rig.events, rig.store, () => {})).toMatchObject({
      views: 3,
      viewsAddedBeside: 3,
    });
    aggregator = new ViewAggregator(rig.events, rig.store, metrics, (err) => errors.push(err), {
      maxBatch: 500,
      maxWaitMs: 20,
    });
    await aggregator.start();
    const end = await rig.events.endOffsets(VIEW_TOPIC);
    await until(async () => {
      const committed = await rig.events.committedOffsets(VIEW_GROUP, VIEW_TOPIC);
      return [...end].every(([p, offset]) => offset === 0n || committed.get(p) === offset);
    });
    expect(await reads([ref(31)])).toEqual([3]);
  });
});
