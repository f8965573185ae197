import { randomBytes } from 'node:crypto';
import type { ChainableCommander, Redis } from 'ioredis';
import {
  bufferVariant,
  byGroup,
  defineScript,
  execPipeline,
  type ScriptCall,
} from '../../platform/kv/redis-kv.js';
import {
  entityKey,
  eventFor,
  FACT_METRICS,
  parseEntityKey,
  type CounterEvent,
  type Counts,
  type EntityRef,
  type EntityType,
  type FactMetric,
} from '../model.js';
import { UnavailableError } from '../../platform/errors/errors.js';
import { decodeSnapshot } from '../snapshot.js';
import { coveredRanges, planStoredViewMark, type OffsetRange } from '../view-marks.js';
import type {
  CounterStore,
  Flags,
  Inspection,
  DeferredEvent,
  StaleEvent,
  LoggedViews,
  ToggleResult,
  ViewIncrement,
} from './counter-store.js';
import { RESTORE_RETRY_AFTER_S } from './counter-store.js';

export interface RedisCounterStoreOptions {
  /** Prepended to every key; must not contain `{`, which would replace the group's hash tag. */
  prefix: string;
  /**
   * Groups entities are spread over. Size it so a group's hashes stay within Redis' listpack limit
   * (hash-max-listpack-entries, 512 by default): about entities / 400. Past the limit a bucket turns
   * into a hashtable, measured at ~3× the bytes per snapshot and ~5× per seq or applied entry.
   */
  groups?: number;
  /** Members a fact set keeps as a plain SET before it is sharded; at most 512 keeps it intset-encoded. */
  sparseMax?: number;
  /**
   * Whether the client talks to one Redis node (the default; not a Redis Cluster). Then the calls
   * that naturally span groups (`flags` of a feed page, a batch of `addViews`) are one script over
   * all of their keys; otherwise every script stays within one group's slot, one per group.
   */
  singleNode?: boolean;
  /**
   * Whether a toggle needs its group sealed (see `seal`): true in a deployment, where a group whose
   * keys are gone lost its facts (Redis came back empty) and takes no toggles until a replay brings
   * them back and seals it again. Off by default, so that a store on fresh keys works at once.
   */
  requireSeal?: boolean;
  /** Told of each toggle refused because its group is not sealed. */
  onUnsealed?: (group: number) => void;
}

/**
 * The field of each group's seq hash that `seal` sets: a group without it has lost its keys (or was
 * emptied by a replay's reset) since it was sealed. Not an entity: no entity field is `~`.
 */
export const SEAL_FIELD = '~';
/**
 * Where a replay leaves its token on each group it restores (`unseal`, `claimForRestore`); its
 * `seal` seals a group only while the token is still there. Not an entity either.
 */
export const RESTORE_FIELD = '~r';
/** Calls of `addLoggedViews` sent again after marks moved under them, before it gives up. */
const VIEW_MARK_ATTEMPTS = 10;
/** (group, partition) marks a store remembers at most (about 100 bytes each); past them it forgets all. */
const VIEW_MARKS_KNOWN = 200_000;

/** What of one record of the views log falls in one group. */
interface GroupViews {
  record: LoggedViews;
  fields: ReadonlyMap<string, number>;
}

export const DEFAULT_GROUPS = 4096;
export const DEFAULT_SPARSE_MAX = 500;
/** Users per shard of a sharded fact set: 16-bit offsets, and a bitmap of 4096 bytes. */
export const SHARD_USERS = 32_768;
/** A packed shard holds at most this many offsets; the next one turns it into a bitmap. */
export const MAX_PACKED = 2047;

/**
 * The type whose entities are stored under the bare id in group hashes: a decimal id that fits 64 bits
 * is kept as an integer inside a listpack (10 bytes instead of ~28 for `knowpost:<id>`).
 */
const BARE_ETYPE: EntityType = 'knowpost';

export function fnv1a32(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code > 0x7f) return fnv1a32Bytes(Buffer.from(text, 'utf8'));
    hash = Math.imul(hash ^ code, 0x01000193);
  }
  return hash >>> 0;
}

function fnv1a32Bytes(bytes: Uint8Array): number {
  let hash = 0x811c9dc5;
  for (const byte of bytes) hash = Math.imul(hash ^ byte, 0x01000193);
  return hash >>> 0;
}

export function counterGroup(ref: EntityRef, groups: number): number {
  return fnv1a32(entityKey(ref)) % groups;
}

// ---------------------------------------------------------------------------------------------
// Lua. Every script touches the keys of one group only, so it is atomic for that group and runs on
// one node of a cluster. Fact sets live in one of two encodings, decided per (entity, metric):
//   sparse:  SET of user ids (intset while small);
//   sharded: HASH, field = floor(uid / 32768), value = sorted 16-bit big-endian offsets (at most
//            2047 of them, so a packed value is never 4096 bytes long) or a 4096-byte bitmap (bit 0 =
//            most significant bit of byte 0, as SETBIT numbers them); field `n` = cardinality.
// A sharded key exists only while n > 0, so its existence alone decides the encoding.
// ---------------------------------------------------------------------------------------------

const SHARDED_LUA = `
local BITMAP = 4096
local MAX_PACKED = ${MAX_PACKED}

local function chars(bytes)
  local parts = {}
  for i = 1, #bytes, 1024 do
    parts[#parts + 1] = string.char(unpack(bytes, i, math.min(i + 1023, #bytes)))
  end
  return table.concat(parts)
end

-- Lower bound of off in a packed shard: the 0-based index where it is or would be, and whether it is there.
local function packed_find(s, off)
  local lo, hi = 0, #s / 2
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local p = mid * 2 + 1
    if s:byte(p) * 256 + s:byte(p + 1) < off then lo = mid + 1 else hi = mid end
  end
  local p = lo * 2 + 1
  return lo, p < #s and s:byte(p) * 256 + s:byte(p + 1) == off
end

local function to_bitmap(s)
  local bytes = {}
  for i = 1, BITMAP do bytes[i] = 0 end
  for p = 1, #s, 2 do
    local off = s:byte(p) * 256 + s:byte(p + 1)
    local i = math.floor(off / 8) + 1
    bytes[i] = bit.bor(bytes[i], bit.lshift(1, 7 - off % 8))
  end
  return chars(bytes)
end

local function shard_has(s, off)
  if #s == BITMAP then
    return bit.band(s:byte(math.floor(off / 8) + 1), bit.lshift(1, 7 - off % 8)) ~= 0
  end
  local _, found = packed_find(s, off)
  return found
end

local function sharded_set(key, shard, off, on)
  local s = redis.call('HGET', key, shard)
  if s and #s == BITMAP then
    local i = math.floor(off / 8) + 1
    local b, m = s:byte(i), bit.lshift(1, 7 - off % 8)
    if (bit.band(b, m) ~= 0) == on then return 0 end
    if on then b = bit.bor(b, m) else b = bit.band(b, bit.bnot(m)) end
    s = s:sub(1, i - 1) .. string.char(b) .. s:sub(i + 1)
    -- A bitmap whose last member left goes (its 4 KiB would stay for nothing while the post has
    -- members in other shards); only looked for when a byte turns zero.
    if b == 0 and not s:find('[^%z]') then
      redis.call('HDEL', key, shard)
    else
      redis.call('HSET', key, shard, s)
    end
  else
    s = s or ''
    local idx, found = packed_find(s, off)
    if found == on then return 0 end
    local p = idx * 2
    if on then
      s = s:sub(1, p) .. string.char(math.floor(off / 256), off % 256) .. s:sub(p + 1)
      if #s / 2 > MAX_PACKED then s = to_bitmap(s) end
      redis.call('HSET', key, shard, s)
    elseif #s == 2 then
      redis.call('HDEL', key, shard)
    else
      redis.call('HSET', key, shard, s:sub(1, p) .. s:sub(p + 3))
    end
  end
  if redis.call('HINCRBY', key, 'n', on and 1 or -1) <= 0 then redis.call('DEL', key) end
  return 1
end

local function to_sharded(set_key, hash_key)
  local shards, names = {}, {}
  for _, m in ipairs(redis.call('SMEMBERS', set_key)) do
    local u = tonumber(m)
    local name = string.format('%d', math.floor(u / ${SHARD_USERS}))
    if not shards[name] then shards[name] = {}; names[#names + 1] = name end
    local offs = shards[name]
    offs[#offs + 1] = u % ${SHARD_USERS}
  end
  local args, count = {}, 0
  for _, name in ipairs(names) do
    local offs = shards[name]
    table.sort(offs)
    local bytes = {}
    for i, off in ipairs(offs) do
      bytes[2 * i - 1] = math.floor(off / 256)
      bytes[2 * i] = off % 256
    end
    local s = chars(bytes)
    if #offs > MAX_PACKED then s = to_bitmap(s) end
    args[#args + 1] = name
    args[#args + 1] = s
    count = count + #offs
  end
  args[#args + 1] = 'n'
  args[#args + 1] = count
  redis.call('HSET', hash_key, unpack(args))
  redis.call('DEL', set_key)
end

-- Returns 1 when the fact set changed.
local function set_fact(set_key, hash_key, uid, shard, off, on, sparse_max)
  if redis.call('EXISTS', hash_key) == 1 then return sharded_set(hash_key, shard, off, on) end
  if not on then return redis.call('SREM', set_key, uid) end
  local added = redis.call('SADD', set_key, uid)
  if added == 1 and redis.call('SCARD', set_key) > sparse_max then to_sharded(set_key, hash_key) end
  return added
end

`;

