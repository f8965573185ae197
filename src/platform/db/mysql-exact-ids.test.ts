import { DummyDriver, Kysely, MysqlAdapter, MysqlIntrospector, MysqlQueryCompiler, sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { MysqlExactIdsPlugin } from './mysql-exact-ids.js';
import type { Database } from './schema.js';

const db = new Kysely<Database>({
  dialect: {
    createAdapter: () => new MysqlAdapter(),
    createDriver: () => new DummyDriver(),
    createIntrospector: (k) => new MysqlIntrospector(k),
    createQueryCompiler: () => new MysqlQueryCompiler(),
  },
  plugins: [new MysqlExactIdsPlugin()],
});

describe(MysqlExactIdsPlugin.name, () => {
  // Two post ids 1 apart near 2^58: as doubles they are the same number.
  const id = '283749823749823749';

  it('sends ids compared with an id column as integers', () => {
    const queries = [
      db.selectFrom('knowposts').select('title').where('id', '=', id),
      db.selectFrom('knowposts').select('title').where('knowposts.id', 'in', [id, '283749823749823750']),
      db.updateTable('knowposts').set({ title: 't' }).where('id', '<', id),
      db.deleteFrom('likes_received_marks').where('post_id', '=', id),
      db
        .selectFrom('knowposts')
        .innerJoin('users', 'users.id', 'knowposts.author_id')
        .select('knowposts.title')
        .where('knowposts.id', '=', id),
    ];
    for (const query of queries) {
      const { parameters } = query.compile();
      expect(parameters.filter((p) => typeof p === 'string')).toEqual(query === queries[2] ? ['t'] : []);
      expect(parameters).toContain(BigInt(id));
    }
  });

  it('leaves other strings alone, digits or not', () => {
    const queries = [
      db.selectFrom('users').select('id').where('zg_id', '=', '1234567890123456'),
      db.selectFrom('users').select('id').where('phone', '=', '13800138000'),
      db.selectFrom('knowposts').select('id').where('id', '=', 'not-an-id'),
      db.insertInto('knowposts').values({ id, author_id: 1 } as never),
    ];
    const strings = queries.map((q) => q.compile().parameters.filter((p) => typeof p === 'string'));
    expect(strings).toEqual([['1234567890123456'], ['13800138000'], ['not-an-id'], [id]]);
    expect(sql`SELECT ${id}`.compile(db).parameters).toEqual([id]);
  });
});
