/**
 * What views cost on their way from detail reads to snapshots: a `ViewRecorder` publishing to Kafka
 * and the `view-agg` consumer (`ViewAggregator`) adding them to Redis, both in this process with the
 * production settings (flush at 1,000 views or 200 ms), fed at a fixed rate of views spread uniformly
 * over a set of posts.
 *
 *   npx tsx bench/views.ts
 *   VIEWS_RATE=5000 VIEWS_POSTS=2000 VIEWS_SECONDS=10 npx tsx bench/views.ts
 *   VIEWS_MODULE=/path/to/other/dist/knowpost/views.js npx tsx bench/views.ts     (A/B runs)
 *
 * VIEWS_MODULE: another build's views module to measure instead of this checkout's. Prints the
 * records published, and per view from the first view recorded until every view is in a snapshot:
 * this process's CPU (recorder, Kafka clients, consumer), Kafka's and Redis' CPU (idle work
 * included, the same for every run of one length). Fails unless the snapshots' `read` fields add up
 * to the views recorded. Uses its own topic prefix, group and key prefix, and deletes them.
 */
import { randomInt } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import { Redis } from 'ioredis';
import { Registry } from 'prom-client';
import type { EntityRef } from '../src/counter/model.js';
import { RedisCounterStore } from '../src/counter/store/redis-counter-store.js';
import * as thisViews from '../src/knowpost/views.js';
import type { EventRecord } from '../src/platform/eventlog/eventlog.js';
import { KafkaEventLog } from '../src/platform/eventlog/kafka-eventlog.js';
import { cpuBetween, cpuMark } from './load.js';
import {
  Cleanups,
  deleteKafkaResources,
  deleteRedisKeys,
  ensureKafka,
  redisCpuSeconds,
  services,
  uniqueName,
} from './servers.js';

const rate = Number(process.env.VIEWS_RATE ?? 5_000);
const postCount = Number(process.env.VIEWS_POSTS ?? 2_000);
const seconds = Number(process.env.VIEWS_SECONDS ?? 10);
const TICK_MS = 10;

const views: typeof thisViews = process.env.VIEWS_MODULE
  ? ((await import(pathToFileURL(process.env.VIEWS_MODULE).href)) as typeof thisViews)
  : thisViews;

const cleanups = new Cleanups();
const log = (line: string) => console.log(`[views] ${line}`);
try {
  await ensureKafka();
  const redisPrefix = `${uniqueName('v')}:`;
  const kafkaPrefix = `${uniqueName('v')}.`;
  cleanups.add(`redis keys ${redisPrefix}*`, () => deleteRedisKeys(redisPrefix).then(() => undefined));
  cleanups.add(`kafka ${kafkaPrefix}*`, () => deleteKafkaResources(kafkaPrefix).then(() => undefined));
  const redis = new Redis(services.redisUrl, { enableAutoPipelining: true });
  cleanups.add('redis client', async () => void (await redis.quit().catch(() => redis.disconnect())));
  const events = new KafkaEventLog({ brokers: services.kafkaBrokers, prefix: kafkaPrefix });
  cleanups.add('event log', () => events.close());
  await events.ensureTopics([views.VIEW_TOPIC]);

  let records = 0;
  const counted = {
    publish: (topic: string, batch: EventRecord[]) => {
      records += batch.length;
      return events.publish(topic, batch);
    },
  };
  const store = new RedisCounterStore(redis, { prefix: redisPrefix });
  const metrics = new views.ViewMetrics(new Registry());
  const errors: unknown[] = [];
  const recorder = new views.ViewRecorder(counted, metrics, {
    maxItems: 1_000,
    flushMs: 200,
    onError: (err) => errors.push(err),
  });
  const aggregator = new views.ViewAggregator(events, store, metrics, (err) => errors.push(err));
  await aggregator.start();
  cleanups.add('view aggregator', () => aggregator.stop());

  const posts: EntityRef[] = Array.from({ length: postCount }, (_, i) => ({
    etype: 'knowpost',
    eid: String(7_400_000_000_000_000_000n + BigInt(i * 7919)),
  }));
  log(
    `${rate} views/s over ${postCount} posts for ${seconds} s${process.env.VIEWS_MODULE ? `; ${process.env.VIEWS_MODULE}` : ''}`,
  );

  const before = cpuMark([]);
  const redisBefore = await redisCpuSeconds(redis);
  let recorded = 0;
  const target = rate * seconds;
  const started = performance.now();
  await new Promise<void>((done) => {
    const timer = setInterval(() => {
      const due = Math.min(target, Math.round(((performance.now() - started) / 1000) * rate));
      for (; recorded < due; recorded++) recorder.record(posts[randomInt(postCount)]!.eid);
      if (recorded >= target) {
        clearInterval(timer);
        done();
      }
    }, TICK_MS);
  });
  await recorder.close();
  const deadline = Date.now() + 30_000;
  let inSnapshots = 0;
  for (;;) {
    const snapshots = await store.readSnapshots(posts);
    inSnapshots = snapshots.reduce((sum, c) => sum + (c?.[0] ?? 0), 0);
    if (inSnapshots >= recorded || Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  const elapsed = (performance.now() - started) / 1000;
  const cpu = cpuBetween(before, cpuMark([]));
  const redisSeconds = (await redisCpuSeconds(redis)) - redisBefore;
  const perView = (cores: number) => ((cores * elapsed) / recorded) * 1e6;
  log(
    `${recorded} views in ${records} records (${(recorded / records).toFixed(1)} views per record), ` +
      `all in snapshots after ${elapsed.toFixed(1)} s`,
  );
  log(
    `per view: this process ${perView(cpu.generator).toFixed(1)} µs, Kafka ${perView(cpu.services.kafka).toFixed(1)} µs, ` +
      `Redis ${((redisSeconds / recorded) * 1e6).toFixed(1)} µs`,
  );
  if (errors.length > 0) log(`errors: ${errors.length}, first: ${String(errors[0])}`);
  if (inSnapshots !== recorded)
    throw new Error(`snapshots hold ${inSnapshots} views of ${recorded} recorded`);
} finally {
  await cleanups.runAll(log);
}
