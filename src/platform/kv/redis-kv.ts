import type { ChainableCommander, Redis } from 'ioredis';
import { checkIncrement, checkTtl, type KeyValueStore } from './kv.js';

// EXISTS before INCRBY tells creation apart from an existing key without expiry; PEXPIRE NX alone
// cannot, as it would add an expiry to such a key.
const INCR_WITH_TTL = `
local created = redis.call('EXISTS', KEYS[1]) == 0
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if created then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return n
`;
const INCR_COMMAND = 'zgKvIncrWithTtl';

// A key of another type is no match (GET would raise WRONGTYPE).
const EXPIRE_IF_EQUALS = `
if redis.call('TYPE', KEYS[1]).ok == 'string' and redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`;
const DELETE_IF_EQUALS = `
if redis.call('TYPE', KEYS[1]).ok == 'string' and redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`;

type IfEquals = (key: string, value: string, ...rest: number[]) => Promise<number>;

type IncrWithTtl = (key: string, by: number, ttlMs: number) => Promise<number>;

/**
 * Lua defining `bump_mark(key, ttl_ms)`: moves a change mark on (a number readers compare before and
 * after their work) and keeps it `ttl_ms`. A mark that expired starts again from the clock's
 * microseconds, not from 1, so it never comes back to a value someone read before it expired
 * (unless it had been moved more than once a microsecond all its life).
 */
export const BUMP_MARK_LUA = `
local function bump_mark(key, ttl)
  if redis.call('EXISTS', key) == 1 then
    redis.call('INCR', key)
  else
    local t = redis.call('TIME')
    redis.call('SET', key, t[1] .. string.format('%06d', tonumber(t[2])))
  end
  redis.call('PEXPIRE', key, ttl)
end
`;

/**
 * Registers a Lua script on the client once (ioredis sends EVAL on a connection's first use and
 * EVALSHA afterwards) and returns it as a typed function.
 */
export function defineScript<F>(redis: Redis, name: string, numberOfKeys: number | null, lua: string): F {
  const commands = redis as unknown as Record<string, unknown>;
  // Without a fixed number of keys, a call passes it first.
  if (typeof commands[name] !== 'function')
    redis.defineCommand(name, numberOfKeys === null ? { lua } : { numberOfKeys, lua });
  const fn = commands[name] as (...args: unknown[]) => unknown;
  return fn.bind(redis) as F;
}

/** A script called with its keys and arguments, answering as Redis does. */
export type ScriptCall = (...args: (string | number | Buffer)[]) => Promise<unknown>;

/** The `…Buffer` twin ioredis defines with every script: bulk replies arrive as Buffers. */
export function bufferVariant(redis: Redis, name: string): ScriptCall {
  const fn = (redis as unknown as Record<string, ScriptCall>)[`${name}Buffer`];
  if (!fn) throw new Error(`script ${name} is not defined`);
  return fn.bind(redis);
}

/** Runs a pipeline and answers its replies in order; the first command that failed throws. */
export async function execPipeline(pipeline: ChainableCommander): Promise<unknown[]> {
  const replies = await pipeline.exec();
  if (!replies) throw new Error('Redis pipeline was discarded');
  return replies.map(([error, value]) => {
    if (error) throw error;
    return value;
  });
}

/** Items by the group (hash tag, key) they belong to, each group's in their order, groups in first-seen order. */
export function byGroup<T, K = number>(items: readonly T[], groupOf: (item: T) => K): Map<K, T[]> {
  const groups = new Map<K, T[]>();
  for (const item of items) {
    const g = groupOf(item);
    const list = groups.get(g);
    if (list) list.push(item);
    else groups.set(g, [item]);
  }
  return groups;
}

/**
 * `KeyValueStore` over Redis. Every method is one command (one round trip); `incr` with a TTL and
 * the compare-and-act methods are Lua scripts, so each is one atomic step.
 */
export class RedisKeyValueStore implements KeyValueStore {
  private readonly incrWithTtl: IncrWithTtl;
  private readonly expireIf: IfEquals;
  private readonly deleteIf: IfEquals;

  constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
  ) {
    this.incrWithTtl = defineScript<IncrWithTtl>(redis, INCR_COMMAND, 1, INCR_WITH_TTL);
    this.expireIf = defineScript<IfEquals>(redis, 'zgKvExpireIfEquals', 1, EXPIRE_IF_EQUALS);
    this.deleteIf = defineScript<IfEquals>(redis, 'zgKvDeleteIfEquals', 1, DELETE_IF_EQUALS);
  }

  private k(key: string): string {
    return this.prefix + key;
  }

  get(key: string): Promise<string | null> {
    return this.redis.get(this.k(key));
  }

  async mget(keys: readonly string[]): Promise<(string | null)[]> {
    if (keys.length === 0) return [];
    return this.redis.mget(keys.map((key) => this.k(key)));
  }

  async set(key: string, value: string, ttlMs?: number): Promise<void> {
    const ttl = checkTtl(ttlMs);
    if (ttl === undefined) await this.redis.set(this.k(key), value);
    else await this.redis.set(this.k(key), value, 'PX', ttl);
  }

  async setIfAbsent(key: string, value: string, ttlMs?: number): Promise<boolean> {
    const ttl = checkTtl(ttlMs);
    const reply =
      ttl === undefined
        ? await this.redis.set(this.k(key), value, 'NX')
        : await this.redis.set(this.k(key), value, 'PX', ttl, 'NX');
    return reply === 'OK';
  }

  getDel(key: string): Promise<string | null> {
    return this.redis.getdel(this.k(key));
  }

  async delete(key: string): Promise<boolean> {
    return (await this.redis.del(this.k(key))) > 0;
  }

  async incr(key: string, by = 1, ttlMs?: number): Promise<number> {
    checkIncrement(by);
    const ttl = checkTtl(ttlMs);
    if (ttl === undefined) return this.redis.incrby(this.k(key), by);
    return this.incrWithTtl(this.k(key), by, ttl);
  }

  async expire(key: string, ttlMs: number): Promise<boolean> {
    const ttl = checkTtl(ttlMs) as number;
    return (await this.redis.pexpire(this.k(key), ttl)) === 1;
  }

  async expireIfEquals(key: string, value: string, ttlMs: number): Promise<boolean> {
    const ttl = checkTtl(ttlMs) as number;
    return (await this.expireIf(this.k(key), value, ttl)) === 1;
  }

  async deleteIfEquals(key: string, value: string): Promise<boolean> {
    return (await this.deleteIf(this.k(key), value)) === 1;
  }

  async ttl(key: string): Promise<number | null> {
    const ms = await this.redis.pttl(this.k(key));
    if (ms === -2) return null;
    return ms;
  }
}