const FACT_COUNT_LUA = `
local function fact_count(set_key, hash_key)
  local n = redis.call('HGET', hash_key, 'n')
  if n then return tonumber(n) end
  return redis.call('SCARD', set_key)
end

`;

// Needs FACT_COUNT_LUA.
const SNAPSHOT_LUA = `
local function unpack_snapshot(raw)
  if raw and #raw == 20 then
    local r, l, f, c, p = struct.unpack('>I4I4I4I4I4', raw)
    return {r, l, f, c, p}
  end
  return nil
end

local function pack_snapshot(c)
  return struct.pack('>I4I4I4I4I4', c[1], c[2], c[3], c[4], c[5])
end

-- After a rebuild from facts the mark becomes the current seq, so every event already issued is
-- skipped. A mark above seq means seq went backwards (lost writes); seq is raised so that new
-- changes are numbered above everything already counted.
local function settle_mark(seq_key, ap_key, field)
  local seq = redis.call('HGET', seq_key, field) or '0'
  local ap = redis.call('HGET', ap_key, field) or '0'
  if tonumber(ap) > tonumber(seq) then
    redis.call('HSET', seq_key, field, ap)
    seq = ap
  end
  if seq ~= '0' then redis.call('HSET', ap_key, field, seq) end
end

-- See CounterStore.rebuild.
local function rebuild_entity(snap_key, pd_key, seq_key, ap_key, field, like_set, like_hash, fav_set, fav_hash)
  local c = unpack_snapshot(redis.call('HGET', snap_key, field)) or {0, 0, 0, 0, 0}
  -- A field holds 32 bits: a count past them stays at the top rather than wrap to 0.
  c[2] = math.min(fact_count(like_set, like_hash), 4294967295)
  c[3] = math.min(fact_count(fav_set, fav_hash), 4294967295)
  redis.call('HSET', snap_key, field, pack_snapshot(c))
  redis.call('HDEL', pd_key, field .. ':1', field .. ':2')
  settle_mark(seq_key, ap_key, field)
  return c
end

-- Fact keys of a group's entity named by its field in the group hashes. Scripts that learn which
-- entities they need only as they run (apply, fold) build them from prefixes carrying the group's
-- hash tag, so these undeclared keys share the slot of the declared ones.
local function derived_fact_keys(sparse_prefix, sharded_prefix, bare_etype, field)
  local e = field
  if not string.find(field, ':', 1, true) then e = bare_etype .. ':' .. field end
  return sparse_prefix .. e .. ':like', sharded_prefix .. e .. ':like',
    sparse_prefix .. e .. ':fav', sharded_prefix .. e .. ':fav'
end
`;

// Fact change, seq increment and the unpublished record in one step: an event exists exactly when
// its change does. KEYS: like-or-fav set, its sharded hash, seq, unpublished.
// ARGV: entity field, event id prefix, uid, shard, offset, on, sparseMax, now, the record's tail
// after the event id (see unpublishedToken), '1' when the group must be sealed. Replies {-1, 0}
// when it must be and is not: its facts are gone, so nothing is changed or answered from them.
const TOGGLE_LUA = `${SHARDED_LUA}
if ARGV[10] == '1' and redis.call('HEXISTS', KEYS[3], '${SEAL_FIELD}') == 0 then
  return {-1, 0}
end
if set_fact(KEYS[1], KEYS[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6] == '1', tonumber(ARGV[7])) == 0 then
  return {0, 0}
end
local seq = redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
redis.call('ZADD', KEYS[4], ARGV[8], ARGV[2] .. ':' .. seq .. ARGV[9])
return {1, seq}
`;

// The fact changes of logged events of one entity and metric, each for a different user, without
// new events; seq only ever rises. KEYS: set, sharded hash, seq. ARGV: entity field, sparseMax,
// highest event seq of the entity, number of adds, the user ids to add, then those to remove.
const REPLAY_LUA = `${SHARDED_LUA}
local sparse_max = tonumber(ARGV[2])
local last_add = 4 + tonumber(ARGV[4])
for i = 5, #ARGV do
  local u = tonumber(ARGV[i])
  set_fact(KEYS[1], KEYS[2], ARGV[i], string.format('%d', math.floor(u / ${SHARD_USERS})), u % ${SHARD_USERS}, i <= last_add, sparse_max)
end
local seq = redis.call('HGET', KEYS[3], ARGV[1]) or '0'
if tonumber(ARGV[3]) > tonumber(seq) then redis.call('HSET', KEYS[3], ARGV[1], ARGV[3]) end
return 1
`;

// Atomic across both encodings: a conversion cannot hide a member between two reads. A fact set is
// in one encoding at a time (scripts convert it whole), so a member of the sparse set answers at
// once; otherwise the sharded hash, if any, decides. Sharded sets are rare (more than sparseMax
// holders), so one EXISTS over the sharded keys of the whole call comes first, and when none of
// them exists each flag is a single SISMEMBER rather than SISMEMBER plus HGET: a `redis.call`
// costs Redis more than the command it runs.
// KEYS: one key of the (first) entity's group, which routes the call in Redis Cluster mode, where
// every entity of a call is in that group. ARGV: uid, shard, offset, key prefix, then one string
// with each entity's group and `etype:eid`, all separated by spaces. The fact keys are built here (as
// factKey does), each in one concatenation, rather than sent: four keys per entity were most of the
// request's bytes and of the caller's work, and one string instead of two arguments per entity, and
// one string in reply instead of an array, cost the caller less to encode and to parse.
// Replies with a string of a like and a fav flag ('1'/'0') per entity, in order.
const FLAGS_LUA = `${SHARDED_LUA}
local uid, shard, off, base = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local sets, shards, n = {}, {}, 0
for g, e in string.gmatch(ARGV[5], '(%d+) (%S+)') do
  sets[n + 1] = base .. 'c:f:{' .. g .. '}:' .. e .. ':like'
  sets[n + 2] = base .. 'c:f:{' .. g .. '}:' .. e .. ':fav'
  shards[n + 1] = base .. 'c:fb:{' .. g .. '}:' .. e .. ':like'
  shards[n + 2] = base .. 'c:fb:{' .. g .. '}:' .. e .. ':fav'
  n = n + 2
end
local sharded = 0
for i = 1, n, 500 do sharded = sharded + redis.call('EXISTS', unpack(shards, i, math.min(i + 499, n))) end
local out = {}
for i = 1, n do
  local held = redis.call('SISMEMBER', sets[i], uid) == 1
  if not held and sharded > 0 then
    local s = redis.call('HGET', shards[i], shard)
    if s and shard_has(s, off) then held = true end
  end
  out[i] = held and '1' or '0'
end
return table.concat(out)
`;

// The snapshots of entities in many groups, on one node: one script instead of an HMGET per group,
// which costs the caller a command (and a reply) per group. KEYS: one snapshot key, which routes
// the call. ARGV: the snapshot key prefix up to the group, then one string with each entity's group
// and field, all separated by spaces. Replies with each snapshot in order (nil where missing).
const SNAPSHOTS_LUA = `
local base = ARGV[1]
local out, n = {}, 0
for g, f in string.gmatch(ARGV[2], '(%d+) (%S+)') do
  n = n + 1
  out[n] = redis.call('HGET', base .. g .. '}', f)
end
return out
`;

// KEYS: like set, like hash, fav set, fav hash.
const COUNT_LUA = `${FACT_COUNT_LUA}
return {fact_count(KEYS[1], KEYS[2]), fact_count(KEYS[3], KEYS[4])}
`;

// Per entity (ARGV after the three prefixes in sixes: field, fromSeq, toSeq, number of distinct
// events, like delta, fav delta; a delta is '' when the batch has no event of that metric): a run
// wholly at or below the applied mark is skipped; a gapless run starting right after the mark is
// added to pending deltas and the mark set to its end; anything else, a gap or an overlap with the
// mark, rebuilds the entity from facts, exact whatever order the events arrived in. A zero net
// delta is still recorded, so the next flush writes (or rebuilds) the snapshot. Replies with each
// entity's mark as it was before, from which the caller tells already counted events apart.
// KEYS: applied, pending, snapshots, seq. ARGV: sparse fact prefix, sharded fact prefix, bare etype, ...
const APPLY_LUA = `${FACT_COUNT_LUA}${SNAPSHOT_LUA}
local marks = {}
for i = 4, #ARGV, 6 do
  local field = ARGV[i]
  local from, to, n = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local mark = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  marks[#marks + 1] = mark
  if to <= mark then
    -- every event of the run was counted before
  elseif from == mark + 1 and to - from + 1 == n then
    if ARGV[i + 4] ~= '' then redis.call('HINCRBY', KEYS[2], field .. ':1', ARGV[i + 4]) end
    if ARGV[i + 5] ~= '' then redis.call('HINCRBY', KEYS[2], field .. ':2', ARGV[i + 5]) end
    redis.call('HSET', KEYS[1], field, ARGV[i + 2])
    -- Events above the entity's seq exist only after a reset; later changes must number above them.
    if to > tonumber(redis.call('HGET', KEYS[4], field) or '0') then redis.call('HSET', KEYS[4], field, ARGV[i + 2]) end
  else
    local ls, lh, fs, fh = derived_fact_keys(ARGV[1], ARGV[2], ARGV[3], field)
    rebuild_entity(KEYS[3], KEYS[2], KEYS[4], KEYS[1], field, ls, lh, fs, fh)
  end
end
return marks
`;

