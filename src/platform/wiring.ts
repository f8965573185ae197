import { join } from 'node:path';
import type { Logger } from 'pino';
import type { Config } from './config/config.js';
import { migrate, openMysql, openSqlite, type Db } from './db/database.js';
import type { KeyValueStore } from './kv/kv.js';
import { createRedisKv, createSqliteKv } from './kv/create.js';
import type { RateLimiter } from './ratelimit/ratelimit.js';
import { createRedisRateLimiter, createSqliteRateLimiter } from './ratelimit/create.js';
import type { EventLog } from './eventlog/eventlog.js';
import { SqliteEventLog } from './eventlog/sqlite-eventlog.js';
import type { OutboxStore } from './outbox/outbox.js';
import { SqliteOutboxStore } from './outbox/sqlite-outbox-store.js';
import type { ObjectStorage } from './storage/object-storage.js';
import { LocalObjectStorage, loadOrCreateSigningKey } from './storage/local-object-storage.js';
import type { CounterStore } from '../counter/store/counter-store.js';
import { SqliteCounterStore } from '../counter/store/sqlite-counter-store.js';
import type { CodeSender } from '../auth/code-sender/code-sender.js';
import { RoutingCodeSender } from '../auth/code-sender/code-sender.js';
import { LogCodeSender } from '../auth/code-sender/log-code-sender.js';
import { SmtpCodeSender } from '../auth/code-sender/smtp-code-sender.js';
import { loadOrCreatePem } from '../auth/keys.js';

/**
 * Every port the features use, built for one profile. This module is the only place that reads
 * `config.profile`; features receive the ports and never learn which adapters they got.
 */
export interface Platform {
  db: Db;
  kv: KeyValueStore;
  limiter: RateLimiter;
  events: EventLog;
  outboxStore: OutboxStore;
  storage: ObjectStorage;
  counterStore: CounterStore;
  codeSender: CodeSender;
  signingKeyPem: string;
  readiness: Record<string, () => Promise<boolean>>;
  /** Closes every connection, in reverse order of opening. */
  close(): Promise<void>;
}

export async function createPlatform(config: Config, log: Logger): Promise<Platform> {
  return config.profile === 'embedded' ? createEmbedded(config, log) : createCluster(config, log);
}

function localStorage(config: Config): ObjectStorage {
  const signingKey =
    config.storageSigningKey ?? loadOrCreateSigningKey(join(config.dataDir, 'keys', 'storage-signing.key'));
  return new LocalObjectStorage(join(config.dataDir, 'objects'), `${config.publicUrl}/files`, { signingKey });
}

async function emailSender(config: Config, log: Logger): Promise<CodeSender> {
  return config.smtp.url ? SmtpCodeSender.create(config.smtp.url, config.smtp.from) : new LogCodeSender(log);
}

async function createEmbedded(config: Config, log: Logger): Promise<Platform> {
  const db = openSqlite(join(config.dataDir, 'zhiguang.db'));
  const closers: (() => Promise<void>)[] = [() => db.close()];
  try {
    await migrate(db);
    const events = new SqliteEventLog(db);
    closers.unshift(() => events.close());
    const codeSender = new RoutingCodeSender({
      EMAIL: await emailSender(config, log),
      PHONE: new LogCodeSender(log),
    });
    closers.unshift(async () => codeSender.close());
    return {
      db,
      kv: createSqliteKv(db),
      limiter: createSqliteRateLimiter(db),
      events,
      outboxStore: new SqliteOutboxStore(db),
      storage: localStorage(config),
      counterStore: new SqliteCounterStore(db),
      codeSender,
      signingKeyPem:
        config.jwt.privateKeyPem ?? loadOrCreatePem(join(config.dataDir, 'keys', 'jwt-private.pem')),
      readiness: {
        database: () =>
          db.kysely
            .selectFrom('users')
            .select('id')
            .limit(1)
            .execute()
            .then(() => true),
      },
      close: () => closeAll(closers),
    };
  } catch (err) {
    await closeAll(closers);
    throw err;
  }
}

async function createCluster(config: Config, log: Logger): Promise<Platform> {
  const closers: (() => Promise<void>)[] = [];
  try {
    const db = await openMysql(required(config.mysqlUrl, 'ZG_MYSQL_URL'));
    closers.unshift(() => db.close());
    await migrate(db);

    const { Redis } = await import('ioredis');
    const redis = new Redis(required(config.redisUrl, 'ZG_REDIS_URL'), {
      maxRetriesPerRequest: 2,
      enableAutoPipelining: true,
    });
    closers.unshift(async () => void (await redis.quit().catch(() => redis.disconnect())));

    const { KafkaEventLog } = await import('./eventlog/kafka-eventlog.js');
    const events = new KafkaEventLog({
      brokers: config.kafkaBrokers,
      prefix: config.kafkaPrefix,
      partitions: config.kafkaPartitions,
      clientId: 'zhiguang',
      // Retry a lost broker at least every second: events published once it is back are no longer
      // covered by the repair job, so counting must resume within seconds (not the default 10 s).
      retryBackoffMs: { min: 200, max: 1_000 },
    });
    closers.unshift(() => events.close());
    const { MysqlOutboxStore } = await import('./outbox/mysql-outbox-store.js');
    const { RedisCounterStore } = await import('../counter/store/redis-counter-store.js');

    const codeSender = new RoutingCodeSender({
      EMAIL: await emailSender(config, log),
      PHONE: new LogCodeSender(log),
    });
    closers.unshift(async () => codeSender.close());
    return {
      db,
      kv: createRedisKv(redis, config.redisPrefix),
      limiter: createRedisRateLimiter(redis, config.redisPrefix),
      events,
      outboxStore: new MysqlOutboxStore(db),
      storage: localStorage(config),
      counterStore: new RedisCounterStore(redis, {
        prefix: config.redisPrefix,
        groups: config.counters.groups,
      }),
      codeSender,
      signingKeyPem: required(config.jwt.privateKeyPem, 'ZG_JWT_PRIVATE_KEY'),
      readiness: {
        database: () =>
          db.kysely
            .selectFrom('users')
            .select('id')
            .limit(1)
            .execute()
            .then(() => true),
        redis: () => redis.ping().then((r) => r === 'PONG'),
        kafka: () => events.ping(),
      },
      close: () => closeAll(closers),
    };
  } catch (err) {
    await closeAll(closers);
    throw err;
  }
}

function required<T>(value: T | undefined, name: string): T {
  if (value === undefined) throw new Error(`${name} is required on the cluster profile`);
  return value;
}

async function closeAll(closers: (() => Promise<void>)[]): Promise<void> {
  for (const close of closers) {
    try {
      await close();
    } catch {
      // Closing is best effort: one stuck connection must not keep the others open.
    }
  }
}
