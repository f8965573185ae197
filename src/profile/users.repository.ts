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

  /** Stores `next` as the user's password hash if it is still `expected`; whether it did. */
  async replacePasswordHash(id: number, expected: string, next: string): Promise<boolean> {
    const result = await this.db.kysely
      .updateTable('users')
      .set({ password_hash: next })
      .where('id', '=', id)
      .where('password_hash', '=', expected)
      .executeTakeFirst();
    return Number(result.numUpdatedRows) > 0;
  }

  /** Stores `next` as the user's avatar if it is still `expected`; whether it did. */
  async replaceAvatar(id: number, expected: string, next: string, updatedAt: number): Promise<boolean> {
    const result = await this.db.kysely
      .updateTable('users')
      .set({ avatar: next, updated_at: updatedAt })
      .where('id', '=', id)
      .where('avatar', '=', expected)
      .executeTakeFirst();
    return Number(result.numUpdatedRows) > 0;
  }

  async update(id: number, patch: UserPatch): Promise<void> {
    try {
      await this.db.kysely.updateTable('users').set(patch).where('id', '=', id).execute();
    } catch (err) {
      translateDbError(err);
    }
  }
}

/** User ids in ascending order after `afterId`, for jobs that visit every user. */
export async function userIdsAfter(db: Db, afterId: number, limit: number): Promise<number[]> {
  const rows = await db.kysely
    .selectFrom('users')
    .select('id')
    .where('id', '>', afterId)
    .orderBy('id')
    .limit(limit)
    .execute();
  return rows.map((r) => Number(r.id));
}

/** Up to `limit` user ids picked at random (cheap on both dialects: a random start id, then a range). */
export async function sampleUserIds(db: Db, limit: number): Promise<number[]> {
  const bounds = await db.kysely
    .selectFrom('users')
    .select((eb) => [eb.fn.min<number | string>('id').as('lo'), eb.fn.max<number | string>('id').as('hi')])
    .executeTakeFirst();
  if (!bounds || bounds.lo === null || bounds.hi === null) return [];
  const lo = Number(bounds.lo);
  const hi = Number(bounds.hi);
  const start = lo - 1 + Math.floor(Math.random() * (hi - lo + 1));
  const ids = await userIdsAfter(db, start, limit);
  return ids.length < limit ? [...ids, ...(await userIdsAfter(db, lo - 1, limit - ids.length))] : ids;
}
