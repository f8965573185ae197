import type { Db } from '../platform/db/database.js';
import { postEvent } from '../knowpost/post-events.js';
import type { UnappliedEvent, UserCountPart } from './source.js';

/** Posts changed since the window listed at most; a user changing more within it is beyond any rebuild race. */
const RECENT_MAX = 10_000;
/**
 * The entries and exits listed per post, the latest ones. A post that entered and left its author's
 * public posts more often than this within the events' transit time could see an old event counted
 * twice, which the reconciler then heals.
 */
const EPOCHS_MAX = 50;

/**
 * `posts`: the user's public posts (published and `public`), the ones everybody may read. Every
 * entry into and exit from them has an event id that follows from the post and the number of its
 * entries (`public_epoch`, see `post-events.ts`), so the events a count includes follow from the
 * posts' rows: a post that entered `n` times counted its entries 1…n, and the exits 1…n, or 1…n−1
 * while it is public now. Those of posts changed since `since` (their last update: every crossing
 * is one) are listed as possibly unapplied; listing one that was applied long ago does no harm.
 */
export class PostCountPart implements UserCountPart {
  readonly fields = ['posts'] as const;

  constructor(private readonly db: Db) {}

  async read(userId: number, since: number) {
    // One transaction: the count and the recent transitions are read from one snapshot.
    return this.db.kysely.transaction().execute(async (trx) => {
      const row = await trx
        .selectFrom('knowposts')
        .select((eb) => eb.fn.countAll<number | string>().as('n'))
        .where('author_id', '=', userId)
        .where('status', '=', 'published')
        .where('visible', '=', 'public')
        .executeTakeFirst();
      const recent = await trx
        .selectFrom('knowposts')
        .select(['id', 'status', 'visible', 'public_epoch'])
        .where('author_id', '=', userId)
        .where('public_epoch', '>', 0)
        .where('updated_at', '>=', since)
        .limit(RECENT_MAX)
        .execute();
      const unapplied: UnappliedEvent[] = [];
      for (const post of recent) {
        const id = String(post.id);
        const epochs = Number(post.public_epoch);
        const publicNow = post.status === 'published' && post.visible === 'public';
        for (let epoch = Math.max(1, epochs - EPOCHS_MAX + 1); epoch <= epochs; epoch++) {
          unapplied.push({
            eventId: postEvent('published', id, userId, 0, epoch).eventId,
            field: 'posts',
            delta: 1,
          });
          if (epoch < epochs || !publicNow)
            unapplied.push({
              eventId: postEvent('unpublished', id, userId, 0, epoch).eventId,
              field: 'posts',
              delta: -1,
            });
        }
      }
      return { counts: { posts: Number(row?.n ?? 0) }, unapplied };
    });
  }
}
