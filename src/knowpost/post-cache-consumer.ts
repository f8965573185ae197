import { Counter, type Registry } from 'prom-client';
import type { InvalidationBus } from '../platform/cache/invalidation-bus.js';
import type { EventLog, Subscription } from '../platform/eventlog/eventlog.js';
import { POST_INVALIDATION_SCOPE, type PostCache } from './post-cache.js';
import { parsePostEvent, POST_TOPIC } from './post-events.js';

export const POST_CACHE_GROUP = 'post-cache';

export interface PostCacheConsumerOptions {
  /** Told about failures the subscription recovered from (the batch is delivered again). */
  onError: (err: unknown) => void;
  /** Where `zg_post_cache_invalidations_total` is registered (none: not exported). */
  registry?: Registry;
  maxWaitMs?: number;
}

/**
 * The durable half of post cache invalidation. The request that changes a post drops it from the
 * caches itself (`postCacheInvalidator`), but that is one attempt: if Redis fails it just then, the
 * shared tier would keep serving a post made private or deleted until its entry expires. Every change
 * that decides who may see a post, replaces (and deletes) a published post's body or pictures, or
 * edits a published public post, is also a `post-events` message written in the change's transaction
 * (published, unpublished, changed), so this consumer drops each such post from the shared tier
 * and announces it on the bus once more, and the batch is committed only when both succeeded; a
 * failure delivers it again. Invalidating twice is harmless, so redeliveries need no bookkeeping.
 *
 * The group starts at the end of the topic: changes older than the shared tier's expiry need nothing.
 */
export class PostCacheConsumer {
  private subscription: Subscription | undefined;
  private readonly invalidated: Counter | undefined;

  constructor(
    private readonly events: EventLog,
    private readonly cache: Pick<PostCache, 'invalidateShared'>,
    private readonly bus: InvalidationBus,
    private readonly options: PostCacheConsumerOptions,
  ) {
    this.invalidated =
      options.registry &&
      new Counter({
        name: 'zg_post_cache_invalidations_total',
        help: 'Posts the post-cache worker dropped from the caches for post events (publish, delete, visibility, new body or pictures, other edits of a public post)',
        registers: [options.registry],
      });
  }

  async start(): Promise<void> {
    this.subscription = await this.events.subscribe({
      group: POST_CACHE_GROUP,
      topics: [POST_TOPIC],
      maxBatch: 1_000,
      maxWaitMs: this.options.maxWaitMs ?? 20,
      fromLatest: true,
      handler: async (batch) => {
        const ids = new Set<string>();
        for (const record of batch.records) {
          // Malformed records are the user-counter consumer's to report.
          const event = parsePostEvent(record.value);
          if (event) ids.add(event.postId);
        }
        if (ids.size === 0) return;
        await this.cache.invalidateShared([...ids]);
        await this.bus.publish(POST_INVALIDATION_SCOPE, [...ids]);
        this.invalidated?.inc(ids.size);
      },
      onError: this.options.onError,
    });
  }

  async stop(): Promise<void> {
    await this.subscription?.close();
    this.subscription = undefined;
  }
}
