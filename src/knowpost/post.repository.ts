import { sql, type Kysely, type Transaction, type Updateable } from 'kysely';
import { translateDbError, type Db } from '../platform/db/database.js';
import type { Database, KnowpostsTable } from '../platform/db/schema.js';

/** The later of a nullable time column and `at`, for an UPDATE that may only move it forward. */
function laterOf(column: 'uploads_open_until', at: number) {
  const current = sql.ref(column);
  return sql<number>`CASE WHEN ${current} IS NULL OR ${current} < ${at} THEN ${at} ELSE ${current} END`;
}

/** The earlier of a nullable time column and `at`, for an UPDATE that may only move it back. */
function earlierOf(column: 'objects_check_at', at: number) {
  const current = sql.ref(column);
  return sql<number>`CASE WHEN ${current} IS NULL OR ${current} > ${at} THEN ${at} ELSE ${current} END`;
}

export type PostStatus = 'draft' | 'published' | 'deleted';

/** The columns the write side needs, with ids and numbers normalised across dialects. */
export interface PostRecord {
  id: string;
  authorId: number;
  status: PostStatus;
  visible: string;
  contentKey: string | null;
  contentEtag: string | null;
  contentSha256: string | null;
  imgUrls: string[];
  /** `imgUrls` as stored, for `update`'s check that no other edit changed them meanwhile. */
  imgUrlsJson: string;
  /** Until when an upload URL of the post may still deliver an object; null when none was handed out. */
  uploadsOpenUntil: number | null;
  /** How many times it became one of its author's public posts (`public_epoch`). */
  publicEpoch: number;
  /** Its latest crossings into and out of those, as stored (`public_crossings`). */
  publicCrossingsJson: string;
}

/**
 * An edit that moves the post into its author's public posts (`enter`: a published post that is not
 * public, made public) or out of them (`leave`: a published public post made anything else).
 */
export type CrossingDirection = 'enter' | 'leave';

export interface PostFields {
  title?: string;
  tagId?: number | null;
  tags?: string[];
  imgUrls?: string[];
  visible?: string;
  isTop?: boolean;
  description?: string;
}

export interface ContentRecord {
  key: string;
  etag: string;
  size: number;
  sha256: string;
}

type Executor = Kysely<Database> | Transaction<Database>;

function parseList(json: string): string[] {
  try {
    const value: unknown = JSON.parse(json);
    return Array.isArray(value) ? value.filter((v): v is string => typeof v === 'string') : [];
  } catch {
    return [];
  }
}

/**
 * SQL of the post write side. Every change is a conditional UPDATE on the row's owner and state, so
 * a change that lost a race (the post was deleted or published meanwhile) matches no row and the
 * service decides what to answer; nothing here reads and then writes.
 */
export class PostRepository {
  constructor(private readonly db: Db) {}

  transaction<T>(work: (trx: Transaction<Database>) => Promise<T>): Promise<T> {
    return this.db.kysely.transaction().execute(work);
  }

  /**
   * Inserts the draft unless its author holds `maxOpen` open drafts already (false then). One
   * author's drafts are counted and added one at a time: MySQL locks the author's row first, SQLite
   * has one writer. Throws `UniqueViolationError` when the id is taken.
   */
  async insertDraft(id: string, authorId: number, now: number, maxOpen: number): Promise<boolean> {
    return this.db.kysely
      .transaction()
      .execute(async (trx) => {
        if (this.db.dialect === 'mysql')
          await trx.selectFrom('users').select('id').where('id', '=', authorId).forUpdate().execute();
        if ((await this.countDrafts(authorId, trx)) >= maxOpen) return false;
        await this.insertDraftRow(trx, id, authorId, now);
        return true;
      })
      .catch(translateDbError);
  }

  private async insertDraftRow(db: Executor, id: string, authorId: number, now: number): Promise<void> {
    await db
      .insertInto('knowposts')
      .values({
        id,
        author_id: authorId,
        status: 'draft',
        visible: 'public',
        created_at: now,
        updated_at: now,
      })
      .execute();
  }

  async countDrafts(authorId: number, db: Executor = this.db.kysely): Promise<number> {
    const row = await db
      .selectFrom('knowposts')
      .select((eb) => eb.fn.countAll().as('n'))
      .where('author_id', '=', authorId)
      .where('status', '=', 'draft')
      .executeTakeFirst();
    return Number(row?.n ?? 0);
  }

