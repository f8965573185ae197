import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import { mayView } from '../counter/entity-directory.js';
import {
  BadRequestError,
  ConflictError,
  ForbiddenError,
  NotFoundError,
  PayloadTooLargeError,
  UniqueViolationError,
} from '../platform/errors/errors.js';
import { isDependencyOutage } from '../platform/errors/outage.js';
import { isVisible } from '../platform/http/schemas.js';
import type { OutboxWriter } from '../platform/outbox/outbox.js';
import { enforceLimit, type RateLimiter } from '../platform/ratelimit/ratelimit.js';
import { normalizeEtag, type ObjectStorage, type StoredObject } from '../platform/storage/object-storage.js';
import type { Transaction } from 'kysely';
import type { Database } from '../platform/db/schema.js';
import {
  crossingEvent,
  postChangedEvent,
  postEventMessage,
  withCrossing,
  type PublicCrossing,
  type PostChange,
  type PostChangeKind,
  type PostChangeListener,
} from './post-events.js';
import {
  bodyCopyExtension,
  confirmedContentKey,
  contentExtension,
  isExternalImageUrl,
  isImageKey,
  isStoredImageKey,
  isStoredImageOf,
  storedImageKey,
  uploadTarget,
} from './post-keys.js';
import { isListed } from './post-read.model.js';
import type { ContentRecord, PostFields, PostRecord, PostRepository } from './post.repository.js';
import type { ConfirmBody, PresignBody, PresignResponse, Visible } from './post.schema.js';

/** How long after an upload URL expires the post's objects are checked. */
export const UPLOAD_CHECK_GRACE_MS = 60_000;

/** How long after a patch of a post's images starts, and again after it made its copies, the post's objects are checked. */
const PATCH_SETTLE_MS = 5 * 60_000;

export interface PostLimits {
  contentMaxBytes: number;
  imageMaxBytes: number;
  presignExpiresSeconds: number;
  /** Presigned uploads per user per minute. */
  presignPerMinute?: number;
  /** Presigned uploads per user per day: bounds what one account can leave in storage unused. */
  presignPerDay?: number;
  /** New drafts per user per hour. */
  draftsPerHour?: number;
  /**
   * Body confirms and image edits per user per minute: each reads or copies stored objects (a
   * confirm reads the whole upload to check its digest), refused or not.
   */
  storesPerMinute?: number;
  /**
   * Edits of a post's metadata (`update`, also pinning and visibility) per user per minute: each
   * writes an event that caches, feeds and counters act on, so a loop of them would keep the
   * workers busy for everyone.
   */
  editsPerMinute?: number;
  /** Drafts a user may hold at once (published and deleted posts do not count). */
  maxOpenDrafts?: number;
  /**
   * How old an upload never confirmed or referred to must be before `PostUploadSweeper` removes
   * it, and how long after its URL expired an upload may still arrive; default 24 h.
   */
  uploadRetentionMs?: number;
}

export interface PostServiceOptions {
  posts: PostRepository;
  storage: ObjectStorage;
  limiter: RateLimiter;
  outbox: OutboxWriter;
  /** Snowflake ids; distinct worker ids per process keep them unique across a deployment. */
  ids: { next(): string };
  limits: PostLimits;
  /**
   * Told after every committed change, in order, awaited. The list is read at each change, so
   * listeners may be added after the service is built.
   */
  onChange?: readonly PostChangeListener[];
  log?: Pick<Logger, 'warn'>;
  now?: () => number;
}

/**
 * The write side of posts: drafts, uploads, metadata and the publish state machine
 *
 *   draft ──publish (content confirmed)──► published
 *     │                                        │
 *     └──────────delete──────► deleted ◄──delete┘
 *
 * Every transition is one conditional UPDATE on the state it leaves, so of two concurrent requests
 * exactly one changes the row. Leaving or entering `published` appends a `post-events` message in
 * the same transaction: the author's post count moves exactly once per transition. A visibility
 * change of a post that is not a draft, and a new body or a pictures edit of a published post,
 * append a `changed` message the same way, for the caches (see `PostCacheConsumer`).
 *
 * Who gets which answer: a post the caller may not see (missing, deleted, someone else's draft or
 * non-public post) is 404 for every route, so ids cannot be probed; someone else's post the caller
 * may see (published and public) is 403. Only `publish` and `presign` tell the author that
 * their post is deleted (409 `INVALID_STATE`); elsewhere a deleted post is 404.
 */