// Removes a group's dirty mark only while it still holds the token the flusher read before its
// fold: an apply marking the group after that read has replaced the token, so its deltas keep the
// group marked whenever the flusher (or the applier) stops. KEYS: dirty. ARGV: group, token, ...
const UNMARK_LUA = `
local removed = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    removed = removed + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return removed
`;

// Folds all pending deltas of the group into its snapshots and clears them, in one step. An entity
// whose snapshot is missing or malformed is rebuilt from its facts instead.
// KEYS: pending, snapshots, seq, applied. ARGV: sparse fact prefix, sharded fact prefix, bare etype.
// Replies {entities folded, fields clamped at zero (a negative count is a bug upstream)}.
const FOLD_LUA = `${FACT_COUNT_LUA}${SNAPSHOT_LUA}
local pending = redis.call('HGETALL', KEYS[1])
if #pending == 0 then return {0, 0} end
local deltas, order = {}, {}
for i = 1, #pending, 2 do
  local field, idx = string.match(pending[i], '^(.*):(%d)$')
  if field then
    local d = deltas[field]
    if not d then
      d = {0, 0, 0, 0, 0}
      deltas[field] = d
      order[#order + 1] = field
    end
    local k = tonumber(idx) + 1
    -- Only the five fields of the layout; anything else is no delta of this store's and is dropped.
    if k <= 5 then d[k] = d[k] + tonumber(pending[i + 1]) end
  end
end
local clamped = 0
for _, field in ipairs(order) do
  local c = unpack_snapshot(redis.call('HGET', KEYS[2], field))
  if c then
    local d = deltas[field]
    for k = 1, 5 do
      local v = c[k] + d[k]
      if v < 0 then
        v = 0
        clamped = clamped + 1
      elseif v > 4294967295 then
        v = 4294967295
      end
      c[k] = v
    end
    redis.call('HSET', KEYS[2], field, pack_snapshot(c))
  else
    local ls, lh, fs, fh = derived_fact_keys(ARGV[1], ARGV[2], ARGV[3], field)
    rebuild_entity(KEYS[2], KEYS[1], KEYS[3], KEYS[4], field, ls, lh, fs, fh)
  end
end
redis.call('DEL', KEYS[1])
return {#order, clamped}
`;

// KEYS: like set, like hash, fav set, fav hash, snapshots, pending, seq, applied. ARGV: entity field.
const REBUILD_LUA = `${FACT_COUNT_LUA}${SNAPSHOT_LUA}
return rebuild_entity(KEYS[5], KEYS[6], KEYS[7], KEYS[8], ARGV[1], KEYS[1], KEYS[2], KEYS[3], KEYS[4])
`;

// Adds views to the `read` field (index 0) of each entity's snapshot, saturating at 2^32 - 1; nothing
// else of the entity changes. A missing or malformed snapshot is first rebuilt from facts.
// KEYS: per group of the call its snapshots, pending, seq, applied and view-mark hashes. ARGV[1]: the
// bare etype; ARGV[2]: '1' when each group must be sealed; then per group: w, w triples (field,
// expected, value) of view marks (see addLoggedViews), the number n of entities, the sparse and
// sharded fact prefixes, n pairs of field and views. When a group must be sealed and is not, the
// call changes nothing and returns -1; when a mark's field does not hold `expected` ('' for none),
// it changes nothing and returns 0; else the marks are set to their values with the views, and it
// returns 1.
const VIEWS_LUA = `${FACT_COUNT_LUA}${SNAPSHOT_LUA}
local i, k = 3, 1
while i <= #ARGV do
  if ARGV[2] == '1' and redis.call('HEXISTS', KEYS[k + 2], '${SEAL_FIELD}') == 0 then return -1 end
  local w = tonumber(ARGV[i])
  for j = i + 1, i + 3 * w, 3 do
    if (redis.call('HGET', KEYS[k + 4], ARGV[j]) or '') ~= ARGV[j + 1] then return 0 end
  end
  i = i + 1 + 3 * w
  i = i + 3 + 2 * tonumber(ARGV[i])
  k = k + 5
end
i, k = 3, 1
while i <= #ARGV do
  local w = tonumber(ARGV[i])
  for j = i + 1, i + 3 * w, 3 do
    redis.call('HSET', KEYS[k + 4], ARGV[j], ARGV[j + 2])
  end
  i = i + 1 + 3 * w
  local n = tonumber(ARGV[i])
  for j = i + 3, i + 1 + 2 * n, 2 do
    local field = ARGV[j]
    local c = unpack_snapshot(redis.call('HGET', KEYS[k], field))
    if not c then
      local ls, lh, fs, fh = derived_fact_keys(ARGV[i + 1], ARGV[i + 2], ARGV[1], field)
      c = rebuild_entity(KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], field, ls, lh, fs, fh)
    end
    c[1] = math.min(c[1] + tonumber(ARGV[j + 1]), 4294967295)
    redis.call('HSET', KEYS[k], field, pack_snapshot(c))
  end
  i = i + 3 + 2 * n
  k = k + 5
end
return 1
`;

// One instant of an entity. Called through the Buffer variant, so the snapshot's bytes arrive intact.
// KEYS: like set, like hash, fav set, fav hash, snapshots, pending, seq, applied. ARGV: entity field.
const INSPECT_LUA = `${FACT_COUNT_LUA}
local field = ARGV[1]
local pending = redis.call('HEXISTS', KEYS[6], field .. ':1') + redis.call('HEXISTS', KEYS[6], field .. ':2')
return {
  tonumber(redis.call('HGET', KEYS[7], field) or '0'),
  tonumber(redis.call('HGET', KEYS[8], field) or '0'),
  pending,
  fact_count(KEYS[1], KEYS[2]),
  fact_count(KEYS[3], KEYS[4]),
  redis.call('HGET', KEYS[5], field),
  redis.call('HEXISTS', KEYS[7], '${SEAL_FIELD}'),
}
`;

// Seals a group for the replay whose token it carries (see `seal`). KEYS: seq hash. ARGV: token.
const SEAL_IF_LUA = `
if redis.call('HGET', KEYS[1], '${RESTORE_FIELD}') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], '${SEAL_FIELD}', '1')
redis.call('HDEL', KEYS[1], '${RESTORE_FIELD}')
return 1
`;

const CMD = {
  toggle: 'zgCounterToggle',
  sealIf: 'zgCounterSealIf',
  replay: 'zgCounterReplay',
  flags: 'zgCounterFlags',
  count: 'zgCounterCount',
  apply: 'zgCounterApply',
  fold: 'zgCounterFold',
  rebuild: 'zgCounterRebuild',
  inspect: 'zgCounterInspect',
  unmark: 'zgCounterUnmark',
  views: 'zgCounterViews',
  snapshots: 'zgCounterSnapshots',
} as const;

/**
 * Scripts a client should send as soon as they are called rather than in its next auto-pipeline
 * (ioredis' `autoPipeliningIgnoredCommands`). Auto-pipelining holds a command until the event loop
 * has gone through the I/O it had waiting, so Redis starts on it only then; worth it for cheap
 * commands, whose batching saves Redis work, but a page's flags take Redis ~50 µs, and running
 * them while the process goes on with other requests gets more through (`npx tsx bench/flags.ts`).
 * Only scripts that need no order with other commands belong here (not the toggle, whose index
 * write must go first).
 */
export const SEND_AT_ONCE: readonly string[] = [CMD.flags];

type ScriptPipeline = ChainableCommander &
  Record<(typeof CMD)[keyof typeof CMD], (...args: (string | number)[]) => ChainableCommander>;

/** Pipelines beyond this many commands are split, so one call never builds an unbounded reply. */
const PIPELINE_CHUNK = 2_000;
/** Facts one replay script applies at most, so no script holds the server long. */
const REPLAY_SCRIPT_FACTS = 1_000;
/** Replay pipelines in flight at once. */
const REPLAY_CONCURRENCY = 4;
/** Groups read per pipeline by the background scans (unpublished, entities, samples). */
const SCAN_CHUNK = 256;
const DIRTY_CHECK_MAX = 256;
/** Entities per views or snapshots script, so one call never holds the server long. */
const VIEWS_CHUNK = 500;
/**
 * From how many groups on one node `readSnapshots` reads with one script rather than an `HMGET` per
 * group. Each command costs the calling process several microseconds (its object, promise, encoding
 * and reply), the script costs Redis more than the HMGETs would; in all, the script costs somewhat
 * less at 4 groups and less than half at 20 (`npx tsx bench/snapshot-reads.ts`).
 */
