import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { migrate, openSqlite } from '../db/database.js';
import { services, uniqueName } from '../../../test/rig/resources.js';
import { defineEventLogContract } from './eventlog.contract.js';
import { KafkaEventLog } from './kafka-eventlog.js';
import { SqliteEventLog } from './sqlite-eventlog.js';

defineEventLogContract('sqlite', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'zg-eventlog-'));
  const db = openSqlite(join(dir, 'events.db'));
  await migrate(db);
  const log = new SqliteEventLog(db, { retryBackoffMs: { min: 50, max: 500 } });
  return {
    log,
    unreachable: async () => {
      const gone = openSqlite(join(dir, 'gone.db'));
      await migrate(gone);
      await gone.close();
      return new SqliteEventLog(gone);
    },
    close: async () => {
      await log.close();
      await db.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
});

defineEventLogContract('kafka', async () => {
  const prefix = `${uniqueName('t')}.`;
  const log = new KafkaEventLog({
    brokers: services.kafkaBrokers(),
    prefix,
    partitions: 3,
    clientId: 'zg-contract',
    sessionTimeoutMs: 6_000,
    heartbeatIntervalMs: 500,
    retryBackoffMs: { min: 100, max: 1_000 },
  });
  return {
    log,
    unreachable: async () =>
      new KafkaEventLog({
        brokers: ['127.0.0.1:1'],
        prefix,
        clientId: 'zg-contract-dead',
        connectTimeoutMs: 500,
        requestTimeoutMs: 1_000,
        retries: 2,
        retryDelayMs: 100,
        publishTimeoutMs: 5_000,
      }),
    cleanup: async (topics, groups) => {
      await log.deleteGroups(groups).catch(() => undefined);
      await log.deleteTopics(topics);
    },
    close: () => log.close(),
  };
});