export class PostService {
  private readonly posts: PostRepository;
  private readonly storage: ObjectStorage;
  private readonly limiter: RateLimiter;
  private readonly outbox: OutboxWriter;
  private readonly ids: { next(): string };
  private readonly limits: Required<PostLimits>;
  private readonly listeners: readonly PostChangeListener[];
  private readonly log: Pick<Logger, 'warn'> | undefined;
  private readonly now: () => number;

  constructor(options: PostServiceOptions) {
    this.posts = options.posts;
    this.storage = options.storage;
    this.limiter = options.limiter;
    this.outbox = options.outbox;
    this.ids = options.ids;
    this.limits = {
      presignPerMinute: 60,
      presignPerDay: 500,
      uploadRetentionMs: 24 * 3_600_000,
      draftsPerHour: 60,
      storesPerMinute: 60,
      editsPerMinute: 120,
      maxOpenDrafts: 100,
      ...options.limits,
    };
    this.listeners = options.onChange ?? [];
    this.log = options.log;
    this.now = options.now ?? Date.now;
  }

  async createDraft(userId: number): Promise<string> {
    await enforceLimit(this.limiter, `post-draft:${userId}`, this.limits.draftsPerHour, 3_600_000, 'drafts');
    const now = this.now();
    // A process started with another's worker id can repeat an id; a fresh one then succeeds.
    for (let attempt = 0; ; attempt++) {
      const id = this.ids.next();
      try {
        if (!(await this.posts.insertDraft(id, userId, now, this.limits.maxOpenDrafts)))
          throw new ConflictError(
            `At most ${this.limits.maxOpenDrafts} drafts may be open; publish or delete one first`,
            'DRAFT_LIMIT',
          );
        await this.announce({ id, authorId: userId, kind: 'created', draft: true, unlisted: true });
        return id;
      } catch (err) {
        if (!(err instanceof UniqueViolationError) || attempt >= 2) throw err;
      }
    }
  }

  private limitStores(userId: number): Promise<void> {
    return enforceLimit(
      this.limiter,
      `post-store:${userId}`,
      this.limits.storesPerMinute,
      60_000,
      'uploads confirmed or images stored',
    );
  }

  async presign(userId: number, request: PresignBody): Promise<PresignResponse> {
    await enforceLimit(
      this.limiter,
      `post-presign:${userId}`,
      this.limits.presignPerMinute,
      60_000,
      'upload requests',
    );
    await enforceLimit(
      this.limiter,
      `post-presign-day:${userId}`,
      this.limits.presignPerDay,
      86_400_000,
      'upload requests today',
    );
    const post = await this.owned(userId, request.postId, true);
    if (post.status === 'deleted') throw new ConflictError('The post is deleted', 'INVALID_STATE');
    const target = uploadTarget(request.scene, post.id, request.contentType, request.ext, this.now());
    if (target.key === post.contentKey) await this.moveLegacyBody(post, target.key);
    const maxBytes =
      request.scene === 'knowpost_content' ? this.limits.contentMaxBytes : this.limits.imageMaxBytes;
    // The post's objects are checked a minute after the URL expires (grace for the store's clock):
    // an upload too large to be accepted goes then, and whatever else is never confirmed or referred
    // to goes once it is older than the retention. The check is moved there even when one is due
    // later, since a later one only waits for objects to age, which this one asks for again; one due
    // earlier stays, and leaves the next one due a minute after this URL expires. A PUT
    // that started before the expiry may still be running, and a URL handed out under a longer
    // expiry may still be valid: checks go on until the expiry plus the retention
    // (`uploads_open_until`, which only grows), as they did before there was an early check.
    const now = this.now();
    const expiresMs = this.limits.presignExpiresSeconds * 1000;
    await this.posts.openUploads(
      post.id,
      now + Math.max(expiresMs + UPLOAD_CHECK_GRACE_MS, PATCH_SETTLE_MS),
      now + expiresMs + this.limits.uploadRetentionMs,
    );
    const signed = await this.storage.presignPut(target.key, {
      contentType: target.contentType,
      maxBytes,
      expiresInSeconds: this.limits.presignExpiresSeconds,
    });
    return {
      objectKey: target.key,
      putUrl: signed.url,
      headers: { 'Content-Type': signed.headers['Content-Type'] ?? target.contentType },
      expiresIn: signed.expiresIn,
    };
  }

