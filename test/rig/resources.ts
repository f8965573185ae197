import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Redis } from 'ioredis';
import { inject } from 'vitest';
import { migrate, openMysql, openSqlite, type Db } from '../../src/platform/db/database.js';
import type { Insertable } from 'kysely';
import type { KnowpostsTable, UsersTable } from '../../src/platform/db/schema.js';
import { KafkaEventLog } from '../../src/platform/eventlog/kafka-eventlog.js';

/**
 * What a test may use of the shared services. The global setup has made sure each one is running
 * and handed over its address; every test isolates itself by name (database, key prefix, topic prefix)
 * and cleans up what it created.
 */
declare module 'vitest' {
  export interface ProvidedContext {
    redisUrl: string;
    mysqlRootUrl: string;
    kafkaBrokers: string;
    s3Endpoint: string;
    runId: string;
  }
}

export const services = {
  redisUrl: (): string => inject('redisUrl'),
  /** URL of the MariaDB server without a database; use `createMysqlDatabase` for a database of your own. */
  mysqlRootUrl: (): string => inject('mysqlRootUrl'),
  kafkaBrokers: (): string[] => inject('kafkaBrokers').split(','),
  /** http://host:port of an S3-compatible server (path-style addressing, region us-east-1). */
  s3Endpoint: (): string => inject('s3Endpoint'),
  /** Credentials for that server (S3Mock takes any; see s3TestCredentials in services.ts). */
  s3Credentials: (): { accessKeyId: string; secretAccessKey: string } => ({
    accessKeyId: process.env.ZG_TEST_S3_ACCESS_KEY_ID ?? 'zg-test',
    secretAccessKey: process.env.ZG_TEST_S3_SECRET_ACCESS_KEY ?? 'zg-test-secret',
  }),
  runId: (): string => inject('runId'),
};

/** A name unique to this run and call, safe for databases, key prefixes and topics. */
export function uniqueName(kind: string): string {
  return `zgt_${services.runId()}_${kind}_${randomBytes(3).toString('hex')}`;
}

/**
 * A bucket name unique to this run and call. S3 bucket names allow no `_`, so these are
 * `zgt-<runId>-<kind>-<random>`; the end-of-run cleanup deletes what is left of them.
 */
export function uniqueBucket(kind = 'b'): string {
  const safeKind =
    kind
      .toLowerCase()
      .replace(/[^a-z0-9]+/g, '-')
      .replace(/^-+|-+$/g, '')
      .slice(0, 30) || 'b';
  return `zgt-${services.runId()}-${safeKind}-${randomBytes(3).toString('hex')}`;
}

/**
 * A Kafka event log on the shared broker under `prefix`, tuned for tests: a short session so a
 * member that died leaves its group within seconds, and quick retries after a lost broker.
 */
export function testKafkaLog(clientId: string, prefix: string, partitions = 2): KafkaEventLog {
  return new KafkaEventLog({
    brokers: services.kafkaBrokers(),
    prefix,
    partitions,
    clientId,
    sessionTimeoutMs: 6_000,
    heartbeatIntervalMs: 500,
    retryBackoffMs: { min: 50, max: 500 },
  });
}

export async function createMysqlDatabase(): Promise<{
  url: string;
  name: string;
  drop: () => Promise<void>;
}> {
  const { createConnection } = await import('mysql2/promise');
  const name = uniqueName('db');
  const conn = await createConnection({ uri: services.mysqlRootUrl() });
  try {
    await conn.query(`CREATE DATABASE \`${name}\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin`);
  } finally {
    await conn.end();
  }
  const url = new URL(services.mysqlRootUrl());
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    name,
    drop: async () => {
      const c = await createConnection({ uri: services.mysqlRootUrl() });
      try {
        await c.query(`DROP DATABASE IF EXISTS \`${name}\``);
      } finally {
        await c.end();
      }
    },
  };
}

export interface FreshDatabase {
  db: Db;
  /** Closes it, and drops it on MariaDB. */
  close(): Promise<void>;
}

/**
 * A new, empty database of each dialect (SQLite in memory, a MariaDB database of its own), migrated
 * when asked: `[name, open]` pairs for `describe.each`.
 */
export function freshDatabases(options: { migrated: boolean }): [string, () => Promise<FreshDatabase>][] {
  const ready = async (fresh: FreshDatabase): Promise<FreshDatabase> => {
    if (!options.migrated) return fresh;
    try {
      await migrate(fresh.db);
    } catch (err) {
      await fresh.close();
      throw err;
    }
    return fresh;
  };
  return [
    [
      'sqlite',
      async () => {
        const db = openSqlite(':memory:');
        return ready({ db, close: () => db.close() });
      },
    ],
    [
      'mariadb',
      async () => {
        const database = await createMysqlDatabase();
        const db = await openMysql(database.url);
        return ready({
          db,
          close: async () => {
            await db.close();
            await database.drop();
          },
        });
      },
    ],
  ];
}

/** A migrated SQLite database in a file of its own; `dispose` closes it and removes the file. */
export async function openTempSqlite(): Promise<{ db: Db; dispose: () => Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), 'zg-t-'));
  const db = openSqlite(join(dir, 'test.db'));
  await migrate(db);
  return {
    db,
    dispose: async () => {
      await db.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Deletes every Redis key that starts with `prefix` (taken literally, not as a pattern). */
export async function deleteByPrefix(redis: Redis, prefix: string): Promise<void> {
  const pattern = `${prefix.replace(/[*?[\]\\]/g, '\\$&')}*`;
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1_000);
    if (keys.length > 0) await redis.del(...keys);
    cursor = next;
  } while (cursor !== '0');
}

/** A `knowposts` row of a published public post by `authorId`, made now; `fields` replaces any of it. */
export function publishedPostRow(
  id: string,
  authorId: number,
  fields: Partial<Insertable<KnowpostsTable>> = {},
): Insertable<KnowpostsTable> {
  const now = Date.now();
  return {
    id,
    author_id: authorId,
    status: 'published',
    visible: 'public',
    created_at: now,
    updated_at: now,
    ...fields,
  };
}

type UserRowValues = Omit<UsersTable, 'id'> & { id?: number };

/** A `users` row with a unique e-mail address and zg_id; `fields` replaces any of it. */
export function userRow(fields: Partial<UserRowValues> = {}): UserRowValues {
  const now = Date.now();
  return {
    phone: null,
    email: `${uniqueName('u')}@example.test`,
    password_hash: null,
    nickname: 'someone',
    avatar: 'https://example.test/a.png',
    bio: null,
    zg_id: uniqueName('z').slice(-32),
    gender: 'UNKNOWN',
    birthday: null,
    school: null,
    tags_json: '[]',
    created_at: now,
    updated_at: now,
    ...fields,
  };
}
