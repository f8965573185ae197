/**
 * Counter pipeline throughput, in process against the real Redis and Kafka: `CounterAggregator` plus
 * the flusher from the log to snapshots, and `replayAll` over the same topic.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import { CounterAggregator } from '../src/counter/aggregator.js';
import { CounterMetrics } from '../src/counter/counter.metrics.js';
import { flushPending, replayAll } from '../src/counter/maintenance.js';
import {
  COUNTER_TOPIC,
  eventFor,
  type CounterEvent,
  type EntityRef,
  type FactMetric,
} from '../src/counter/model.js';
import { RedisCounterStore } from '../src/counter/store/redis-counter-store.js';
import { KafkaEventLog } from '../src/platform/eventlog/kafka-eventlog.js';
import { PeriodicTask } from '../src/platform/workers/periodic.js';
import { startProfile } from './profile.js';
import {
  deleteKafkaResources,
  deleteRedisKeys,
  ensureKafka,
  redisCpuSeconds,
  services,
  uniqueName,
  type Cleanups,
} from './servers.js';

export interface PipelineOptions {
  events: number;
  entities: number;
  partitions: number;
  flushMs: number;
  log: (line: string) => void;
  /** The aggregator's batch bound (production: 20000). */
  maxBatch: number;
  /** Write fact sets consistent with the events before aggregating (slow; not needed for the measurement). */
  writeFacts: boolean;
  /** Directory for CPU profiles of the measured phases (none when undefined). */
  cpuProfDir?: string | undefined;
}

export interface PipelineResult {
  events: number;
  entities: number;
  partitions: number;
  setupSeconds: number;
  factsWritten: boolean;
  publishSeconds: number;
  aggregate?: {
    /** From `start()` (group join included) until the last fold finished. */
    totalSeconds: number;
    joinSeconds: number;
    /** From the first batch handed to the store until everything was applied. */
    applySeconds: number;
    /** From everything applied until the final fold finished. */
    tailSeconds: number;
    applied: number;
    skipped: number;
    mismatches: number;
    cpu: PhaseCpu;
    /** Wall seconds inside store calls (applyEvents, flush, isQuiet). */
    inStore: Record<string, number>;
  };
  replay?: {
    seconds: number;
    events: number;
    facts: number;
    rebuilt: number;
    mismatches: number;
    cpu: PhaseCpu;
    /** Wall seconds inside store and event log calls (reset, readRange, replayFacts, rebuild). */
    phases: Record<string, number>;
  };
}

/**
 * Wraps `target` so that the wall time spent in the named async methods is added up in `into`
 * (seconds during which at least one call of the method was in flight: concurrent calls count once).
 */
function timed<T extends object>(target: T, methods: readonly string[], into: Record<string, number>): T {
  const inFlight = new Map<string, { calls: number; since: number }>();
  return new Proxy(target, {
    get(obj, prop, receiver) {
      const value: unknown = Reflect.get(obj, prop, receiver);
      if (typeof prop !== 'string' || !methods.includes(prop) || typeof value !== 'function') return value;
      return async (...args: unknown[]): Promise<unknown> => {
        let state = inFlight.get(prop);
        if (!state) inFlight.set(prop, (state = { calls: 0, since: 0 }));
        if (state.calls++ === 0) state.since = performance.now();
        try {
          return await (value as (...a: unknown[]) => Promise<unknown>).apply(obj, args);
        } finally {
          if (--state.calls === 0) into[prop] = (into[prop] ?? 0) + (performance.now() - state.since) / 1000;
        }
      };
    },
  });
}

/** CPU seconds spent in a phase by this process and by the Redis server (INFO cpu). */
export interface PhaseCpu {
  node: number;
  redis: number;
}

async function cpuPhase(redis: Redis): Promise<() => Promise<PhaseCpu>> {
  const node = process.cpuUsage();
  const r = await redisCpuSeconds(redis);
  return async () => {
    const used = process.cpuUsage(node);
    return { node: (used.user + used.system) / 1e6, redis: (await redisCpuSeconds(redis)) - r };
  };
}

/** Zipf-like sampler over 0..n-1 (exponent `s`), by binary search in the cumulative weights. */
function zipf(n: number, s: number): () => number {
  const cdf = new Float64Array(n);
  let sum = 0;
  for (let i = 0; i < n; i++) cdf[i] = sum += 1 / Math.pow(i + 1, s);
  return () => {
    const x = Math.random() * sum;
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cdf[mid]! < x) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
}

interface Generated {
  refs: EntityRef[];
  events: CounterEvent[];
  /** Final [like, fav] per entity, in `refs` order. */
  expected: [number, number][];
}

