import type { ChainableCommander, Redis } from 'ioredis';
import { BUMP_MARK_LUA, defineScript, execPipeline, type ScriptCall } from '../kv/redis-kv.js';
import type { CacheFill, CacheRead, CacheSlot, SharedCache } from './shared-cache.js';

// A value is stored as "<generation>|<value>" and read only while its guard still has that
// generation, so moving the guard hides every value under it without finding them. A guard that is
// missing (never made, expired, or lost with Redis' data) reads as the generation "" and hides
// every value; a fill under "" makes it, with a generation of the clock, and only while it is still
// missing: an invalidation between the read and the fill made it first, and the fill stores nothing.
// Values stored under a generation a guard had before it went can never be read again (no fixed
// generation such as 0 comes back). A read makes no key: ids asked for and never found (a
// crawler's) leave nothing behind.
// KEYS: guard, value.
const GET_LUA = `
local g = redis.call('GET', KEYS[1])
if not g then return {''} end
local v = redis.call('GET', KEYS[2])
if v then
  local sep = string.find(v, '|', 1, true)
  if sep and string.sub(v, 1, sep - 1) == g then return {g, string.sub(v, sep + 1)} end
end
return {g}
`;
// KEYS: guard, value. ARGV: generation read, value, the value's ttl, the guard's ttl (ms).
const FILL_LUA = `
local g = redis.call('GET', KEYS[1])
if ARGV[1] == '' then
  if g then return 0 end
  local t = redis.call('TIME')
  g = t[1] .. string.format('%06d', tonumber(t[2]))
elseif g ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], g .. '|' .. ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[1], g, 'PX', ARGV[4])
return 1
`;
// KEYS: guard. ARGV: ttl ms.
const INVALIDATE_LUA = `${BUMP_MARK_LUA}
bump_mark(KEYS[1], ARGV[1])
return 1
`;
const CMD = { get: 'zgCacheGet', fill: 'zgCacheFill', invalidate: 'zgCacheInvalidate' } as const;

type ScriptPipeline = ChainableCommander &
  Record<(typeof CMD)[keyof typeof CMD], (...args: (string | number)[]) => ChainableCommander>;

export interface RedisSharedCacheOptions {
  /** Prefix of every key (the deployment's Redis prefix). */
  prefix: string;
  /**
   * How long a guard's generation is kept after it was made or last moved. Fills are capped at half
   * of it; a value that outlives its guard stays hidden, since a guard made again takes a value of
   * the clock, never one it had.
   */
  guardTtlMs?: number;
}

/**
 * `SharedCache` in Redis. A guard's generation and the values under it share one hash tag, so each
 * per-entry script touches one slot (Redis Cluster ready); a call is one pipeline of such scripts.
 */
export class RedisSharedCache implements SharedCache {
  private readonly prefix: string;
  private readonly guardTtlMs: number;
  private readonly getScript: ScriptCall;

  constructor(
    private readonly redis: Redis,
    options: RedisSharedCacheOptions,
  ) {
    this.prefix = options.prefix;
    this.guardTtlMs = options.guardTtlMs ?? 24 * 3600_000;
    this.getScript = defineScript<ScriptCall>(redis, CMD.get, 2, GET_LUA);
    // Called through pipelines, which find them on the client.
    defineScript(redis, CMD.fill, 2, FILL_LUA);
    defineScript(redis, CMD.invalidate, 1, INVALIDATE_LUA);
  }

  private genKey(guard: string): string {
    if (/[{}]/.test(guard)) throw new RangeError(`cache guard must not contain braces: ${guard}`);
    return `${this.prefix}c:{${guard}}`;
  }

  private valueKey(slot: CacheSlot): string {
    return `${this.genKey(slot.guard)}:${slot.key}`;
  }

  async get(slots: readonly CacheSlot[]): Promise<CacheRead[]> {
    if (slots.length === 0) return [];
    // Plain calls, not a pipeline of their own: auto-pipelining sends them in one write together
    // with whatever other requests asked for in the same tick.
    const replies = (await Promise.all(
      slots.map((slot) => this.getScript(this.genKey(slot.guard), this.valueKey(slot))),
    )) as [string, string?][];
    return replies.map(([gen, value]) => ({ gen: String(gen), value: value ?? null }));
  }

  async fill(entries: readonly CacheFill[], ttlMs: number): Promise<void> {
    if (entries.length === 0) return;
    const ttl = Math.ceil(Math.min(ttlMs, this.guardTtlMs / 2));
    if (!(ttl > 0)) throw new RangeError(`ttlMs must be positive, got ${ttlMs}`);
    const pipeline = this.redis.pipeline() as ScriptPipeline;
    for (const e of entries)
      pipeline[CMD.fill](this.genKey(e.guard), this.valueKey(e), e.gen, e.value, ttl, this.guardTtlMs);
    await execPipeline(pipeline);
  }

  async invalidate(guards: readonly string[]): Promise<void> {
    if (guards.length === 0) return;
    const pipeline = this.redis.pipeline() as ScriptPipeline;
    for (const guard of new Set(guards)) pipeline[CMD.invalidate](this.genKey(guard), this.guardTtlMs);
    await execPipeline(pipeline);
  }
}