export const SNAPSHOTS_SCRIPT_GROUPS = 4;
const MAX_U32 = 0xffffffff;
/** Groups a flush checks for pending deltas without a dirty mark, in rotation (a safety net, see flush). */
const SWEEP_CHUNK = 128;
/** Groups each `staleUnpublished` call checks beside its index, in rotation (a safety net, see there). */
const UNPUBLISHED_SWEEP = 16;

/** One entity's events of an `applyEvents` batch, folded; a delta is null when the batch has no event of that metric. */
interface EntityRun {
  group: number;
  field: string;
  seqs: Set<number>;
  from: number;
  to: number;
  like: number | null;
  fav: number | null;
}

/** One (entity, metric) of a `replayFacts` call: per user, the event with the highest seq. */
interface ReplaySet {
  etype: EntityType;
  eid: string;
  metric: FactMetric;
  top: number;
  users: Map<number, CounterEvent>;
}

interface Addressed {
  group: number;
  field: string;
}

/** The score of a `ZRANGE key 0 0 WITHSCORES` reply, null for an empty set. */
/**
 * An unpublished record holds its whole event, so the repair job can publish it again:
 * `<eventId>:<metric>:<userId>:<1 for an add, 0 for a removal>:<ts>` (ts is the toggle's time, the
 * record's first score). Records written before the tail existed are the bare event id.
 */
function tokenTail(metric: FactMetric, userId: number, delta: 1 | -1, ts: number): string {
  return `:${metric}:${userId}:${delta > 0 ? 1 : 0}:${ts}`;
}

function unpublishedToken(e: CounterEvent): string {
  return `${e.eventId}${tokenTail(e.metric, e.userId, e.delta, e.ts)}`;
}

function parseUnpublished(token: string): StaleEvent | null {
  const [etype, eid, seq, metric, userId, add, ts, ...rest] = token.split(':');
  const ref = parseEntityKey(`${etype}:${eid}`);
  if (!ref || !/^\d+$/.test(seq ?? '') || rest.length > 0) return null;
  if (metric === undefined) return { ref, token, event: null };
  if (
    !(FACT_METRICS as readonly string[]).includes(metric) ||
    !/^\d+$/.test(userId ?? '') ||
    !/^[01]$/.test(add ?? '') ||
    !/^\d+$/.test(ts ?? '')
  )
    return null;
  return {
    ref,
    token,
    event: eventFor(ref, metric as FactMetric, Number(userId), add === '1' ? 1 : -1, Number(seq), Number(ts)),
  };
}

function oldestScore(reply: unknown): number | null {
  const pair = reply as string[];
  return pair.length >= 2 ? Number(pair[1]) : null;
}

function toInt(value: unknown): number {
  return typeof value === 'number' ? value : Number(value);
}

function checkUserId(userId: number): void {
  if (!Number.isSafeInteger(userId) || userId < 0) throw new RangeError(`invalid user id: ${userId}`);
}

function checkViews(n: number): void {
  if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`invalid view count: ${n}`);
}

function checkRef(ref: EntityRef): void {
  if (parseEntityKey(entityKey(ref)) === null) throw new RangeError(`invalid entity: ${entityKey(ref)}`);
}

function shuffle<T>(items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [items[i], items[j]] = [items[j] as T, items[i] as T];
  }
  return items;
}

/**
 * `CounterStore` on Redis. Keys (g = fnv1a32(`etype:eid`) % groups, always inside `{g}`, so one
 * group is one cluster slot):
 *   c:f:{g}:<etype>:<eid>:<metric>   sparse fact SET          c:fb:{g}:…   sharded fact HASH
 *   c:seq:{g}  HASH entity → seq      c:ap:{g}  HASH entity → applied mark
 *   c:pd:{g}   HASH entity:idx → pending delta
 *   c:s:{g}    HASH entity → 20-byte snapshot
 *   c:un:{g}   ZSET unpublished event (unpublishedToken) by toggle time
 *   c:dirty    HASH group → token: groups with pending deltas        } the two keys outside
 *   c:unpub    ZSET group by oldest unpublished event (a lower bound) } any group
 * where "entity" is the bare eid for posts and `etype:eid` otherwise.
 *
 * Round trips: `toggle`, `factCounts`, `rebuild`, `inspect`, `flags` (any page size),
 * `readSnapshots` (any number), `addViews` (any number), `applyEvents` (all groups of the batch)
 * and `markPublished` take one; `flush` two (three when it folded a group or its sweep found an unmarked one);
 * `staleUnpublished` one when nothing is stale. The request paths (`toggle`, `flags`,
 * `readSnapshots`, `markPublished`, `addViews`) issue their commands on the client in one tick
 * rather than in a pipeline of their own, so a client with auto-pipelining writes the commands of
 * every request in flight at once (but for `SEND_AT_ONCE`, which such a client sends as soon as it
 * is called); background work keeps explicit pipelines. The scans over all
 * groups (`scanEntities`, `sampleEntities`, `reset`) are for background jobs and admin tools.
 *
 * The dirty mark lives outside every group's slot, so a group's scripts cannot set or clear it
 * together with the pending deltas. "A group with pending deltas is marked" holds by ordering and
 * tokens instead: an apply marks its groups before and after its scripts (one pipeline on one
 * connection, so in that order), each time with a token never used before; a flusher reads the
 * token, folds, and removes the mark only if the token is unchanged. Deltas that reach a group
 * after its fold come with a new token, so whenever either process dies, the mark survives. The one
 * window left, an applier dying between its script and its second mark while a flusher cleared the
 * first, is closed by each flush re-marking unmarked groups it finds with pending deltas, a few
 * groups per call in rotation.
 */
export class RedisCounterStore implements CounterStore {
  readonly groups: number;
  readonly sparseMax: number;
  private readonly prefix: string;
  private readonly dirtyKey: string;
  private readonly toggleScript: ScriptCall;
  private readonly countScript: ScriptCall;
  private readonly flagsScript: ScriptCall;
  private readonly singleNode: boolean;
  private readonly rebuildScript: ScriptCall;
  private readonly inspectScript: ScriptCall;
  private readonly viewsScript: ScriptCall;
  /** The view marks this process last read or wrote, by `group:partition` ('' for none). */
  private readonly viewMarks = new Map<string, string>();
  private readonly snapshotsScript: ScriptCall;
  private clamped = 0;
  /** Marks are this instance's random prefix plus a counter: unique across processes and restarts. */
  private readonly markPrefix = randomBytes(6).toString('base64url');
  private marks = 0;
  private sweepFrom = 0;
  private sweptUnpublished = false;
  private unpubSweepFrom = 0;
  private readonly unpubKey: string;
  private readonly requireSeal: boolean;
  private readonly onUnsealed: (group: number) => void;

  constructor(
    private readonly redis: Redis,
    options: RedisCounterStoreOptions,
  ) {
    if (options.prefix.includes('{')) throw new RangeError('the key prefix must not contain "{"');
    const groups = options.groups ?? DEFAULT_GROUPS;
    const sparseMax = options.sparseMax ?? DEFAULT_SPARSE_MAX;
    if (!Number.isInteger(groups) || groups < 1) throw new RangeError(`invalid groups: ${groups}`);
    if (!Number.isInteger(sparseMax) || sparseMax < 1 || sparseMax > MAX_PACKED) {
      throw new RangeError(`invalid sparseMax: ${sparseMax}`);
    }
    this.prefix = options.prefix;
    this.groups = groups;
    this.sparseMax = sparseMax;
    this.dirtyKey = `${this.prefix}c:dirty`;
    this.unpubKey = `${this.prefix}c:unpub`;
    this.toggleScript = defineScript<ScriptCall>(redis, CMD.toggle, 4, TOGGLE_LUA);
    defineScript(redis, CMD.replay, 3, REPLAY_LUA);
    defineScript(redis, CMD.sealIf, 1, SEAL_IF_LUA);
    this.flagsScript = defineScript<ScriptCall>(redis, CMD.flags, null, FLAGS_LUA);
    this.singleNode = options.singleNode ?? true;
    this.requireSeal = options.requireSeal ?? false;
    this.onUnsealed = options.onUnsealed ?? (() => undefined);
    this.countScript = defineScript<ScriptCall>(redis, CMD.count, 4, COUNT_LUA);
    defineScript(redis, CMD.apply, 4, APPLY_LUA);
    defineScript(redis, CMD.fold, 4, FOLD_LUA);
    this.rebuildScript = defineScript<ScriptCall>(redis, CMD.rebuild, 8, REBUILD_LUA);
    defineScript(redis, CMD.inspect, 8, INSPECT_LUA);
    defineScript(redis, CMD.unmark, 1, UNMARK_LUA);
    this.viewsScript = defineScript<ScriptCall>(redis, CMD.views, null, VIEWS_LUA);
    this.inspectScript = bufferVariant(redis, CMD.inspect);
    defineScript(redis, CMD.snapshots, 1, SNAPSHOTS_LUA);
    this.snapshotsScript = bufferVariant(redis, CMD.snapshots);
  }

  get clampedFields(): number {
    return this.clamped;
  }

  groupOf(ref: EntityRef): number {
    return counterGroup(ref, this.groups);
  }

