import { Migrator, type Migration } from 'kysely/migration';
import { afterEach, describe, expect, it } from 'vitest';
import { freshDatabases, services } from '../../../../test/rig/resources.js';
import { UniqueViolationError } from '../../errors/errors.js';
import { isDeployed, migrate, openMysql, translateDbError, type Db } from '../database.js';
import { sql, type Kysely } from 'kysely';
import { migrationsFor } from './index.js';

const backends = freshDatabases({ migrated: false });

/** Runs the migrations up to and with `name`, as a database of that release would have them. */
async function migrateTo(db: Db, name: string): Promise<void> {
  const migrator = new Migrator({
    db: db.kysely,
    provider: { getMigrations: () => Promise.resolve(migrationsFor(db.dialect)) },
  });
  const { error } = await migrator.migrateTo(name);
  if (error)
    throw error instanceof Error ? error : new Error(`migrating to ${name} failed`, { cause: error });
}

describe.each(backends)('migrations on %s', (_name, open) => {
  let close: (() => Promise<void>) | undefined;
  afterEach(async () => {
    await close?.();
    close = undefined;
  });

  /** A new database as the release with migration `name` last left it. */
  async function databaseAt(name: string): Promise<Db> {
    const backend = await open();
    close = () => backend.close();
    await migrateTo(backend.db, name);
    return backend.db;
  }

  it('0017 lets the objects sweep page and the reconciler find old marks by index, with no sort', async () => {
    const db = await databaseAt('0017_unapplied_age_sweep_order');
    const plan = async (query: string): Promise<string> =>
      db.dialect === 'sqlite'
        ? (await sql.raw<{ detail: string }>(`EXPLAIN QUERY PLAN ${query}`).execute(db.kysely)).rows
            .map((r) => r.detail)
            .join('; ')
        : JSON.stringify((await sql.raw(`EXPLAIN ${query}`).execute(db.kysely)).rows);
    const sweep = await plan(
      `SELECT id, objects_check_at FROM knowposts WHERE objects_check_at <= 5
        AND (objects_check_at > 1 OR (objects_check_at = 1 AND id > '7'))
        ORDER BY objects_check_at, id LIMIT 100`,
    );
    const marks = await plan(
      `SELECT event_id FROM relation_unapplied WHERE created_at < 5 ORDER BY created_at LIMIT 100`,
    );
    if (db.dialect === 'sqlite') {
      expect(sweep).toContain('knowposts_sweep_order');
      expect(marks).toContain('relation_unapplied_created');
      expect(`${sweep}; ${marks}`).not.toContain('TEMP B-TREE');
    } else {
      expect(marks).toContain('relation_unapplied_created');
      expect(`${sweep} ${marks}`).not.toContain('filesort');
    }
  });

  it('tells a database no server migrated from a deployment', async () => {
    const backend = await open();
    close = () => backend.close();
    expect(await isDeployed(backend.db)).toBe(false);
    await migrate(backend.db);
    expect(await isDeployed(backend.db)).toBe(true);
  });

  it('0010 has every live post from before it checked once, first', async () => {
    const db = await databaseAt('0009_knowpost_purge');
    const post = (id: string, status: string) => ({
      id,
      author_id: 1,
      status,
      visible: 'public',
      created_at: 1,
      updated_at: 1,
    });
    await db.kysely
      .insertInto('knowposts')
      .values([post('11', 'draft'), post('12', 'published'), post('13', 'deleted')])
      .execute();
    await migrate(db);
    const rows = await db.kysely
      .selectFrom('knowposts')
      .select(['id', 'objects_check_at'])
      .orderBy('id')
      .execute();
    expect(
      rows.map((r) => [String(r.id), r.objects_check_at === null ? null : Number(r.objects_check_at)]),
    ).toEqual([
      ['11', 0],
      ['12', 0],
      ['13', null],
    ]);
  });

  it('0011 makes zgIds unique whatever their case, the oldest holder keeping theirs', async () => {
    const db = await databaseAt('0010_knowpost_sweep');
    const user = (id: number, zgId: string) => ({
      id,
      phone: `1380000000${id}`,
      email: null,
      password_hash: null,
      nickname: `u${id}`,
      avatar: 'https://a.test/a.png',
      bio: null,
      zg_id: zgId,
      gender: 'UNKNOWN',
      birthday: null,
      school: null,
      tags_json: '[]',
      created_at: id,
      updated_at: id,
    });
    await db.kysely
      .insertInto('users')
      .values([user(1, 'Alice_1'), user(2, 'alice_1'), user(3, 'ALICE_1'), user(4, 'bob_22')])
      .execute();
    await migrate(db);

    const handles = (await db.kysely.selectFrom('users').select(['id', 'zg_id']).orderBy('id').execute()).map(
      (r) => [Number(r.id), r.zg_id],
    );
    expect(handles[0]).toEqual([1, 'Alice_1']);
    expect(handles[3]).toEqual([4, 'bob_22']);
    for (const [, zgId] of handles.slice(1, 3)) expect(zgId).toMatch(/^zg_[0-9a-f]{10}$/);
    expect(new Set(handles.map(([, zgId]) => String(zgId).toLowerCase())).size).toBe(4);

    const taken = await db.kysely
      .updateTable('users')
      .set({ zg_id: 'BOB_22' })
      .where('id', '=', 1)
      .execute()
      .then(() => 'ok', violation);
    expect(taken).toMatch(/^unique .*zg_id/);
    // A holder may change the case of their own.
    await db.kysely.updateTable('users').set({ zg_id: 'BOB_22' }).where('id', '=', 4).execute();
  });

  it("0015 stores each e-mail address in its mailbox's one form, unless another account holds that form", async () => {
    const db = await databaseAt('0014_likes_received_parked');
    const addresses = [
      'a@mail.xn--fiqs8s', // becomes a@mail.中国
      'b@ｍａｉｌ.中国', // full-width host letters
      'josé@example.com'.normalize('NFD'),
      'c@mail.中国', // already in its form
      'd@mail.xn--fiqs8s', // its form is held by the next account: left as it is
      'd@mail.中国',
      'e@example.com',
    ];
    await db.kysely
      .insertInto('users')
      .values(
        addresses.map((email, i) => ({
          id: i + 1,
          phone: null,
          email,
          password_hash: null,
          nickname: `u${i + 1}`,
          avatar: 'https://a.test/a.png',
          bio: null,
          zg_id: `zg_${i + 1}`,
          gender: 'UNKNOWN',
          birthday: null,
          school: null,
          tags_json: '[]',
          created_at: 1,
          updated_at: 1,
        })),
      )
      .execute();
    await migrate(db);
    const emails = (await db.kysely.selectFrom('users').select('email').orderBy('id').execute()).map(
      (r) => r.email,
    );
    expect(emails).toEqual([
      'a@mail.中国',
      'b@mail.中国',
      'josé@example.com'.normalize('NFC'),
      'c@mail.中国',
      'd@mail.xn--fiqs8s',
      'd@mail.中国',
      'e@example.com',
    ]);
  });
});

