import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createMysqlDatabase, openTempSqlite } from '../../test/rig/resources.js';
import { migrate, openMysql, type Db } from '../platform/db/database.js';
import type { Insertable } from 'kysely';
import type { KnowpostsTable } from '../platform/db/schema.js';
import { PostReadRepository } from './post-read.repository.js';

type Dialect = 'sqlite' | 'mysql';

async function openDb(dialect: Dialect): Promise<{ db: Db; dispose: () => Promise<void> }> {
  if (dialect === 'sqlite') return openTempSqlite();
  const database = await createMysqlDatabase();
  const db = await openMysql(database.url, 2);
  await migrate(db);
  return {
    db,
    dispose: async () => {
      await db.close();
      await database.drop();
    },
  };
}

const BASE = 7_100_000_000_000_000_000n;
const id = (n: number) => String(BASE + BigInt(n));

describe.each<Dialect>(['sqlite', 'mysql'])(`${PostReadRepository.name} on %s`, (dialect) => {
  let db: Db;
  let dispose: () => Promise<void>;
  let sut: PostReadRepository;
  let alice: number;
  let bob: number;

  const insertPost = (n: number, fields: Partial<Insertable<KnowpostsTable>> & { author_id: number }) =>
    db.kysely
      .insertInto('knowposts')
      .values({
        id: id(n),
        status: 'published',
        visible: 'public',
        created_at: 1,
        updated_at: 1,
        publish_time: 1_000 + n,
        ...fields,
      })
      .execute();

  beforeAll(async () => {
    ({ db, dispose } = await openDb(dialect));
    sut = new PostReadRepository(db);
    const user = (nickname: string, phone: string) => ({
      phone,
      email: `${nickname}@example.test`,
      password_hash: 'secret-hash',
      nickname,
      avatar: `https://a.example.test/${nickname}.png`,
      bio: null,
      zg_id: `zg_${nickname}`,
      gender: 'UNKNOWN',
      birthday: null,
      school: null,
      tags_json: `["${nickname}"]`,
      created_at: 1,
      updated_at: 1,
    });
    await db.kysely
      .insertInto('users')
      .values([user('alice', '13800000001'), user('bob', '13800000002')])
      .execute();
    const users = await db.kysely.selectFrom('users').select(['id', 'nickname']).execute();
    alice = Number(users.find((u) => u.nickname === 'alice')!.id);
    bob = Number(users.find((u) => u.nickname === 'bob')!.id);

    // Feed order is publish time, then id, newest first; 5 and 6 share a publish time.
    await insertPost(1, { author_id: alice, title: 'one', tags_json: '["x","y"]', img_urls_json: '["k"]' });
    await insertPost(2, { author_id: bob });
    await insertPost(3, { author_id: alice, visible: 'private' });
    await insertPost(4, { author_id: alice, status: 'draft', publish_time: null });
    await insertPost(5, { author_id: alice, publish_time: 2_000, is_top: 1 });
    await insertPost(6, { author_id: bob, publish_time: 2_000 });
    await insertPost(7, { author_id: alice, status: 'deleted' });
    await insertPost(8, { author_id: bob, visible: 'unlisted' });
    await insertPost(9, {
      author_id: alice,
      tags_json: 'not json',
      content_key: `posts/${id(9)}/content.md`,
    });
  });
  afterAll(async () => dispose?.());

  it('pages published public posts, newest first, telling whether more follow', async () => {
    expect(await sut.feedPage(1, 2)).toEqual({ ids: [id(6), id(5)], hasMore: true });
    expect(await sut.feedPage(2, 2)).toEqual({ ids: [id(9), id(2)], hasMore: true });
    expect(await sut.feedPage(3, 2)).toEqual({ ids: [id(1)], hasMore: false });
    expect(await sut.feedPage(1, 5)).toEqual({ ids: [id(6), id(5), id(9), id(2), id(1)], hasMore: false });
    expect(await sut.feedPage(4, 2)).toEqual({ ids: [], hasMore: false });
  });

  it('pages an author’s published posts of any visibility, top ones first', async () => {
    expect(await sut.authorPage(alice, 1, 10)).toEqual({ ids: [id(5), id(9), id(3), id(1)], hasMore: false });
    expect(await sut.authorPage(alice, 1, 3)).toEqual({ ids: [id(5), id(9), id(3)], hasMore: true });
    expect(await sut.authorPage(bob, 1, 10)).toEqual({ ids: [id(6), id(8), id(2)], hasMore: false });
    expect(await sut.authorPage(999_999, 1, 10)).toEqual({ ids: [], hasMore: false });
  });

  it('loads posts in one batch with ids, numbers and lists normalised', async () => {
    const rows = await sut.loadPosts([id(1), id(4), id(9), id(1), '123']);
    const byId = new Map(rows.map((r) => [r.id, r]));
    expect(rows).toHaveLength(3);
    expect(byId.get(id(1))).toEqual({
      id: id(1),
      authorId: alice,
      status: 'published',
      visible: 'public',
      title: 'one',
      description: null,
      tags: ['x', 'y'],
      imgUrls: ['k'],
      contentKey: null,
      isTop: false,
      type: 'image_text',
      publishTime: 1_001,
    });
    expect(byId.get(id(4))).toMatchObject({ status: 'draft', publishTime: null, tags: [], imgUrls: [] });
    expect(byId.get(id(9))).toMatchObject({ tags: [], contentKey: `posts/${id(9)}/content.md` });
    expect(await sut.loadPosts([])).toEqual([]);
  });

  it('loads authors’ public fields only, never phone or e-mail', async () => {
    const rows = await sut.loadAuthors([alice, bob, alice, 424242]);
    expect(rows.sort((a, b) => a.id - b.id)).toEqual(
      [
        { id: alice, nickname: 'alice', avatar: 'https://a.example.test/alice.png', tagsJson: '["alice"]' },
        { id: bob, nickname: 'bob', avatar: 'https://a.example.test/bob.png', tagsJson: '["bob"]' },
      ].sort((a, b) => a.id - b.id),
    );
    expect(JSON.stringify(rows)).not.toMatch(/1380000000|example\.test"|secret-hash/);
    expect(await sut.loadAuthors([])).toEqual([]);
  });
});
