import { randomBytes } from 'node:crypto';
import type { TestProject } from 'vitest/node';

// Minimal placeholder: hands over the default local service addresses. Replaced by the full rig.
export default function setup(project: TestProject): void {
  project.provide('redisUrl', process.env.ZG_TEST_REDIS_URL ?? 'redis://127.0.0.1:6379');
  project.provide('mysqlRootUrl', process.env.ZG_TEST_MYSQL_URL ?? 'mysql://root@127.0.0.1:3306');
  project.provide('kafkaBrokers', process.env.ZG_TEST_KAFKA_BROKERS ?? '127.0.0.1:19092');
  project.provide('runId', randomBytes(3).toString('hex'));
}