/** What the repositories make of a driver's error (see `translateDbError`). */
function violation(err: unknown): string {
  try {
    translateDbError(err);
  } catch (translated) {
    if (translated instanceof UniqueViolationError) return `unique ${translated.constraint}`;
  }
  return 'other';
}

describe('migrations on MySQL without the database', () => {
  it('say that the database must be created first', async () => {
    const url = new URL(services.mysqlRootUrl());
    url.pathname = `/zg_missing_${process.pid}_${Date.now()}`;
    const db = await openMysql(url.toString(), 1);
    try {
      await expect(migrate(db)).rejects.toThrow(/Unknown database .*create it first: CREATE DATABASE/);
    } finally {
      await db.close();
    }
  });
});

describe('migrations on MariaDB cut short', () => {
  const [, open] = freshDatabases({ migrated: false }).find(([name]) => name === 'mariadb')!;

  it('run a step of several statements again to its end when its first ones already ran', async () => {
    const fresh = await open();
    const db = fresh.db;
    try {
      await migrateTo(db, '0006_user_counters');
      // 0007 cut short after its first table, as MySQL commits each CREATE at once.
      await sql`CREATE TABLE following (
        from_user_id BIGINT UNSIGNED NOT NULL, to_user_id BIGINT UNSIGNED NOT NULL,
        created_at BIGINT NOT NULL, PRIMARY KEY (from_user_id, to_user_id))`.execute(db.kysely);
      await migrateTo(db, '0009_knowpost_purge');
      await db.kysely
        .insertInto('knowposts')
        .values({
          id: '21',
          author_id: 1,
          status: 'published',
          visible: 'public',
          created_at: 1,
          updated_at: 1,
        })
        .execute();
      // 0010 cut short after its ALTER, during the UPDATE.
      await sql`ALTER TABLE knowposts ADD COLUMN objects_check_at BIGINT NULL,
        ADD KEY knowposts_sweep (objects_check_at)`.execute(db.kysely);
      await migrate(db);
      const row = await db.kysely
        .selectFrom('knowposts')
        .select('objects_check_at')
        .where('id', '=', '21')
        .executeTakeFirstOrThrow();
      expect(Number(row.objects_check_at)).toBe(0);
      expect(await db.kysely.selectFrom('follower').select('to_user_id').execute()).toEqual([]);
    } finally {
      await fresh.close();
    }
  });
});

