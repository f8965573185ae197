import type { Db } from '../platform/db/database.js';
import { crossingEvent, parseCrossings } from '../knowpost/post-events.js';
import type { UnappliedEvent, UserCountPart } from './source.js';

/** Posts changed since the window listed at most; a user changing more within it is beyond any rebuild race. */
const RECENT_MAX = 10_000;

/**
 * `posts`: the user's public posts (published and `public`), the ones everybody may read. Each
 * entry into and exit from them is an event whose id follows from the post and the number of the
 * entry, and the post keeps its latest crossings with their times (`post-events.ts`), so the events
 * of the window a count includes are read from the same rows: those of the posts changed since
 * `since` (a crossing is a change), each crossing made since then (see `CROSSINGS_KEPT_MS`). A post
 * of the earlier release, which counted every published post, has none kept but may still leave
 * (`left:0`).
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
        .select(['id', 'public_crossings'])
        .where('author_id', '=', userId)
        .where('public_crossings', '!=', '[]')
        .where('updated_at', '>=', since)
        .limit(RECENT_MAX)
        .execute();
      const unapplied: UnappliedEvent[] = [];
      for (const post of recent) {
        for (const crossing of parseCrossings(post.public_crossings)) {
          if (crossing[2] < since) continue;
          const event = crossingEvent(String(post.id), userId, crossing);
          unapplied.push({ eventId: event.eventId, field: 'posts', delta: crossing[1] });
        }
      }
      return { counts: { posts: Number(row?.n ?? 0) }, unapplied };
    });
  }
}
