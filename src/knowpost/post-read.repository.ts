import type { Db } from '../platform/db/database.js';

/** One post as the read side needs it, with ids and numbers normalised across dialects. */
export interface PostReadRow {
  id: string;
  authorId: number;
  status: string;
  visible: string;
  title: string | null;
  description: string | null;
  tags: string[];
  /** Object keys under `posts/{id}/images/` or absolute http(s) URLs, as stored. */
  imgUrls: string[];
  contentKey: string | null;
  isTop: boolean;
  type: string;
  publishTime: number | null;
}

/** What a post page shows of its author; never phone or e-mail. */
export interface AuthorRow {
  id: number;
  nickname: string;
  avatar: string;
  tagsJson: string;
}

export interface IdPage {
  ids: string[];
  hasMore: boolean;
}

function stringList(json: string | null | undefined): string[] {
  if (!json) return [];
  try {
    const value: unknown = JSON.parse(json);
    return Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : [];
  } catch {
    return [];
  }
}

/**
 * SQL of the read side: pages of ids and batched loads, each one query whatever the page size.
 * Pages read `size + 1` rows to tell whether another page follows.
 */
export class PostReadRepository {
  constructor(private readonly db: Db) {}

  /** Published public posts, newest first (publish time, then id). */
  async feedPage(page: number, size: number): Promise<IdPage> {
    const ids = await this.feedIds((page - 1) * size, size + 1);
    return { ids: ids.slice(0, size), hasMore: ids.length > size };
  }

  /** Ids of the public feed, newest first, from `offset` on, at most `limit`. */
  async feedIds(offset: number, limit: number): Promise<string[]> {
    const rows = await this.db.kysely
      .selectFrom('knowposts')
      .select('id')
      .where('status', '=', 'published')
      .where('visible', '=', 'public')
      .orderBy('publish_time', 'desc')
      .orderBy('id', 'desc')
      .limit(limit)
      .offset(offset)
      .execute();
    return rows.map((r) => String(r.id));
  }

  /** The author's published posts of any visibility, top ones first, then newest first. */
  async authorPage(authorId: number, page: number, size: number): Promise<IdPage> {
    const rows = await this.db.kysely
      .selectFrom('knowposts')
      .select('id')
      .where('author_id', '=', authorId)
      .where('status', '=', 'published')
      .orderBy('is_top', 'desc')
      .orderBy('publish_time', 'desc')
      .orderBy('id', 'desc')
      .limit(size + 1)
      .offset((page - 1) * size)
      .execute();
    return toPage(rows, size);
  }

  /** The posts with these ids, in any state, in no particular order; one query. */
  async loadPosts(ids: readonly string[]): Promise<PostReadRow[]> {
    if (ids.length === 0) return [];
    const rows = await this.db.kysely
      .selectFrom('knowposts')
      .select([
        'id',
        'author_id',
        'status',
        'visible',
        'title',
        'description',
        'tags_json',
        'img_urls_json',
        'content_key',
        'is_top',
        'type',
        'publish_time',
      ])
      .where('id', 'in', [...new Set(ids)])
      .execute();
    return rows.map((r) => ({
      id: String(r.id),
      authorId: Number(r.author_id),
      status: r.status,
      visible: r.visible,
      title: r.title,
      description: r.description,
      tags: stringList(r.tags_json),
      imgUrls: stringList(r.img_urls_json),
      contentKey: r.content_key,
      isTop: Number(r.is_top) !== 0,
      type: r.type,
      publishTime: r.publish_time === null ? null : Number(r.publish_time),
    }));
  }

  /** Public profile fields of these users; one query. */
  async loadAuthors(ids: readonly number[]): Promise<AuthorRow[]> {
    if (ids.length === 0) return [];
    const rows = await this.db.kysely
      .selectFrom('users')
      .select(['id', 'nickname', 'avatar', 'tags_json'])
      .where('id', 'in', [...new Set(ids)])
      .execute();
    return rows.map((r) => ({
      id: Number(r.id),
      nickname: r.nickname,
      avatar: r.avatar,
      tagsJson: r.tags_json,
    }));
  }
}

function toPage(rows: { id: string }[], size: number): IdPage {
  return { ids: rows.slice(0, size).map((r) => String(r.id)), hasMore: rows.length > size };
}
