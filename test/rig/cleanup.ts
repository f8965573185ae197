/**
 * End-of-run cleanup: removes whatever a test run left behind under its prefix `zgt_<runId>_`
 * (databases, Redis keys, Kafka topics and consumer groups), even when a test forgot to.
 */
import { Admin } from '@platformatic/kafka';
import { Redis } from 'ioredis';
import type { RowDataPacket } from 'mysql2';
import { createConnection } from 'mysql2/promise';

export interface CleanupTargets {
  runId: string;
  redisUrl: string;
  mysqlRootUrl: string;
  kafkaBrokers: string[];
}

export interface CleanupReport {
  databases: number;
  keys: number;
  topics: number;
  groups: number;
}

export function runPrefix(runId: string): string {
  return `zgt_${runId}_`;
}

export async function dropDatabases(mysqlRootUrl: string, prefix: string): Promise<number> {
  const conn = await createConnection({ uri: mysqlRootUrl, connectTimeout: 5000 });
  try {
    const [rows] = await conn.query<({ Database: string } & RowDataPacket)[]>('SHOW DATABASES');
    const names = rows.map((row) => row.Database).filter((name) => name.startsWith(prefix));
    for (const name of names) await conn.query(`DROP DATABASE IF EXISTS \`${name}\``);
    return names.length;
  } finally {
    await conn.end();
  }
}

/** Deletes keys containing the prefix (so hash-tagged keys such as `{zgt_<runId>_…}:x` go too). */
export async function deleteKeys(redisUrl: string, prefix: string): Promise<number> {
  const redis = new Redis(redisUrl, { lazyConnect: true, connectTimeout: 5000, maxRetriesPerRequest: 1 });
  redis.on('error', () => {});
  try {
    await redis.connect();
    let cursor = '0';
    let deleted = 0;
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', `*${prefix}*`, 'COUNT', 1000);
      cursor = next;
      if (keys.length > 0) deleted += await redis.unlink(...keys);
    } while (cursor !== '0');
    return deleted;
  } finally {
    redis.disconnect();
  }
}

/**
 * Deletes the run's topics, then its consumer groups. Groups are best effort: one whose consumer was
 * not closed keeps a member until its session times out and cannot be deleted before (its offsets
 * expire with the broker's retention anyway).
 */
export async function deleteKafkaResources(
  brokers: string[],
  prefix: string,
): Promise<{ topics: number; groups: number }> {
  const admin = new Admin({ clientId: 'zg-test-rig-cleanup', bootstrapBrokers: brokers, timeout: 10_000 });
  try {
    const topics = (await admin.listTopics()).filter((name) => name.startsWith(prefix));
    if (topics.length > 0) await admin.deleteTopics({ topics });
    let groups = 0;
    try {
      const ids = [...(await admin.listGroups()).keys()].filter((id) => id.startsWith(prefix));
      for (const id of ids) {
        groups += await admin.deleteGroups({ groups: [id] }).then(
          () => 1,
          () => 0,
        );
      }
    } catch {
      // best effort, see above
    }
    return { topics: topics.length, groups };
  } finally {
    await admin.close();
  }
}

/** Runs every cleanup even when one fails; throws one error naming each failure. */
export async function cleanupRun(targets: CleanupTargets): Promise<CleanupReport> {
  const prefix = runPrefix(targets.runId);
  const [databases, keys, kafka] = await Promise.allSettled([
    dropDatabases(targets.mysqlRootUrl, prefix),
    deleteKeys(targets.redisUrl, prefix),
    deleteKafkaResources(targets.kafkaBrokers, prefix),
  ]);
  const failures: string[] = [];
  const value = <T>(name: string, result: PromiseSettledResult<T>, fallback: T): T => {
    if (result.status === 'fulfilled') return result.value;
    failures.push(
      `${name}: ${result.reason instanceof Error ? result.reason.message : String(result.reason)}`,
    );
    return fallback;
  };
  const report: CleanupReport = {
    databases: value('MariaDB databases', databases, 0),
    keys: value('Redis keys', keys, 0),
    ...value('Kafka topics and groups', kafka, { topics: 0, groups: 0 }),
  };
  if (failures.length > 0) {
    throw new Error(`Cleanup of test run ${prefix}* left things behind:\n - ${failures.join('\n - ')}`);
  }
  return report;
}
