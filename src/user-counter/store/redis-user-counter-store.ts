import type { ChainableCommander, Redis } from 'ioredis';
import { decodeSnapshot, encodeSnapshot } from '../../counter/snapshot.js';
import {
  bufferVariant,
  byGroup,
  defineScript,
  execPipeline,
  type ScriptCall,
} from '../../platform/kv/redis-kv.js';
import { fromLayout, toLayout, type UserCounterDelta, type UserCounts } from '../model.js';
import { eventRuns, type EventRun } from './runs.js';
import {
  checkUserId,
  DEFAULT_RETENTION_MS,
  type ApplyResult,
  type UserCounterStore,
  type UserInspection,
  type WriteOptions,
  type WriteResult,
} from './user-counter-store.js';

export interface RedisUserCounterStoreOptions {
  /** Prepended to every key; must not contain `{`, which would replace the group's hash tag. */
  prefix: string;
  /**
   * Groups users are spread over (user id modulo groups, so sequential ids spread evenly). Size it
   * so a group's snapshot hash stays within Redis' listpack limit (512 entries by default): about
   * users / 400.
   */
  groups?: number;
  /** How long a (user, event) pair stays recorded as applied. */
  retentionMs?: number;
}

export const DEFAULT_USER_GROUPS = 4096;

// Every script touches the keys of one group only (KEYS: snapshots, versions, applied, marks), so
// it is atomic for the group and runs on one node of a cluster. A snapshot is valid only at 20
// bytes; a user's field in the hashes is its decimal id (an integer inside a listpack), its applied
// ids are `<userId>:<eventId>` members of the group's sorted set, scored by the time they were
// recorded, and its marks are `<userId>:<source>` fields of the marks hash.

// Shared by the scripts: whether an event id is recorded for a user, and recording it. A sequenced
// id (`<source>#<seq>`, 1 to 15 digits, as parseSequencedEventId reads it) is recorded when its seq
// is at or below the mark of (user, source); recording raises the mark, never lowers it.
const EVENT_LUA = `
local function sequenced(id)
  local src, q = string.match(id, '^([^#]+)#([1-9]%d*)$')
  if src and #q <= 15 then return src, tonumber(q), q end
  return nil, nil, nil
end
local function recorded(uid, id)
  local src, q = sequenced(id)
  if src then return q <= tonumber(redis.call('HGET', KEYS[4], uid .. ':' .. src) or '0') end
  return redis.call('ZSCORE', KEYS[3], uid .. ':' .. id) ~= false
end
-- True when the event was not recorded before.
local function record(uid, id, now)
  local src, q, digits = sequenced(id)
  if src then
    local field = uid .. ':' .. src
    if q <= tonumber(redis.call('HGET', KEYS[4], field) or '0') then return false end
    -- The digits as given: a Lua number would be written with 14 significant digits at most.
    redis.call('HSET', KEYS[4], field, digits)
    return true
  end
  return redis.call('ZADD', KEYS[3], 'NX', now, uid .. ':' .. id) == 1
end
`;

// ARGV: now, horizon (recorded before it is forgotten), then per (user, event): user id, event id,
// n, and n pairs of field index (0-based) and delta.
const APPLY_LUA = `${EVENT_LUA}
local now = ARGV[1]
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[2])
local applied, skipped = 0, 0
local i = 3
while i <= #ARGV do
  local uid, n = ARGV[i], tonumber(ARGV[i + 2])
  local first = i + 3
  if not record(uid, ARGV[i + 1], now) then
    skipped = skipped + n
  else
    applied = applied + n
    redis.call('HINCRBY', KEYS[2], uid, 1)
    local raw = redis.call('HGET', KEYS[1], uid)
    -- No snapshot: the database already holds this change and the next rebuild reads it.
    if raw and #raw == 20 then
      local c = { struct.unpack('>I4I4I4I4I4', raw) }
      for k = 0, n - 1 do
        local idx = tonumber(ARGV[first + 2 * k]) + 1
        local v = c[idx] + tonumber(ARGV[first + 2 * k + 1])
        if v < 0 then v = 0 elseif v > 4294967295 then v = 4294967295 end
        c[idx] = v
      end
      redis.call('HSET', KEYS[1], uid, struct.pack('>I4I4I4I4I4', c[1], c[2], c[3], c[4], c[5]))
    end
  end
  i = first + 2 * n
end
return { applied, skipped }
`;

