import { Migrator } from 'kysely/migration';
import { afterEach, describe, expect, it } from 'vitest';
import { createMysqlDatabase } from '../../test/rig/resources.js';
import { migrate, openMysql, openSqlite, type Db } from '../platform/db/database.js';
import { migrationsFor } from '../platform/db/migrations/index.js';

const backends: [string, () => Promise<{ db: Db; close(): Promise<void> }>][] = [
  [
    'sqlite',
    async () => {
      const db = openSqlite(':memory:');
      return { db, close: () => db.close() };
    },
  ],
  [
    'mariadb',
    async () => {
      const database = await createMysqlDatabase();
      const db = await openMysql(database.url);
      return {
        db,
        close: async () => {
          await db.close();
          await database.drop();
        },
      };
    },
  ],
];

describe.each(backends)('the upload sweep migration on %s', (_name, open) => {
  let close: (() => Promise<void>) | undefined;
  afterEach(async () => {
    await close?.();
    close = undefined;
  });

  it('has every live post from before it checked once, first', async () => {
    const backend = await open();
    close = () => backend.close();
    const { db } = backend;
    const migrator = new Migrator({
      db: db.kysely,
      provider: { getMigrations: () => Promise.resolve(migrationsFor(db.dialect)) },
    });
    const before = await migrator.migrateTo('0009_knowpost_purge');
    expect(before.error).toBeUndefined();
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
});
