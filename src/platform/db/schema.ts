import type { Generated } from 'kysely';

/**
 * Row types of every table, the same on both dialects. Times are epoch milliseconds (BIGINT),
 * so no dialect's date handling leaks into the code.
 */
export interface UsersTable {
  id: Generated<number>;
  phone: string | null;
  email: string | null;
  password_hash: string | null;
  nickname: string;
  avatar: string;
  bio: string | null;
  zg_id: string;
  gender: string;
  birthday: string | null;
  school: string | null;
  tags_json: string;
  created_at: number;
  updated_at: number;
}

export interface LoginAuditTable {
  id: Generated<number>;
  user_id: number | null;
  identifier: string;
  channel: string;
  success: number;
  reason: string | null;
  ip: string | null;
  user_agent: string | null;
  created_at: number;
}

/** Embedded key-value store (the cluster profile keeps these in Redis). */
export interface KvTable {
  k: string;
  v: string;
  expires_at: number | null;
}

/** Embedded event log: one append-only table; `offset` orders records across all topics. */
export interface EventLogTable {
  offset: Generated<number>;
  topic: string;
  key: string;
  value: string;
  ts: number;
}

export interface ConsumerOffsetsTable {
  group_id: string;
  topic: string;
  next_offset: number;
}

/** Transactional outbox, in the system-of-record database on both profiles. */
export interface OutboxTable {
  id: Generated<number>;
  topic: string;
  msg_key: string;
  payload: string;
  created_at: number;
}

/** Embedded counter store (the cluster profile keeps these in Redis); see sqlite-counter-store.ts. */
export interface CounterFactsTable {
  etype: string;
  eid: string;
  metric: string;
  user_id: number;
}

export interface CounterEntitiesTable {
  etype: string;
  eid: string;
  seq: number;
  applied: number;
}

export interface CounterPendingTable {
  etype: string;
  eid: string;
  idx: number;
  delta: number;
}

export interface CounterSnapshotsTable {
  etype: string;
  eid: string;
  data: Uint8Array;
}

/**
 * Posts. `id` is a snowflake kept as a decimal string (TEXT on SQLite, BIGINT UNSIGNED on MySQL,
 * which mysql2 returns as a string with `bigNumberStrings`). `status` is draft | published | deleted;
 * `visible` public | followers | school | private | unlisted. JSON columns hold string arrays.
 * Times are epoch milliseconds; `publish_time` is set once, when the draft is published.
 */
export interface KnowpostsTable {
  id: string;
  author_id: number;
  status: string;
  visible: string;
  created_at: number;
  updated_at: number;
  title: string | null;
  description: string | null;
  tag_id: number | null;
  tags_json: Generated<string>;
  img_urls_json: Generated<string>;
  content_key: string | null;
  content_etag: string | null;
  content_size: number | null;
  content_sha256: string | null;
  is_top: Generated<number>;
  type: Generated<string>;
  publish_time: number | null;
}

export interface Database {
  users: UsersTable;
  login_audit: LoginAuditTable;
  kv: KvTable;
  event_log: EventLogTable;
  consumer_offsets: ConsumerOffsetsTable;
  outbox: OutboxTable;
  counter_facts: CounterFactsTable;
  counter_entities: CounterEntitiesTable;
  counter_pending: CounterPendingTable;
  counter_snapshots: CounterSnapshotsTable;
  knowposts: KnowpostsTable;
}