/**
 * Valid events of a consistent history: per entity, seq runs 1, 2, 3…; a like or favourite is added
 * for a user who does not hold it (80 %) or removed from one who does (20 %, when anyone does).
 * Entities are drawn Zipf-like (exponent 0.8), users from 1..1,000,000; 80 % likes, 20 % favourites.
 */
function generate(count: number, entities: number): Generated {
  const base = BigInt(Date.now()) * 1_000_000n;
  const refs: EntityRef[] = Array.from({ length: entities }, (_, i) => ({
    etype: 'knowpost',
    eid: String(base + BigInt(i)),
  }));
  const seqs = new Uint32Array(entities);
  const holders = new Map<string, { list: number[]; set: Set<number> }>();
  const expected: [number, number][] = refs.map(() => [0, 0]);
  const draw = zipf(entities, 0.8);
  const now = Date.now();
  const events: CounterEvent[] = [];
  for (let n = 0; n < count; n++) {
    const e = draw();
    const metric: FactMetric = Math.random() < 0.8 ? 'like' : 'fav';
    const key = `${e}:${metric}`;
    let h = holders.get(key);
    if (!h) holders.set(key, (h = { list: [], set: new Set() }));
    let userId: number;
    let delta: 1 | -1;
    if (h.list.length > 0 && Math.random() < 0.2) {
      const i = Math.floor(Math.random() * h.list.length);
      userId = h.list[i]!;
      h.list[i] = h.list[h.list.length - 1]!;
      h.list.pop();
      h.set.delete(userId);
      delta = -1;
    } else {
      do userId = 1 + Math.floor(Math.random() * 1_000_000);
      while (h.set.has(userId));
      h.list.push(userId);
      h.set.add(userId);
      delta = 1;
    }
    expected[e]![metric === 'like' ? 0 : 1] += delta;
    events.push(eventFor(refs[e]!, metric, userId, delta, ++seqs[e]!, now));
  }
  return { refs, events, expected };
}

async function mismatches(store: RedisCounterStore, g: Generated): Promise<number> {
  let bad = 0;
  for (let i = 0; i < g.refs.length; i += 1000) {
    const snaps = await store.readSnapshots(g.refs.slice(i, i + 1000));
    snaps.forEach((c, k) => {
      const want = g.expected[i + k]!;
      // A post without a snapshot reads as rebuilt from facts: right only when it has none.
      if (c ? c[1] !== want[0] || c[2] !== want[1] : want[0] !== 0 || want[1] !== 0) bad++;
    });
  }
  return bad;
}