  /**
   * Records the uploaded body. The object must be exactly what the client says it uploaded: same
   * size, ETag and SHA-256 (read back from the store), within the size limit. A missing object is
   * 409 `OBJECT_NOT_UPLOADED` (upload first, then confirm); an oversized one is deleted and 413.
   *
   * Readers get a copy of exactly the bytes checked, made inside the store at
   * `posts/{id}/body/{64 random hex}{ext}`, which no presigned URL can write: the upload URL stays
   * usable until it expires, and a PUT through it after confirm changes nothing anyone reads. The
   * upload itself is then deleted. Confirming the same body again succeeds (a retried request).
   *
   * The body is set only over the one this request read; of overlapping confirms the last to store
   * wins, and each deletes just the copy it replaced itself, whose name no confirm writes again.
   */
  async confirmContent(userId: number, postId: string, body: ConfirmBody): Promise<void> {
    await this.limitStores(userId);
    let post = await this.owned(userId, postId);
    const extension = contentExtension(post.id, body.objectKey);
    if (extension === undefined) {
      throw new BadRequestError(`objectKey must be posts/${post.id}/content with an allowed extension`);
    }
    const sha256 = body.sha256.toLowerCase();
    // The post already shows a copy of this very upload (a retry, or an overlapping request).
    const showsThis = async (p: PostRecord | null | undefined) =>
      p != null &&
      p.contentKey !== null &&
      p.contentSha256 === sha256 &&
      bodyCopyExtension(p.id, p.contentKey) === extension &&
      (await this.alreadyConfirmed(p.contentKey, body));
    const replaced: string[] = [];
    if (!(await showsThis(post))) {
      const key = confirmedContentKey(post.id, extension);
      let copied = false;
      try {
        const copy = await this.copyChecked(body, sha256, key);
        copied = true;
        const content = { key, etag: normalizeEtag(copy.etag), size: copy.size, sha256 };
        for (let tries = 1; ; tries++) {
          if (await this.storeContent(post, content)) {
            if (post.contentKey !== null) replaced.push(post.contentKey);
            break;
          }
          const found = await this.posts.find(post.id);
          if (!found || found.status === 'deleted' || found.authorId !== userId) throw notFound();
          if (await showsThis(found)) {
            replaced.push(key);
            break;
          }
          if (tries >= 3) {
            throw new ConflictError(
              'The post’s body changed while this one was being confirmed; try again',
              'POST_CHANGED',
            );
          }
          post = found;
        }
      } catch (err) {
        const now = await this.posts.find(post.id).then(
          (found) => ({ found }),
          () => undefined,
        );
        // The copy is this request's own, unless the row took it after all (a write that
        // committed and then failed to answer). When the row cannot be read either, that is
        // unknown: the copy stays, and the sweep removes it if no post shows it.
        if (copied && now !== undefined && now.found?.contentKey !== key) await this.discard(post.id, [key]);
        else if (copied && now === undefined)
          await this.askForObjectsCheck(post.id, this.now() + PATCH_SETTLE_MS);
        // A request for the same body that overlapped this one (a retry) may have confirmed it and
        // deleted the upload meanwhile: then this one succeeded too.
        if (!(err instanceof ConflictError) || !(await showsThis(now?.found))) throw err;
      }
    }
    // Caches drop the old body's URL before the object goes.
    await this.announce({
      id: post.id,
      authorId: userId,
      kind: 'updated',
      ...(await this.stillHidden(post)),
    });
    // A body this one replaced, and the upload, are no longer read by anyone; the upload only while
    // it still holds the bytes confirmed (another PUT through its URL may have come since).
    await this.discard(post.id, replaced);
    await this.discardUploads(post.id, new Map([[body.objectKey, body.etag]]));
  }

  /**
   * Deletes objects the post no longer uses (after the caches were told). One the store refuses is
   * logged and left to the post's next objects check, asked for now.
   */
  private async discard(postId: string, keys: Iterable<string>): Promise<void> {
    let failed = false;
    for (const key of new Set(keys)) {
      await this.storage.delete(key).catch((err: unknown) => {
        failed = true;
        this.log?.warn({ err, key }, 'could not delete an object a post no longer uses');
      });
    }
    if (failed) {
      await this.askForObjectsCheck(postId, this.now());
    }
  }

  /**
   * Deletes each upload that still holds the object of the ETag given, the one a confirm or patch
   * copied: bytes PUT since through the same URL stay, for a confirm or patch to take. (Between the
   * check and the delete a PUT can still slip in; the window is one round trip.)
   */
  private async discardUploads(postId: string, uploads: ReadonlyMap<string, string>): Promise<void> {
    const copied: string[] = [];
    for (const [key, etag] of uploads) {
      const head = await this.storage.head(key).catch((err: unknown) => {
        this.log?.warn({ err, key }, 'could not read an upload a post no longer uses');
        return undefined;
      });
      if (head === undefined) await this.askForObjectsCheck(postId, this.now());
      else if (head !== null && normalizeEtag(head.etag) === normalizeEtag(etag)) copied.push(key);
    }
    await this.discard(postId, copied);
  }

