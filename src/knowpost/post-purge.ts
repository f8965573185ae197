import { Counter, type Registry } from 'prom-client';
import { isDependencyOutage } from '../platform/errors/outage.js';
import type { ObjectStorage } from '../platform/storage/object-storage.js';
import type { PostRepository } from './post.repository.js';

/** What the tasks that remove posts' objects (the purge and the upload sweep) share. */
export interface PostObjectsTaskOptions {
  /** Most posts taken per batch; default 100. */
  batch?: number;
  /** A round takes further batches while the last was full, until it has run this long; default 30 s. */
  budgetMs?: number;
  /** Told about a post whose objects could not be handled (it is tried again later). */
  onError?: (err: unknown, postId: string) => void;
  now?: () => number;
}

export interface PostPurgeOptions extends PostObjectsTaskOptions {
  /**
   * How long after its deletion a post's objects go: past the validity of any upload URL handed out
   * before the deletion, so an upload through one cannot land after the purge.
   */
  graceMs: number;
}

/** How long a post the store refused waits before it is tried again, and how many are remembered. */
const REFUSED_RETRY_MS = 10 * 60_000;
const REFUSED_KEPT = 1_000;

/**
 * Removes the stored objects of deleted posts (body uploads and copies, images): a post its author
 * deleted is gone from storage too, not only from every answer. A round takes the posts deleted
 * longer than `graceMs` ago whose objects are still there, deletes everything under
 * `posts/{id}/` and marks the row; a failure is reported and leaves the row, which this process
 * tries again 10 minutes later, taking the posts after it meanwhile (so posts the store keeps
 * refusing do not hold up the rest). Several workers may run it at once (deleting twice is harmless).
 */
export class PostObjectPurger {
  private readonly batch: number;
  private readonly now: () => number;
  /** Posts the store refused, and when each is due again. */
  private readonly refused = new Map<string, number>();

  constructor(
    private readonly posts: Pick<PostRepository, 'deletedUnpurged' | 'markPurged'>,
    private readonly storage: Pick<ObjectStorage, 'deletePrefix'>,
    private readonly options: PostPurgeOptions,
  ) {
    this.batch = options.batch ?? 100;
    this.now = options.now ?? Date.now;
  }

  /**
   * One round, ended early once `signal` is aborted; resolves to how many posts were purged. A
   * backlog goes a batch after another (one batch a minute would purge 144,000 posts a day at most,
   * fewer than authors may delete), until a batch is not full, makes no progress or the budget is
   * spent.
   */
  async runOnce(signal?: AbortSignal): Promise<{ posts: number; objects: number }> {
    const now = this.now();
    const started = performance.now();
    for (const [id, due] of this.refused) if (due <= now) this.refused.delete(id);
    let objects = 0;
    let posts = 0;
    for (;;) {
      const ids = (
        await this.posts.deletedUnpurged(now - this.options.graceMs, this.batch + this.refused.size)
      )
        .filter((id) => !this.refused.has(id))
        .slice(0, this.batch);
      let progress = false;
      for (const id of ids) {
        if (signal?.aborted) return { posts, objects };
        try {
          objects += await this.storage.deletePrefix(`posts/${id}`);
          await this.posts.markPurged(id, this.now());
          posts += 1;
          progress = true;
        } catch (err) {
          // One post the store refuses must not hold up the others, in this round or the next ones.
          if (this.refused.size < REFUSED_KEPT) {
            this.refused.set(id, now + REFUSED_RETRY_MS);
            progress = true;
          }
          this.options.onError?.(err, id);
          // A store out of reach fails every post alike (each after its timeouts): the rest wait.
          if (isDependencyOutage(err)) return { posts, objects };
        }
      }
      if (
        ids.length < this.batch ||
        !progress ||
        performance.now() - started >= (this.options.budgetMs ?? 30_000)
      )
        return { posts, objects };
    }
  }
}

/** `zg_post_objects_removed_total{task}`: what the purge and the upload sweep removed from storage. */
export function postObjectsRemovedCounter(registry: Registry): Counter<'task'> {
  return new Counter({
    name: 'zg_post_objects_removed_total',
    help: 'Objects removed from storage: of deleted posts (task purge), unused uploads and image copies of live posts (task sweep)',
    labelNames: ['task'],
    registers: [registry],
  });
}
