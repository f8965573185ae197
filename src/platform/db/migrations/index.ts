import { domainToASCII, domainToUnicode } from 'node:url';
import { sql, type Kysely } from 'kysely';
import type { Migration } from 'kysely/migration';
import type { Dialect } from '../database.js';

/**
 * Numbered, forward-only migrations, one list per dialect. A released migration keeps its effect; a
 * change to the schema is a new entry at the end of both lists. Its text has changed only so that
 * it runs on more servers (MySQL 8 takes a default for a TEXT column only as an expression) or can
 * run again after being cut short: MySQL commits each DDL statement at once, so a step interrupted
 * half-way (a process killed during a long `UPDATE`), or after its last statement and before the
 * migrator recorded it, is run again whole at the next start, and every statement of a MySQL step
 * must find its own work done and go on. SQLite runs the pending steps in one transaction (see
 * node-sqlite-dialect.ts): one cut short leaves nothing.
 */
type Step = (db: Kysely<unknown>) => Promise<void>;

const exec =
  (...statements: string[]): Step =>
  async (db) => {
    for (const statement of statements) await sql.raw(statement).execute(db);
  };

/**
 * Rewrites the e-mail addresses of the rows `filter` selects to the one form of their mailbox that
 * sign-up and sign-in use from this release on (`canonicalEmail` in src/auth/identifiers.ts, whose
 * rule is written out again here so that this migration never changes): the local part in Unicode
 * normal form C and lower case, the host name as IDNA maps it, in Unicode. An address whose form
 * another account already holds is left as it is: two accounts of one mailbox cannot be merged here.
 */
const canonicalEmails =
  (filter: string): Step =>
  async (db) => {
    const { rows } = await sql<{ id: number | string; email: string }>`
      SELECT id, email FROM users WHERE email IS NOT NULL AND (${sql.raw(filter)}) ORDER BY id`.execute(db);
    for (const { id, email } of rows) {
      const at = email.lastIndexOf('@');
      if (at < 0) continue;
      const host = domainToUnicode(email.slice(at + 1));
      const next = `${email.slice(0, at).normalize('NFC').toLowerCase()}@${host}`;
      // Only to a host name that is the same one in ASCII (where the mail goes).
      if (host === '' || next === email || domainToASCII(host) !== domainToASCII(email.slice(at + 1)))
        continue;
      const { rows: holders } = await sql`SELECT id FROM users WHERE email = ${next}`.execute(db);
      if (holders.length > 0) continue;
      await sql`UPDATE users SET email = ${next} WHERE id = ${id} AND email = ${email}`.execute(db);
    }
  };

/** Runs `statement` unless `existing` (a query of information_schema) finds a row. */
const unlessFound =
  (existing: (db: Kysely<unknown>) => Promise<{ rows: unknown[] }>, statement: string): Step =>
  async (db) => {
    if ((await existing(db)).rows.length === 0) await sql.raw(statement).execute(db);
  };

/** Runs `statement` unless `table` has `column` already (MySQL 8 has no `ADD COLUMN IF NOT EXISTS`). */
const unlessColumn = (table: string, column: string, statement: string): Step =>
  unlessFound(
    (db) =>
      sql`SELECT 1 FROM information_schema.COLUMNS
           WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ${table} AND COLUMN_NAME = ${column}`.execute(db),
    statement,
  );

/** Runs `statement` unless `table` has the index `index` already. */
const unlessIndex = (table: string, index: string, statement: string): Step =>
  unlessFound(
    (db) =>
      sql`SELECT 1 FROM information_schema.STATISTICS
           WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ${table} AND INDEX_NAME = ${index}`.execute(db),
    statement,
  );

const inTurn =
  (...steps: Step[]): Step =>
  async (db) => {
    for (const step of steps) await step(db);
  };