  /** Name of a group-level key: `seq`, `ap` (applied), `pd` (pending), `s` (snapshots) or `un` (unpublished). */
  groupKey(kind: 'seq' | 'ap' | 'pd' | 's' | 'un' | 'vm', group: number): string {
    return `${this.prefix}c:${kind}:{${group}}`;
  }

  /** The sparse (SET) or sharded (HASH) fact key of an entity's metric. */
  factKey(ref: EntityRef, metric: FactMetric, sharded: boolean): string {
    return `${this.factPrefix(this.groupOf(ref), sharded)}${entityKey(ref)}:${metric}`;
  }

  private factPrefix(group: number, sharded: boolean): string {
    return `${this.prefix}c:${sharded ? 'fb' : 'f'}:{${group}}:`;
  }

  private fieldOf(ref: EntityRef): string {
    return ref.etype === BARE_ETYPE ? ref.eid : entityKey(ref);
  }

  private refOfField(field: string): EntityRef | null {
    return parseEntityKey(field.includes(':') ? field : `${BARE_ETYPE}:${field}`);
  }

  private address(ref: EntityRef): Addressed {
    return { group: this.groupOf(ref), field: this.fieldOf(ref) };
  }

  private factKeys(ref: EntityRef): string[] {
    return FACT_METRICS.flatMap((metric) => [
      this.factKey(ref, metric, false),
      this.factKey(ref, metric, true),
    ]);
  }

  private pipeline(): ScriptPipeline {
    return this.redis.pipeline() as ScriptPipeline;
  }

  async toggle(
    ref: EntityRef,
    metric: FactMetric,
    userId: number,
    on: boolean,
    now: number,
  ): Promise<ToggleResult> {
    checkRef(ref);
    checkUserId(userId);
    const group = this.groupOf(ref);
    // The group enters the index of groups with unpublished events before the script can record
    // one there. Same tick: auto-pipelining writes both in one go, in this order (see staleUnpublished).
    const indexed = this.indexUnpublished(group, now);
    const reply = (await this.toggleScript(
      this.factKey(ref, metric, false),
      this.factKey(ref, metric, true),
      this.groupKey('seq', group),
      this.groupKey('un', group),
      this.fieldOf(ref),
      entityKey(ref),
      userId,
      Math.floor(userId / SHARD_USERS),
      userId % SHARD_USERS,
      on ? 1 : 0,
      this.sparseMax,
      now,
      tokenTail(metric, userId, on ? 1 : -1, now),
      this.requireSeal ? '1' : '0',
    )) as [number, number];
    if (reply[0] === -1) {
      this.onUnsealed(group);
      throw new UnavailableError(
        'Likes and favourites are being restored after a data loss; try again later',
        { retryAfterSeconds: RESTORE_RETRY_AFTER_S },
      );
    }
    if (reply[0] !== 1) return { changed: false, state: on, event: null, published: false };
    // Once more if the first attempt failed; failing again, the sweep of staleUnpublished finds the group.
    if (!(await indexed)) await this.indexUnpublished(group, now);
    return {
      changed: true,
      state: on,
      event: eventFor(ref, metric, userId, on ? 1 : -1, reply[1], now),
      published: false,
    };
  }

  /**
   * Marks every group as holding its facts (see `SEAL_FIELD`): at a deployment's first start, once
   * at the first start of a release that checks seals, and after a replay brought the facts back.
   * With a replay's `token`, a group only while it still carries the token (`RESTORE_FIELD`), which
   * goes: one emptied meanwhile (Redis wiped under the replay) stays unsealed.
   */
  async seal(groups?: readonly number[], token?: string): Promise<void> {
    // Highest first, so that group 0 (which `unseal` takes first) is sealed last: while it is not,
    // some group may not be (`restoring`), whichever pipeline a failure stops at.
    const all = [...(groups ?? Array.from({ length: this.groups }, (_, g) => g))].sort((a, b) => b - a);
    for (let from = 0; from < all.length; from += SCAN_CHUNK) {
      const pipeline = this.redis.pipeline() as unknown as Record<string, (...args: string[]) => unknown> &
        ReturnType<Redis['pipeline']>;
      for (const g of all.slice(from, from + SCAN_CHUNK)) {
        if (token === undefined) pipeline.hset(this.groupKey('seq', g), SEAL_FIELD, '1');
        else pipeline[CMD.sealIf]!(this.groupKey('seq', g), token);
      }
      await execPipeline(pipeline);
    }
  }

  /**
   * The groups sealed now are read first, so a failure half-way seals them again before it is told.
   * With a replay's `token`, every group carries it from now on (see `seal`).
   */
  async unseal(token?: string): Promise<number[]> {
    const sealed = (await this.sealFlags()).flatMap((on, g) => (on ? [g] : []));
    try {
      if (token !== undefined) await this.claimForRestore(token);
      for (let from = 0; from < sealed.length; from += SCAN_CHUNK) {
        const pipeline = this.redis.pipeline();
        for (const g of sealed.slice(from, from + SCAN_CHUNK))
          pipeline.hdel(this.groupKey('seq', g), SEAL_FIELD);
        await execPipeline(pipeline);
      }
    } catch (err) {
      await this.seal(sealed, token).catch(() => undefined);
      throw err;
    }
    return sealed;
  }

  async claimForRestore(token: string): Promise<void> {
    for (let from = 0; from < this.groups; from += SCAN_CHUNK) {
      const pipeline = this.redis.pipeline();
      for (let g = from; g < Math.min(this.groups, from + SCAN_CHUNK); g++)
        pipeline.hset(this.groupKey('seq', g), RESTORE_FIELD, token);
      await execPipeline(pipeline);
    }
  }

  async unsealedGroups(): Promise<number> {
    if (!this.requireSeal) return 0;
    return (await this.sealFlags()).filter((on) => !on).length;
  }

  /** Group 0's seal: the last `seal` sets and the first `unseal` takes away. */
  async restoring(): Promise<boolean> {
    if (!this.requireSeal) return false;
    return (await this.redis.hexists(this.groupKey('seq', 0), SEAL_FIELD)) === 0;
  }

  /** Whether each group, by number, carries its seal. */
  private async sealFlags(): Promise<boolean[]> {
    const flags: boolean[] = [];
    for (let from = 0; from < this.groups; from += SCAN_CHUNK) {
      const pipeline = this.redis.pipeline();
      const end = Math.min(this.groups, from + SCAN_CHUNK);
      for (let g = from; g < end; g++) pipeline.hexists(this.groupKey('seq', g), SEAL_FIELD);
      for (const n of (await execPipeline(pipeline)) as number[]) flags.push(n > 0);
    }
    return flags;
  }

  async flags(userId: number, refs: readonly EntityRef[]): Promise<Flags[]> {
    checkUserId(userId);
    if (refs.length === 0) return [];
    // Each ref goes into a space-separated argument: one with a space in it would shift the rest.
    refs.forEach(checkRef);
    const shard = Math.floor(userId / SHARD_USERS);
    const offset = userId % SHARD_USERS;
    const groups = refs.map((ref) => this.groupOf(ref));
    const call = async (indexes: number[]): Promise<[number[], string]> => {
      let entities = '';
      for (const i of indexes) entities += `${groups[i]!} ${entityKey(refs[i]!)} `;
      const route = this.groupKey('s', groups[indexes[0]!]!);
      const reply = (await this.flagsScript(
        1,
        route,
        userId,
        shard,
        offset,
        this.prefix,
        entities,
      )) as string;
      return [indexes, reply];
    };
    const all = refs.map((_, i) => i);
    // Per group, issued in one tick (sent at once by a client that lists them in SEND_AT_ONCE).
    const replies = this.singleNode
      ? [await call(all)]
      : await Promise.all([...byGroup(all, (i) => groups[i]!).values()].map(call));
    const out = new Array<Flags>(refs.length);
    for (const [indexes, flags] of replies) {
      indexes.forEach((i, k) => (out[i] = { like: flags[2 * k] === '1', fav: flags[2 * k + 1] === '1' }));
    }
    return out;
  }

  async factCounts(ref: EntityRef): Promise<Record<FactMetric, number>> {
    const [like, fav] = (await this.countScript(...this.factKeys(ref))) as [number, number];
    return { like, fav };
  }

  async readSnapshots(refs: readonly EntityRef[]): Promise<(Counts | null)[]> {
    if (refs.length === 0) return [];
    const byGroup = new Map<number, number[]>();
    const addressed = refs.map((ref) => this.address(ref));
    addressed.forEach((a, i) => {
      const list = byGroup.get(a.group);
      if (list) list.push(i);
      else byGroup.set(a.group, [i]);
    });
    if (this.singleNode && byGroup.size >= SNAPSHOTS_SCRIPT_GROUPS) {
      refs.forEach(checkRef); // as in `flags`
      const chunks: Promise<(Buffer | null)[]>[] = [];
      for (let start = 0; start < addressed.length; start += VIEWS_CHUNK) {
        const chunk = addressed.slice(start, start + VIEWS_CHUNK);
        let entities = '';
        for (const a of chunk) entities += `${a.group} ${a.field} `;
        const call = this.snapshotsScript(
          this.groupKey('s', chunk[0]!.group),
          `${this.prefix}c:s:{`,
          entities,
        );
        chunks.push(call as Promise<(Buffer | null)[]>);
      }
      return (await Promise.all(chunks)).flat().map((value) => decodeSnapshot(value));
    }
    const replies = await Promise.all(
      [...byGroup].map(([group, indexes]) =>
        this.redis.hmgetBuffer(
          this.groupKey('s', group),
          ...indexes.map((i) => (addressed[i] as Addressed).field),
        ),
      ),
    );
    const out: (Counts | null)[] = new Array<Counts | null>(refs.length).fill(null);
    let r = 0;
    for (const indexes of byGroup.values()) {
      const values = replies[r++] ?? [];
      indexes.forEach((i, k) => (out[i] = decodeSnapshot(values[k])));
    }
    return out;
  }