  /**
   * Asks for a check of the post's objects at `at` or after. A check due earlier stays due: moved
   * later, edits repeated every few minutes would put it off for ever, and with it the removal of
   * an upload too large to keep. That check leaves one due at `at` (`uploads_open_until` is taken
   * as if an upload URL expired then; see `PostUploadSweeper`).
   */
  private checkObjectsAt(postId: string, at: number): Promise<void> {
    return this.posts.openUploads(postId, at, at - UPLOAD_CHECK_GRACE_MS + this.limits.uploadRetentionMs);
  }

  /** `checkObjectsAt`, with a failure logged, not thrown. */
  private async askForObjectsCheck(postId: string, at: number): Promise<void> {
    await this.checkObjectsAt(postId, at).catch((err: unknown) => {
      this.log?.warn({ err, post: postId }, 'could not schedule a check of a post’s objects');
    });
  }

  /**
   * Reads the upload back, checks it against what the client says it uploaded, and copies exactly
   * those bytes to `key` (only while the upload's ETag, their MD5, still holds).
   */
  private async copyChecked(body: ConfirmBody, sha256: string, key: string): Promise<StoredObject> {
    const limit = this.limits.contentMaxBytes;
    const head = await this.storage.head(body.objectKey);
    if (!head) throw notUploaded();
    if (head.size > limit) await this.refuseOversize(body.objectKey, limit);
    if (head.size !== body.size) throw new BadRequestError('size does not match the uploaded object');
    const got = await this.storage.get(body.objectKey);
    if (!got) throw notUploaded();
    const hash = createHash('sha256');
    let bytes = 0;
    try {
      for await (const chunk of got.body) {
        const buffer = chunk as Buffer;
        bytes += buffer.length;
        // Replaced since the HEAD by a larger object: stop reading at the limit.
        if (bytes > limit) await this.refuseOversize(body.objectKey, limit);
        hash.update(buffer);
      }
    } catch (err) {
      // Deleted while it was read (a local file opens when read).
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw notUploaded();
      throw err;
    } finally {
      got.body.destroy();
    }
    // Judged on what was read, so an object replaced since the HEAD is judged as it is now.
    if (bytes !== body.size) throw new BadRequestError('size does not match the uploaded object');
    if (normalizeEtag(got.object.etag) !== normalizeEtag(body.etag))
      throw new BadRequestError('etag does not match the uploaded object');
    if (hash.digest('hex') !== sha256) throw new BadRequestError('sha256 does not match the uploaded object');
    const copy = await this.storage.copy(body.objectKey, key, got.object.etag);
    if (copy) return copy;
    if (!(await this.storage.head(body.objectKey))) throw notUploaded();
    throw new ConflictError(
      'The uploaded object changed while it was being confirmed; confirm what is there now',
      'OBJECT_CHANGED',
    );
  }

  /**
   * A body confirmed before confirm made copies is still read from its upload key, which this
   * presign is about to hand out: copy it to where confirm would have (while it is still what was
   * confirmed), so the URL cannot change what readers get.
   */
  private async moveLegacyBody(post: PostRecord, uploadKey: string): Promise<void> {
    const extension = contentExtension(post.id, uploadKey);
    if (extension === undefined || post.contentEtag === null || post.contentSha256 === null) return;
    const key = confirmedContentKey(post.id, extension);
    // The ETag as the store gives it (the post keeps it normalised): the copy's condition.
    const upload = await this.storage.head(uploadKey);
    if (
      upload === null ||
      normalizeEtag(upload.etag) !== normalizeEtag(post.contentEtag) ||
      !(await this.storage.copy(uploadKey, key, upload.etag))
    ) {
      this.log?.warn({ post: post.id, key: uploadKey }, 'a post body no longer matches what was confirmed');
      return;
    }
    // A published post's other caches hear of it through its `changed` event, as for any new body:
    // the upload key they show is about to take another body.
    if (
      await this.replacingObjects(post.id, this.now(), (trx) =>
        this.posts.moveContent(post.id, uploadKey, key, trx),
      )
    ) {
      await this.announce({
        id: post.id,
        authorId: post.authorId,
        kind: 'updated',
        ...(await this.stillHidden(post)),
      });
    }
  }

  /** The post's body is already the copy of this upload: same key (so same SHA-256), size and ETag. */
  private async alreadyConfirmed(key: string, body: ConfirmBody): Promise<boolean> {
    const copy = await this.storage.head(key);
    return copy !== null && copy.size === body.size && normalizeEtag(copy.etag) === normalizeEtag(body.etag);
  }