const sqlite: Record<string, Step> = {
  '0001_accounts': exec(
    `CREATE TABLE users (
       id INTEGER PRIMARY KEY AUTOINCREMENT,
       phone TEXT UNIQUE, email TEXT UNIQUE, password_hash TEXT,
       nickname TEXT NOT NULL, avatar TEXT NOT NULL, bio TEXT,
       zg_id TEXT NOT NULL UNIQUE, gender TEXT NOT NULL DEFAULT 'UNKNOWN',
       birthday TEXT, school TEXT, tags_json TEXT NOT NULL DEFAULT '[]',
       created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)`,
    `CREATE TABLE login_audit (
       id INTEGER PRIMARY KEY AUTOINCREMENT, user_id INTEGER, identifier TEXT NOT NULL,
       channel TEXT NOT NULL, success INTEGER NOT NULL, reason TEXT, ip TEXT, user_agent TEXT,
       created_at INTEGER NOT NULL)`,
    `CREATE INDEX login_audit_user ON login_audit (user_id, created_at)`,
  ),
  '0002_platform': exec(
    `CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT NOT NULL, expires_at INTEGER) WITHOUT ROWID`,
    `CREATE INDEX kv_expires ON kv (expires_at) WHERE expires_at IS NOT NULL`,
    `CREATE TABLE event_log (
       "offset" INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, key TEXT NOT NULL,
       value TEXT NOT NULL, ts INTEGER NOT NULL)`,
    `CREATE INDEX event_log_topic ON event_log (topic, "offset")`,
    `CREATE TABLE consumer_offsets (
       group_id TEXT NOT NULL, topic TEXT NOT NULL, next_offset INTEGER NOT NULL,
       PRIMARY KEY (group_id, topic)) WITHOUT ROWID`,
    `CREATE TABLE outbox (
       id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, msg_key TEXT NOT NULL,
       payload TEXT NOT NULL, created_at INTEGER NOT NULL)`,
  ),
  '0003_counters': exec(
    `CREATE TABLE counter_facts (
       etype TEXT NOT NULL, eid TEXT NOT NULL, metric TEXT NOT NULL, user_id INTEGER NOT NULL,
       PRIMARY KEY (etype, eid, metric, user_id)) WITHOUT ROWID`,
    `CREATE TABLE counter_entities (
       etype TEXT NOT NULL, eid TEXT NOT NULL,
       seq INTEGER NOT NULL DEFAULT 0, applied INTEGER NOT NULL DEFAULT 0,
       PRIMARY KEY (etype, eid)) WITHOUT ROWID`,
    `CREATE TABLE counter_pending (
       etype TEXT NOT NULL, eid TEXT NOT NULL, idx INTEGER NOT NULL, delta INTEGER NOT NULL,
       PRIMARY KEY (etype, eid, idx)) WITHOUT ROWID`,
    `CREATE TABLE counter_snapshots (
       etype TEXT NOT NULL, eid TEXT NOT NULL, data BLOB NOT NULL,
       PRIMARY KEY (etype, eid)) WITHOUT ROWID`,
  ),
  // Post ids are 64-bit snowflakes: TEXT here, because node:sqlite reads INTEGER as a double.
  '0004_knowposts': exec(
    `CREATE TABLE knowposts (
       id TEXT NOT NULL PRIMARY KEY, author_id INTEGER NOT NULL,
       status TEXT NOT NULL DEFAULT 'draft', visible TEXT NOT NULL DEFAULT 'public',
       created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)`,
    `CREATE INDEX knowposts_author ON knowposts (author_id, created_at)`,
  ),
  '0005_knowpost_content': exec(
    `ALTER TABLE knowposts ADD COLUMN title TEXT`,
    `ALTER TABLE knowposts ADD COLUMN description TEXT`,
    `ALTER TABLE knowposts ADD COLUMN tag_id INTEGER`,
    `ALTER TABLE knowposts ADD COLUMN tags_json TEXT NOT NULL DEFAULT '[]'`,
    `ALTER TABLE knowposts ADD COLUMN img_urls_json TEXT NOT NULL DEFAULT '[]'`,
    `ALTER TABLE knowposts ADD COLUMN content_key TEXT`,
    `ALTER TABLE knowposts ADD COLUMN content_etag TEXT`,
    `ALTER TABLE knowposts ADD COLUMN content_size INTEGER`,
    `ALTER TABLE knowposts ADD COLUMN content_sha256 TEXT`,
    `ALTER TABLE knowposts ADD COLUMN is_top INTEGER NOT NULL DEFAULT 0`,
    `ALTER TABLE knowposts ADD COLUMN type TEXT NOT NULL DEFAULT 'image_text'`,
    `ALTER TABLE knowposts ADD COLUMN publish_time INTEGER`,
    `CREATE INDEX knowposts_feed ON knowposts (status, visible, publish_time, id)`,
    `CREATE INDEX knowposts_mine ON knowposts (author_id, status, is_top, publish_time)`,
  ),
  // User snapshots (data NULL: not known, rebuilt from the database on read) and the (user, event)
  // pairs already applied, trimmed by age; see user-counter/store/sqlite-user-counter-store.ts.
  '0006_user_counters': exec(
    `CREATE TABLE user_counters (
       user_id INTEGER PRIMARY KEY, data BLOB, version INTEGER NOT NULL DEFAULT 0)`,
    `CREATE TABLE user_counter_applied (
       user_id INTEGER NOT NULL, event_id TEXT NOT NULL, applied_at INTEGER NOT NULL,
       PRIMARY KEY (user_id, event_id)) WITHOUT ROWID`,
    `CREATE INDEX user_counter_applied_age ON user_counter_applied (applied_at)`,
  ),
  // `following` is written by the API; `follower` is its mirror, kept by the relation-proj consumer.
  '0007_relations': exec(
    `CREATE TABLE following (
       from_user_id INTEGER NOT NULL, to_user_id INTEGER NOT NULL, created_at INTEGER NOT NULL,
       PRIMARY KEY (from_user_id, to_user_id)) WITHOUT ROWID`,
    `CREATE INDEX following_list ON following (from_user_id, created_at, to_user_id)`,
    `CREATE INDEX following_to ON following (to_user_id, from_user_id)`,
    `CREATE TABLE follower (
       to_user_id INTEGER NOT NULL, from_user_id INTEGER NOT NULL, created_at INTEGER NOT NULL,
       PRIMARY KEY (to_user_id, from_user_id)) WITHOUT ROWID`,
    `CREATE INDEX follower_list ON follower (to_user_id, created_at, from_user_id)`,
    // Changes whose counter deltas are not applied yet: what a counter rebuild must not count twice.
    `CREATE TABLE relation_unapplied (
       event_id TEXT NOT NULL PRIMARY KEY, from_user_id INTEGER NOT NULL, to_user_id INTEGER NOT NULL,
       delta INTEGER NOT NULL, created_at INTEGER NOT NULL) WITHOUT ROWID`,
    `CREATE INDEX relation_unapplied_from ON relation_unapplied (from_user_id)`,
    `CREATE INDEX relation_unapplied_to ON relation_unapplied (to_user_id)`,
    // Per post, the highest counter-event seq whose like/fav delta reached its author's counts.
    `CREATE TABLE likes_received_marks (
       post_id TEXT NOT NULL PRIMARY KEY, applied_seq INTEGER NOT NULL) WITHOUT ROWID`,
  ),
  // Per (user, source), the highest seq applied of a source's sequenced event ids (a post's likes):
  // one row per source instead of one per event.
  '0008_user_counter_marks': exec(
    `CREATE TABLE user_counter_marks (
       user_id INTEGER NOT NULL, source TEXT NOT NULL, seq INTEGER NOT NULL,
       PRIMARY KEY (user_id, source)) WITHOUT ROWID`,
  ),
  '0009_knowpost_purge': exec(
    `ALTER TABLE knowposts ADD COLUMN objects_purged_at INTEGER`,
    `CREATE INDEX knowposts_purge ON knowposts (status, objects_purged_at, updated_at)`,
  ),
  // When a live post's objects are next checked for uploads and copies it no longer refers to;
  // posts from before the column are checked once, first.
  '0010_knowpost_sweep': exec(
    `ALTER TABLE knowposts ADD COLUMN objects_check_at INTEGER`,
    `CREATE INDEX knowposts_sweep ON knowposts (objects_check_at)`,
    `UPDATE knowposts SET objects_check_at = 0 WHERE status <> 'deleted'`,
  ),
  // A zgId is a handle: `Alice_1` and `alice_1` name one person. Of handles already held in two
  // cases, the oldest account keeps its own; the later ones get a generated one, as at sign-up.
  '0011_zg_id_nocase': exec(
    `UPDATE users SET zg_id = 'zg_' || lower(hex(randomblob(5)))
       WHERE EXISTS (SELECT 1 FROM users o WHERE lower(o.zg_id) = lower(users.zg_id) AND o.id < users.id)`,
    `CREATE UNIQUE INDEX users_zg_id_nocase ON users (zg_id COLLATE NOCASE)`,
  ),
  // Until when an upload URL of the post may still deliver an object: a check of its objects before
  // then is followed by another one then.
  '0012_knowpost_uploads_open': exec(`ALTER TABLE knowposts ADD COLUMN uploads_open_until INTEGER`),
  '0013_knowpost_public_crossings': exec(
    `ALTER TABLE knowposts ADD COLUMN public_epoch INTEGER NOT NULL DEFAULT 0`,
    `ALTER TABLE knowposts ADD COLUMN public_crossings TEXT NOT NULL DEFAULT '[]'`,
  ),
  // A post's counter events that came before an earlier one of the same post: they wait here until
  // the missing one arrives (or its author is rebuilt from the facts); per such post, when that
  // rebuild is (next) due and how many were tried. (IF NOT EXISTS: MariaDB commits each statement
  // of a migration on its own, so one cut short is run again whole.)
  '0014_likes_received_parked': exec(
    `CREATE TABLE IF NOT EXISTS likes_received_parked (
       post_id TEXT NOT NULL, seq INTEGER NOT NULL, metric TEXT NOT NULL, delta INTEGER NOT NULL,
       PRIMARY KEY (post_id, seq)) WITHOUT ROWID`,
    `CREATE TABLE IF NOT EXISTS likes_received_holes (
       post_id TEXT NOT NULL PRIMARY KEY, retry_at INTEGER NOT NULL, tries INTEGER NOT NULL
     ) WITHOUT ROWID`,
    `CREATE INDEX IF NOT EXISTS likes_received_holes_retry ON likes_received_holes (retry_at)`,
  ),
  // Addresses with an IDNA label or any character outside ASCII: only those can change.
  '0015_email_one_form': canonicalEmails(
    `email LIKE '%xn--%' OR length(CAST(email AS BLOB)) <> length(email)`,
  ),
  // The counter store's own state: `unsealed` while a counters replay rebuilds it (and after one
  // that stopped half-way), when toggles are refused.
  '0016_counter_meta': exec(
    `CREATE TABLE counter_meta (k TEXT NOT NULL PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID`,
  ),
  // The reconciler's lost relation events (marks by age), and the objects sweep's pages, which go
  // by (time due, id): the old index ordered by time alone, and ties (a backlog) were sorted whole.
  '0017_unapplied_age_sweep_order': exec(
    `CREATE INDEX IF NOT EXISTS relation_unapplied_created ON relation_unapplied (created_at)`,
    `CREATE INDEX IF NOT EXISTS knowposts_sweep_order ON knowposts (objects_check_at, id)`,
    `DROP INDEX IF EXISTS knowposts_sweep`,
  ),
  // What the counter store added from each partition of the views log (see src/counter/view-marks.ts).
  '0018_counter_view_marks': exec(
    `CREATE TABLE counter_view_marks (partition INTEGER NOT NULL PRIMARY KEY, mark TEXT NOT NULL)`,
  ),
};

