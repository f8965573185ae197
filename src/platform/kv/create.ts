import type { Redis } from 'ioredis';
import type { Db } from '../db/database.js';
import { RedisKeyValueStore } from './redis-kv.js';
import { SqliteKeyValueStore, type SqliteKvOptions } from './sqlite-kv.js';

/** Key-value store in the embedded database's `kv` table (migrations must have run). */
export function createSqliteKv(db: Db, options?: SqliteKvOptions): SqliteKeyValueStore {
  return new SqliteKeyValueStore(db, options);
}

/** Key-value store in Redis; every key is stored as `prefix + key`. */
export function createRedisKv(redis: Redis, prefix: string): RedisKeyValueStore {
  return new RedisKeyValueStore(redis, prefix);
}