  /**
   * Metadata edits. Image entries are this post's image keys (checked to exist within the image
   * size limit, like confirm does for the body), URLs of them, or absolute http(s) URLs.
   *
   * An edit of the images applies only while the post still shows what it read: of two overlapping
   * ones, the second is judged again against what the first stored, so it cannot put back a copy the
   * first deleted. After three such losses it answers 409 `POST_CHANGED`.
   */
  async update(userId: number, postId: string, fields: PostFields): Promise<void> {
    if (fields.visible === undefined) return this.updateNow(userId, postId, fields);
    return this.announcedIfUncertain(userId, postId, () => this.updateNow(userId, postId, fields));
  }

  private async updateNow(userId: number, postId: string, fields: PostFields): Promise<void> {
    if (Object.values(fields).every((v) => v === undefined))
      throw new BadRequestError('body must set at least one field');
    refuseBlankText(fields);
    await enforceLimit(this.limiter, `post-edit:${userId}`, this.limits.editsPerMinute, 60_000, 'post edits');
    if (fields.imgUrls !== undefined) await this.limitStores(userId);
    let post = await this.owned(userId, postId);
    const requested = fields.imgUrls?.map((value, index) => this.ownImageKey(post, value, index));
    let stored = fields;
    /** Uploads read for this patch, with the ETag of what was read (and copied). */
    const uploads = new Map<string, string>();
    if (requested === undefined) {
      if (!(await this.write(post, fields))) throw notFound();
    } else {
      // A patch racing this one may copy images this one drops without knowing them: the post's
      // objects are checked after every such patch has made its copies, and that check waits for
      // them to be older than the retention. Asked before anything changes (so a failure here
      // changes nothing) and again once this patch's copies are made, however long they took.
      await this.checkObjectsAt(post.id, this.now() + PATCH_SETTLE_MS);
      // Copies this patch made that no post row shows (an attempt refused, or one another edit got
      // ahead of): deleted before answering, so a refused patch leaves no storage behind.
      const unused: string[] = [];
      try {
        for (let attempt = 1; ; attempt++) {
          const made: string[] = [];
          const images = await this.storedImages(post, requested, made, uploads).catch((err: unknown) => {
            unused.push(...made);
            throw err;
          });
          stored = { ...fields, imgUrls: images };
          // (A write that fails outright may have committed: its copies are left to the check.)
          if (await this.write(post, stored, post.imgUrlsJson)) break;
          unused.push(...made);
          // Deleted (404 from `owned`), or another edit changed the images since they were read.
          post = await this.owned(userId, postId);
          if (attempt === 3) {
            throw new ConflictError('The post changed while it was being edited; try again', 'POST_CHANGED');
          }
        }
      } finally {
        await this.discard(post.id, unused);
        await this.askForObjectsCheck(post.id, this.now() + PATCH_SETTLE_MS);
      }
    }
    const kinds: PostChangeKind[] = [];
    const { visible, isTop, ...rest } = fields;
    if (Object.values(rest).some((v) => v !== undefined)) kinds.push('updated');
    if (visible !== undefined) kinds.push('visibility');
    if (isTop !== undefined) kinds.push('top');
    const hidden = await this.stillHidden(post);
    for (const kind of kinds) await this.announce({ id: post.id, authorId: userId, kind, ...hidden });
    if (requested !== undefined) {
      // Images the post showed and no longer does, and uploads now copied, are read by no one.
      const kept = new Set(stored.imgUrls);
      const dropped = [...post.imgUrls, ...requested].filter(
        (key) => !kept.has(key) && (isImageKey(post.id, key) || isStoredImageKey(post.id, key)),
      );
      await this.discard(
        post.id,
        dropped.filter((key) => !uploads.has(key)),
      );
      await this.discardUploads(
        post.id,
        new Map(dropped.filter((key) => uploads.has(key)).map((key) => [key, uploads.get(key)!])),
      );
    }
  }

  /**
   * Sets the post's body over the one `post` shows. A published post may be in the shared cache
   * with the URL of the body this replaces, which is deleted next (see `replacingObjects`).
   */
  private storeContent(post: PostRecord, content: ContentRecord): Promise<boolean> {
    const now = this.now();
    return this.replacingObjects(post.id, now, (trx) =>
      this.posts.setContent(post.id, post.authorId, post.contentKey, content, now, trx),
    );
  }

