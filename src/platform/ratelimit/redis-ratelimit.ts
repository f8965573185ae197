import type { Redis } from 'ioredis';
import { defineScript } from '../kv/redis-kv.js';
import { checkWindow, decide, type RateLimitDecision, type RateLimiter } from './ratelimit.js';

// The window starts at a key's first hit and is timed by the Redis server alone, so processes with
// skewed clocks still share one window. A key left without expiry (PTTL -1) gets one here too, so no
// window key can outlive its window.
const HIT = `
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
`;
const HIT_COMMAND = 'zgRateLimitHit';

type Hit = (key: string, windowMs: number) => Promise<[number, number]>;

/**
 * Fixed-window `RateLimiter` on Redis: one key per limited key (`{prefix}rl:{key}`) holding the hit
 * count, expiring with its window. `hit` is one Lua script and `reset` one DEL, one round trip each.
 */
export class RedisRateLimiter implements RateLimiter {
  private readonly hitScript: Hit;

  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {
    this.hitScript = defineScript<Hit>(redis, HIT_COMMAND, 1, HIT);
  }

  private k(key: string): string {
    return `${this.prefix}rl:${key}`;
  }

  async hit(key: string, limit: number, windowMs: number): Promise<RateLimitDecision> {
    const window = checkWindow(limit, windowMs);
    const [count, ttl] = await this.hitScript(this.k(key), window);
    return decide(count, limit, ttl);
  }

  async reset(key: string): Promise<void> {
    await this.redis.del(this.k(key));
  }
}
