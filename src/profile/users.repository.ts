import type { Selectable, Updateable } from 'kysely';
import type { Db } from '../platform/db/database.js';
import { translateDbError } from '../platform/db/database.js';
import type { UsersTable } from '../platform/db/schema.js';

export type UserRow = Selectable<UsersTable>;
export type UserPatch = Omit<Updateable<UsersTable>, 'id' | 'created_at'>;
export type NewUser = Omit<UsersTable, 'id'>;

/** The `users` table; unique-key violations surface as `UniqueViolationError`. */
export class UsersRepository {
  constructor(private readonly db: Db) {}

  async findById(id: number): Promise<UserRow | undefined> {
    return this.db.kysely.selectFrom('users').selectAll().where('id', '=', id).executeTakeFirst();
  }

  async findByIds(ids: readonly number[]): Promise<UserRow[]> {
    if (ids.length === 0) return [];
    return this.db.kysely
      .selectFrom('users')
      .selectAll()
      .where('id', 'in', [...ids])
      .execute();
  }

  async findByIdentifier(type: 'PHONE' | 'EMAIL', identifier: string): Promise<UserRow | undefined> {
    const column = type === 'PHONE' ? 'phone' : 'email';
    return this.db.kysely.selectFrom('users').selectAll().where(column, '=', identifier).executeTakeFirst();
  }

  async insert(user: NewUser): Promise<UserRow> {
    try {
      const result = await this.db.kysely.insertInto('users').values(user).executeTakeFirstOrThrow();
      const id = Number(result.insertId);
      const row = await this.findById(id);
      if (!row) throw new Error(`user ${id} vanished after insert`);
      return row;
    } catch (err) {
      return translateDbError(err);
    }
  }

  async update(id: number, patch: UserPatch): Promise<void> {
    try {
      await this.db.kysely.updateTable('users').set(patch).where('id', '=', id).execute();
    } catch (err) {
      translateDbError(err);
    }
  }
}
