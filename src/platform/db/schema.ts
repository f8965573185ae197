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
  /** When the objects under `posts/{id}/` of a deleted post were removed from storage. */
  objects_purged_at: number | null;
  /**
   * When a live post's objects are next checked for uploads never confirmed or referred to and
   * copies it no longer refers to (`PostUploadSweeper`); null when nothing is due.
   */
  objects_check_at: number | null;
  /**
   * Until when an upload URL handed out for the post may still deliver an object (its expiry plus
   * the upload retention, for a PUT that started in time and ran long); null when none was.
   */
  uploads_open_until: number | null;
  /**
   * How many times the post became one of its author's public posts (published and `public`): the
   * author's `posts` count moves by events numbered with it (`post-events.ts`).
   */
  public_epoch: Generated<number>;
  /** Its entries into and exits from those of the last days, with their times (`PublicCrossing`). */
  public_crossings: Generated<string>;
}

/** Embedded user counters (the cluster profile keeps these in Redis); see sqlite-user-counter-store.ts. */
export interface UserCountersTable {
  user_id: number;
  /** 20-byte snapshot, or null when not known (rebuilt from the database on read). */
  data: Uint8Array | null;
  version: number;
}

export interface UserCounterAppliedTable {
  user_id: number;
  event_id: string;
  applied_at: number;
}

/** Who follows whom; written by the API in the transaction that appends the relation event. */
export interface FollowingTable {
  from_user_id: number;
  to_user_id: number;
  created_at: number;
}

/** The mirror of `following` keyed by the followed user, kept by the relation-proj consumer. */
export interface FollowerTable {
  to_user_id: number;
  from_user_id: number;
  created_at: number;
}

/**
 * Relation changes whose user-counter deltas are not applied yet: written with the change, deleted
 * by the relation-proj consumer once the deltas are in the user-counter store.
 */
export interface RelationUnappliedTable {
  event_id: string;
  from_user_id: number;
  to_user_id: number;
  delta: number;
  created_at: number;
}

/** Per post, the highest counter-event seq applied to its author's likes/favourites received. */
/** Per (user, source), the highest seq of the source's sequenced event ids applied to the user. */
export interface UserCounterMarksTable {
  user_id: number;
  source: string;
  seq: number;
}

export interface LikesReceivedParkedTable {
  post_id: string;
  seq: number;
  metric: string;
  delta: number;
}

export interface LikesReceivedHolesTable {
  post_id: string;
  retry_at: number;
  tries: number;
}

export interface LikesReceivedMarksTable {
  /** Snowflake as a decimal string (TEXT on SQLite, BIGINT UNSIGNED on MySQL). */
  post_id: string;
  applied_seq: number;
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
  user_counters: UserCountersTable;
  user_counter_applied: UserCounterAppliedTable;
  user_counter_marks: UserCounterMarksTable;
  following: FollowingTable;
  follower: FollowerTable;
  relation_unapplied: RelationUnappliedTable;
  likes_received_marks: LikesReceivedMarksTable;
  likes_received_parked: LikesReceivedParkedTable;
  likes_received_holes: LikesReceivedHolesTable;
}
