import { sql } from 'kysely';
import { parseCounterEvent } from '../counter/aggregator.js';
import { COUNTER_TOPIC, type CounterEvent, type EntityRef } from '../counter/model.js';
import type { CounterStore } from '../counter/store/counter-store.js';
import { LruCache } from '../platform/cache/lru.js';
import type { Db } from '../platform/db/database.js';
import {
  IDEMPOTENT_COMMIT_INTERVAL_MS,
  type EventLog,
  type Subscription,
} from '../platform/eventlog/eventlog.js';
import type { UserCounterDelta } from '../user-counter/model.js';
import type { UnappliedEvent, UserCountPart } from '../user-counter/source.js';
import { sequencedEventId, type UserCounterStore } from '../user-counter/store/user-counter-store.js';
import type { RelationMetrics } from './relation.metrics.js';

export const LIKES_RECEIVED_GROUP = 'user-likes-received';

// Far below both dialects' limits on bound parameters per statement.
const CHUNK = 400;
/**
 * A post's counter events are sequenced (seq 1, 2, 3… per post), so the user-counter store keeps one
 * mark per (author, post) for them rather than one applied id per like.
 */
const eventIdOf = (postId: string, seq: number) => sequencedEventId(`knowpost:${postId}`, seq);

/**
 * Posts' authors (they never change, so they are cached for long) and, per post, the highest
 * counter-event seq already applied to the author's likes/favourites received.
 */
export class LikesReceivedRepository {
  private readonly authors = new LruCache<number>({ maxEntries: 100_000, ttlMs: 3_600_000 });

  constructor(private readonly db: Db) {}

  /** Author of each post that exists; one query for the posts not cached. */
  async authorsOf(postIds: readonly string[]): Promise<Map<string, number>> {
    const found = new Map<string, number>();
    const missing: string[] = [];
    for (const id of new Set(postIds)) {
      const author = this.authors.get(id);
      if (author === undefined) missing.push(id);
      else found.set(id, author);
    }
    for (let i = 0; i < missing.length; i += CHUNK) {
      const rows = await this.db.kysely
        .selectFrom('knowposts')
        .select(['id', 'author_id'])
        .where('id', 'in', missing.slice(i, i + CHUNK))
        .execute();
      for (const row of rows) {
        const id = String(row.id);
        this.authors.set(id, Number(row.author_id));
        found.set(id, Number(row.author_id));
      }
    }
    return found;
  }

  async postsOf(authorId: number): Promise<string[]> {
    const rows = await this.db.kysely
      .selectFrom('knowposts')
      .select('id')
      .where('author_id', '=', authorId)
      .execute();
    return rows.map((r) => String(r.id));
  }

  async marks(postIds: readonly string[]): Promise<Map<string, number>> {
    const found = new Map<string, number>();
    for (let i = 0; i < postIds.length; i += CHUNK) {
      const rows = await this.db.kysely
        .selectFrom('likes_received_marks')
        .select(['post_id', 'applied_seq'])
        .where('post_id', 'in', postIds.slice(i, i + CHUNK))
        .execute();
      for (const row of rows) found.set(String(row.post_id), Number(row.applied_seq));
    }
    return found;
  }

  /** Raises marks (never lowers them): one upsert statement per chunk of posts. */
  async raiseMarks(marks: ReadonlyMap<string, number>): Promise<void> {
    const rows = [...marks].map(([post_id, applied_seq]) => ({ post_id, applied_seq }));
    for (let i = 0; i < rows.length; i += CHUNK) {
      const insert = this.db.kysely.insertInto('likes_received_marks').values(rows.slice(i, i + CHUNK));
      if (this.db.dialect === 'mysql') {
        await insert
          .onDuplicateKeyUpdate({ applied_seq: sql`GREATEST(applied_seq, VALUES(applied_seq))` })
          .execute();
      } else {
        await insert
          .onConflict((oc) =>
            oc.column('post_id').doUpdateSet({ applied_seq: sql`MAX(applied_seq, excluded.applied_seq)` }),
          )
          .execute();
      }
    }
  }
}

export interface LikesReceivedConsumerDeps {
  events: EventLog;
  repo: LikesReceivedRepository;
  store: UserCounterStore;
  metrics: RelationMetrics;
  /**
   * A post's events skipped a seq: the author's counts are rebuilt from the facts (exact). A result
   * with `written: false` (deltas kept landing meanwhile) fails the batch, to be delivered again.
   */
  onGap: (authorId: number) => Promise<{ written: boolean } | null | void>;
  onError: (err: unknown) => void;
  /** Told which authors a batch moved (the user-counter reconciler checks them first). */
  onApplied?: (userIds: number[]) => void;
  now?: () => number;
}

/**
 * The `user-likes-received` consumer: each like or favourite a post gains or loses moves its
 * author's `likesReceived` or `favsReceived` by the same amount.
 *
 * Idempotent twice over: deltas carry the counter event's sequenced id (`knowpost:<id>#<seq>`),
 * which the user-counter store applies once per author, keeping one mark per (author, post) in the
 * same atomic step as the counts; and each post has a mark in the database, the highest seq applied,
 * at or below which events are not even sent. Events of one post normally arrive in seq order. When they do
 * not — a seq was skipped because two API processes published one hot post's events in another
 * order — the skipped event will be at or below the mark when it comes, so it is dropped, and the
 * author's counts are rebuilt at once from the facts (the likes-received count part), which counts
 * it exactly. The rebuilds run before the batch's deltas and before it raises the database marks,
 * so a batch whose rebuild failed, or whose worker died, is delivered again and either finds the
 * same gaps or, with the late event now in it, none.
 */
export class LikesReceivedConsumer {
  private subscription: Subscription | undefined;
  private readonly now: () => number;