  async rebuild(ref: EntityRef): Promise<Counts> {
    const { group, field } = this.address(ref);
    const reply = (await this.rebuildScript(
      ...this.factKeys(ref),
      this.groupKey('s', group),
      this.groupKey('pd', group),
      this.groupKey('seq', group),
      this.groupKey('ap', group),
      field,
    )) as number[];
    return [reply[0] ?? 0, reply[1] ?? 0, reply[2] ?? 0, reply[3] ?? 0, reply[4] ?? 0];
  }

  async addViews(entries: readonly ViewIncrement[]): Promise<void> {
    const byGroup = this.viewsByGroup(entries);
    // Calls of up to VIEWS_CHUNK entities: on one node a call spans groups, in cluster mode it stays in
    // one. Issued in one tick: the client's auto-pipelining writes them together, one round trip.
    const calls: Promise<unknown>[] = [];
    let keys: string[] = [];
    let args: (string | number)[] = [];
    let size = 0;
    const send = (): void => {
      if (size > 0) calls.push(this.viewsScript(keys.length, ...keys, BARE_ETYPE, '0', ...args));
      keys = [];
      args = [];
      size = 0;
    };
    for (const [group, fields] of byGroup) {
      const pairs = [...fields];
      for (let start = 0; start < pairs.length;) {
        const take = pairs.slice(start, start + VIEWS_CHUNK - size);
        keys.push(...this.viewsKeys(group));
        args.push(
          0,
          take.length,
          this.factPrefix(group, false),
          this.factPrefix(group, true),
          ...take.flat(),
        );
        size += take.length;
        start += take.length;
        if (size >= VIEWS_CHUNK) send();
      }
      if (!this.singleNode) send();
    }
    send();
    await Promise.all(calls);
  }

  /**
   * Each group's views go in one call with its view marks (one per partition of the records), whole:
   * a group is never split, so its views and marks move together. A call is sent on condition that
   * each mark still holds what this process last knew of it (nothing, at first); one refused
   * because a mark moved (another member, another process, or what this one has not seen yet) reads
   * its groups' marks, leaves out the records they name as added and is sent again. Usually one round
   * trip: a partition is handed to one member at a time, which knows its marks after its first call.
   */
  async addLoggedViews(
    records: readonly LoggedViews[],
    covered?: ReadonlyMap<number, readonly OffsetRange[]>,
    options: { restoring?: boolean } = {},
  ): Promise<number> {
    const sealed = this.requireSeal && !options.restoring ? '1' : '0';
    const ranges = coveredRanges(records, covered);
    const byGroup = new Map<number, GroupViews[]>();
    for (const record of records) {
      for (const [group, fields] of this.viewsByGroup(record.views)) {
        let parts = byGroup.get(group);
        if (!parts) byGroup.set(group, (parts = []));
        parts.push({ record, fields });
      }
    }
    // On one node groups share a call up to VIEWS_CHUNK entities; in cluster mode a call is one group.
    const calls: number[][] = [];
    let call: number[] = [];
    let size = 0;
    for (const [group, parts] of byGroup) {
      call.push(group);
      size += new Set(parts.flatMap((part) => [...part.fields.keys()])).size;
      if (!this.singleNode || size >= VIEWS_CHUNK) {
        calls.push(call);
        call = [];
        size = 0;
      }
    }
    if (call.length > 0) calls.push(call);
    if (this.viewMarks.size > VIEW_MARKS_KNOWN) this.viewMarks.clear();
    // Every call settles before the answer, so none lands after a failure was reported.
    const settled = await Promise.allSettled(
      calls.map(async (groups) => {
        for (let attempt = 0; ; attempt++) {
          const sent = this.loggedViewsCall(groups, byGroup, ranges);
          const done = await this.viewsScript(
            sent.keys.length,
            ...sent.keys,
            BARE_ETYPE,
            sealed,
            ...sent.args,
          );
          if (done === -1) {
            throw new UnavailableError(
              'Views wait while the counter store is being restored; try again later',
              { retryAfterSeconds: RESTORE_RETRY_AFTER_S },
            );
          }
          if (done === 1) {
            for (const [key, value] of sent.marks) this.viewMarks.set(key, value);
            return sent.views;
          }
          if (attempt === VIEW_MARK_ATTEMPTS) {
            throw new Error(`the view marks of groups ${groups.join(', ')} kept moving`);
          }
          await Promise.all(
            groups.map(async (group) => {
              const partitions = [...new Set(byGroup.get(group)!.map((part) => part.record.partition))];
              const values = await this.redis.hmget(this.groupKey('vm', group), ...partitions.map(String));
              partitions.forEach((p, i) => this.viewMarks.set(`${group}:${p}`, values[i] ?? ''));
            }),
          );
        }
      }),
    );
    let added = 0;
    for (const result of settled) {
      if (result.status === 'rejected') throw result.reason;
      added += result.value;
    }
    return added;
  }

  /**
   * The keys and arguments of one views call (see VIEWS_LUA) for whole groups, expecting the marks
   * this process knows: the records those name as added are left out. With the views it adds and
   * the marks it sets.
   */
  private loggedViewsCall(
    groups: readonly number[],
    byGroup: ReadonlyMap<number, readonly GroupViews[]>,
    ranges: ReadonlyMap<number, readonly OffsetRange[]>,
  ): { keys: string[]; args: (string | number)[]; views: number; marks: Map<string, string> } {
    const keys: string[] = [];
    const args: (string | number)[] = [];
    const marks = new Map<string, string>();
    let views = 0;
    for (const group of groups) {
      const parts = byGroup.get(group)!;
      const byPartition = new Map<number, GroupViews[]>();
      for (const part of parts) {
        const list = byPartition.get(part.record.partition);
        if (list) list.push(part);
        else byPartition.set(part.record.partition, [part]);
      }
      const triples: string[] = [];
      const fields = new Map<string, number>();
      for (const [partition, list] of byPartition) {
        const key = `${group}:${partition}`;
        const expected = this.viewMarks.get(key) ?? '';
        const { add, next: value } = planStoredViewMark(
          expected,
          ranges.get(partition)!,
          list.map((part) => part.record),
        );
        triples.push(String(partition), expected, value);
        marks.set(key, value);
        list.forEach((part, i) => {
          if (!add[i]) return;
          for (const [field, n] of part.fields) {
            fields.set(field, Math.min(MAX_U32, (fields.get(field) ?? 0) + n));
            views += n;
          }
        });
      }
      keys.push(...this.viewsKeys(group));
      args.push(
        triples.length / 3,
        ...triples,
        fields.size,
        this.factPrefix(group, false),
        this.factPrefix(group, true),
        ...[...fields].flat(),
      );
    }
    return { keys, args, views, marks };
  }

  /** The views of `entries` per group and entity field, summed (saturating); zeros left out. */
  private viewsByGroup(entries: readonly ViewIncrement[]): Map<number, Map<string, number>> {
    const byGroup = new Map<number, Map<string, number>>();
    for (const { ref, n } of entries) {
      checkRef(ref);
      checkViews(n);
      if (n === 0) continue;
      const { group, field } = this.address(ref);
      let fields = byGroup.get(group);
      if (!fields) byGroup.set(group, (fields = new Map<string, number>()));
      fields.set(field, Math.min(MAX_U32, (fields.get(field) ?? 0) + n));
    }
    return byGroup;
  }

  private viewsKeys(group: number): string[] {
    return [
      this.groupKey('s', group),
      this.groupKey('pd', group),
      this.groupKey('seq', group),
      this.groupKey('ap', group),
      this.groupKey('vm', group),
    ];
  }

  async inspect(ref: EntityRef): Promise<Inspection> {
    const { group, field } = this.address(ref);
    const reply = (await this.inspectScript(
      ...this.factKeys(ref),
      this.groupKey('s', group),
      this.groupKey('pd', group),
      this.groupKey('seq', group),
      this.groupKey('ap', group),
      field,
    )) as [number, number, number, number, number, Buffer | null, number];
    return {
      seq: reply[0],
      applied: reply[1],
      pending: reply[2] > 0,
      snapshot: decodeSnapshot(reply[5]),
      facts: { like: reply[3], fav: reply[4] },
      sealed: !this.requireSeal || reply[6] === 1,
    };
  }

