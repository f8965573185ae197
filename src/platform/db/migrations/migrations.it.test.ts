import { Migrator } from 'kysely/migration';
import { afterEach, describe, expect, it } from 'vitest';
import { createMysqlDatabase } from '../../../../test/rig/resources.js';
import { UniqueViolationError } from '../../errors/errors.js';
import { migrate, openMysql, openSqlite, translateDbError, type Db } from '../database.js';
import { migrationsFor } from './index.js';

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

describe.each(backends)('migrations on %s', (_name, open) => {
  let close: (() => Promise<void>) | undefined;
  afterEach(async () => {
    await close?.();
    close = undefined;
  });

  it('0011 makes zgIds unique whatever their case, the oldest holder keeping theirs', async () => {
    const backend = await open();
    close = () => backend.close();
    const { db } = backend;
    const migrator = new Migrator({
      db: db.kysely,
      provider: { getMigrations: () => Promise.resolve(migrationsFor(db.dialect)) },
    });
    expect((await migrator.migrateTo('0010_knowpost_sweep')).error).toBeUndefined();
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
