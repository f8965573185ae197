import type { Redis } from 'ioredis';
import { BUMP_MARK_LUA, byGroup } from '../../platform/kv/redis-kv.js';
import type { ListEntry, ListPosition } from '../model.js';
import {
  listKey,
  type ListCache,
  type ListCacheOptions,
  type ListChange,
  type ListPage,
  type ListRef,
  type ListWatch,
} from './list-cache.js';

// A cached list is a sorted set: score = created_at, member = the other user's id zero-padded to 16
// digits, so equal scores order by id (Redis orders equal scores by member bytes). It always holds
// the member '#' at score -inf: the set exists exactly when the list is cached, even when the list
// is empty, and reverse order puts the marker last. The list key and its change mark share the
// owner's hash tag, so every script touches one slot.
const MARKER = '#';
const ID_WIDTH = 16;

// KEYS: list. ARGV: mode ('o' | 'c'), offset | (score, member), limit + 1.
// Returns false when the list is not cached, else member, score, member, score, ...
const PAGE_LUA = `
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local want = tonumber(ARGV[#ARGV])
local start
if ARGV[1] == 'o' then
  start = tonumber(ARGV[2])
else
  local s, m = ARGV[2], ARGV[3]
  local lo = redis.call('ZCOUNT', KEYS[1], '(' .. s, '+inf')
  local hi = lo + redis.call('ZCOUNT', KEYS[1], s, s)
  -- Ties on the cursor's score are in descending member order: find the first one below the cursor.
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local member = redis.call('ZRANGE', KEYS[1], mid, mid, 'REV')[1]
    if member < m then hi = mid else lo = mid + 1 end
  end
  start = lo
end
local out = {}
local got = redis.call('ZRANGE', KEYS[1], start, start + want - 1, 'REV', 'WITHSCORES')
for i = 1, #got, 2 do
  if got[i] ~= '${MARKER}' then
    out[#out + 1] = got[i]
    out[#out + 1] = got[i + 1]
  end
end
return out
`;

// KEYS: mark. ARGV: mark ttl ms. The mark a fill compares its install with; a missing one is made
// from the clock (as \`bump_mark\` does), so a fill never compares with a value a lost mark had.
const MARK_LUA = `
local m = redis.call('GET', KEYS[1])
if m then return m end
local t = redis.call('TIME')
m = t[1] .. string.format('%06d', tonumber(t[2]))
redis.call('SET', KEYS[1], m, 'PX', ARGV[1])
return m
`;

// KEYS: list, mark. ARGV: expected mark, ttl ms, max entries, then score, member pairs.
const INSTALL_LUA = `
if (redis.call('GET', KEYS[2]) or '0') ~= ARGV[1] then return 0 end
if (#ARGV - 3) / 2 > tonumber(ARGV[3]) then return 0 end
redis.call('DEL', KEYS[1])
redis.call('ZADD', KEYS[1], '-inf', '${MARKER}')
local i = 4
while i <= #ARGV do
  local last = math.min(i + 999, #ARGV)
  redis.call('ZADD', KEYS[1], unpack(ARGV, i, last))
  i = last + 1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`;

// KEYS: list, mark. ARGV: mark ttl ms, max entries, the mark watched ('' = none), then
// op ('a' add | 'r' remove | 'd' drop), score, member for each change. A list whose mark moved since
// it was watched (or was lost) is dropped: what touched it may be newer than the changes.
const CHANGE_LUA = `${BUMP_MARK_LUA}
local watched = ARGV[3]
local moved = watched ~= '' and redis.call('GET', KEYS[2]) ~= watched
bump_mark(KEYS[2], ARGV[1])
if moved then return redis.call('DEL', KEYS[1]) end
for i = 4, #ARGV, 3 do
  if ARGV[i] == 'd' then return redis.call('DEL', KEYS[1]) end
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for i = 4, #ARGV, 3 do
  if ARGV[i] == 'a' then
    redis.call('ZADD', KEYS[1], ARGV[i + 1], ARGV[i + 2])
  else
    redis.call('ZREM', KEYS[1], ARGV[i + 2])
  end
end
if redis.call('ZCARD', KEYS[1]) > tonumber(ARGV[2]) + 1 then redis.call('DEL', KEYS[1]) end
return 1
`;

const CMD = {
  page: 'zgRelListPage',
  mark: 'zgRelListMark',
  install: 'zgRelListInstall',
  change: 'zgRelListChange',
} as const;

type Commands = {
  [CMD.page]: (list: string, ...args: (string | number)[]) => Promise<string[] | null>;
  [CMD.mark]: (mark: string, ttlMs: number) => Promise<string>;
  [CMD.install]: (list: string, mark: string, ...args: (string | number)[]) => Promise<number>;
  [CMD.change]: (list: string, mark: string, ...args: (string | number)[]) => Promise<number>;
};

export interface RedisListCacheOptions extends ListCacheOptions {
  /** Prefix of every key (the deployment's Redis prefix). */
  prefix: string;
  /** How long a list's change mark is kept after it last moved; far longer than any fill takes. */
  markTtlMs?: number;
}

/**
 * A mark only has to outlive the fills that read it (one query of at most `maxEntries` rows): every
 * follow moves two marks, so a day's worth would keep a key per active user around for nothing. A
 * fill slower than that is still refused after a change: an expired mark starts again from the
 * clock, not from a value the fill read.
 */