  async applyEvents(events: readonly CounterEvent[]): Promise<{ applied: number; skipped: number }> {
    const runs = new Map<string, EntityRun>();
    for (const event of events) {
      const ref: EntityRef = { etype: event.entityType, eid: event.entityId };
      const key = entityKey(ref);
      let run = runs.get(key);
      if (!run) {
        run = {
          group: this.groupOf(ref),
          field: this.fieldOf(ref),
          seqs: new Set(),
          from: event.seq,
          to: event.seq,
          like: null,
          fav: null,
        };
        runs.set(key, run);
      }
      if (run.seqs.has(event.seq)) continue;
      run.seqs.add(event.seq);
      if (event.seq < run.from) run.from = event.seq;
      if (event.seq > run.to) run.to = event.seq;
      if (event.metric === 'like') run.like = (run.like ?? 0) + event.delta;
      else run.fav = (run.fav ?? 0) + event.delta;
    }
    // A repeated seq is the same change delivered twice.
    let skipped = events.length;
    let applied = 0;
    if (runs.size === 0) return { applied, skipped };
    const byGroup = new Map<number, EntityRun[]>();
    for (const run of runs.values()) {
      skipped -= run.seqs.size;
      const list = byGroup.get(run.group);
      if (list) list.push(run);
      else byGroup.set(run.group, [run]);
    }
    const pipeline = this.pipeline();
    pipeline.hset(this.dirtyKey, this.markArgs(byGroup.keys()));
    for (const [group, list] of byGroup) {
      const args: (string | number)[] = [
        this.factPrefix(group, false),
        this.factPrefix(group, true),
        BARE_ETYPE,
      ];
      for (const run of list) {
        args.push(run.field, run.from, run.to, run.seqs.size, run.like ?? '', run.fav ?? '');
      }
      pipeline[CMD.apply](
        this.groupKey('ap', group),
        this.groupKey('pd', group),
        this.groupKey('s', group),
        this.groupKey('seq', group),
        ...args,
      );
    }
    pipeline.hset(this.dirtyKey, this.markArgs(byGroup.keys()));
    const replies = await execPipeline(pipeline);
    let r = 1;
    for (const list of byGroup.values()) {
      const marks = replies[r++] as number[];
      list.forEach((run, k) => {
        const mark = marks[k] ?? 0;
        if (run.from > mark) applied += run.seqs.size;
        else if (run.to <= mark) skipped += run.seqs.size;
        else {
          // Rebuilt from facts: what was at or below the mark had been counted already.
          for (const seq of run.seqs) {
            if (seq > mark) applied++;
            else skipped++;
          }
        }
      });
    }
    return { applied, skipped };
  }

  /** One fresh token for each of the groups, as HSET field-value pairs. */
  private markArgs(groups: Iterable<number>): Record<string, string> {
    const token = `${this.markPrefix}${(this.marks++).toString(36)}`;
    const args: Record<string, string> = {};
    for (const group of groups) args[group] = token;
    return args;
  }

  /**
   * Folds up to `limit` marked groups, then clears the mark of each group folded unless an apply
   * re-marked it meanwhile. The folds' pipeline checks the next few groups in rotation for pending
   * deltas without a mark (left only by an applier that died half-way); the second marks them for
   * a later flush and clears the marks. A fold that failed leaves its mark, and `flush` rejects
   * with its error once the others are done.
   */
  async flush(limit: number): Promise<number> {
    if (!(limit >= 1)) return 0;
    const picked = (await this.redis.hrandfield(this.dirtyKey, Math.floor(limit), 'WITHVALUES')) as string[];
    const pipeline = this.pipeline();
    for (let i = 0; i < picked.length; i += 2) {
      const group = Number(picked[i]);
      pipeline[CMD.fold](
        this.groupKey('pd', group),
        this.groupKey('s', group),
        this.groupKey('seq', group),
        this.groupKey('ap', group),
        this.factPrefix(group, false),
        this.factPrefix(group, true),
        BARE_ETYPE,
      );
    }
    const sweep = Array.from(
      { length: Math.min(SWEEP_CHUNK, this.groups) },
      (_, k) => (this.sweepFrom + k) % this.groups,
    );
    this.sweepFrom = (this.sweepFrom + sweep.length) % this.groups;
    for (const group of sweep) pipeline.exists(this.groupKey('pd', group));
    pipeline.hmget(this.dirtyKey, ...sweep.map(String));
    const results = await pipeline.exec();
    if (!results) throw new Error('Redis pipeline was discarded');
    const folds = picked.length / 2;
    let folded = 0;
    let failed: Error | undefined;
    // A group's mark goes only once its fold succeeded: a fold refused (a Redis out of memory
    // refuses its HSET, not the unmark's HDEL) leaves its deltas pending and its group marked.
    const unmark: string[] = [];
    for (let i = 0; i < folds; i++) {
      const [error, reply] = results[i]!;
      if (error) {
        failed ??= error;
        continue;
      }
      const [entities, clamped] = reply as [number, number];
      folded += entities;
      this.clamped += clamped;
      unmark.push(picked[2 * i] as string, picked[2 * i + 1] as string);
    }
    const swept = results.slice(folds).map(([error, reply]) => {
      if (error) throw error;
      return reply;
    });
    const marked = swept[sweep.length] as (string | null)[];
    const orphans = sweep.filter((_, k) => toInt(swept[k]) > 0 && marked[k] === null);
    if (unmark.length > 0 || orphans.length > 0) {
      const after = this.pipeline();
      if (unmark.length > 0) after[CMD.unmark](this.dirtyKey, ...unmark);
      if (orphans.length > 0) after.hset(this.dirtyKey, this.markArgs(orphans));
      await execPipeline(after);
    }
    if (failed !== undefined) throw failed;
    return folded;
  }

  async isQuiet(): Promise<boolean> {
    if ((await this.redis.hlen(this.dirtyKey)) > DIRTY_CHECK_MAX) return false;
    // Only pending deltas count, in every group: a mark may outlive its deltas (a fully skipped
    // apply, a rebuild), and deltas their mark (an applier that died half-way, until the flush's
    // sweep marks the group again).
    const pipeline = this.redis.pipeline();
    for (let g = 0; g < this.groups; g++) pipeline.exists(this.groupKey('pd', g));
    const replies = await execPipeline(pipeline);
    return replies.every((n) => toInt(n) === 0);
  }

  /** Adds the group to the unpublished index, keeping the older score; never rejects. */
  private indexUnpublished(group: number, now: number): Promise<boolean> {
    return this.redis.zadd(this.unpubKey, 'LT', now, group).then(
      () => true,
      () => false,
    );
  }

  /**
   * Reads only the groups the index names with a score before the bound, plus a few groups in
   * rotation (all of them on an instance's first call): when idle, one round trip of constant size.
   *
   * The index (`c:unpub`, outside every group's slot) maps a group to a lower bound of its oldest
   * unpublished event's time. It may name too many groups, never too few: a toggle adds its group
   * (ZADD LT) before its script runs; a scan raises a group's score to its oldest event (ZADD GT,
   * which a concurrent toggle's LT cannot undo below the truth) and removes a group only after
   * seeing its set empty, then reads the set again and puts the group back if an event arrived
   * meanwhile. What that leaves open, a toggle whose index write lands before the removal and
   * whose script lands after the second read (or an index write that failed), the rotation sweep
   * repairs: it puts back any group it finds with events.
   */
  async staleUnpublished(now: number, olderThanMs: number, limit: number): Promise<StaleEvent[]> {
    const out: StaleEvent[] = [];
    if (!(limit >= 1)) return out;
    const cutoff = now - olderThanMs;
    const candidates = new Set<number>();
    const sweep = this.nextUnpublishedSweep();
    for (let start = 0; start < sweep.length || start === 0; start += SCAN_CHUNK) {
      const chunk = sweep.slice(start, start + SCAN_CHUNK);
      const pipeline = this.redis.pipeline();
      for (const g of chunk) pipeline.zrange(this.groupKey('un', g), 0, '0', 'WITHSCORES');
      if (start === 0) pipeline.zrangebyscore(this.unpubKey, '-inf', `(${cutoff}`, 'LIMIT', 0, this.groups);
      const replies = await execPipeline(pipeline);
      const found: (string | number)[] = [];
      chunk.forEach((g, k) => {
        const oldest = oldestScore(replies[k]);
        if (oldest === null) return;
        found.push(oldest, g);
        if (oldest < cutoff) candidates.add(g);
      });
      if (start === 0) for (const g of replies[chunk.length] as string[]) candidates.add(Number(g));
      if (found.length > 0) await this.redis.zadd(this.unpubKey, 'LT', ...found);
    }
    const empty: number[] = [];
    const groups = [...candidates];
    for (let start = 0; start < groups.length && out.length < limit; start += SCAN_CHUNK) {
      const chunk = groups.slice(start, start + SCAN_CHUNK);
      const pipeline = this.redis.pipeline();
      for (const g of chunk) {
        const un = this.groupKey('un', g);
        pipeline.zrangebyscore(un, '-inf', `(${cutoff}`, 'LIMIT', 0, limit - out.length);
        pipeline.zrange(un, 0, '0', 'WITHSCORES');
      }
      const replies = await execPipeline(pipeline);
      const settle = this.redis.pipeline();
      chunk.forEach((g, k) => {
        for (const token of replies[2 * k] as string[]) {
          if (out.length >= limit) break;
          const stale = parseUnpublished(token);
          if (stale) out.push(stale);
        }
        const oldest = oldestScore(replies[2 * k + 1]);
        if (oldest === null) empty.push(g);
        else settle.zadd(this.unpubKey, 'GT', oldest, g);
      });
      if (settle.length > 0) await execPipeline(settle);
    }
    if (empty.length > 0) await this.unindexEmpty(empty);
    return out;
  }

