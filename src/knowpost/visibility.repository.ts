import type { Db } from '../platform/db/database.js';
import type { Visibility } from '../counter/entity-directory.js';
import type { EntityRef } from '../counter/model.js';

/** Who may see which post, read from the `knowposts` table in one query per batch. */
export class KnowpostVisibilityRepository {
  constructor(private readonly db: Db) {}

  async load(refs: readonly EntityRef[]): Promise<Map<string, Visibility>> {
    const ids = [...new Set(refs.filter((r) => r.etype === 'knowpost').map((r) => r.eid))];
    const found = new Map<string, Visibility>();
    if (ids.length === 0) return found;
    const rows = await this.db.kysely
      .selectFrom('knowposts')
      .select(['id', 'author_id', 'status', 'visible'])
      .where('id', 'in', ids)
      .execute();
    for (const row of rows) {
      found.set(`knowpost:${String(row.id)}`, {
        authorId: Number(row.author_id),
        status: row.status as Visibility['status'],
        visible: row.visible,
      });
    }
    return found;
  }
}
