/**
 * The counter pipeline end to end inside one process, on both profiles: toggles through the store,
 * events through the real event log (SQLite table / Kafka), the `counter-agg` aggregator, the flusher,
 * the repair job, the reconciler and replay. Each test names the invariant it proves (numbered as in
 * the design's counter pipeline section; docs/architecture.md, "The counter pipeline", describes how
 * each holds), and injects the failure that would break it.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { sql } from 'kysely';
import { Registry } from 'prom-client';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { deleteByPrefix, services, testKafkaLog, uniqueName } from '../../test/rig/resources.js';
import { migrate, openSqlite, type Db } from '../platform/db/database.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import { KafkaEventLog } from '../platform/eventlog/kafka-eventlog.js';
import { SqliteEventLog } from '../platform/eventlog/sqlite-eventlog.js';
import { createRedisKv, createSqliteKv } from '../platform/kv/create.js';
import { COUNTER_GROUP, CounterAggregator, parseCounterEvent } from './aggregator.js';
import { CounterMetrics } from './counter.metrics.js';
import { RateLimitedError } from '../platform/errors/errors.js';
import { MemoryRateLimiter } from '../platform/ratelimit/memory-ratelimit.js';
import { CounterService } from './counter.service.js';
import { CounterEventPublisher } from './event-publisher.js';
import { CounterReconciler, flushPending, repairUnpublished, replayAll, verifyAll } from './maintenance.js';
import {
  COUNTER_TOPIC,
  entityKey,
  eventFor,
  type CounterEvent,
  type Counts,
  type EntityRef,
  type FactMetric,
} from './model.js';
import { CounterRestorer } from './restore.js';
import { encodeSnapshot } from './snapshot.js';
import type { CounterStore, ToggleResult } from './store/counter-store.js';
import { RedisCounterStore } from './store/redis-counter-store.js';
import { SqliteCounterStore } from './store/sqlite-counter-store.js';

type Profile = 'embedded' | 'cluster';

const GROUPS = 64;
const post = (i: number): EntityRef => ({
  etype: 'knowpost',
  eid: String(7_400_000_000_000_000_000n + BigInt(i)),
});
const posts = (n: number, from = 0): EntityRef[] => Array.from({ length: n }, (_, i) => post(from + i));

/** Deterministic pseudo-random numbers, so a failing run can be repeated. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Who holds what, as the toggles' answers say. */
class Model {
  private readonly sets = new Map<string, Set<number>>();

  private set(ref: EntityRef, metric: FactMetric): Set<number> {
    const key = `${entityKey(ref)}:${metric}`;
    let s = this.sets.get(key);
    if (!s) this.sets.set(key, (s = new Set()));
    return s;
  }

  has(ref: EntityRef, metric: FactMetric, user: number): boolean {
    return this.set(ref, metric).has(user);
  }

  apply(ref: EntityRef, metric: FactMetric, user: number, on: boolean): void {
    if (on) this.set(ref, metric).add(user);
    else this.set(ref, metric).delete(user);
  }

  count(ref: EntityRef, metric: FactMetric): number {
    return this.set(ref, metric).size;
  }
}

/** Forwards everything to `target` except the given methods (which receive the original as `this`-free function). */
function intercept<T extends object>(target: T, overrides: { [K in keyof T]?: T[K] }): T {
  return new Proxy(target, {
    get(t, prop, receiver) {
      if (Object.prototype.hasOwnProperty.call(overrides, prop)) return overrides[prop as keyof T];
      const value: unknown = Reflect.get(t, prop, receiver);
      return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(t) : value;
    },
  });
}

async function metricValue(
  registry: Registry,
  name: string,
  labels: Record<string, string> = {},
): Promise<number> {
  const metric = registry.getSingleMetric(name);
  if (!metric) throw new Error(`no metric ${name}`);
  const { values } = await metric.get();
  return values
    .filter((v) => Object.entries(labels).every(([k, l]) => v.labels[k] === l))
    .reduce((sum, v) => sum + v.value, 0);
}

