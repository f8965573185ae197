import { isDependencyOutage } from '../platform/errors/outage.js';
import type { ObjectStorage } from '../platform/storage/object-storage.js';
import { bodyCopyExtension, isContentKey, isImageKey, isStoredImageKey } from './post-keys.js';
import type { PostObjectsTaskOptions } from './post-purge.js';
import type { PostRepository } from './post.repository.js';
import { UPLOAD_CHECK_GRACE_MS } from './post.service.js';

export interface PostUploadSweepOptions extends PostObjectsTaskOptions {
  /** How old an upload or image copy the post does not use must be before it goes. */
  retentionMs: number;
  /**
   * The largest body and image uploads accepted. A larger upload can never be confirmed or shown
   * (an S3 presigned PUT cannot cap its size), so it goes at the first check, whatever its age.
   */
  maxBytes: { content: number; image: number };
  /** When a post whose check failed is tried again; default 10 minutes. */
  retryMs?: number;
}

/**
 * Removes what a live post keeps in storage and does not use: body and image uploads that were
 * never confirmed or referred to in a patch, and body and image copies the post no longer shows
 * (confirms and patches delete those themselves; this catches a delete that failed, and a copy
 * whose request ended before the post took it). Posts ask for
 * a check (`objects_check_at`) a minute after an upload URL they hand out expires (unless one is due
 * earlier, which then leaves that one due), and when a patch or confirm leaves objects behind.
 * Until `uploads_open_until` (a URL's expiry plus the retention: a PUT that started in time may
 * finish late) a check always leaves another one due.
 *
 * A check lists the post's objects, reads the post and deletes each unused one older than the
 * retention, and each upload larger than its kind may be at once; a younger one sets the next check
 * to when it is old enough. Uploads go first; copies are listed again afterwards, so a copy made
 * from an upload just before that upload was deleted is seen as new. A copy is judged by its age
 * like an upload: one that a confirm or patch in flight is about to store was made moments ago
 * (a body copy's name is never written twice). Deleted posts are the purge's (`PostObjectPurger`),
 * which leaves a check due when uploads may still arrive after it: that check removes everything
 * under the post again. Several workers may run it at once.
 */
export class PostUploadSweeper {
  private readonly batch: number;
  private readonly now: () => number;

  constructor(
    private readonly posts: Pick<PostRepository, 'objectsCheckDue' | 'finishObjectsCheck' | 'find'>,
    private readonly storage: Pick<ObjectStorage, 'listPrefix' | 'delete' | 'deletePrefix'>,
    private readonly options: PostUploadSweepOptions,
  ) {
    this.batch = options.batch ?? 100;
    this.now = options.now ?? Date.now;
  }

  /** One round, ended early once `signal` is aborted; resolves to how many posts were checked and objects deleted. */
  async runOnce(signal?: AbortSignal): Promise<{ posts: number; objects: number }> {
    const now = this.now();
    const started = performance.now();
    let posts = 0;
    let objects = 0;
    // A backlog (every post after the upgrade that added checks) goes at a batch after another, not
    // a batch a minute; page by page, so a check left due (moved meanwhile) waits for the next round.
    let after: { id: string; due: number } | undefined;
    for (;;) {
      const due = await this.posts.objectsCheckDue(now, this.batch, after);
      for (const check of due) {
        // A check not begun stays due for the next round.
        if (signal?.aborted) return { posts, objects };
        const { id } = check;
        try {
          const swept = await this.sweep(id, now);
          await this.posts.finishObjectsCheck(id, check.due, swept.next, swept.openUntil);
          objects += swept.deleted;
          posts += 1;
        } catch (err) {
          // One post the store refuses must not hold up the others, now or in the next rounds.
          this.options.onError?.(err, id);
          await this.posts.finishObjectsCheck(id, check.due, now + (this.options.retryMs ?? 600_000));
          // A store out of reach fails every post alike (each after its timeouts): the rest wait.
          if (isDependencyOutage(err)) return { posts, objects };
        }
      }
      if (due.length < this.batch || performance.now() - started >= (this.options.budgetMs ?? 30_000))
        return { posts, objects };
      after = due[due.length - 1];
    }
  }

  /**
   * A deleted post has a check due only when the purge left one for uploads that may still arrive:
   * whatever came since goes, and another check is left while uploads may still come.
   */
  private async sweepDeleted(id: string, uploadsOpenUntil: number | null, now: number): Promise<Swept> {
    const deleted = await this.storage.deletePrefix(`posts/${id}`);
    return {
      deleted,
      next: uploadsOpenUntil !== null && uploadsOpenUntil > now ? uploadsOpenUntil : null,
      openUntil: uploadsOpenUntil,
    };
  }

  private async sweep(id: string, now: number): Promise<Swept> {
    const { retentionMs, maxBytes } = this.options;
    const oversize = (key: string, size: number) =>
      size > (isContentKey(id, key) ? maxBytes.content : isImageKey(id, key) ? maxBytes.image : Infinity);
    let deleted = 0;
    let next: number | null = null;
    let openUntil: number | null | undefined;
    const passes: [string, (postId: string, key: string) => boolean][] = [
      [`posts/${id}`, (postId, key) => isContentKey(postId, key) || isImageKey(postId, key)],
      [`posts/${id}/pictures`, isStoredImageKey],
      [`posts/${id}/body`, (postId, key) => bodyCopyExtension(postId, key) !== undefined],
    ];
    for (const [prefix, sweeps] of passes) {
      const listed = await this.storage.listPrefix(prefix);
      // Read after the listing: anything referred to before the listing is seen as used.
      const post = await this.posts.find(id);
      if (!post) return { deleted, next: null };
      if (post.status === 'deleted') return this.sweepDeleted(id, post.uploadsOpenUntil, now);
      openUntil = post.uploadsOpenUntil;
      if (post.uploadsOpenUntil !== null && post.uploadsOpenUntil > now) {
        // The last URL handed out expires at `uploadsOpenUntil` less the retention: a check a
        // minute later removes an upload too large to keep, as when that URL was handed out (a
        // check due earlier than that one stays due, so this may be it).
        const afterExpiry = post.uploadsOpenUntil - retentionMs + UPLOAD_CHECK_GRACE_MS;
        next = Math.min(next ?? Infinity, afterExpiry > now ? afterExpiry : post.uploadsOpenUntil);
      }
      const used = new Set([post.contentKey, ...post.imgUrls]);
      for (const object of listed) {
        if (!sweeps(id, object.key) || used.has(object.key)) continue;
        if (object.lastModified <= now - retentionMs || oversize(object.key, object.size)) {
          await this.storage.delete(object.key);
          deleted += 1;
        } else {
          // Whole milliseconds: file times have finer ones.
          next = Math.min(next ?? Infinity, Math.ceil(object.lastModified + retentionMs));
        }
      }
    }
    return openUntil === undefined ? { deleted, next } : { deleted, next, openUntil };
  }
}

/**
 * What a check did, when the next one is due, and the `uploads_open_until` it read last: uploads
 * opened after that read keep this check due (see `PostRepository.finishObjectsCheck`).
 */
interface Swept {
  deleted: number;
  next: number | null;
  openUntil?: number | null;
}