const mysql: Record<string, Step> = {
  '0001_accounts': exec(
    `CREATE TABLE IF NOT EXISTS users (
       id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
       phone VARCHAR(32) NULL, email VARCHAR(320) NULL, password_hash VARCHAR(255) NULL,
       nickname VARCHAR(64) NOT NULL, avatar VARCHAR(1024) NOT NULL, bio VARCHAR(512) NULL,
       zg_id VARCHAR(32) NOT NULL, gender VARCHAR(16) NOT NULL DEFAULT 'UNKNOWN',
       birthday CHAR(10) NULL, school VARCHAR(128) NULL, tags_json TEXT NOT NULL,
       created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
       UNIQUE KEY users_phone (phone), UNIQUE KEY users_email (email), UNIQUE KEY users_zg_id (zg_id)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
    `CREATE TABLE IF NOT EXISTS login_audit (
       id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, user_id BIGINT UNSIGNED NULL,
       identifier VARCHAR(320) NOT NULL, channel VARCHAR(16) NOT NULL, success TINYINT NOT NULL,
       reason VARCHAR(64) NULL, ip VARCHAR(64) NULL, user_agent VARCHAR(512) NULL,
       created_at BIGINT NOT NULL, KEY login_audit_user (user_id, created_at)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
  ),
  // kv, event_log and consumer_offsets live in Redis and Kafka on this dialect's profile.
  '0002_platform': exec(
    `CREATE TABLE IF NOT EXISTS outbox (
       id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, topic VARCHAR(255) NOT NULL,
       msg_key VARCHAR(255) NOT NULL, payload MEDIUMTEXT NOT NULL, created_at BIGINT NOT NULL
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
  ),
  // The cluster profile keeps counters in Redis; the entry keeps both lists numbered alike.
  '0003_counters': exec(),
  '0004_knowposts': exec(
    `CREATE TABLE IF NOT EXISTS knowposts (
       id BIGINT UNSIGNED NOT NULL PRIMARY KEY, author_id BIGINT UNSIGNED NOT NULL,
       status VARCHAR(16) NOT NULL DEFAULT 'draft', visible VARCHAR(16) NOT NULL DEFAULT 'public',
       created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, KEY knowposts_author (author_id, created_at)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
  ),
  '0005_knowpost_content': unlessColumn(
    'knowposts',
    'title',
    `ALTER TABLE knowposts
       ADD COLUMN title VARCHAR(256) NULL, ADD COLUMN description VARCHAR(255) NULL,
       ADD COLUMN tag_id BIGINT NULL, ADD COLUMN tags_json TEXT NOT NULL DEFAULT ('[]'),
       ADD COLUMN img_urls_json TEXT NOT NULL DEFAULT ('[]'), ADD COLUMN content_key VARCHAR(512) NULL,
       ADD COLUMN content_etag VARCHAR(128) NULL, ADD COLUMN content_size BIGINT NULL,
       ADD COLUMN content_sha256 CHAR(64) NULL, ADD COLUMN is_top TINYINT NOT NULL DEFAULT 0,
       ADD COLUMN type VARCHAR(16) NOT NULL DEFAULT 'image_text', ADD COLUMN publish_time BIGINT NULL,
       ADD KEY knowposts_feed (status, visible, publish_time, id),
       ADD KEY knowposts_mine (author_id, status, is_top, publish_time)`,
  ),
  // The cluster profile keeps user counters in Redis; the entry keeps both lists numbered alike.
  '0006_user_counters': exec(),
  '0007_relations': exec(
    `CREATE TABLE IF NOT EXISTS following (
       from_user_id BIGINT UNSIGNED NOT NULL, to_user_id BIGINT UNSIGNED NOT NULL, created_at BIGINT NOT NULL,
       PRIMARY KEY (from_user_id, to_user_id),
       KEY following_list (from_user_id, created_at, to_user_id), KEY following_to (to_user_id)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
    `CREATE TABLE IF NOT EXISTS follower (
       to_user_id BIGINT UNSIGNED NOT NULL, from_user_id BIGINT UNSIGNED NOT NULL, created_at BIGINT NOT NULL,
       PRIMARY KEY (to_user_id, from_user_id), KEY follower_list (to_user_id, created_at, from_user_id)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
    `CREATE TABLE IF NOT EXISTS relation_unapplied (
       event_id VARCHAR(64) NOT NULL PRIMARY KEY, from_user_id BIGINT UNSIGNED NOT NULL,
       to_user_id BIGINT UNSIGNED NOT NULL, delta TINYINT NOT NULL, created_at BIGINT NOT NULL,
       KEY relation_unapplied_from (from_user_id), KEY relation_unapplied_to (to_user_id)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
    `CREATE TABLE IF NOT EXISTS likes_received_marks (
       post_id BIGINT UNSIGNED NOT NULL PRIMARY KEY, applied_seq BIGINT NOT NULL
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
  ),
  // Redis keeps the cluster profile's user-counter marks.
  '0008_user_counter_marks': exec(),
  '0009_knowpost_purge': unlessColumn(
    'knowposts',
    'objects_purged_at',
    `ALTER TABLE knowposts ADD COLUMN objects_purged_at BIGINT NULL,
       ADD KEY knowposts_purge (status, objects_purged_at, updated_at)`,
  ),
  '0010_knowpost_sweep': inTurn(
    unlessColumn(
      'knowposts',
      'objects_check_at',
      `ALTER TABLE knowposts ADD COLUMN objects_check_at BIGINT NULL, ADD KEY knowposts_sweep (objects_check_at)`,
    ),
    exec(`UPDATE knowposts SET objects_check_at = 0 WHERE status <> 'deleted'`),
  ),
  '0011_zg_id_nocase': exec(
    `UPDATE users u JOIN users o ON LOWER(o.zg_id) = LOWER(u.zg_id) AND o.id < u.id
       SET u.zg_id = CONCAT('zg_', LEFT(SHA2(CONCAT(RAND(), u.id), 256), 10))`,
    // The unique key compares in the column's collation.
    `ALTER TABLE users MODIFY zg_id VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL`,
  ),
  '0012_knowpost_uploads_open': unlessColumn(
    'knowposts',
    'uploads_open_until',
    `ALTER TABLE knowposts ADD COLUMN uploads_open_until BIGINT NULL`,
  ),
  '0013_knowpost_public_crossings': unlessColumn(
    'knowposts',
    'public_epoch',
    `ALTER TABLE knowposts ADD COLUMN public_epoch INT NOT NULL DEFAULT 0,
       ADD COLUMN public_crossings TEXT NOT NULL DEFAULT ('[]')`,
  ),
  '0014_likes_received_parked': exec(
    `CREATE TABLE IF NOT EXISTS likes_received_parked (
       post_id BIGINT UNSIGNED NOT NULL, seq BIGINT NOT NULL, metric VARCHAR(8) NOT NULL,
       delta TINYINT NOT NULL, PRIMARY KEY (post_id, seq)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
    `CREATE TABLE IF NOT EXISTS likes_received_holes (
       post_id BIGINT UNSIGNED NOT NULL PRIMARY KEY, retry_at BIGINT NOT NULL, tries INT NOT NULL,
       KEY likes_received_holes_retry (retry_at)
     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`,
  ),
  '0015_email_one_form': canonicalEmails(`email LIKE '%xn--%' OR LENGTH(email) <> CHAR_LENGTH(email)`),
  // Redis keeps the cluster profile's counter seals.
  '0016_counter_meta': exec(),
  // InnoDB's index on objects_check_at holds the primary key: the sweep's order is there already.
  '0017_unapplied_age_sweep_order': unlessIndex(
    'relation_unapplied',
    'relation_unapplied_created',
    `ALTER TABLE relation_unapplied ADD KEY relation_unapplied_created (created_at)`,
  ),
  // Redis keeps the cluster profile's view marks.
  '0018_counter_view_marks': exec(),
};

export function migrationsFor(dialect: Dialect): Record<string, Migration> {
  const steps = dialect === 'sqlite' ? sqlite : mysql;
  return Object.fromEntries(Object.entries(steps).map(([name, up]) => [name, { up }]));
}