  /**
   * Runs `edit`, which replaces objects a cached copy of the post may still show (its body, its
   * pictures) and which the request deletes next. For a published post the change is also a
   * `changed` event, written with it, so the `post-cache` worker drops the post from every cache
   * even if this request's own invalidation fails. Whether the post is published is read after the
   * edit, which holds the row: one read as a draft may have been published since.
   */
  private replacingObjects(
    postId: string,
    now: number,
    edit: (trx: Transaction<Database>) => Promise<boolean>,
  ): Promise<boolean> {
    return this.posts.transaction(async (trx) => {
      if (!(await edit(trx))) return false;
      const current = await this.posts.find(postId, trx);
      if (current?.status === 'published') await this.changed(trx, current, now);
      return true;
    });
  }

  /** One edit of the author's post; false when it is deleted or its images are no longer `imagesWere`. */
  private async write(post: PostRecord, fields: PostFields, imagesWere?: string): Promise<boolean> {
    const now = this.now();
    if (fields.visible === undefined && fields.imgUrls !== undefined)
      return this.replacingObjects(post.id, now, (trx) =>
        this.posts.update(post.id, post.authorId, fields, now, imagesWere, trx),
      );
    if (fields.visible === undefined)
      // Any other edit of a published public post (title, tags, description, pinning): the caches of
      // other processes must hear of it even when this process fails to tell them (Redis failing
      // just then), so it is an event too, written with it. A private or draft post is in no cache.
      return this.posts.transaction(async (trx) => {
        if (!(await this.posts.update(post.id, post.authorId, fields, now, imagesWere, trx))) return false;
        const current = await this.posts.find(post.id, trx);
        if (current?.status === 'published' && current.visible === 'public')
          await this.changed(trx, current, now);
        return true;
      });
    // Who may see the post changes: the caches must hear of it even if this process fails to tell
    // them, so the change is also an event, written with it; one that moves the post into or out of
    // its author's public posts is the event that moves their count. Not for a draft (read after
    // the update, which holds the row): no cache holds one, and its publish writes an event of its
    // own. The crossing is tried first as an UPDATE of its own, so whether it happened is decided
    // by the row as the update found it.
    const crossing = fields.visible === 'public' ? 'enter' : 'leave';
    return this.posts.transaction(async (trx) => {
      const crossed = await this.posts.update(post.id, post.authorId, fields, now, imagesWere, trx, crossing);
      if (!crossed && !(await this.posts.update(post.id, post.authorId, fields, now, imagesWere, trx)))
        return false;
      const current = await this.posts.find(post.id, trx);
      if (!current || current.status === 'draft') return true;
      if (crossed) await this.crossed(trx, current, crossing === 'enter' ? 1 : -1, now);
      else await this.changed(trx, current, now);
      return true;
    });
  }

  async setTop(userId: number, postId: string, isTop: boolean): Promise<void> {
    await this.update(userId, postId, { isTop });
  }

  async setVisibility(userId: number, postId: string, visible: Visible): Promise<void> {
    await this.update(userId, postId, { visible });
  }

  /** draft → published. 409 `INVALID_STATE` unless a draft; 409 `CONTENT_REQUIRED` without a confirmed body. */
  async publish(userId: number, postId: string): Promise<void> {
    return this.announcedIfUncertain(userId, postId, () => this.publishNow(userId, postId));
  }

  private async publishNow(userId: number, postId: string): Promise<void> {
    const post = await this.owned(userId, postId, true);
    if (post.status !== 'draft') throw invalidState(post.status);
    if (post.contentKey === null)
      throw new ConflictError('Confirm the post body before publishing', 'CONTENT_REQUIRED');
    const now = this.now();
    const published = await this.posts.transaction(async (trx) => {
      if (!(await this.posts.publish(trx, post.id, userId, now))) return false;
      // Read after the update, which holds the row: counted when it was public then.
      const current = (await this.posts.find(post.id, trx))!;
      if (current.visible === 'public') await this.crossed(trx, current, 1, now);
      else await this.changed(trx, current, now);
      return true;
    });
    if (!published) {
      // Lost a race: another request published or deleted it since it was read.
      const current = await this.posts.find(post.id);
      throw invalidState(current?.status ?? 'deleted');
    }
    await this.announce({ id: post.id, authorId: userId, kind: 'published', draft: false, unlisted: false });
  }

  /**
   * Soft delete; a published public post leaving its author's public posts appends `unpublished` in
   * the same transaction (another published post a `changed` event). Deleting the author's already
   * deleted post succeeds and changes nothing, so a retried request gets its 204.
   */
  async delete(userId: number, postId: string): Promise<void> {
    return this.announcedIfUncertain(userId, postId, () => this.deleteNow(userId, postId));
  }