export async function runPipeline(
  options: PipelineOptions,
  cleanups: Cleanups,
  parts: { aggregate: boolean; replay: boolean },
): Promise<PipelineResult> {
  const { log } = options;
  await ensureKafka();
  const redisPrefix = `${uniqueName('p')}:`;
  const kafkaPrefix = `${uniqueName('p')}.`;
  const redis = new Redis(services.redisUrl, { maxRetriesPerRequest: 2, enableAutoPipelining: true });
  cleanups.add(
    'pipeline redis client',
    async () => void (await redis.quit().catch(() => redis.disconnect())),
  );
  cleanups.add(`redis keys ${redisPrefix}*`, () => deleteRedisKeys(redisPrefix).then(() => undefined));
  const events = new KafkaEventLog({
    brokers: services.kafkaBrokers,
    prefix: kafkaPrefix,
    partitions: options.partitions,
    clientId: `zg-bench-${randomBytes(2).toString('hex')}`,
  });
  cleanups.add(`kafka ${kafkaPrefix}*`, () => deleteKafkaResources(kafkaPrefix).then(() => undefined));
  cleanups.add('pipeline event log', () => events.close());
  const store = new RedisCounterStore(redis, { prefix: redisPrefix });
  const metrics = new CounterMetrics(new Registry());

  log(`pipeline: generating ${options.events} events over ${options.entities} posts`);
  const g = generate(options.events, options.entities);
  const result: PipelineResult = {
    events: g.events.length,
    entities: g.refs.length,
    partitions: options.partitions,
    setupSeconds: 0,
    factsWritten: options.writeFacts,
    publishSeconds: 0,
  };

  // Existing posts: (zero) snapshots, so folds add deltas. Fact sets are written only on request: the
  // aggregator reads them only to rebuild after a gap, and such a rebuild from empty facts would show
  // up as a mismatch below, so the check also proves that the delta path was measured.
  let t = performance.now();
  for (let i = 0; i < g.refs.length; i += 1000)
    await Promise.all(g.refs.slice(i, i + 1000).map((ref) => store.rebuild(ref)));
  if (options.writeFacts)
    for (let i = 0; i < g.events.length; i += 10_000) await store.replayFacts(g.events.slice(i, i + 10_000));
  result.setupSeconds = (performance.now() - t) / 1000;

  await events.ensureTopics([COUNTER_TOPIC]);
  t = performance.now();
  for (let i = 0; i < g.events.length; i += 10_000) {
    await events.publish(
      COUNTER_TOPIC,
      g.events
        .slice(i, i + 10_000)
        .map((e) => ({ key: `${e.entityType}:${e.entityId}`, value: JSON.stringify(e) })),
    );
  }
  result.publishSeconds = (performance.now() - t) / 1000;
  log(
    `pipeline: set up in ${result.setupSeconds.toFixed(1)} s, published in ${result.publishSeconds.toFixed(1)} s`,
  );

  if (parts.aggregate) {
    let seen = 0;
    let first = 0;
    let allApplied = 0;
    let done: () => void = () => undefined;
    const finished = new Promise<void>((ok) => (done = ok));
    const errors: unknown[] = [];
    const inStore: Record<string, number> = {};
    const timedStore = timed(store, ['applyEvents', 'flush', 'isQuiet'], inStore);
    const aggregator = new CounterAggregator(events, timedStore, metrics, (err) => errors.push(err), {
      maxBatch: options.maxBatch,
      maxWaitMs: 50,
      onApplied: (batch) => {
        if (first === 0) first = performance.now();
        seen += batch.length;
        if (seen >= g.events.length && allApplied === 0) {
          allApplied = performance.now();
          done();
        }
      },
    });
    const flusher = new PeriodicTask(
      'counter-flush',
      options.flushMs,
      () => flushPending(timedStore, metrics),
      (_, err) => errors.push(err),
      { fixedRate: true },
    );
    const cpu = await cpuPhase(redis);
    const stopProfile = await startProfile(options.cpuProfDir, 'aggregator');
    const start = performance.now();
    await aggregator.start();
    const joined = performance.now();
    flusher.start();
    const timeout = setTimeout(done, 120_000);
    await finished;
    clearTimeout(timeout);
    await flusher.stop();
    while (!(await timedStore.isQuiet())) await flushPending(timedStore, metrics);
    const end = performance.now();
    await stopProfile();
    await aggregator.stop();
    if (allApplied === 0)
      throw new Error(
        `aggregator applied only ${seen} of ${g.events.length} events in 120 s; errors: ${errors.map(String).join('; ')}`,
      );
    const applied = (await metrics.eventsApplied.get()).values;
    result.aggregate = {
      totalSeconds: (end - start) / 1000,
      joinSeconds: (joined - start) / 1000,
      applySeconds: (allApplied - first) / 1000,
      tailSeconds: (end - allApplied) / 1000,
      applied: applied.find((v) => v.labels.outcome === 'applied')?.value ?? 0,
      skipped: applied.find((v) => v.labels.outcome === 'skipped')?.value ?? 0,
      mismatches: 0,
      cpu: await cpu(),
      inStore,
    };
    result.aggregate.mismatches = await mismatches(store, g);
    if (errors.length > 0) log(`pipeline: ${errors.length} background errors, first: ${String(errors[0])}`);
    log(
      `pipeline: aggregated in ${result.aggregate.totalSeconds.toFixed(2)} s (CPU s: node ${result.aggregate.cpu.node.toFixed(1)}, redis ${result.aggregate.cpu.redis.toFixed(1)}), ${result.aggregate.mismatches} mismatching snapshots`,
    );
  }

  if (parts.replay) {
    const cpu = await cpuPhase(redis);
    const stopProfile = await startProfile(options.cpuProfDir, 'replay');
    t = performance.now();
    const phases: Record<string, number> = {};
    const report = await replayAll(
      timed(store, ['reset', 'replayFacts', 'rebuild'], phases),
      timed(events, ['readRange', 'endOffsets'], phases),
      () => undefined,
    );
    const seconds = (performance.now() - t) / 1000;
    await stopProfile();
    result.replay = {
      seconds,
      events: report.events,
      facts: report.facts,
      rebuilt: report.entities,
      mismatches: 0,
      cpu: await cpu(),
      phases,
    };
    result.replay.mismatches = await mismatches(store, g);
    log(
      `pipeline: replayed in ${seconds.toFixed(2)} s (CPU s: node ${result.replay.cpu.node.toFixed(1)}, redis ${result.replay.cpu.redis.toFixed(1)}), ${result.replay.mismatches} mismatching snapshots`,
    );
  }
  return result;
}