  async find(id: string, db: Executor = this.db.kysely): Promise<PostRecord | null> {
    const row = await db
      .selectFrom('knowposts')
      .select([
        'id',
        'author_id',
        'status',
        'visible',
        'content_key',
        'content_etag',
        'content_sha256',
        'img_urls_json',
        'uploads_open_until',
        'public_epoch',
        'public_crossings',
      ])
      .where('id', '=', id)
      .executeTakeFirst();
    if (!row) return null;
    return {
      id: String(row.id),
      authorId: Number(row.author_id),
      status: row.status as PostStatus,
      visible: row.visible,
      contentKey: row.content_key,
      contentEtag: row.content_etag,
      contentSha256: row.content_sha256,
      imgUrls: parseList(row.img_urls_json),
      imgUrlsJson: row.img_urls_json,
      uploadsOpenUntil: row.uploads_open_until === null ? null : Number(row.uploads_open_until),
      publicEpoch: Number(row.public_epoch),
      publicCrossingsJson: row.public_crossings,
    };
  }

  /**
   * Applies `fields` to the author's post unless it is deleted, and only while its images are still
   * `imagesWere` (as `imgUrlsJson` read them) when that is given; false when no such row. With
   * `crossing`, only when the edit makes that crossing, which then also counts an entry.
   */
  async update(
    id: string,
    authorId: number,
    fields: PostFields,
    now: number,
    imagesWere?: string,
    db: Executor = this.db.kysely,
    crossing?: CrossingDirection,
  ): Promise<boolean> {
    const set: Updateable<KnowpostsTable> = { updated_at: now };
    if (fields.title !== undefined) set.title = fields.title;
    if (fields.tagId !== undefined) set.tag_id = fields.tagId;
    if (fields.tags !== undefined) set.tags_json = JSON.stringify(fields.tags);
    if (fields.imgUrls !== undefined) set.img_urls_json = JSON.stringify(fields.imgUrls);
    if (fields.visible !== undefined) set.visible = fields.visible;
    if (fields.isTop !== undefined) set.is_top = fields.isTop ? 1 : 0;
    if (fields.description !== undefined) set.description = fields.description;
    let update = db
      .updateTable('knowposts')
      .set(set)
      .where('id', '=', id)
      .where('author_id', '=', authorId)
      .where('status', '!=', 'deleted');
    if (imagesWere !== undefined) update = update.where('img_urls_json', '=', imagesWere);
    if (crossing !== undefined)
      update = update
        .where('status', '=', 'published')
        .where('visible', crossing === 'enter' ? '!=' : '=', 'public');
    if (crossing === 'enter') update = update.set({ public_epoch: sql<number>`public_epoch + 1` });
    const result = await update.executeTakeFirst();
    return result.numUpdatedRows > 0n;
  }

  /**
   * Sets the post's body, only while it is still `previous` (the key the caller read): false when
   * the post is gone or its body changed meanwhile.
   */
  async setContent(
    id: string,
    authorId: number,
    previous: string | null,
    content: ContentRecord,
    now: number,
    db: Executor = this.db.kysely,
  ): Promise<boolean> {
    const result = await db
      .updateTable('knowposts')
      .set({
        content_key: content.key,
        content_etag: content.etag,
        content_size: content.size,
        content_sha256: content.sha256,
        updated_at: now,
      })
      .where('id', '=', id)
      .where('author_id', '=', authorId)
      .where('status', '!=', 'deleted')
      .where((eb) => (previous === null ? eb('content_key', 'is', null) : eb('content_key', '=', previous)))
      .executeTakeFirst();
    return result.numUpdatedRows > 0n;
  }

  /**
   * draft → published, only with confirmed content; false when the row was not such a draft. A
   * public post thereby enters its author's public posts, which counts an entry.
   */
  async publish(trx: Transaction<Database>, id: string, authorId: number, now: number): Promise<boolean> {
    const result = await trx
      .updateTable('knowposts')
      .set({
        status: 'published',
        publish_time: now,
        updated_at: now,
        public_epoch: sql<number>`CASE WHEN visible = 'public' THEN public_epoch + 1 ELSE public_epoch END`,
      })
      .where('id', '=', id)
      .where('author_id', '=', authorId)
      .where('status', '=', 'draft')
      .where('content_key', 'is not', null)
      .executeTakeFirst();
    return result.numUpdatedRows > 0n;
  }

  /** Stores the post's kept crossings; in the transaction of the change that made the last one. */
  async recordCrossings(trx: Transaction<Database>, id: string, crossingsJson: string): Promise<void> {
    await trx
      .updateTable('knowposts')
      .set({ public_crossings: crossingsJson })
      .where('id', '=', id)
      .execute();
  }

  /** Points the body of a post not deleted at `to` if it is still at `from`; false otherwise. */
  async moveContent(id: string, from: string, to: string, trx?: Transaction<Database>): Promise<boolean> {
    const result = await (trx ?? this.db.kysely)
      .updateTable('knowposts')
      .set({ content_key: to })
      .where('id', '=', id)
      .where('content_key', '=', from)
      .where('status', '!=', 'deleted')
      .executeTakeFirst();
    return result.numUpdatedRows > 0n;
  }

