/**
 * What the Kafka broker spends per produce request and per record: a producer like the service's
 * (idempotent, acks from all in-sync replicas, 6 partitions, records keyed by post) sends the same
 * number of records a second in requests of different sizes, and the broker's CPU is read from
 * /proc, against its idle CPU measured first. No consumer runs.
 *
 *   npx tsx bench/kafka-requests.ts
 *   KREQ_RATE=2500 KREQ_SECONDS=8 KREQ_INTERVALS=5,20,60,100 npx tsx bench/kafka-requests.ts
 *
 * Needs the broker of scripts/kafka-broker.sh (started when it is not running and ZG_KAFKA_BROKERS
 * is unset). Its topic is named `zgb_…` and deleted at the end.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { KafkaEventLog } from '../src/platform/eventlog/kafka-eventlog.js';
import { cpuBetween, cpuMark } from './load.js';
import { Cleanups, ensureKafka, services, uniqueName } from './servers.js';

const rate = Number(process.env.KREQ_RATE ?? 2_500);
const seconds = Number(process.env.KREQ_SECONDS ?? 8);
const intervals = (process.env.KREQ_INTERVALS ?? '5,20,60,100').split(',').map(Number);

/** The broker's CPU (cores) over the next `ms`. */
async function brokerCores(ms: number): Promise<number> {
  const before = cpuMark([]);
  await sleep(ms);
  return cpuBetween(before, cpuMark([])).services.kafka;
}

const cleanups = new Cleanups();
try {
  if (!process.env.ZG_KAFKA_BROKERS) await ensureKafka();
  const prefix = `${uniqueName('kreq')}.`;
  const log = new KafkaEventLog({ brokers: services.kafkaBrokers, prefix, partitions: 6 });
  cleanups.add('event log', () => log.close());
  await log.ensureTopics(['requests']);
  cleanups.add(`topic ${prefix}requests`, () => log.deleteTopics(['requests']));
  await sleep(2_000);
  const idle = await brokerCores(seconds * 1000);
  console.log(`broker idle: ${(idle * 100).toFixed(1)} % of a core`);
  console.log('records/request  requests/s  broker % of a core  above idle  µs per request  µs per record');
  let n = 0;
  for (const intervalMs of intervals) {
    const perRequest = Math.max(1, Math.round((rate * intervalMs) / 1000));
    const timer = setInterval(() => {
      const records = Array.from({ length: perRequest }, () => {
        n++;
        const post = n % 2000;
        const value = JSON.stringify({
          id: `${n}-${'x'.repeat(24)}`,
          entity: `knowpost:${post}`,
          delta: 1,
          seq: n,
        });
        return { key: `knowpost:${post}`, value };
      });
      void log.publish('requests', records).catch(() => undefined);
    }, intervalMs);
    await sleep(2_000);
    const cores = await brokerCores(seconds * 1000);
    clearInterval(timer);
    const requests = 1000 / intervalMs;
    const above = Math.max(0, cores - idle);
    console.log(
      `${String(perRequest).padStart(15)}  ${requests.toFixed(0).padStart(10)}  ${(cores * 100).toFixed(1).padStart(18)}  ` +
        `${(above * 100).toFixed(1).padStart(10)}  ${((above / requests) * 1e6).toFixed(0).padStart(14)}  ` +
        `${((above / rate) * 1e6).toFixed(1).padStart(13)}`,
    );
    await sleep(1_000);
  }
} finally {
  await cleanups.runAll((line) => console.error(line));
}