/** Polls until `done` holds; fails with `describe()` after `ms`. */
async function until(
  done: () => boolean | Promise<boolean>,
  ms: number,
  describe: () => string = () => '',
): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${ms} ms ${describe()}`);
    await sleep(10);
  }
}

interface Rig {
  profile: Profile;
  store: CounterStore;
  events: EventLog;
  registry: Registry;
  metrics: CounterMetrics;
  publisher: CounterEventPublisher;
  service: CounterService;
  errors: unknown[];
  db?: Db;
  redis?: Redis;
  prefix?: string;
  /** A store over a connection of its own (what another process has); closed with the rig. */
  separateStore(options?: { topic?: string }): { store: CounterStore; redis?: Redis };
  /** An event log client of its own (another process); closed with the rig. */
  separateEvents(): EventLog;
  aggregator(options?: { store?: CounterStore; events?: EventLog; maxBatch?: number }): CounterAggregator;
  publisherOn(
    events: EventLog,
    store?: CounterStore,
    options?: Partial<PublisherOptions>,
  ): CounterEventPublisher;
  /** What CounterService.toggle does after its visibility check. */
  toggle(ref: EntityRef, metric: FactMetric, user: number, on: boolean): Promise<ToggleResult>;
  cleanup(): Promise<void>;
}

type PublisherOptions = { lingerMs: number; maxBatch: number; maxBuffered: number; maxBackoffMs: number };
const PUBLISHER: PublisherOptions = { lingerMs: 5, maxBatch: 500, maxBuffered: 100_000, maxBackoffMs: 300 };

const everyoneSeesEverything = { visible: async (refs: readonly EntityRef[]) => refs.map(() => true) };

async function openRig(profile: Profile): Promise<Rig> {
  const registry = new Registry();
  const metrics = new CounterMetrics(registry);
  const errors: unknown[] = [];
  const closers: (() => Promise<void>)[] = [];
  const aggregators: CounterAggregator[] = [];
  const publishers: CounterEventPublisher[] = [];
  let store: CounterStore;
  let events: EventLog;
  let db: Db | undefined;
  let redis: Redis | undefined;
  let prefix: string | undefined;
  let separateStore: Rig['separateStore'];
  let separateEvents: Rig['separateEvents'];

  if (profile === 'embedded') {
    const dir = mkdtempSync(join(tmpdir(), 'zg-pipeline-'));
    const sqlite = openSqlite(join(dir, 'zhiguang.db'));
    db = sqlite;
    await migrate(sqlite);
    const log = new SqliteEventLog(sqlite, { idlePollMs: 10, retryBackoffMs: { min: 20, max: 200 } });
    events = log;
    // As the servers make it: replays read it whole.
    await log.ensureTopics([COUNTER_TOPIC], { keepForever: [COUNTER_TOPIC] });
    store = new SqliteCounterStore(sqlite);
    closers.push(async () => {
      await log.close();
      await sqlite.close();
      rmSync(dir, { recursive: true, force: true });
    });
    // One process owns the embedded database; "another process" shares its connection.
    separateStore = (options = {}) => ({ store: new SqliteCounterStore(sqlite, options) });
    separateEvents = () => log;
  } else {
    const keyPrefix = `${uniqueName('c')}:`;
    prefix = keyPrefix;
    const topicPrefix = `${uniqueName('k')}.`;
    const main = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
    redis = main;
    store = new RedisCounterStore(main, { prefix: keyPrefix, groups: GROUPS });
    const extraRedis: Redis[] = [];
    const extraLogs: KafkaEventLog[] = [];
    const kafka = (): KafkaEventLog => testKafkaLog('zg-pipeline', topicPrefix, 3);
    const log = kafka();
    events = log;
    await log.ensureTopics([COUNTER_TOPIC], { keepForever: [COUNTER_TOPIC] });
    closers.push(async () => {
      await Promise.allSettled(extraLogs.map((l) => l.close()));
      await log.deleteGroups([COUNTER_GROUP]).catch(() => undefined);
      await log.deleteTopics([COUNTER_TOPIC]).catch(() => undefined);
      await log.close();
      for (const r of extraRedis) r.disconnect();
      await deleteByPrefix(main, keyPrefix);
      await main.quit();
    });
    separateStore = () => {
      const conn = new Redis(services.redisUrl(), { maxRetriesPerRequest: 1 });
      conn.on('error', () => undefined);
      extraRedis.push(conn);
      return { store: new RedisCounterStore(conn, { prefix: keyPrefix, groups: GROUPS }), redis: conn };
    };
    separateEvents = () => {
      const l = kafka();
      extraLogs.push(l);
      return l;
    };
  }

  const publisherOn: Rig['publisherOn'] = (log, s = store, options = {}) => {
    const p = new CounterEventPublisher(
      log,
      s,
      { onFailed: (_n, err) => errors.push(err) },
      { ...PUBLISHER, ...options },
    );
    publishers.push(p);
    return p;
  };
  const publisher = publisherOn(events);
  const service = new CounterService(store, everyoneSeesEverything, publisher, metrics);

  return {
    profile,
    store,
    events,
    registry,
    metrics,
    publisher,
    service,
    errors,
    ...(db ? { db } : {}),
    ...(redis ? { redis } : {}),
    ...(prefix ? { prefix } : {}),
    separateStore,
    separateEvents,
    publisherOn,
    aggregator(options = {}) {
      const a = new CounterAggregator(
        options.events ?? events,
        options.store ?? store,
        metrics,
        (err) => errors.push(err),
        {
          maxBatch: options.maxBatch ?? 200,
          maxWaitMs: 20,
        },
      );
      aggregators.push(a);
      return a;
    },
    async toggle(ref, metric, user, on) {
      const result = await store.toggle(ref, metric, user, on, Date.now());
      if (result.event && !result.published) publisher.enqueue(result.event);
      return result;
    },
    async cleanup() {
      await Promise.allSettled(aggregators.map((a) => a.stop()));
      await Promise.allSettled(publishers.map((p) => p.close()));
      for (const close of closers) await close();
    },
  };
}

/** Runs `flushPending` every `everyMs` until stopped, as the worker's periodic task does. */
function runFlusher(rig: Rig, store = rig.store, everyMs = 15): { stop(): Promise<void> } {
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      await flushPending(store, rig.metrics).catch((err: unknown) => rig.errors.push(err));
      await sleep(everyMs);
    }
  })();
  return {
    stop: async () => {
      stopped = true;
      await loop;
    },
  };
}

/** Waits until every event of `refs` is published, applied and folded: the pipeline is quiet. */
/** Empties the counter store from outside, as a lost Redis or a lost set of tables would; the log stays. */
async function wipeCounterStore(rig: Rig): Promise<void> {
  if (rig.redis && rig.prefix) {
    await deleteByPrefix(rig.redis, rig.prefix);
    return;
  }
  for (const table of ['counter_facts', 'counter_entities', 'counter_pending', 'counter_snapshots'])
    await sql.raw(`DELETE FROM ${table}`).execute(rig.db!.kysely);
}

async function settle(rig: Rig, refs: readonly EntityRef[], timeoutMs = 20_000): Promise<void> {
  let busy: string[] = [];
  await until(
    async () => {
      await flushPending(rig.store, rig.metrics);
      if (rig.publisher.buffered > 0) {
        busy = [`${rig.publisher.buffered} events buffered`];
        return false;
      }
      const states = await Promise.all(refs.map((r) => rig.store.inspect(r)));
      busy = states.flatMap((s, i) =>
        s.seq !== s.applied || s.pending
          ? [`${entityKey(refs[i]!)} seq=${s.seq} applied=${s.applied} pending=${s.pending}`]
          : [],
      );
      return busy.length === 0;
    },
    timeoutMs,
    () => `(still busy: ${busy.slice(0, 5).join('; ')})`,
  );
}

/** Every snapshot and every fact set equals the model, exactly. */
/** Toggles `o` through a running aggregator until every count is folded; how many changed. */
async function loadQuiet(rig: Rig, model: Model, o: LoadOptions): Promise<number> {
  const aggregator = rig.aggregator();
  await aggregator.start();
  const changes = await load(rig, model, o);
  await settle(rig, o.refs);
  await aggregator.stop();
  return changes;
}

async function expectExact(rig: Rig, refs: readonly EntityRef[], model: Model): Promise<void> {
  const snapshots = await rig.store.readSnapshots(refs);
  const got = await Promise.all(
    refs.map(async (ref, i) => {
      const facts = await rig.store.factCounts(ref);
      const s = snapshots[i];
      return [entityKey(ref), s ? s[1] : null, s ? s[2] : null, facts.like, facts.fav];
    }),
  );
  const want = refs.map((ref) => {
    const like = model.count(ref, 'like');
    const fav = model.count(ref, 'fav');
    return [entityKey(ref), like, fav, like, fav];
  });
  expect(got).toEqual(want);
}

let nextUser = 5_000_000;

/** `n` new likes on `ref` by fresh users, toggled and then applied: its pending deltas grow by `n`. */
async function likesApplied(rig: Rig, model: Model, ref: EntityRef, n: number): Promise<void> {
  const events: CounterEvent[] = [];
  for (let i = 0; i < n; i++) {
    const user = nextUser++;
    const r = await rig.toggle(ref, 'like', user, true);
    model.apply(ref, 'like', user, true);
    events.push(r.event!);
  }
  await rig.store.applyEvents(events);
}

/** All counter events in the log, earliest to the end as of now. */
async function loggedEvents(events: EventLog): Promise<CounterEvent[]> {
  const out: CounterEvent[] = [];
  await events.readRange(COUNTER_TOPIC, await events.endOffsets(COUNTER_TOPIC), async (batch) => {
    for (const record of batch.records) {
      const e = parseCounterEvent(record.value);
      if (e) out.push(e);
    }
  });
  return out;
}

interface LoadOptions {
  refs: readonly EntityRef[];
  users: number;
  ops: number;
  seed: number;
  wave?: number;
  /** Sends each toggle twice at once (a double click): exactly one of them may change anything. */
  twice?: boolean;
  toggle?: (ref: EntityRef, metric: FactMetric, user: number, on: boolean) => Promise<ToggleResult>;
  onEvent?: (event: CounterEvent) => void;
}

/**
 * Random likes and favourites in concurrent waves; within a wave each (entity, metric, user) occurs
 * once, so the final state of every pair is known from the answers. Returns the changes made.
 */
async function load(rig: Rig, model: Model, o: LoadOptions): Promise<number> {
  const rand = prng(o.seed);
  const toggle = o.toggle ?? ((ref, metric, user, on) => rig.toggle(ref, metric, user, on));
  const wave = o.wave ?? 50;
  let changes = 0;
  for (let done = 0; done < o.ops;) {
    const seen = new Set<string>();
    const batch: { ref: EntityRef; metric: FactMetric; user: number; on: boolean }[] = [];
    while (batch.length < wave && done + batch.length < o.ops) {
      const ref = o.refs[Math.floor(rand() * o.refs.length)]!;
      const metric: FactMetric = rand() < 0.7 ? 'like' : 'fav';
      const user = 1 + Math.floor(rand() * o.users);
      const key = `${entityKey(ref)}:${metric}:${user}`;
      if (seen.has(key)) continue;
      seen.add(key);
      batch.push({ ref, metric, user, on: rand() < 0.6 });
    }
    const results = await Promise.all(
      batch.map(async (op) => {
        const calls = o.twice
          ? [toggle(op.ref, op.metric, op.user, op.on), toggle(op.ref, op.metric, op.user, op.on)]
          : [toggle(op.ref, op.metric, op.user, op.on)];
        return Promise.all(calls);
      }),
    );
    batch.forEach((op, i) => {
      const answers = results[i]!;
      const expectedChange = model.has(op.ref, op.metric, op.user) !== op.on;
      const changed = answers.filter((a) => a.changed);
      // Idempotent: a toggle to the state already held changes nothing and yields no event.
      expect([entityKey(op.ref), op.metric, op.user, op.on, changed.length]).toEqual([
        entityKey(op.ref),
        op.metric,
        op.user,
        op.on,
        expectedChange ? 1 : 0,
      ]);
      for (const a of answers) expect(a.state).toBe(op.on);
      for (const a of changed) {
        expect(a.event).not.toBeNull();
        o.onEvent?.(a.event!);
      }
      for (const a of answers) if (!a.changed) expect(a.event).toBeNull();
      model.apply(op.ref, op.metric, op.user, op.on);
      changes += changed.length;
    });
    done += batch.length;
  }
  return changes;
}

describe.each<Profile>(['embedded', 'cluster'])('counter pipeline (%s profile)', (profile) => {
  let rig: Rig;

  beforeEach(async () => {
    rig = await openRig(profile);
  });
  afterEach(async () => {
    await rig?.cleanup();
  });

  it('keeps every count equal to its fact set, with idempotent toggles and one event per change (invariants 1, 2)', async () => {
    const refs = posts(12);
    const model = new Model();
    const aggregator = rig.aggregator();
    await aggregator.start();
    const flusher = runFlusher(rig);
    // Readers during the run only ever see counts within what the facts allowed at some point.
    let reading = true;
    const readerFailures: string[] = [];
    const reader = (async () => {
      while (reading) {
        const counts = await rig.service.snapshots(refs);
        for (const c of counts)
          if (c[1] < 0 || c[1] > 150 || c[2] > 150) readerFailures.push(JSON.stringify(c));
        await sleep(5);
      }
    })();
    const changes = await load(rig, model, { refs, users: 150, ops: 2_500, seed: 1, twice: true });
    reading = false;
    await reader;
    await settle(rig, refs);
    await flusher.stop();
    await aggregator.stop();

    expect(readerFailures).toEqual([]);
    await expectExact(rig, refs, model);
    // One event per change: every entity's log holds seq 1..n exactly once.
    const logged = await loggedEvents(rig.events);
    expect(logged).toHaveLength(changes);
    for (const ref of refs) {
      const seqs = logged
        .filter((e) => e.entityId === ref.eid)
        .map((e) => e.seq)
        .sort((a, b) => a - b);
      const { seq } = await rig.store.inspect(ref);
      expect([entityKey(ref), seqs]).toEqual([entityKey(ref), Array.from({ length: seq }, (_, i) => i + 1)]);
    }
    expect(await rig.store.isQuiet()).toBe(true);
    expect((await verifyAll(rig.store, false, () => undefined)).drifted).toEqual([]);
  });

  it('counts a batch once when its consumer applied it and died before committing, and across members leaving and joining (invariant 3)', async () => {
    const refs = posts(6);
    const model = new Model();
    const deliveries = new Map<string, number>();
    let crashBudget = 3;
    let crashes = 0;
    // Applies, then "dies" before the handler returns, i.e. before the offsets are committed.
    const dying = (target: CounterStore): CounterStore =>
      intercept(target, {
        applyEvents: async (batch: readonly CounterEvent[]) => {
          for (const e of batch) deliveries.set(e.eventId, (deliveries.get(e.eventId) ?? 0) + 1);
          const result = await target.applyEvents(batch);
          if (crashBudget > 0) {
            crashBudget--;
            crashes++;
            throw new Error('injected: consumer died after applying, before committing');
          }
          return result;
        },
      });
    const flusher = runFlusher(rig);
    const first = rig.aggregator({ store: dying(rig.store), maxBatch: 50 });
    await first.start();
    await load(rig, model, { refs, users: 60, ops: 600, seed: 2 });
    await until(
      () => crashes >= 3,
      15_000,
      () => `(crashes: ${crashes})`,
    );
    // The member leaves mid-run (events still arriving); a second one, in another client, takes over,
    // applies one batch and dies again before committing, and is abandoned during its back-off.
    const loading = load(rig, model, { refs, users: 60, ops: 600, seed: 3 });
    await first.stop();
    crashBudget = 1;
    const secondStore = rig.separateStore().store;
    const second = rig.aggregator({ store: dying(secondStore), events: rig.separateEvents(), maxBatch: 50 });
    await second.start();
    await loading;
    await until(
      () => crashes >= 4,
      15_000,
      () => `(crashes: ${crashes})`,
    );
    await second.stop();
    const third = rig.aggregator({ store: dying(rig.separateStore().store), events: rig.separateEvents() });
    await third.start();
    await settle(rig, refs);
    await flusher.stop();

    await expectExact(rig, refs, model);
    const redelivered = [...deliveries.values()].filter((n) => n > 1).length;
    expect(redelivered).toBeGreaterThan(0);
    expect(
      await metricValue(rig.registry, 'zg_counter_events_consumed_total', { outcome: 'skipped' }),
    ).toBeGreaterThanOrEqual(redelivered);
    expect(rig.errors.filter((e) => /injected: consumer died/.test(String(e)))).toHaveLength(4);
  });

  it('loses nothing and doubles nothing when a flusher dies at any step of a fold (invariant 4)', async () => {
    const refs = posts(10);
    const model = new Model();
    const pending: CounterEvent[] = [];
    const rand = prng(4);
    let seed = 100;
    const moreEvents = async (ops: number): Promise<void> => {
      await load(rig, model, { refs, users: 40, ops, seed: seed++, onEvent: (e) => pending.push(e) });
    };
    const applyPending = async (): Promise<void> => {
      // Delivered in shuffled batches, as a log with several partitions might.
      const batch = pending.splice(0).sort(() => rand() - 0.5);
      await rig.store.applyEvents(batch);
    };

    let kills = 0;
    let interleaved = 0;
    if (rig.profile === 'embedded') {
      // A fault point on every write of a fold: snapshot writes and the clearing of pending deltas.
      let countdown = 0;
      const raw = rig.db!.raw!;
      raw.function('zg_fault_point', () => {
        if (countdown > 0 && --countdown === 0) throw new Error('injected: flusher died');
        return 0;
      });
      raw.exec(`
        CREATE TEMP TRIGGER fault_snapshot_insert BEFORE INSERT ON main.counter_snapshots BEGIN SELECT zg_fault_point(); END;
        CREATE TEMP TRIGGER fault_snapshot_update BEFORE UPDATE ON main.counter_snapshots BEGIN SELECT zg_fault_point(); END;
        CREATE TEMP TRIGGER fault_pending_delete BEFORE DELETE ON main.counter_pending BEGIN SELECT zg_fault_point(); END;`);
      for (let round = 0; round < 30; round++) {
        await moreEvents(40);
        await applyPending();
        countdown = 1 + (round % 15);
        const died = await rig.store.flush(1_000).then(
          () => false,
          (err: unknown) => /injected: flusher died/.test(String(err)),
        );
        countdown = 0;
        if (died) kills++;
        // The store after the crash is the store before the flush: nothing half-written.
        const states = await Promise.all(refs.map((r) => rig.store.inspect(r)));
        if (died) expect(states.some((s) => s.pending)).toBe(true);
        await moreEvents(20);
        await applyPending();
      }
    } else {
      // Each round a new flusher (its own connection) dies at one of its round-trip boundaries:
      // before sending its pipeline, after Redis ran it but before the reply came back, or before a
      // later command; or it loses its connection while the pipeline is in flight. Appliers on other
      // connections land between the pipeline's commands, as Redis interleaves clients there.
      const points = ['send', 'reply', 'later'] as const;
      const diedAt = new Set<string>();
      for (let round = 0; round < 30; round++) {
        await moreEvents(40);
        await applyPending();
        const { store: flusher, redis: conn } = rig.separateStore();
        if (round % 4 === 3) {
          const flushing = flusher.flush(1_000);
          setImmediate(() => conn!.disconnect());
          const died = await flushing.then(
            () => false,
            () => true,
          );
          if (died) kills++;
        } else {
          const interleaveAt = round % 5;
          stepCommands(conn!, {
            interleave: async (_name, index) => {
              if (index !== interleaveAt) return;
              await moreEvents(5);
              await applyPending();
              interleaved++;
            },
            crash: (point) => point === points[round % points.length],
          });
          const died = await flusher.flush(1_000).then(
            () => false,
            (err: unknown) => /injected: flusher died/.test(String(err)),
          );
          if (died) {
            kills++;
            diedAt.add(points[round % points.length]!);
          }
        }
        await moreEvents(20);
        await applyPending();
      }
      expect([...diedAt].sort()).toEqual(['later', 'reply', 'send']);
    }
    expect(kills).toBeGreaterThanOrEqual(rig.profile === 'cluster' ? 10 : 15);
    if (rig.profile === 'cluster') expect(interleaved).toBeGreaterThan(0);
    await settle(rig, refs);
    await expectExact(rig, refs, model);
    expect(rig.store.clampedFields).toBe(0);
  });

  it('reproduces the read-then-delete race of a naive flush, which the store’s fold does not have (invariant 4)', async () => {
    const [naive, atomic] = [post(1), post(2)];
    const model = new Model();
    const likes = (ref: EntityRef, n: number): Promise<void> => likesApplied(rig, model, ref, n);
    for (const ref of [naive, atomic]) await likes(ref, 10);
    await flushPending(rig.store, rig.metrics);
    await likes(naive, 5);

    // HGETALL pending -> write snapshot -> DEL pending, with 3 likes applied between read and delete.
    await naiveFlush(rig, naive, () => likes(naive, 3));
    await flushPending(rig.store, rig.metrics);
    const lost = await rig.store.inspect(naive);
    // The pipeline believes it is quiet, and the three increments are gone for good.
    expect({
      seq: lost.seq,
      applied: lost.applied,
      pending: lost.pending,
      facts: lost.facts.like,
      snapshot: lost.snapshot?.[1],
    }).toEqual({
      seq: 18,
      applied: 18,
      pending: false,
      facts: 18,
      snapshot: 15,
    });

    // The same interleaving against the store's fold: increments before, during and after it.
    await likes(atomic, 5);
    if (rig.profile === 'cluster') {
      const { store: flusher, redis: conn } = rig.separateStore();
      const seen: string[] = [];
      stepCommands(conn!, {
        interleave: async (name) => {
          seen.push(name);
          // Increments land right before the fold and after each of the flusher's pipelines ran.
          if (name === 'zgCounterFold' || name === 'after') await likes(atomic, 3);
        },
      });
      await flusher.flush(1_000);
      // The fold, then the end of its pipeline and of the unmarking one.
      expect(seen.filter((name) => name === 'zgCounterFold' || name === 'after')).toEqual([
        'zgCounterFold',
        'after',
        'after',
      ]);
    } else {
      await Promise.all([rig.store.flush(1_000), likes(atomic, 3), rig.store.flush(1_000), likes(atomic, 3)]);
    }
    await flushPending(rig.store, rig.metrics);
    const kept = await rig.store.inspect(atomic);
    expect({ pending: kept.pending, facts: kept.facts.like, snapshot: kept.snapshot?.[1] }).toEqual({
      pending: false,
      facts: model.count(atomic, 'like'),
      snapshot: model.count(atomic, 'like'),
    });
    expect(model.count(atomic, 'like')).toBe(rig.profile === 'cluster' ? 24 : 21);
  });

  it('rebuilds missing and malformed snapshots on read, all fields, never showing zeros, while toggles run (invariant 6)', async () => {
    const refs = posts(8);
    const model = new Model();
    // 30 permanent likers and 10 permanent favourites per entity, so no honest read is ever below that.
    for (const ref of refs) {
      for (let u = 1_000; u < 1_030; u++)
        await rig.toggle(ref, 'like', u, true).then(() => model.apply(ref, 'like', u, true));
      for (let u = 1_000; u < 1_010; u++)
        await rig.toggle(ref, 'fav', u, true).then(() => model.apply(ref, 'fav', u, true));
    }
    const aggregator = rig.aggregator();
    await aggregator.start();
    const flusher = runFlusher(rig);
    let running = true;
    const bad: string[] = [];
    let reads = 0;
    let sabotaged = 0;
    const rand = prng(6);
    const saboteur = (async () => {
      while (running) {
        const ref = refs[Math.floor(rand() * refs.length)]!;
        await rig.store.writeRawSnapshot(ref, rand() < 0.5 ? null : Buffer.from('garbage'));
        sabotaged++;
        await sleep(2);
      }
    })();
    const readers = [0, 1, 2].map(async (r) => {
      while (running) {
        // Asking for likes only must still rebuild every field (checked below through fav).
        const counts = await rig.service.snapshots(r === 0 ? refs : [refs[reads % refs.length]!]);
        for (const c of counts)
          if (c[1] < 30 || c[1] > 30 + 50 || c[2] < 10 || c[2] > 10 + 50) bad.push(JSON.stringify(c));
        reads++;
        // SQLite answers within microtasks; yield so timers and the toggles' commits get their turn.
        await sleep(1);
      }
    });
    await load(rig, model, { refs, users: 50, ops: 800, seed: 7 });
    await until(() => sabotaged >= 40 && reads >= 40, 10_000);
    running = false;
    await Promise.all([saboteur, ...readers]);
    expect(bad).toEqual([]);
    expect(await metricValue(rig.registry, 'zg_counter_rebuilds_total', { reason: 'read' })).toBeGreaterThan(
      0,
    );

    // Quiet again: every snapshot exists and is exact, whatever the saboteur left.
    await settle(rig, refs);
    await flusher.stop();
    await aggregator.stop();
    await Promise.all(refs.map(async (ref) => rig.service.counts(ref, null, ['like'])));
    await expectExact(rig, refs, model);
  });

  it('rebuilds a missing snapshot once for concurrent readers, and keeps read through folds, gap rebuilds and heals (invariant 6)', async () => {
    const ref = post(1);
    const model = new Model();
    const events: CounterEvent[] = [];
    for (let u = 1; u <= 7; u++) events.push((await rig.toggle(ref, 'like', u, true)).event!);
    for (let u = 1; u <= 3; u++) events.push((await rig.toggle(ref, 'fav', u, true)).event!);
    for (let u = 1; u <= 7; u++) model.apply(ref, 'like', u, true);
    for (let u = 1; u <= 3; u++) model.apply(ref, 'fav', u, true);

    // Concurrent readers of a missing snapshot share one slow rebuild and none of them sees zeros.
    let rebuilds = 0;
    const slow = intercept(rig.store, {
      rebuild: async (r: EntityRef) => {
        rebuilds++;
        await sleep(150);
        return rig.store.rebuild(r);
      },
    });
    const service = new CounterService(slow, everyoneSeesEverything, null, rig.metrics);
    const answers = await Promise.all(Array.from({ length: 25 }, () => service.counts(ref, null, ['like'])));
    expect(rebuilds).toBe(1);
    expect(new Set(answers.map((a) => JSON.stringify(a)))).toEqual(new Set([JSON.stringify({ like: 7 })]));
    // Every field was rebuilt, not just the one asked for.
    expect(await rig.store.readSnapshots([ref])).toEqual([[0, 7, 3, 0, 0]]);

    // A readable snapshot's other fields (read) survive a fold, a rebuild on a gap and a heal.
    await rig.store.writeRawSnapshot(ref, encodeSnapshot([41, 7, 3, 2, 1]));
    await rig.store.applyEvents(events); // all at or below the mark: skipped
    const later: CounterEvent[] = [];
    for (let u = 8; u <= 10; u++) later.push((await rig.toggle(ref, 'like', u, true)).event!);
    for (let u = 8; u <= 10; u++) model.apply(ref, 'like', u, true);
    await rig.store.applyEvents([later[0]!]);
    await flushPending(rig.store, rig.metrics);
    expect(await rig.store.readSnapshots([ref])).toEqual([[41, 8, 3, 2, 1]]);
    await rig.store.applyEvents([later[2]!]); // a gap: rebuilt from facts
    await rig.store.applyEvents([later[1]!]); // late: skipped
    await flushPending(rig.store, rig.metrics);
    expect(await rig.store.readSnapshots([ref])).toEqual([[41, 10, 3, 2, 1]]);
    await rig.store.writeRawSnapshot(ref, encodeSnapshot([41, 99, 0, 2, 1]));
    const reconciler = new CounterReconciler(rig.store, rig.metrics);
    expect(await reconciler.runOnce()).toEqual({ checked: 1, drifted: 1 });
    expect(await rig.service.snapshots([ref])).toEqual([[41, 10, 3, 2, 1]]);
    await expectExact(rig, [ref], model);
  });

  it("refuses a user's toggles past the per-user limit with 429, changing nothing, and leaves other users alone", async () => {
    const ref = post(1);
    const limited = new CounterService(
      rig.store,
      everyoneSeesEverything,
      rig.publisher,
      rig.metrics,
      Date.now,
      {
        limiter: new MemoryRateLimiter(),
        perMinute: 3,
      },
    );
    expect((await limited.toggle(ref, 'like', 1, true)).changed).toBe(true);
    expect((await limited.toggle(ref, 'like', 1, false)).changed).toBe(true);
    expect((await limited.toggle(ref, 'like', 1, true)).changed).toBe(true);
    // Likes and favourites share the one budget.
    await expect(limited.toggle(ref, 'like', 1, false)).rejects.toMatchObject({
      status: 429,
      code: 'RATE_LIMITED',
    });
    await expect(limited.toggle(ref, 'fav', 1, true)).rejects.toBeInstanceOf(RateLimitedError);
    expect(await rig.store.flags(1, [ref])).toEqual([{ like: true, fav: false }]);
    expect(await rig.store.factCounts(ref)).toEqual({ like: 1, fav: 0 });
    expect((await limited.toggle(ref, 'fav', 2, true)).changed).toBe(true);
  });

  it('replays the log from the earliest offset into an emptied store, exactly, up to the end captured at the start (invariant 7)', async () => {
    const refs = posts(10);
    const model = new Model();
    const changes = await loadQuiet(rig, model, { refs, users: 80, ops: 1_500, seed: 8 });
    await expectExact(rig, refs, model);
    const flagsBefore = await Promise.all([1, 2, 3, 40, 79].map((u) => rig.store.flags(u, refs)));
    const seqBefore = await Promise.all(refs.map(async (r) => (await rig.store.inspect(r)).seq));
    // A toggle's event reaches the log while the replay reads it: it is read too (with what came
    // after the first end, read once toggles are refused). Something written after the last end
    // was captured is not replayed.
    const during = eventFor(refs[2]!, 'like', 424_241, 1, seqBefore[2]! + 1, Date.now());
    model.apply(refs[2]!, 'like', 424_241, true);
    const late = eventFor(refs[0]!, 'like', 424_242, 1, 1_000_000, Date.now());
    let captures = 0;
    const events = intercept(rig.events, {
      endOffsets: async (topic: string) => {
        const end = await rig.events.endOffsets(topic);
        const [ref, written] = ++captures === 1 ? [refs[2]!, during] : [refs[0]!, late];
        await rig.events.publish(COUNTER_TOPIC, [{ key: entityKey(ref), value: JSON.stringify(written) }]);
        return end;
      },
    });

    // The disaster: the counter store is lost (emptied from outside), the log is all there is.
    await wipeCounterStore(rig);
    expect(await rig.store.factCounts(refs[0]!)).toEqual({ like: 0, fav: 0 });

    const report = await replayAll(rig.store, events, () => undefined);
    expect(captures).toBe(2);
    expect(report).toMatchObject({ events: changes + 1, malformed: 0, entities: refs.length });
    await expectExact(rig, refs, model);
    expect(await Promise.all([1, 2, 3, 40, 79].map((u) => rig.store.flags(u, refs)))).toEqual(flagsBefore);
    expect((await rig.store.flags(424_241, [refs[2]!]))[0]).toEqual({ like: true, fav: false });
    expect((await rig.store.flags(424_242, [refs[0]!]))[0]).toEqual({ like: false, fav: false });
    const states = await Promise.all(refs.map((r) => rig.store.inspect(r)));
    const seqAfter = seqBefore.map((s, i) => (i === 2 ? s + 1 : s));
    expect(states.map((s) => [s.seq, s.applied, s.pending])).toEqual(seqAfter.map((s) => [s, s, false]));
    // New changes number above the replayed ones, so the aggregator counts them.
    const next = await rig.toggle(refs[1]!, 'fav', 9_999, true);
    model.apply(refs[1]!, 'fav', 9_999, true);
    expect(next.event?.seq).toBe(seqBefore[1]! + 1);
    // The late record reaches the aggregator as a gap, which rebuilds from facts: still exact.
    const resumed = rig.aggregator();
    await resumed.start();
    await settle(rig, refs);
    await expectExact(rig, refs, model);
  });

  it('replays to the same facts whatever order the log holds one entity’s events in (invariant 7)', async () => {
    const ref = post(3);
    const other = post(4);
    // Seq order: u1 like(1), u2 like(2), u1 unlike(3), u3 like(4), u3 unlike(5), u1 like(6), u2 fav(7), u2 unfav(8), u4 fav(9)
    const history: [number, FactMetric, number, 1 | -1][] = [
      [1, 'like', 1, 1],
      [2, 'like', 2, 1],
      [3, 'like', 1, -1],
      [4, 'like', 3, 1],
      [5, 'like', 3, -1],
      [6, 'like', 1, 1],
      [7, 'fav', 2, 1],
      [8, 'fav', 2, -1],
      [9, 'fav', 4, 1],
    ];
    const bySeq = new Map(
      history.map(([seq, metric, user, delta]) => [seq, eventFor(ref, metric, user, delta, seq, 1)]),
    );
    const logOrder = [6, 5, 3, 9, 1, 8, 4, 2, 7];
    // Folding in log order would leave u3 liked and u2's favourite on: the order matters.
    const naive = new Map<string, number>();
    for (const s of logOrder) {
      const e = bySeq.get(s)!;
      naive.set(`${e.metric}:${e.userId}`, e.delta);
    }
    expect(
      [...naive]
        .filter(([, d]) => d > 0)
        .map(([k]) => k)
        .sort(),
    ).toEqual(['fav:2', 'fav:4', 'like:1', 'like:2', 'like:3']);
    await rig.events.publish(
      COUNTER_TOPIC,
      logOrder.map((s) => ({ key: entityKey(ref), value: JSON.stringify(bySeq.get(s)) })),
    );
    await rig.events.publish(COUNTER_TOPIC, [
      { key: entityKey(other), value: JSON.stringify(eventFor(other, 'like', 5, 1, 1, 1)) },
    ]);
    await rig.events.publish(COUNTER_TOPIC, [{ key: entityKey(other), value: 'not an event' }]);

    const report = await replayAll(rig.store, rig.events, () => undefined);
    expect(report).toEqual({ published: 0, events: 10, malformed: 1, facts: 6, entities: 2 });
    expect(await rig.store.factCounts(ref)).toEqual({ like: 2, fav: 1 });
    expect(await rig.store.flags(1, [ref])).toEqual([{ like: true, fav: false }]);
    expect(await rig.store.flags(2, [ref])).toEqual([{ like: true, fav: false }]);
    expect(await rig.store.flags(3, [ref])).toEqual([{ like: false, fav: false }]);
    expect(await rig.store.flags(4, [ref])).toEqual([{ like: false, fav: true }]);
    expect(await rig.store.readSnapshots([ref, other])).toEqual([
      [0, 2, 1, 0, 0],
      [0, 1, 0, 0, 0],
    ]);
    expect(await rig.store.inspect(ref)).toMatchObject({ seq: 9, applied: 9, pending: false });
  });

  it('restores by itself a store whose facts were lost, one process replaying while the others wait, and takes toggles again (invariant 7, ZG_COUNTER_AUTO_REPLAY)', async () => {
    const refs = posts(6);
    const model = new Model();
    await loadQuiet(rig, model, { refs, users: 40, ops: 400, seed: 12 });
    await expectExact(rig, refs, model);
    // As a deployment's first start leaves it.
    await rig.store.seal();
    const kv = rig.redis ? createRedisKv(rig.redis, rig.prefix!) : createSqliteKv(rig.db!);
    const told: string[] = [];
    const log = {
      warn: (_fields: object, message: string) => void told.push(message),
      error: (_fields: object, message: string) => void told.push(message),
    } as unknown as Pick<Logger, 'warn' | 'error'>;
    const restorer = (store: CounterStore) =>
      new CounterRestorer(
        {
          store,
          events: rig.events,
          kv,
          markRestored: async () => undefined,
          addViewsBack: async () => ({}),
        },
        log,
        60_000,
      );
    // Stores as deployments make them, refusing toggles in a group without its seal.
    const sealing = (): CounterStore => {
      const { store, redis } = rig.separateStore();
      return redis
        ? new RedisCounterStore(redis, { prefix: rig.prefix!, groups: GROUPS, requireSeal: true })
        : store;
    };
    const [a, b] = [sealing(), sealing()];
    const [one, two] = [restorer(a), restorer(b)];
    expect(await one.runOnce()).toBe('sealed');

    // The disaster: Redis back without its data; embedded, a replay that stopped half-way.
    if (rig.redis) await wipeCounterStore(rig);
    else {
      await rig.store.unseal();
      await rig.store.reset();
    }
    expect(await a.unsealedGroups()).toBeGreaterThan(0);
    await expect(a.toggle(refs[0]!, 'like', 777_001, true, Date.now())).rejects.toThrow(/restored/);

    const outcomes = await Promise.all([one.runOnce(), two.runOnce()]);
    expect(outcomes.sort()).toEqual(['busy', 'restored']);
    expect(await a.unsealedGroups()).toBe(0);
    await expectExact(rig, refs, model);
    expect(told).toContain('counter store restored from the event log: likes and favourites are taken again');
    expect(await two.runOnce()).toBe('sealed');
    // Toggles are taken again, numbered after the replayed ones.
    expect((await rig.toggle(refs[0]!, 'like', 777_001, true)).changed).toBe(true);
    model.apply(refs[0]!, 'like', 777_001, true);
    const resumed = rig.aggregator();
    await resumed.start();
    await settle(rig, refs);
    await expectExact(rig, refs, model);
  });

  it('stops a replay that lost its claim on the deployment: before the reset changing nothing, after it leaving the store unsealed (invariant 7)', async () => {
    const refs = posts(3);
    const model = new Model();
    await loadQuiet(rig, model, { refs, users: 20, ops: 120, seed: 13 });
    const { store, redis } = rig.separateStore();
    const sealing = redis
      ? new RedisCounterStore(redis, { prefix: rig.prefix!, groups: GROUPS, requireSeal: true })
      : store;
    await sealing.seal();
    // Lost before the reset: nothing changes, and the groups stay for the replay that holds it now.
    await expect(
      replayAll(sealing, rig.events, () => undefined, { holds: async () => false }),
    ).rejects.toThrow(/lost its claim/);
    await expectExact(rig, refs, model);
    expect(await sealing.unsealedGroups()).toBeGreaterThan(0);
    // Lost while it refilled the store: it does not seal what another replay may be refilling.
    await sealing.seal();
    let asked = 0;
    await expect(
      replayAll(sealing, rig.events, () => undefined, { holds: async () => ++asked < 2 }),
    ).rejects.toThrow(/lost its claim/);
    expect(asked).toBe(2);
    expect(await sealing.unsealedGroups()).toBeGreaterThan(0);
    // The replay holding the claim makes it whole.
    await replayAll(sealing, rig.events, () => undefined, { holds: async () => true });
    expect(await sealing.unsealedGroups()).toBe(0);
    await expectExact(rig, refs, model);
  });

  it.runIf(profile === 'cluster')(
    'does not seal a store wiped while the replay refilled it: it stays refused for the next replay (invariant 7)',
    async () => {
      const refs = posts(3);
      const model = new Model();
      await loadQuiet(rig, model, { refs, users: 20, ops: 120, seed: 14 });
      const { redis } = rig.separateStore();
      const sealing = new RedisCounterStore(redis!, {
        prefix: rig.prefix!,
        groups: GROUPS,
        requireSeal: true,
      });
      await sealing.seal();
      // Redis wiped (a FLUSHALL, no reconnection) after the facts are back, just before the seal.
      await expect(
        replayAll(sealing, rig.events, () => undefined, { refill: () => wipeCounterStore(rig) }),
      ).rejects.toThrow(/emptied while the replay refilled them/);
      expect(await sealing.unsealedGroups()).toBe(GROUPS);
      await expect(sealing.toggle(refs[0]!, 'like', 99_001, true, Date.now())).rejects.toThrow(/restored/);
      // The next replay makes it whole.
      await replayAll(sealing, rig.events, () => undefined);
      expect(await sealing.unsealedGroups()).toBe(0);
      await expectExact(rig, refs, model);
    },
  );

  it('publishes toggles that never reached the log before a replay reads it, so none is lost (invariant 7)', async () => {
    const refs = posts(3);
    const model = new Model();
    // A process stopped while the log was down: its toggles' events never left their records.
    for (let u = 1; u <= 20; u++) {
      const ref = refs[u % refs.length]!;
      await rig.store.toggle(ref, u % 4 === 0 ? 'fav' : 'like', u, true, Date.now());
      model.apply(ref, u % 4 === 0 ? 'fav' : 'like', u, true);
    }
    const report = await replayAll(rig.store, rig.events, () => undefined);
    // Embedded toggles append their events in the same transaction: nothing ever waits.
    expect(report.published).toBe(rig.profile === 'cluster' ? 20 : 0);
    expect(report.facts).toBe(20);
    await expectExact(rig, refs, model);
    expect(await rig.store.staleUnpublished(Date.now(), 0, 100)).toEqual([]);
  });

  it('finds and heals drift in quiet entities only, and exports what it found (invariant 8)', async () => {
    const refs = posts(6);
    const model = new Model();
    const aggregator = rig.aggregator();
    const reconciler = new CounterReconciler(rig.store, rig.metrics, {
      recentCapacity: 100,
      sampleRecent: 100,
      sampleRandom: 100,
    });
    await aggregator.start();
    await load(rig, model, { refs, users: 30, ops: 300, seed: 9, onEvent: (e) => reconciler.touched([e]) });
    await settle(rig, refs);
    await aggregator.stop();
    expect(await reconciler.runOnce()).toEqual({ checked: refs.length, drifted: 0 });
    const foundBefore = await metricValue(rig.registry, 'zg_counter_drift_found_total');
    const healedBefore = await metricValue(rig.registry, 'zg_counter_drift_healed_total');

    // Drift in two quiet entities (one wrong by far, one missing a like), and a busy one that only looks wrong.
    const [a, b, busy] = refs as [EntityRef, EntityRef, EntityRef];
    const like = (r: EntityRef): number => model.count(r, 'like');
    const fav = (r: EntityRef): number => model.count(r, 'fav');
    await rig.store.writeRawSnapshot(a, encodeSnapshot([9, like(a) + 5, fav(a), 0, 0]));
    await rig.store.writeRawSnapshot(b, encodeSnapshot([3, Math.max(0, like(b) - 1), fav(b) + 1, 0, 0]));
    const inFlight = await rig.toggle(busy, 'like', 777, true);
    model.apply(busy, 'like', 777, true);
    reconciler.touched([inFlight.event!]);
    const verified = await verifyAll(rig.store, false, () => undefined);
    expect(verified.drifted.map(entityKey).sort()).toEqual([a, b].map(entityKey).sort());
    expect(verified.busy).toBe(1);

    expect(await reconciler.runOnce()).toEqual({ checked: refs.length, drifted: 2 });
    expect(await metricValue(rig.registry, 'zg_counter_drift_found_total')).toBe(foundBefore + 2);
    expect(await metricValue(rig.registry, 'zg_counter_drift_healed_total')).toBe(healedBefore + 2);
    expect(await metricValue(rig.registry, 'zg_counter_rebuilds_total', { reason: 'drift' })).toBe(2);
    expect(await rig.store.readSnapshots([a, b])).toEqual([
      [9, like(a), fav(a), 0, 0],
      [3, like(b), fav(b), 0, 0],
    ]);
    // The busy entity is left to the pipeline, which makes it exact.
    const resumed = rig.aggregator();
    await resumed.start();
    await settle(rig, refs);
    await expectExact(rig, refs, model);
    expect(await reconciler.runOnce()).toEqual({ checked: refs.length, drifted: 0 });
  });

  it.runIf(profile === 'cluster')(
    'leaves no pending delta unmarked, wherever an apply lands among a flusher’s commands and wherever that flusher dies (invariant 4)',
    async () => {
      const model = new Model();
      let n = 0;
      for (const crashAt of ['send', 'reply', 'later', 'none']) {
        for (let applyAt = 0; applyAt <= 3; applyAt++) {
          const ref = post(20 + n++);
          await likesApplied(rig, model, ref, 4);
          await flushPending(rig.store, rig.metrics);
          await likesApplied(rig, model, ref, 2);
          const { store: flusher, redis: conn } = rig.separateStore();
          let landed = false;
          stepCommands(conn!, {
            // An applier's whole apply, its dirty-set marks included, lands before the flusher's
            // command number `applyAt` (or after its pipeline when there are fewer).
            interleave: async (_name, index) => {
              if (index !== applyAt) return;
              landed = true;
              await likesApplied(rig, model, ref, 1);
            },
            crash: (point) => point === crashAt,
          });
          const outcome = await flusher.flush(100).then(
            () => 'flushed',
            (err: unknown) => String(err),
          );
          if (!landed) await likesApplied(rig, model, ref, 1);
          // Every point is reached: the flusher dies there, or, with none, flushes.
          expect([crashAt, applyAt, outcome]).toEqual([
            crashAt,
            applyAt,
            crashAt === 'none' ? 'flushed' : expect.stringContaining(`injected: flusher died at ${crashAt}`),
          ]);
          // Any other flusher carries on from here.
          await flushPending(rig.store, rig.metrics);
          const state = await rig.store.inspect(ref);
          expect([crashAt, applyAt, state.pending, state.facts.like, state.snapshot?.[1]]).toEqual([
            crashAt,
            applyAt,
            false,
            7,
            7,
          ]);
          expect(await rig.store.isQuiet()).toBe(true);
        }
      }
    },
  );

  it('ends exact when two publishers deliver one entity’s events out of seq order (gaps)', async () => {
    const refs = posts(3);
    const hot = refs[0]!;
    const model = new Model();
    // Embedded toggles append to the log themselves; here they go to a side topic, and two
    // publishers forward the events to counter-events as two API processes would.
    const side = rig.separateStore({ topic: 'counter-events-side' });
    const store = side.store;
    const fast = rig.publisherOn(rig.events, store);
    // The late half goes out only once the early half has been consumed, so it lands in later
    // batches however slowly the consumer runs.
    let releaseLate!: () => void;
    const late = new Promise<void>((resolve) => (releaseLate = resolve));
    const delayed: EventLog = intercept(rig.events, {
      publish: async (topic: string, records: { key: string; value: string }[]) => {
        await late;
        return rig.events.publish(topic, records);
      },
    });
    const slow = rig.publisherOn(delayed, store);
    const consumed = () => metricValue(rig.registry, 'zg_counter_events_consumed_total');
    const consumedBefore = await consumed();
    const aggregator = rig.aggregator({ store });
    await aggregator.start();
    const flusher = runFlusher(rig, store);
    let n = 0;
    await load(rig, model, {
      refs: [hot, hot, hot, refs[1]!, refs[2]!],
      users: 60,
      ops: 600,
      seed: 10,
      wave: 20,
      toggle: async (ref, metric, user, on) => {
        const r = await store.toggle(ref, metric, user, on, Date.now());
        if (r.event) (n++ % 2 === 0 ? fast : slow).enqueue(r.event);
        return r;
      },
    });
    const lateEvents = n - Math.ceil(n / 2);
    // Every entity's last event goes out early: applied after all the others were toggled, it raises
    // the entity's mark past every late event, whichever batches the early half fell into.
    for (const [i, ref] of refs.entries()) {
      const r = await store.toggle(ref, 'like', 1_000 + i, true, Date.now());
      model.apply(ref, 'like', 1_000 + i, true);
      fast.enqueue(r.event!);
    }
    const early = Math.ceil(n / 2) + refs.length;
    await until(async () => fast.buffered === 0 && (await consumed()) - consumedBefore >= early, 10_000);
    releaseLate();
    await until(() => slow.buffered === 0, 10_000);
    // Quiet counts do not wait for events that change nothing: wait for the late half itself.
    await until(async () => (await consumed()) - consumedBefore >= early + lateEvents, 10_000);
    await settle(rig, refs);
    await flusher.stop();
    await expectExact(rig, refs, model);
    // The late halves arrived below the marks the gap rebuilds had raised, and were skipped.
    expect(lateEvents).toBeGreaterThan(100);
    expect(
      await metricValue(rig.registry, 'zg_counter_events_consumed_total', { outcome: 'skipped' }),
    ).toBeGreaterThanOrEqual(lateEvents);
  });

  it.runIf(profile === 'cluster')(
    'keeps toggling through an event-log outage and is exact again once the log is back (invariant 5)',
    async () => {
      const refs = posts(5);
      const model = new Model();
      let down = false;
      const flaky: EventLog = intercept(rig.events, {
        publish: async (topic: string, records: { key: string; value: string }[]) => {
          if (down) throw new Error('injected: event log unreachable');
          return rig.events.publish(topic, records);
        },
      });
      // A small in-memory buffer, so part of the outage's events is dropped from memory altogether.
      const publisher = rig.publisherOn(flaky, rig.store, { maxBuffered: 100, maxBackoffMs: 200 });
      const toggle = async (
        ref: EntityRef,
        metric: FactMetric,
        user: number,
        on: boolean,
      ): Promise<ToggleResult> => {
        const r = await rig.store.toggle(ref, metric, user, on, Date.now());
        if (r.event) publisher.enqueue(r.event);
        return r;
      };
      const aggregator = rig.aggregator();
      await aggregator.start();
      const flusher = runFlusher(rig);
      await load(rig, model, { refs, users: 50, ops: 200, seed: 11, toggle });
      await until(() => publisher.buffered === 0, 10_000);

      down = true;
      await load(rig, model, { refs, users: 50, ops: 400, seed: 12, toggle });
      // The load may end within the publisher's linger: its first attempt fails soon after.
      await until(() => rig.errors.some((e) => /injected: event log unreachable/.test(String(e))), 2_000);
      expect(publisher.buffered).toBeLessThanOrEqual(100);
      // Still down: the repair job cannot publish the events older than its bound again, so it
      // rebuilds their entities from facts and keeps the events for another attempt.
      await sleep(250);
      const repaired = await repairUnpublished(rig.store, flaky, rig.metrics, Date.now(), 200);
      expect(repaired.rebuilt).toBeGreaterThan(0);
      expect(repaired.republished).toBe(0);
      await flushPending(rig.store, rig.metrics);
      await expectExact(rig, refs, model);
      const kept = await rig.store.staleUnpublished(Date.now() + 1_000, 0, 1_000);
      expect(kept.length).toBeGreaterThan(100); // more than the publisher holds in memory
      expect(kept.every((s) => s.event !== null)).toBe(true);

      // Back up: what waited in memory goes out, lands below the raised marks and changes nothing;
      // what the publisher let go of is published by the repair job from its records.
      down = false;
      const back = Date.now();
      await until(() => publisher.buffered === 0, 5_000);
      await settle(rig, refs, 5_000);
      expect(Date.now() - back).toBeLessThan(5_000);
      // Each record is tried again once as long as its event had waited has passed (here about the
      // outage's length, a second or two), as the job's runs would.
      const waiting = () => rig.store.staleUnpublished(Date.now() + 120_000, 0, 10);
      let republished = 0;
      while ((await waiting()).length > 0 && Date.now() - back < 15_000) {
        await sleep(100);
        const again = await repairUnpublished(rig.store, flaky, rig.metrics, Date.now(), 200);
        expect(again.rebuilt).toBe(0);
        republished += again.republished;
      }
      expect(republished).toBeGreaterThan(0);
      expect(await waiting()).toEqual([]);
      await settle(rig, refs, 5_000);
      await flusher.stop();
      await aggregator.stop();
      await expectExact(rig, refs, model);

      // Every change reached the log: a replay into an emptied store gives the same counts.
      await replayAll(rig.store, rig.events, () => undefined);
      await expectExact(rig, refs, model);
    },
  );
});

/**
 * The naive fold the store must not be: read the pending deltas, write the snapshot, delete the
 * deltas, each a separate step; `between` runs after the read and before the delete.
 */
async function naiveFlush(rig: Rig, ref: EntityRef, between: () => Promise<void>): Promise<void> {
  if (rig.store instanceof RedisCounterStore) {
    const redis = rig.redis!;
    const group = rig.store.groupOf(ref);
    const pdKey = rig.store.groupKey('pd', group);
    const sKey = rig.store.groupKey('s', group);
    const pending = await redis.hgetall(pdKey);
    const current = (await rig.store.readSnapshots([ref]))[0] ?? ([0, 0, 0, 0, 0] as Counts);
    for (const [field, delta] of Object.entries(pending)) {
      const [eid, idx] = field.split(':');
      if (eid === ref.eid) current[Number(idx)]! += Number(delta);
    }
    await between();
    await redis.hset(sKey, ref.eid, encodeSnapshot(current));
    await redis.del(pdKey);
    return;
  }
  const kysely = rig.db!.kysely;
  const pending = await kysely
    .selectFrom('counter_pending')
    .select(['idx', 'delta'])
    .where('eid', '=', ref.eid)
    .execute();
  const current = (await rig.store.readSnapshots([ref]))[0] ?? ([0, 0, 0, 0, 0] as Counts);
  for (const row of pending) current[Number(row.idx)]! += Number(row.delta);
  await between();
  await rig.store.writeRawSnapshot(ref, encodeSnapshot(current));
  await kysely.deleteFrom('counter_pending').where('eid', '=', ref.eid).execute();
}

type CrashPoint = 'send' | 'reply' | 'later';

interface Stepping {
  /** Runs before each pipelined command (`index` counts them across pipelines): other clients' commands interleave there. */
  interleave?: (name: string, index: number) => Promise<void>;
  /**
   * Whether the process dies at a round-trip boundary: `send` before its first pipeline is written,
   * `reply` after Redis ran that pipeline but before the reply was read, `later` before a later
   * pipeline or single write command (a flush's second pipeline, which unmarks the groups folded).
   */
  crash?: (point: CrashPoint) => boolean;
}

/**
 * Makes `conn`'s pipelines run their commands one at a time, so work of other connections can land
 * between them exactly where a test wants it, and kills the "process" at round-trip boundaries: a
 * pipeline is written to the socket whole, so a client dies before sending it or after it ran.
 */
function stepCommands(conn: Redis, steps: Stepping): void {
  const target = conn as unknown as Record<string, (...args: unknown[]) => Promise<unknown>>;
  let index = 0;
  let pipelines = 0;
  const maybeDie = (point: CrashPoint): void => {
    if (!steps.crash?.(point)) return;
    conn.disconnect();
    throw new Error(`injected: flusher died at ${point}`);
  };
  const originals: Record<string, (...args: unknown[]) => Promise<unknown>> = {};
  for (const command of ['sadd', 'srem', 'hset', 'hdel', 'del']) {
    const original = (originals[command] = target[command]!.bind(conn));
    target[command] = async (...args: unknown[]) => {
      maybeDie('later');
      return original(...args);
    };
  }
  (conn as unknown as { pipeline: () => unknown }).pipeline = () => {
    const first = pipelines++ === 0;
    const queue: [string, unknown[]][] = [];
    const pipeline: unknown = new Proxy(
      {},
      {
        get(_t, prop) {
          if (prop === 'then') return undefined;
          if (prop === 'exec') {
            return async () => {
              maybeDie(first ? 'send' : 'later');
              const replies: [Error | null, unknown][] = [];
              for (const [name, args] of queue) {
                await steps.interleave?.(name, index++);
                try {
                  replies.push([null, await (originals[name] ?? target[name]!).apply(conn, args)]);
                } catch (err) {
                  replies.push([err as Error, null]);
                }
              }
              await steps.interleave?.('after', index++);
              if (first) maybeDie('reply');
              return replies;
            };
          }
          return (...args: unknown[]) => {
            queue.push([String(prop), args]);
            return pipeline;
          };
        },
      },
    );
    return pipeline;
  };
}
