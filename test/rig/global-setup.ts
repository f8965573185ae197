/**
 * Vitest global setup: makes sure Redis, MariaDB, the Kafka test broker and the S3 test server answer
 * (starting the local ones when they do not), hands their addresses and a fresh run id to the tests
 * (see resources.ts), and at the end removes every database, key, topic and consumer group named
 * `zgt_<runId>_…` and every bucket named `zgt-<runId>-…`.
 *
 * A service that cannot be had fails the run here, loudly. The broker and the S3 server are left
 * running afterwards: the next run reuses them (scripts/kafka-broker.sh stop and
 * scripts/s3-server.sh stop end them).
 */
import { randomBytes } from 'node:crypto';
import type { TestProject } from 'vitest/node';
import { deleteS3Buckets, ensureKafka, ensureMysql, ensureRedis, ensureS3 } from './services.js';

interface ServiceAddresses {
  redisUrl: string;
  mysqlRootUrl: string;
  kafkaBrokers: string;
  s3Endpoint: string;
}

async function ensureServices(): Promise<ServiceAddresses> {
  const [redis, mysql, kafka, s3] = await Promise.allSettled([
    ensureRedis(),
    ensureMysql(),
    ensureKafka(),
    ensureS3(),
  ]);
  if (
    redis.status === 'fulfilled' &&
    mysql.status === 'fulfilled' &&
    kafka.status === 'fulfilled' &&
    s3.status === 'fulfilled'
  ) {
    return {
      redisUrl: redis.value,
      mysqlRootUrl: mysql.value,
      kafkaBrokers: kafka.value,
      s3Endpoint: s3.value,
    };
  }
  const problems = [
    ['Redis', redis],
    ['MariaDB', mysql],
    ['Kafka', kafka],
    ['S3', s3],
  ] as const;
  const lines = problems.flatMap(([name, result]) =>
    result.status === 'rejected'
      ? [`${name}: ${result.reason instanceof Error ? result.reason.message : String(result.reason)}`]
      : [],
  );
  throw new Error(`The test services are not available:\n\n${lines.join('\n\n')}\n`);
}

// Vitest runs the global setup once for the root project and once per selected project, each in a
// fresh module instance; the services are checked once per process.
const servicesKey = Symbol.for('zhiguang.test-rig.services');
type WithServices = typeof globalThis & { [servicesKey]?: Promise<ServiceAddresses> };

function services(): Promise<ServiceAddresses> {
  const holder = globalThis as WithServices;
  holder[servicesKey] ??= ensureServices();
  return holder[servicesKey];
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  // The project runs on the Node.js it pins (the `node` dev dependency); a test run on another
  // major version would prove nothing about the one users run.
  if (!process.version.startsWith('v24.')) {
    throw new Error(
      `Tests must run on the pinned Node.js 24 (got ${process.version}); run them through npm scripts.`,
    );
  }
  const addresses = await services();
  // 8 hex digits: valid in database names, Redis keys and Kafka topic names alike.
  const runId = randomBytes(4).toString('hex');
  project.provide('redisUrl', addresses.redisUrl);
  project.provide('mysqlRootUrl', addresses.mysqlRootUrl);
  project.provide('kafkaBrokers', addresses.kafkaBrokers);
  project.provide('s3Endpoint', addresses.s3Endpoint);
  project.provide('runId', runId);

  return async () => {
    const { cleanupRun } = await import('./cleanup.js');
    const [others, buckets] = await Promise.allSettled([
      cleanupRun({ runId, ...addresses, kafkaBrokers: addresses.kafkaBrokers.split(',') }),
      deleteS3Buckets(addresses.s3Endpoint, `zgt-${runId}-`),
    ]);
    const message = (reason: unknown): string => (reason instanceof Error ? reason.message : String(reason));
    const failures: string[] = [];
    if (others.status === 'rejected') failures.push(message(others.reason));
    if (buckets.status === 'rejected') failures.push(`S3 buckets zgt-${runId}-*: ${message(buckets.reason)}`);
    if (failures.length > 0) throw new Error(failures.join('\n'));
  };
}