// ARGV: user id, snapshot bytes, if-absent (1/0), if-version ('' for any), now, event ids to record.
const WRITE_LUA = `${EVENT_LUA}
local uid = ARGV[1]
local raw = redis.call('HGET', KEYS[1], uid)
if ARGV[3] == '1' and raw and #raw == 20 then return { 'present', raw } end
local version = redis.call('HGET', KEYS[2], uid) or '0'
if ARGV[4] ~= '' and version ~= ARGV[4] then return { 'conflict', version } end
redis.call('HSET', KEYS[1], uid, ARGV[2])
-- A rebuild that read the version before this write must not land after it.
redis.call('HINCRBY', KEYS[2], uid, 1)
for i = 6, #ARGV do record(uid, ARGV[i], ARGV[5]) end
return { 'written' }
`;

// ARGV: user id, event ids. Returns the snapshot (or false), the version and a 1/0 per event id.
const INSPECT_LUA = `${EVENT_LUA}
local uid = ARGV[1]
local out = { redis.call('HGET', KEYS[1], uid) or false, redis.call('HGET', KEYS[2], uid) or '0' }
for i = 2, #ARGV do
  out[#out + 1] = recorded(uid, ARGV[i]) and 1 or 0
end
return out
`;

const CMD = {
  apply: 'zgUserCounterApply',
  write: 'zgUserCounterWrite',
  inspect: 'zgUserCounterInspect',
} as const;

type ScriptPipeline = ChainableCommander &
  Record<(typeof CMD)['apply'], (...args: (string | number)[]) => ChainableCommander>;

function decode(raw: Buffer | null | undefined): UserCounts | null {
  const counts = decodeSnapshot(raw);
  return counts ? fromLayout(counts) : null;
}

/**
 * `UserCounterStore` on Redis. Keys (g = user id % groups, always inside `{u<g>}`, so one group is one
 * cluster slot and user groups do not share slots with the post counters' groups):
 *   uc:s:{u<g>}   HASH user id → 20-byte snapshot
 *   uc:v:{u<g>}   HASH user id → version (applied deltas so far)
 *   uc:ap:{u<g>}  ZSET `<userId>:<eventId>` by the time it was recorded (trimmed by age on apply)
 *   uc:sm:{u<g>}  HASH `<userId>:<source>` → highest seq applied (sequenced event ids)
 *
 * Round trips: `read` (any number of users), `apply` (all groups of the batch), `write`, `inspect`
 * and `remove` take one each.
 */
export class RedisUserCounterStore implements UserCounterStore {
  readonly groups: number;
  private readonly prefix: string;
  private readonly retentionMs: number;
  private readonly writeScript: ScriptCall;
  private readonly inspectScript: ScriptCall;

  constructor(
    private readonly redis: Redis,
    options: RedisUserCounterStoreOptions,
  ) {
    if (options.prefix.includes('{')) throw new RangeError('the key prefix must not contain "{"');
    const groups = options.groups ?? DEFAULT_USER_GROUPS;
    if (!Number.isInteger(groups) || groups < 1) throw new RangeError(`invalid groups: ${groups}`);
    this.prefix = options.prefix;
    this.groups = groups;
    this.retentionMs = options.retentionMs ?? DEFAULT_RETENTION_MS;
    defineScript(redis, CMD.apply, 4, APPLY_LUA);
    defineScript(redis, CMD.write, 4, WRITE_LUA);
    defineScript(redis, CMD.inspect, 4, INSPECT_LUA);
    this.writeScript = bufferVariant(redis, CMD.write);
    this.inspectScript = bufferVariant(redis, CMD.inspect);
  }

  groupOf(userId: number): number {
    return userId % this.groups;
  }

  /** Name of a group's key: `s` (snapshots), `v` (versions), `ap` (applied ids) or `sm` (marks). */
  groupKey(kind: 's' | 'v' | 'ap' | 'sm', group: number): string {
    return `${this.prefix}uc:${kind}:{u${group}}`;
  }

  private keys(group: number): [string, string, string, string] {
    return [
      this.groupKey('s', group),
      this.groupKey('v', group),
      this.groupKey('ap', group),
      this.groupKey('sm', group),
    ];
  }