export const DEFAULT_MARK_TTL_MS = 10 * 60_000;

const member = (userId: number) => String(userId).padStart(ID_WIDTH, '0');

/** `ListCache` in Redis: one sorted set per list; every operation is one script per list. */
export class RedisListCache implements ListCache {
  private readonly cmd: Commands;
  private readonly markTtlMs: number;

  constructor(
    redis: Redis,
    private readonly options: RedisListCacheOptions,
  ) {
    this.markTtlMs = options.markTtlMs ?? DEFAULT_MARK_TTL_MS;
    const commands = redis as unknown as Record<string, unknown>;
    if (typeof commands[CMD.page] !== 'function')
      redis.defineCommand(CMD.page, { numberOfKeys: 1, lua: PAGE_LUA });
    if (typeof commands[CMD.mark] !== 'function')
      redis.defineCommand(CMD.mark, { numberOfKeys: 1, lua: MARK_LUA });
    if (typeof commands[CMD.install] !== 'function')
      redis.defineCommand(CMD.install, { numberOfKeys: 2, lua: INSTALL_LUA });
    if (typeof commands[CMD.change] !== 'function')
      redis.defineCommand(CMD.change, { numberOfKeys: 2, lua: CHANGE_LUA });
    this.cmd = {
      [CMD.page]: (commands[CMD.page] as Commands[typeof CMD.page]).bind(redis),
      [CMD.mark]: (commands[CMD.mark] as Commands[typeof CMD.mark]).bind(redis),
      [CMD.install]: (commands[CMD.install] as Commands[typeof CMD.install]).bind(redis),
      [CMD.change]: (commands[CMD.change] as Commands[typeof CMD.change]).bind(redis),
    };
  }

  private key(list: ListRef): string {
    return `${this.options.prefix}rel:{u${list.owner}}:${list.kind}`;
  }

  private markKey(list: ListRef): string {
    return `${this.key(list)}:mark`;
  }

  async page(list: ListRef, position: ListPosition, limit: number): Promise<ListPage | null> {
    const args =
      'offset' in position
        ? ['o', position.offset]
        : ['c', position.after.createdAt, member(position.after.userId)];
    const reply = await this.cmd[CMD.page](this.key(list), ...args, limit + 1);
    if (reply === null) return null;
    const entries = toEntries(reply);
    return { entries: entries.slice(0, limit), more: entries.length > limit };
  }

  async all(list: ListRef): Promise<ListEntry[] | null> {
    const reply = await this.cmd[CMD.page](this.key(list), 'o', 0, this.options.maxEntries + 2);
    return reply === null ? null : toEntries(reply);
  }

  async fill(
    list: ListRef,
    load: () => Promise<ListEntry[]>,
  ): Promise<{ entries: ListEntry[]; cached: boolean }> {
    const mark = await this.cmd[CMD.mark](this.markKey(list), this.markTtlMs);
    const entries = await load();
    if (entries.length > this.options.maxEntries) return { entries, cached: false };
    const pairs: (string | number)[] = [];
    for (const e of entries) pairs.push(e.createdAt, member(e.userId));
    const installed = await this.cmd[CMD.install](
      this.key(list),
      this.markKey(list),
      mark,
      Math.ceil(this.options.ttlMs),
      this.options.maxEntries,
      ...pairs,
    );
    return { entries, cached: installed === 1 };
  }

  async watch(lists: readonly ListRef[]): Promise<ListWatch> {
    const keys = [...new Map(lists.map((l) => [listKey(l), l])).entries()];
    const marks = await Promise.all(keys.map(([, l]) => this.cmd[CMD.mark](this.markKey(l), this.markTtlMs)));
    return new RedisListWatch(new Map(keys.map(([key], i) => [key, marks[i]!])));
  }

  async apply(changes: readonly ListChange[], watch?: ListWatch): Promise<void> {
    const marks = watch instanceof RedisListWatch ? watch.marks : undefined;
    await Promise.all(
      [...byGroup(changes, listKey)].map(([key, list]) => {
        const ops: (string | number)[] = [];
        for (const c of list) ops.push(c.createdAt === null ? 'r' : 'a', c.createdAt ?? 0, member(c.userId));
        return this.cmd[CMD.change](
          this.key(list[0]!),
          this.markKey(list[0]!),
          this.markTtlMs,
          this.options.maxEntries,
          marks?.get(key) ?? '',
          ...ops,
        );
      }),
    );
  }

  async invalidate(lists: readonly ListRef[]): Promise<void> {
    await Promise.all(
      lists.map((l) =>
        this.cmd[CMD.change](
          this.key(l),
          this.markKey(l),
          this.markTtlMs,
          this.options.maxEntries,
          '',
          'd',
          0,
          '',
        ),
      ),
    );
  }

  async close(): Promise<void> {
    // The connection belongs to the platform.
  }
}

/** The lists' change marks when watched (a watch of lists with a mark read in one script each). */
class RedisListWatch implements ListWatch {
  constructor(readonly marks: ReadonlyMap<string, string>) {}
  release(): void {
    // Nothing is held.
  }
}

function toEntries(reply: string[]): ListEntry[] {
  const entries: ListEntry[] = [];
  for (let i = 0; i + 1 < reply.length; i += 2) {
    entries.push({ userId: Number(reply[i]), createdAt: Number(reply[i + 1]) });
  }
  return entries;
}