  /** Deleted posts whose objects are still in storage, deleted before `before`, oldest first. */
  async deletedUnpurged(before: number, limit: number): Promise<string[]> {
    const rows = await this.db.kysely
      .selectFrom('knowposts')
      .select('id')
      .where('status', '=', 'deleted')
      .where('objects_purged_at', 'is', null)
      .where('updated_at', '<', before)
      .orderBy('updated_at')
      .limit(limit)
      .execute();
    return rows.map((r) => String(r.id));
  }

  /**
   * Marks a deleted post's objects removed. While an upload URL handed out before the deletion may
   * still deliver an object (`uploads_open_until`: a PUT that started in time may finish late), a
   * check of the post's objects is left due then, which removes what came late.
   */
  async markPurged(id: string, now: number): Promise<void> {
    const open = sql.ref('uploads_open_until');
    await this.db.kysely
      .updateTable('knowposts')
      .set({
        objects_purged_at: now,
        objects_check_at: sql<number | null>`CASE WHEN ${open} > ${now} THEN ${open} ELSE NULL END`,
      })
      .where('id', '=', id)
      .where('status', '=', 'deleted')
      .execute();
  }

  /**
   * An upload URL is handed out (or a patch may leave copies behind): moves the post's objects
   * check to `checkAt` unless one is due earlier (see `PostService.presign`), and records that
   * uploads may arrive until `openUntil`, so that checks go on until then (`PostUploadSweeper`,
   * whose check due earlier leaves one due after this URL expires). Never later: URLs or patches
   * asked for one after another would put a check off for ever.
   */
  async openUploads(id: string, checkAt: number, openUntil: number): Promise<void> {
    await this.db.kysely
      .updateTable('knowposts')
      .set({
        objects_check_at: earlierOf('objects_check_at', checkAt),
        uploads_open_until: laterOf('uploads_open_until', openUntil),
      })
      .where('id', '=', id)
      .execute();
  }

  /**
   * Posts whose objects check is due at `now`, earliest first (then by id), with when each was due;
   * past `after`, the last of a previous page, when given.
   */
  async objectsCheckDue(
    now: number,
    limit: number,
    after?: { id: string; due: number },
  ): Promise<{ id: string; due: number }[]> {
    let query = this.db.kysely
      .selectFrom('knowposts')
      .select(['id', 'objects_check_at'])
      .where('objects_check_at', '<=', now);
    if (after)
      query = query.where((eb) =>
        eb.or([
          eb('objects_check_at', '>', after.due),
          eb.and([eb('objects_check_at', '=', after.due), eb('id', '>', after.id)]),
        ]),
      );
    const rows = await query.orderBy('objects_check_at').orderBy('id').limit(limit).execute();
    return rows.map((r) => ({ id: String(r.id), due: Number(r.objects_check_at) }));
  }

  /**
   * Ends the check that was due at `due`: the next one at `next` (none when null), unless the check
   * was moved meanwhile (a patch), or, given the `uploads_open_until` the check read last, uploads
   * were opened since (a presign, which keeps a check due earlier): the check then stays due, and
   * the next round runs it again with what changed.
   */
  async finishObjectsCheck(
    id: string,
    due: number,
    next: number | null,
    openUntilRead?: number | null,
  ): Promise<void> {
    let update = this.db.kysely
      .updateTable('knowposts')
      .set({ objects_check_at: next })
      .where('id', '=', id)
      .where('objects_check_at', '=', due);
    if (openUntilRead !== undefined)
      update = update.where((eb) =>
        openUntilRead === null
          ? eb('uploads_open_until', 'is', null)
          : eb('uploads_open_until', '=', openUntilRead),
      );
    await update.execute();
  }

  /**
   * `from` → deleted; false when the row is no longer in state `from`, or with `publicOnly` when it is
   * not public (a published public post so leaves its author's public posts).
   */
  async softDelete(
    trx: Transaction<Database>,
    id: string,
    authorId: number,
    from: Exclude<PostStatus, 'deleted'>,
    now: number,
    publicOnly = false,
  ): Promise<boolean> {
    let update = trx
      .updateTable('knowposts')
      .set({ status: 'deleted', updated_at: now })
      .where('id', '=', id)
      .where('author_id', '=', authorId)
      .where('status', '=', from);
    if (publicOnly) update = update.where('visible', '=', 'public');
    const result = await update.executeTakeFirst();
    return result.numUpdatedRows > 0n;
  }
}