  private async deleteNow(userId: number, postId: string): Promise<void> {
    for (let attempt = 0; attempt < 3; attempt++) {
      const post = await this.owned(userId, postId, true);
      if (post.status === 'deleted') return;
      const from = post.status;
      const now = this.now();
      const deleted = await this.posts.transaction(async (trx) => {
        const left =
          from === 'published' && (await this.posts.softDelete(trx, post.id, userId, from, now, true));
        if (!left && !(await this.posts.softDelete(trx, post.id, userId, from, now))) return false;
        if (from !== 'published') return true;
        const current = (await this.posts.find(post.id, trx))!;
        if (left) await this.crossed(trx, current, -1, now);
        else await this.changed(trx, current, now);
        return true;
      });
      if (deleted) {
        // Who could read it just before is not known from the row read earlier: as listed unless a draft.
        const draft = from === 'draft';
        await this.announce({ id: post.id, authorId: userId, kind: 'deleted', draft, unlisted: draft });
        return;
      }
      // The post changed state in between (published or deleted meanwhile): judge it again.
    }
    throw new ConflictError('The post changed while it was being deleted; try again');
  }

  /**
   * Writes the event of the post's entry into (+1) or exit from (-1) its author's public posts and
   * keeps the crossing with the post, in the transaction of the change; `post` as read after it.
   */
  private async crossed(trx: Transaction<Database>, post: PostRecord, delta: 1 | -1, now: number) {
    const crossing: PublicCrossing = [post.publicEpoch, delta, now];
    await this.posts.recordCrossings(trx, post.id, withCrossing(post.publicCrossingsJson, crossing));
    await this.outbox.append(trx, postEventMessage(crossingEvent(post.id, post.authorId, crossing)));
  }

  /** Writes the event of any other change of who may see the post, which moves no count. */
  private async changed(trx: Transaction<Database>, post: PostRecord, now: number) {
    const event = postChangedEvent(post.id, post.authorId, now, this.ids.next());
    await this.outbox.append(trx, postEventMessage(event));
  }

  /**
   * The caller's post. 404 when they may not see it (see the class comment), 403 when they may
   * see it but it is someone else's. Deleted posts are 404 unless `deletedToo`, for routes that
   * tell the author why they cannot act.
   */
  private async owned(userId: number, postId: string, deletedToo = false): Promise<PostRecord> {
    const post = await this.posts.find(postId);
    if (!post) throw notFound();
    if (post.authorId !== userId) {
      if (mayView(post, userId)) throw new ForbiddenError('Only the author may change this post');
      throw notFound();
    }
    if (post.status === 'deleted' && !deletedToo) throw notFound();
    return post;
  }

  /**
   * The key a URL of this post's objects names, for clients that send back what they were given: an
   * upload URL without its query (what clients of the original service store) or a signed image URL
   * of a detail answer (an edit that keeps the images), which would otherwise be kept as an outside
   * image and break once it expires. A URL of another post's objects is refused (its signature
   * expires too, and the post it belongs to may delete the object), unless the post stores it
   * already (an earlier release kept such URLs): an edit may send back what the post shows. Any
   * other value is returned as it is.
   */
  private ownImageKey(post: PostRecord, value: string, index: number): string {
    if (!isExternalImageUrl(value)) return value;
    const key = this.storage.keyOf(value);
    if (key === null || !key.startsWith('posts/')) return value;
    if (key.startsWith(`posts/${post.id}/`)) return key;
    if (post.imgUrls.includes(value)) return value;
    throw new BadRequestError(
      `imgUrls[${index}] is an address of another post's image; upload the image to this post`,
    );
  }