  async read(userIds: readonly number[]): Promise<(UserCounts | null)[]> {
    if (userIds.length === 0) return [];
    userIds.forEach(checkUserId);
    const indexes = byGroup(
      userIds.map((_, i) => i),
      (i) => this.groupOf(userIds[i]!),
    );
    // Auto-pipelined: one write for all groups, shared with other requests of the same tick.
    const replies = await Promise.all(
      [...indexes].map(([group, list]) =>
        this.redis.hmgetBuffer(this.groupKey('s', group), ...list.map((i) => String(userIds[i]))),
      ),
    );
    const out = new Array<UserCounts | null>(userIds.length).fill(null);
    let r = 0;
    for (const list of indexes.values()) {
      const values = replies[r++] ?? [];
      list.forEach((i, k) => (out[i] = decode(values[k])));
    }
    return out;
  }

  async apply(deltas: readonly UserCounterDelta[], now: number): Promise<ApplyResult> {
    const { runs, repeats } = eventRuns(deltas);
    if (runs.length === 0) return { applied: 0, skipped: repeats };
    const pipeline = this.redis.pipeline() as ScriptPipeline;
    const horizon = now - this.retentionMs;
    for (const [group, list] of byGroup(runs, (run: EventRun) => this.groupOf(run.userId))) {
      const args: (string | number)[] = [now, horizon];
      for (const run of list) {
        args.push(run.userId, run.eventId, run.deltas.size);
        for (const [idx, delta] of run.deltas) args.push(idx, delta);
      }
      pipeline[CMD.apply](...this.keys(group), ...args);
    }
    let applied = 0;
    let skipped = repeats;
    for (const reply of (await execPipeline(pipeline)) as [number, number][]) {
      applied += reply[0];
      skipped += reply[1];
    }
    return { applied, skipped };
  }

  async write(userId: number, counts: UserCounts, options: WriteOptions, now: number): Promise<WriteResult> {
    checkUserId(userId);
    const reply = (await this.writeScript(
      ...this.keys(this.groupOf(userId)),
      String(userId),
      encodeSnapshot(toLayout(counts)),
      options.ifAbsent ? '1' : '0',
      options.ifVersion === undefined ? '' : String(options.ifVersion),
      now,
      ...new Set(options.markApplied ?? []),
    )) as [Buffer, Buffer?];
    const outcome = reply[0].toString();
    if (outcome === 'written') return { outcome };
    if (outcome === 'conflict') return { outcome, version: Number(reply[1]?.toString() ?? 0) };
    const present = decode(reply[1]);
    if (outcome !== 'present' || !present) throw new Error(`unexpected reply from ${CMD.write}: ${outcome}`);
    return { outcome, counts: present };
  }

  async inspect(userId: number, eventIds: readonly string[] = []): Promise<UserInspection> {
    checkUserId(userId);
    const reply = (await this.inspectScript(
      ...this.keys(this.groupOf(userId)),
      String(userId),
      ...eventIds,
    )) as [Buffer | null, Buffer, ...number[]];
    const [raw, version, ...flags] = reply;
    return {
      counts: decode(raw),
      version: Number(version.toString()),
      applied: flags.map((f) => f === 1),
    };
  }

  async remove(userIds: readonly number[]): Promise<void> {
    if (userIds.length === 0) return;
    userIds.forEach(checkUserId);
    const pipeline = this.redis.pipeline();
    for (const [group, list] of byGroup(userIds, (id) => this.groupOf(id))) {
      pipeline.hdel(this.groupKey('s', group), ...list.map(String));
    }
    await execPipeline(pipeline);
  }

  async removeAll(): Promise<boolean> {
    // A key per group, deleted in pipelines of a few hundred (one slot each, as Redis Cluster wants).
    let removed = 0;
    for (let first = 0; first < this.groups; first += 500) {
      const pipeline = this.redis.pipeline();
      for (let group = first; group < Math.min(first + 500, this.groups); group++)
        pipeline.del(this.groupKey('s', group));
      for (const deleted of (await execPipeline(pipeline)) as number[]) removed += deleted;
    }
    return removed > 0;
  }

  async writeRawSnapshot(userId: number, bytes: Buffer | null): Promise<void> {
    checkUserId(userId);
    const key = this.groupKey('s', this.groupOf(userId));
    if (bytes === null) await this.redis.hdel(key, String(userId));
    else await this.redis.hset(key, String(userId), bytes);
  }
}
