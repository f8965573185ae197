import type { Redis } from 'ioredis';
import type { InvalidationBus } from './invalidation-bus.js';
import { LocalInvalidationBus, LocalInvalidationHub } from './local-invalidation-bus.js';
import { RedisInvalidationBus } from './redis-invalidation-bus.js';
import { RedisSharedCache } from './redis-shared-cache.js';
import { NoSharedCache, type SharedCache } from './shared-cache.js';

/** Embedded: one process, so messages only go to its own subscribers. */
export function createLocalInvalidationBus(hub?: LocalInvalidationHub): InvalidationBus {
  return new LocalInvalidationBus(hub);
}

/**
 * Cluster: Redis pub/sub on `{prefix}invalidate`. `subscriber` must be a connection of its own (a
 * subscribed connection can run no other command); the bus closes it.
 */
export function createRedisInvalidationBus(options: {
  publisher: Redis;
  subscriber: Redis;
  prefix: string;
  onError?: (err: unknown) => void;
}): Promise<InvalidationBus> {
  return RedisInvalidationBus.start(options);
}

/** Embedded: no shared tier (the in-process tier is all a single process needs). */
export function createNoSharedCache(): SharedCache {
  return new NoSharedCache();
}

/** Cluster: the shared tier in Redis, under keys `{prefix}c:{guard}…`. */
export function createRedisSharedCache(redis: Redis, prefix: string): SharedCache {
  return new RedisSharedCache(redis, { prefix });
}