  /** Removes groups seen empty from the index, then puts back those that got an event meanwhile. */
  private async unindexEmpty(groups: readonly number[]): Promise<void> {
    await this.redis.zrem(this.unpubKey, ...groups);
    const pipeline = this.redis.pipeline();
    for (const g of groups) pipeline.zrange(this.groupKey('un', g), 0, '0', 'WITHSCORES');
    const replies = await execPipeline(pipeline);
    const back: (string | number)[] = [];
    groups.forEach((g, k) => {
      const oldest = oldestScore(replies[k]);
      if (oldest !== null) back.push(oldest, g);
    });
    if (back.length > 0) await this.redis.zadd(this.unpubKey, 'LT', ...back);
  }

  /** All groups on the first call, then `UNPUBLISHED_SWEEP` of them per call in rotation. */
  private nextUnpublishedSweep(): number[] {
    if (!this.sweptUnpublished) {
      this.sweptUnpublished = true;
      return Array.from({ length: this.groups }, (_, g) => g);
    }
    const n = Math.min(UNPUBLISHED_SWEEP, this.groups);
    const groups = Array.from({ length: n }, (_, k) => (this.unpubSweepFrom + k) % this.groups);
    this.unpubSweepFrom = (this.unpubSweepFrom + n) % this.groups;
    return groups;
  }

  async markPublished(events: readonly CounterEvent[]): Promise<void> {
    await this.removeUnpublished(
      events.map((e) => ({ ref: { etype: e.entityType, eid: e.entityId }, token: unpublishedToken(e) })),
    );
  }

  async dropUnpublished(entries: readonly StaleEvent[]): Promise<void> {
    await this.removeUnpublished(entries);
  }

  private async removeUnpublished(entries: readonly { ref: EntityRef; token: string }[]): Promise<void> {
    await Promise.all(
      [...this.tokensByGroup(entries)].map(([group, tokens]) =>
        this.redis.zrem(this.groupKey('un', group), ...tokens),
      ),
    );
  }

  async deferUnpublished(entries: readonly DeferredEvent[]): Promise<void> {
    await Promise.all(
      [...byGroup(entries, (e) => this.groupOf(e.ref))].map(async ([group, list]) => {
        // Indexed first, as a toggle does; XX: a record published meanwhile stays gone.
        await this.indexUnpublished(group, Math.min(...list.map((e) => e.at)));
        await this.redis.zadd(this.groupKey('un', group), 'XX', ...list.flatMap((e) => [e.at, e.token]));
      }),
    );
  }

  private tokensByGroup(entries: readonly { ref: EntityRef; token: string }[]): Map<number, string[]> {
    const grouped = byGroup(entries, (e) => this.groupOf(e.ref));
    return new Map([...grouped].map(([group, list]) => [group, list.map((e) => e.token)]));
  }

  /** The cursor is `<group>` or `<group>|<last field returned>`; fields of a group come in sorted order. */
  async scanEntities(cursor: string, limit: number): Promise<{ refs: EntityRef[]; cursor: string | null }> {
    const bar = cursor.indexOf('|');
    let group = cursor === '' ? 0 : Number(bar < 0 ? cursor : cursor.slice(0, bar));
    let after: string | null = bar < 0 ? null : cursor.slice(bar + 1);
    if (!Number.isInteger(group) || group < 0) throw new RangeError(`invalid cursor: ${cursor}`);
    const refs: EntityRef[] = [];
    const max = Math.max(1, Math.floor(limit));
    while (group < this.groups) {
      const end = Math.min(this.groups, group + SCAN_CHUNK);
      const pipeline = this.redis.pipeline();
      for (let g = group; g < end; g++) {
        pipeline.hkeys(this.groupKey('s', g));
        pipeline.hkeys(this.groupKey('seq', g));
      }
      const replies = (await execPipeline(pipeline)) as string[][];
      for (let g = group; g < end; g++) {
        const i = (g - group) * 2;
        const fields = [...new Set([...(replies[i] ?? []), ...(replies[i + 1] ?? [])])].sort();
        for (const field of fields) {
          if (after !== null && field <= after) continue;
          const ref = this.refOfField(field);
          if (!ref) continue;
          refs.push(ref);
          if (refs.length >= max) {
            return { refs, cursor: `${g}|${field}` };
          }
        }
        after = null;
      }
      group = end;
    }
    return { refs, cursor: null };
  }

  async sampleEntities(limit: number): Promise<EntityRef[]> {
    const max = Math.floor(limit);
    if (!(max >= 1)) return [];
    const perGroup = Math.max(1, Math.ceil(max / 16));
    const order = shuffle(Array.from({ length: this.groups }, (_, g) => g));
    const seen = new Map<string, EntityRef>();
    for (let start = 0; start < order.length && seen.size < max; start += SCAN_CHUNK) {
      const pipeline = this.redis.pipeline();
      const chunk = order.slice(start, start + SCAN_CHUNK);
      for (const g of chunk) pipeline.hrandfield(this.groupKey('s', g), perGroup);
      for (const fields of (await execPipeline(pipeline)) as string[][]) {
        for (const field of fields) {
          const ref = this.refOfField(field);
          if (ref) seen.set(entityKey(ref), ref);
        }
      }
    }
    return shuffle([...seen.values()]).slice(0, max);
  }

  async reset(): Promise<void> {
    // Every counter key goes on with a letter (`c:seq:`, `c:f:`, `c:dirty`, …); the shared cache's
    // `c:{guard}…` keys share the prefix and are left alone.
    const pattern = `${this.prefix.replace(/[*?[\]\\]/g, '\\$&')}c:[a-z]*`;
    let cursor = '0';
    do {
      const [next, keys] = await this.redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1_000);
      if (keys.length > 0) await this.redis.unlink(...keys);
      cursor = next;
    } while (cursor !== '0');
  }

  /**
   * One script per (entity, metric) and up to `REPLAY_SCRIPT_FACTS` facts, in pipelines of about
   * `PIPELINE_CHUNK` facts, `REPLAY_CONCURRENCY` of them in flight. Per (entity, metric, user) only
   * the event with the highest seq is applied, so the scripts touch disjoint facts and their order
   * does not matter; every script of an entity raises its seq to the entity's highest event seq.
   */
  async replayFacts(events: readonly CounterEvent[]): Promise<void> {
    const sets = new Map<string, ReplaySet>();
    for (const e of events) {
      checkUserId(e.userId);
      const key = `${e.entityType}:${e.entityId}:${e.metric}`;
      let set = sets.get(key);
      if (!set) {
        set = { etype: e.entityType, eid: e.entityId, metric: e.metric, top: 0, users: new Map() };
        sets.set(key, set);
      }
      if (e.seq > set.top) set.top = e.seq;
      const known = set.users.get(e.userId);
      if (!known || known.seq < e.seq) set.users.set(e.userId, e);
    }
    const tops = new Map<string, number>();
    for (const set of sets.values()) {
      const entity = `${set.etype}:${set.eid}`;
      tops.set(entity, Math.max(tops.get(entity) ?? 0, set.top));
    }
    const batches: (string | number)[][][] = [[]];
    let size = 0;
    for (const { etype, eid, metric, users } of sets.values()) {
      const ref: EntityRef = { etype, eid };
      checkRef(ref);
      const entity = entityKey(ref);
      const group = this.groupOf(ref);
      const facts = [...users.values()];
      for (let start = 0; start < facts.length; start += REPLAY_SCRIPT_FACTS) {
        const chunk = facts.slice(start, start + REPLAY_SCRIPT_FACTS);
        const adds = chunk.filter((e) => e.delta > 0).map((e) => e.userId);
        const removes = chunk.filter((e) => e.delta <= 0).map((e) => e.userId);
        (batches[batches.length - 1] as (string | number)[][]).push([
          `${this.factPrefix(group, false)}${entity}:${metric}`,
          `${this.factPrefix(group, true)}${entity}:${metric}`,
          this.groupKey('seq', group),
          this.fieldOf(ref),
          this.sparseMax,
          tops.get(entity) ?? 0,
          adds.length,
          ...adds,
          ...removes,
        ]);
        size += chunk.length;
        if (size >= PIPELINE_CHUNK) {
          batches.push([]);
          size = 0;
        }
      }
    }
    let next = 0;
    const worker = async (): Promise<void> => {
      while (next < batches.length) {
        const batch = batches[next++] as (string | number)[][];
        if (batch.length === 0) continue;
        const pipeline = this.pipeline();
        for (const args of batch) pipeline[CMD.replay](...args);
        await execPipeline(pipeline);
      }
    };
    await Promise.all(Array.from({ length: Math.min(REPLAY_CONCURRENCY, batches.length) }, worker));
  }

  async writeRawSnapshot(ref: EntityRef, bytes: Buffer | null): Promise<void> {
    const { group, field } = this.address(ref);
    if (bytes === null) await this.redis.hdel(this.groupKey('s', group), field);
    else await this.redis.hset(this.groupKey('s', group), field, bytes);
  }
}
