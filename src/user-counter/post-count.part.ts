import type { Db } from '../platform/db/database.js';
import { postEvent } from '../knowpost/post-events.js';
import type { UnappliedEvent, UserCountPart } from './source.js';

/** Recent transitions listed at most; a user publishing more within the window is beyond any rebuild race. */
const RECENT_MAX = 10_000;

/**
 * `posts`: the user's published posts. Every transition's event id follows from the post and the
 * transition (`post-events.ts`), so the events a count includes follow from the posts' states: a
 * post that reached `published` (published now, or deleted after publishing) counted its
 * `published` event, and a published post that was deleted counted its `unpublished` event. Those of
 * transitions made since `since` (the publish time; for a deletion, the post's last update) are
 * listed as possibly unapplied.
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
        .executeTakeFirst();
      const recent = await trx
        .selectFrom('knowposts')
        .select(['id', 'status', 'publish_time', 'updated_at'])
        .where('author_id', '=', userId)
        .where('publish_time', 'is not', null)
        .where((eb) =>
          eb.or([
            eb('publish_time', '>=', since),
            eb.and([eb('status', '=', 'deleted'), eb('updated_at', '>=', since)]),
          ]),
        )
        .limit(RECENT_MAX)
        .execute();
      const unapplied: UnappliedEvent[] = [];
      for (const post of recent) {
        const id = String(post.id);
        if (Number(post.publish_time) >= since) {
          unapplied.push({
            eventId: postEvent('published', id, userId, 0).eventId,
            field: 'posts',
            delta: 1,
          });
        }
        // A deleted post is never changed again, so its last update is its deletion.
        if (post.status === 'deleted' && Number(post.updated_at) >= since) {
          unapplied.push({
            eventId: postEvent('unpublished', id, userId, 0).eventId,
            field: 'posts',
            delta: -1,
          });
        }
      }
      return { counts: { posts: Number(row?.n ?? 0) }, unapplied };
    });
  }
}