describe('migrations on MariaDB run again', () => {
  const [, open] = freshDatabases({ migrated: false }).find(([name]) => name === 'mariadb')!;

  it('take every step that ran whole but was not recorded (a process killed before the record)', async () => {
    const fresh = await open();
    const db = fresh.db;
    try {
      for (const [name, migration] of Object.entries(migrationsFor('mysql'))) {
        // The step's own statements, committed one by one, as MySQL does with DDL; then the migrator.
        await migration.up(db.kysely as Kysely<unknown>);
        await expect(migrateTo(db, name).then(() => name)).resolves.toBe(name);
      }
    } finally {
      await fresh.close();
    }
  });
});

describe('migrations on SQLite cut short', () => {
  const [, open] = freshDatabases({ migrated: false }).find(([name]) => name === 'sqlite')!;

  it('leave nothing of a step that failed half-way, so the next start runs it whole', async () => {
    const fresh = await open();
    const db = fresh.db;
    try {
      await migrateTo(db, '0009_knowpost_purge');
      const all = migrationsFor('sqlite');
      // 0010 fails after its ALTER and its index, before it is recorded (a process killed there).
      const cut: Record<string, Migration> = {
        ...Object.fromEntries(Object.entries(all).filter(([name]) => name <= '0009_knowpost_purge')),
        '0010_knowpost_sweep': {
          up: async (trx) => {
            await sql`ALTER TABLE knowposts ADD COLUMN objects_check_at INTEGER`.execute(trx);
            await sql`CREATE INDEX knowposts_sweep ON knowposts (objects_check_at)`.execute(trx);
            throw new Error('killed');
          },
        },
      };
      const { error } = await new Migrator({
        db: db.kysely,
        provider: { getMigrations: () => Promise.resolve(cut) },
      }).migrateToLatest();
      expect(error).toBeInstanceOf(Error);
      const columns = await sql<{ name: string }>`SELECT name FROM pragma_table_info('knowposts')`.execute(
        db.kysely,
      );
      expect(columns.rows.map((c) => c.name)).not.toContain('objects_check_at');
      await migrate(db);
      expect(await isDeployed(db)).toBe(true);
    } finally {
      await fresh.close();
    }
  });
});
