import type { Db } from '../platform/db/database.js';
import { crossingEvent, parseCrossings } from '../knowpost/post-events.js';
import type { UnappliedEvent, UserCountPart } from './source.js';

/** Posts changed since the window read at most; a user changing more within it is beyond any rebuild race. */
const RECENT_MAX = 10_000;
/** Posts read at a time, newest change first, until enough events are listed. */
const RECENT_PAGE = 200;
/**
 * Events listed at most, the latest: each is an argument of the store's check and write, so a user
 * flipping posts between public and private all week (1.2 million crossings at the edit limit)
 * would otherwise have every check send them all. An older one still on its way after so many
 * later ones is counted twice and healed by the reconciler.
 */
export const UNAPPLIED_MAX = 10_000;

/**
 * `posts`: the user's public posts (published and `public`), the ones everybody may read. Each
 * entry into and exit from them is an event whose id follows from the post and the number of the
 * entry, and the post keeps its latest crossings with their times (`post-events.ts`), so the events
 * of the window a count includes are read from the same rows: those of the posts changed since
 * `since` (a crossing is a change), each crossing made since then (see `CROSSINGS_KEPT_MS`), the
 * latest `UNAPPLIED_MAX` of them. A post
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
      let unapplied: Array<UnappliedEvent & { at: number }> = [];
      // Newest change first, in pages, until the latest events are all listed: a post's crossings
      // are never later than its last change (which may be an edit), so once `UNAPPLIED_MAX` are
      // listed that are no older than the last post read was changed, later pages could only add
      // older ones.
      let after: { updatedAt: number; id: string } | null = null;
      for (let read = 0; read < RECENT_MAX;) {
        const cursor: { updatedAt: number; id: string } | null = after;
        const page = await trx
          .selectFrom('knowposts')
          .select(['id', 'updated_at', 'public_crossings'])
          .where('author_id', '=', userId)
          .where('public_crossings', '!=', '[]')
          .where('updated_at', '>=', since)
          .$if(cursor !== null, (q) =>
            q.where((eb) =>
              eb.or([
                eb('updated_at', '<', cursor!.updatedAt),
                eb.and([eb('updated_at', '=', cursor!.updatedAt), eb('id', '<', cursor!.id)]),
              ]),
            ),
          )
          .orderBy('updated_at', 'desc')
          .orderBy('id', 'desc')
          .limit(Math.min(RECENT_PAGE, RECENT_MAX - read))
          .execute();
        for (const post of page) {
          for (const crossing of parseCrossings(post.public_crossings)) {
            if (crossing[2] < since) continue;
            const event = crossingEvent(String(post.id), userId, crossing);
            unapplied.push({ eventId: event.eventId, field: 'posts', delta: crossing[1], at: crossing[2] });
          }
        }
        read += page.length;
        if (unapplied.length >= UNAPPLIED_MAX)
          unapplied = unapplied.toSorted((a, b) => b.at - a.at).slice(0, UNAPPLIED_MAX);
        const last = page.at(-1);
        if (page.length < RECENT_PAGE || !last) break;
        if (unapplied.length >= UNAPPLIED_MAX && unapplied.at(-1)!.at >= Number(last.updated_at)) break;
        after = { updatedAt: Number(last.updated_at), id: String(last.id) };
      }
      return { counts: { posts: Number(row?.n ?? 0) }, unapplied: unapplied.map(({ at: _, ...e }) => e) };
    });
  }
}