  /**
   * The image entries to store for `imgUrls`: upload keys of this post (checked to exist within the
   * image size limit, like confirm does for the body) become copies made inside the store while the
   * upload's ETag holds (`storedImageKey`), so a PUT through a still valid upload URL changes nothing
   * readers get; copies the post shows stay; http(s) URLs stay.
   */
  private async storedImages(
    post: PostRecord,
    imgUrls: string[],
    made: string[],
    uploads: Map<string, string>,
  ): Promise<string[]> {
    // Every entry is checked before any is copied: one refused entry costs no copy of the others.
    const plan = await Promise.all(
      imgUrls.map(async (value, index): Promise<string | { upload: string; etag: string; index: number }> => {
        if (isExternalImageUrl(value)) return value;
        if (isStoredImageKey(post.id, value)) {
          // Only a copy the post shows: one it no longer shows is deleted, now or by the sweep.
          if (post.imgUrls.includes(value)) return value;
          throw new BadRequestError(`imgUrls[${index}]: the post shows no image stored under ${value}`);
        }
        if (!isImageKey(post.id, value)) {
          throw new BadRequestError(
            `imgUrls[${index}] must be an image key under posts/${post.id}/images/ or an http(s) URL`,
          );
        }
        const head = await this.storage.head(value);
        if (!head) {
          // Copied by an earlier patch, which deleted the upload: the post's copy of it stands. Read
          // again, for a patch that overlapped this one (a retried request).
          const shown = (await this.posts.find(post.id))?.imgUrls ?? [];
          const copy = shown.find((key) => isStoredImageOf(post.id, value, key));
          if (copy !== undefined) return copy;
          throw new BadRequestError(`imgUrls[${index}]: no image was uploaded under ${value}`);
        }
        if (head.size > this.limits.imageMaxBytes)
          await this.refuseOversize(value, this.limits.imageMaxBytes);
        uploads.set(value, head.etag);
        // These bytes are the post's already (a retried patch): a copy it shows of this upload with
        // the upload's ETag (a copy keeps the ETag of what it copied).
        for (const shown of post.imgUrls.filter((key) => isStoredImageOf(post.id, value, key))) {
          const copy = await this.storage.head(shown);
          if (copy && normalizeEtag(copy.etag) === normalizeEtag(head.etag)) return shown;
        }
        return { upload: value, etag: head.etag, index };
      }),
    );
    // Each copy is listed in `made` before it is asked for: a copy that failed half-way is deleted too.
    const results = await Promise.allSettled(
      plan.map(async (entry) => {
        if (typeof entry === 'string') return entry;
        const key = storedImageKey(post.id, entry.upload);
        made.push(key);
        if (!(await this.storage.copy(entry.upload, key, entry.etag))) {
          throw new ConflictError(
            `imgUrls[${entry.index}]: the image changed while it was being checked; send the patch again`,
            'OBJECT_CHANGED',
          );
        }
        return key;
      }),
    );
    const failed = results.find((r) => r.status === 'rejected');
    if (failed) throw failed.reason;
    return results.map((r) => (r as PromiseFulfilledResult<string>).value);
  }

  private async refuseOversize(key: string, limit: number): Promise<never> {
    await this.storage.delete(key);
    throw new PayloadTooLargeError(`The upload exceeds its limit of ${limit} bytes and was removed`);
  }

  /**
   * After a change to a post read as a draft, or as published but not public: whether it still is
   * (`draft`, `unlisted`). A publish or a visibility change that committed before the change makes it
   * a change to a published or listed post; one after it announces itself.
   */
  private async stillHidden(before: PostRecord): Promise<Pick<PostChange, 'draft' | 'unlisted'>> {
    if (isListed(before)) return { draft: false, unlisted: false };
    const after = await this.posts.find(before.id);
    return {
      draft: before.status === 'draft' && after?.status === 'draft',
      unlisted: !after || !isListed(after),
    };
  }

  /**
   * Runs a change of who may see a post; when it fails for want of the database (a COMMIT whose
   * answer never came may still have been done), the change is announced as if made: caches
   * everywhere drop the post, rather than go on believing, while the database is away and nothing
   * corrects them, what the post may no longer be.
   */
  private async announcedIfUncertain(
    userId: number,
    postId: string,
    work: () => Promise<void>,
  ): Promise<void> {
    try {
      await work();
    } catch (err) {
      if (isDependencyOutage(err))
        await this.announce({
          id: postId,
          authorId: userId,
          kind: 'visibility',
          draft: false,
          unlisted: false,
        });
      throw err;
    }
  }

  private async announce(change: PostChange): Promise<void> {
    for (const listener of this.listeners) {
      try {
        await listener(change);
      } catch (err) {
        this.log?.warn({ err, post: change.id, kind: change.kind }, 'post change listener failed');
      }
    }
  }
}

function notFound(): NotFoundError {
  return new NotFoundError('Post not found');
}

function notUploaded(): ConflictError {
  return new ConflictError(
    'No object is under objectKey (a confirmed upload is moved to the post’s body); upload it first',
    'OBJECT_NOT_UPLOADED',
  );
}

function invalidState(status: string): ConflictError {
  return new ConflictError(`Only a draft can be published; this post is ${status}`, 'INVALID_STATE');
}

/**
 * A title, description or tag that shows nothing (only spaces or invisible characters) would be an
 * empty line in every feed: refused, as a blank nickname is. An empty title or description clears it.
 */
function refuseBlankText(fields: PostFields): void {
  for (const name of ['title', 'description'] as const) {
    const value = fields[name];
    if (value !== undefined && value !== '' && !isVisible(value))
      throw new BadRequestError(`body.${name} must not be blank (an empty string clears it)`);
  }
  if (fields.tags?.some((tag) => !isVisible(tag)))
    throw new BadRequestError('body.tags must not hold a blank tag');
}
