import type { Redis } from 'ioredis';
import type { Db } from '../db/database.js';
import { RedisRateLimiter } from './redis-ratelimit.js';
import { SqliteRateLimiter, type SqliteRateLimiterOptions } from './sqlite-ratelimit.js';

/** Rate limiter in the embedded database's `kv` table, under keys `rl:{key}` by default. */
export function createSqliteRateLimiter(db: Db, options?: SqliteRateLimiterOptions): SqliteRateLimiter {
  return new SqliteRateLimiter(db, options);
}

/** Rate limiter in Redis, under keys `{prefix}rl:{key}`. */
export function createRedisRateLimiter(redis: Redis, prefix: string): RedisRateLimiter {
  return new RedisRateLimiter(redis, prefix);
}