  constructor(private readonly deps: LikesReceivedConsumerDeps) {
    this.now = deps.now ?? Date.now;
  }

  async start(): Promise<void> {
    this.subscription = await this.deps.events.subscribe({
      group: LIKES_RECEIVED_GROUP,
      topics: [COUNTER_TOPIC],
      maxBatch: 5_000,
      maxWaitMs: 50,
      // Nobody waits on these counts within the second; fewer, larger fetches are cheaper.
      fetchMaxWaitMs: 250,
      commitIntervalMs: IDEMPOTENT_COMMIT_INTERVAL_MS,
      handler: async (batch) => {
        const events: CounterEvent[] = [];
        for (const record of batch.records) {
          const event = parseCounterEvent(record.value);
          if (event && event.entityType === 'knowpost' && /^\d{1,20}$/.test(event.entityId))
            events.push(event);
          else this.deps.metrics.likesReceivedEvents.inc({ outcome: 'malformed' });
        }
        await this.apply(events);
      },
      onError: this.deps.onError,
    });
  }

  async stop(): Promise<void> {
    await this.subscription?.close();
    this.subscription = undefined;
  }

  /** Applies a batch of counter events; idempotent (exported for tests). */
  async apply(events: readonly CounterEvent[]): Promise<void> {
    if (events.length === 0) return;
    const { repo, metrics } = this.deps;
    const byPost = new Map<string, CounterEvent[]>();
    for (const e of events) {
      const list = byPost.get(e.entityId);
      if (list) list.push(e);
      else byPost.set(e.entityId, [e]);
    }
    const postIds = [...byPost.keys()];
    const [authors, marks] = await Promise.all([repo.authorsOf(postIds), repo.marks(postIds)]);

    const deltas: UserCounterDelta[] = [];
    const raised = new Map<string, number>();
    const gaps = new Set<number>();
    let skipped = 0;
    let unknown = 0;
    for (const [postId, list] of byPost) {
      const author = authors.get(postId);
      if (author === undefined) {
        unknown += list.length;
        continue;
      }
      let mark = marks.get(postId) ?? 0;
      for (const e of [...list].sort((x, y) => x.seq - y.seq)) {
        if (e.seq <= mark) {
          skipped++;
          continue;
        }
        if (e.seq > mark + 1) gaps.add(author);
        deltas.push({
          eventId: eventIdOf(postId, e.seq),
          userId: author,
          field: e.metric === 'like' ? 'likesReceived' : 'favsReceived',
          delta: e.delta,
        });
        mark = e.seq;
      }
      if (mark > (marks.get(postId) ?? 0)) raised.set(postId, mark);
    }
    // Rebuilds first. One that fails leaves the store as it was: the batch, delivered again, may
    // bring the skipped event with it (no gap then), which deltas recorded already would mark as
    // applied and lose. One that succeeds records the facts' seq of each of the author's posts, so
    // the deltas below skip what it counted. And all before the marks move: a failed batch comes
    // again and finds its gaps again.
    for (const author of gaps) {
      const rebuilt = await this.deps.onGap(author);
      if (rebuilt && !rebuilt.written) throw new Error(`likes received of user ${author} not rebuilt yet`);
    }
    const result = await this.deps.store.apply(deltas, this.now());
    await repo.raiseMarks(raised);

    metrics.likesReceivedEvents.inc({ outcome: 'applied' }, result.applied);
    if (result.skipped + skipped > 0)
      metrics.likesReceivedEvents.inc({ outcome: 'skipped' }, result.skipped + skipped);
    if (unknown > 0) metrics.likesReceivedEvents.inc({ outcome: 'unknown-post' }, unknown);
    if (deltas.length > 0) this.deps.onApplied?.([...new Set(deltas.map((d) => d.userId))]);
  }
}

/**
 * `likesReceived` and `favsReceived` for user-counter rebuilds: the likes and favourites held on
 * every post of the author, by the posts' fact sets. Read per post in this order — the post's mark,
 * then its facts with their seq in one atomic step — so every event counted in the facts is either
 * at or below the mark (applied, or skipped when it comes) or above it up to the facts' seq. Of
 * those only the one at the facts' seq is listed as unapplied: recording it raises the store's mark
 * for the post, which covers the ones below it. It stands for likes and favourites whose deltas the
 * facts do not tell, so it is listed for both fields with no delta (null): its id is what a rebuild
 * needs, and while it is not applied the reconciler leaves the two fields uncompared (`busy`).
 */
export class LikesReceivedPart implements UserCountPart {
  readonly fields = ['likesReceived', 'favsReceived'] as const;

  constructor(
    private readonly repo: LikesReceivedRepository,
    private readonly counters: CounterStore,
  ) {}

  async read(userId: number) {
    const posts = await this.repo.postsOf(userId);
    const marks = await this.repo.marks(posts);
    const inspections = await Promise.all(
      posts.map((eid) => this.counters.inspect({ etype: 'knowpost', eid } satisfies EntityRef)),
    );
    let likesReceived = 0;
    let favsReceived = 0;
    const unapplied: UnappliedEvent[] = [];
    posts.forEach((postId, i) => {
      const inspection = inspections[i]!;
      likesReceived += inspection.facts.like;
      favsReceived += inspection.facts.fav;
      // The highest one stands for all: recording it raises the post's mark over the rest.
      const mark = marks.get(postId) ?? 0;
      if (inspection.seq > mark) {
        const eventId = eventIdOf(postId, inspection.seq);
        // Every event of the post above the mark moves one of the two fields by one.
        const span = inspection.seq - mark;
        unapplied.push(
          { eventId, field: 'likesReceived', delta: null, span },
          { eventId, field: 'favsReceived', delta: null, span },
        );
      }
    });
    return { counts: { likesReceived, favsReceived }, unapplied };
  }
}
