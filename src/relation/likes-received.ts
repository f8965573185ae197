import { sql } from 'kysely';
import { parseCounterEvent } from '../counter/aggregator.js';
import { COUNTER_TOPIC, type CounterEvent, type EntityRef } from '../counter/model.js';
import type { CounterStore, Inspection } from '../counter/store/counter-store.js';
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
import { PeriodicTask } from '../platform/workers/periodic.js';
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

  /** The events of these posts set aside to wait for an earlier one, by post, in seq order. */
  async parked(postIds: readonly string[]): Promise<Map<string, ParkedEvent[]>> {
    const found = new Map<string, ParkedEvent[]>();
    for (let i = 0; i < postIds.length; i += CHUNK) {
      const rows = await this.db.kysely
        .selectFrom('likes_received_parked')
        .select(['post_id', 'seq', 'metric', 'delta'])
        .where('post_id', 'in', postIds.slice(i, i + CHUNK))
        .orderBy('seq')
        .execute();
      for (const row of rows) {
        const postId = String(row.post_id);
        const event: ParkedEvent = {
          seq: Number(row.seq),
          metric: row.metric === 'fav' ? 'fav' : 'like',
          delta: Number(row.delta),
        };
        const list = found.get(postId);
        if (list) list.push(event);
        else found.set(postId, [event]);
      }
    }
    return found;
  }

  /** Sets events aside (one set aside already stays as it is). */
  async park(rows: readonly (ParkedEvent & { postId: string })[]): Promise<void> {
    const values = [...rows]
      .sort((x, y) => compareIds(x.postId, y.postId) || x.seq - y.seq)
      .map((r) => ({ post_id: r.postId, seq: r.seq, metric: r.metric, delta: r.delta }));
    for (let i = 0; i < values.length; i += CHUNK)
      await this.db.kysely
        .insertInto('likes_received_parked')
        .values(values.slice(i, i + CHUNK))
        .orIgnore()
        .execute();
  }

  /** Forgets each post's events set aside at or below the given seq. */
  async unpark(upTo: ReadonlyMap<string, number>): Promise<void> {
    const entries = [...upTo].sort(([x], [y]) => compareIds(x, y));
    for (let i = 0; i < entries.length; i += CHUNK / 2) {
      const chunk = entries.slice(i, i + CHUNK / 2);
      await this.db.kysely
        .deleteFrom('likes_received_parked')
        .where((eb) =>
          eb.or(chunk.map(([postId, seq]) => eb.and([eb('post_id', '=', postId), eb('seq', '<=', seq)]))),
        )
        .execute();
    }
  }

  /** Of these posts, those with events waiting: when their author's rebuild is due, and tries so far. */
  async holes(postIds: readonly string[]): Promise<Map<string, Hole>> {
    const found = new Map<string, Hole>();
    for (let i = 0; i < postIds.length; i += CHUNK) {
      const rows = await this.db.kysely
        .selectFrom('likes_received_holes')
        .select(['post_id', 'retry_at', 'tries'])
        .where('post_id', 'in', postIds.slice(i, i + CHUNK))
        .execute();
      for (const row of rows)
        found.set(String(row.post_id), { retryAt: Number(row.retry_at), tries: Number(row.tries) });
    }
    return found;
  }

  /**
   * Records when each post's rebuild is due: `replace` overwrites a hole recorded already (a new gap
   * after progress), otherwise one recorded already stays as it is.
   */
  async putHoles(holes: ReadonlyMap<string, Hole>, replace: boolean): Promise<void> {
    for (const [postId, hole] of holes) {
      const insert = this.db.kysely
        .insertInto('likes_received_holes')
        .values({ post_id: postId, retry_at: hole.retryAt, tries: hole.tries });
      if (!replace) await insert.orIgnore().execute();
      else if (this.db.dialect === 'mysql')
        await insert.onDuplicateKeyUpdate({ retry_at: hole.retryAt, tries: hole.tries }).execute();
      else
        await insert
          .onConflict((oc) => oc.column('post_id').doUpdateSet({ retry_at: hole.retryAt, tries: hole.tries }))
          .execute();
    }
  }

  /** After a refused or failed rebuild: the next try, unless another consumer moved the hole on meanwhile. */
  async backOff(postId: string, from: Hole, to: Hole): Promise<void> {
    await this.db.kysely
      .updateTable('likes_received_holes')
      .set({ retry_at: to.retryAt, tries: to.tries })
      .where('post_id', '=', postId)
      .where('tries', '=', from.tries)
      .execute();
  }

  /**
   * Takes due holes for this caller: moves each one's due time to `until` if it is still the one
   * read, so other workers' sweeps pass it over; the posts taken.
   */
  async claimHoles(due: readonly { postId: string; retryAt: number }[], until: number): Promise<string[]> {
    const taken: string[] = [];
    for (const { postId, retryAt } of due) {
      const result = await this.db.kysely
        .updateTable('likes_received_holes')
        .set({ retry_at: until })
        .where('post_id', '=', postId)
        .where('retry_at', '=', retryAt)
        .executeTakeFirst();
      if (Number(result.numUpdatedRows) > 0) taken.push(postId);
    }
    return taken;
  }

  async deleteHoles(postIds: readonly string[]): Promise<void> {
    for (let i = 0; i < postIds.length; i += CHUNK)
      await this.db.kysely
        .deleteFrom('likes_received_holes')
        .where('post_id', 'in', postIds.slice(i, i + CHUNK))
        .execute();
  }

  /** Posts whose rebuild is due at `now`, with their due time (the longest due first, at most `limit`). */
  async dueHoles(now: number, limit: number): Promise<{ postId: string; retryAt: number }[]> {
    const rows = await this.db.kysely
      .selectFrom('likes_received_holes')
      .select(['post_id', 'retry_at'])
      .where('retry_at', '<=', now)
      .orderBy('retry_at')
      .limit(limit)
      .execute();
    return rows.map((r) => ({ postId: String(r.post_id), retryAt: Number(r.retry_at) }));
  }

  /** Posts with events set aside but no hole (one consumer closed it while another set events aside). */
  async orphans(limit: number): Promise<string[]> {
    const rows = await this.db.kysely
      .selectFrom('likes_received_parked as p')
      .leftJoin('likes_received_holes as h', 'h.post_id', 'p.post_id')
      .where('h.post_id', 'is', null)
      .select('p.post_id')
      .distinct()
      .limit(limit)
      .execute();
    return rows.map((r) => String(r.post_id));
  }

  /** Raises marks (never lowers them): one upsert statement per chunk of posts. */
  async raiseMarks(marks: ReadonlyMap<string, number>): Promise<void> {
    const rows = [...marks]
      .sort(([x], [y]) => compareIds(x, y))
      .map(([post_id, applied_seq]) => ({ post_id, applied_seq }));
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

/** A post's counter event that came before an earlier one of the same post. */
export interface ParkedEvent {
  seq: number;
  metric: 'like' | 'fav';
  delta: number;
}

/** A post with events waiting: when its author's rebuild is (next) due, and how many were refused. */
export interface Hole {
  retryAt: number;
  tries: number;
}

/**
 * How long a post's events wait for an earlier one that has not come before its author is rebuilt
 * from the facts instead (at least; see `LikesReceivedConsumerDeps.holeWaitMs`). Events of one post
 * come out of order by milliseconds (two API processes publishing one hot post's likes); one that
 * comes much later was let go by its publisher and is sent again by the counter repair job, or
 * never, when the repair rebuilt the post instead.
 */
export const HOLE_WAIT_MS = 10_000;
/** The longest wait between two rebuilds tried for one post (each refusal doubles it). */
const MAX_RETRY_MS = 600_000;
/** After this many refused or failed rebuilds of one post's author, it is reported (once). */
const TRIES_TO_TELL = 4;
/** Posts whose rebuild is due handled per sweep. */
const SWEEP_LIMIT = 200;

export interface LikesReceivedConsumerDeps {
  events: EventLog;
  repo: LikesReceivedRepository;
  store: UserCounterStore;
  metrics: RelationMetrics;
  /**
   * An earlier event of a post did not come within `holeWaitMs`: the author's counts are rebuilt
   * from the facts (exact). With `written: false` (deltas kept landing meanwhile) or an error, the
   * post's events wait on, and the rebuild is tried again later, each time twice as late.
   */
  onGap: (authorId: number) => Promise<{ written: boolean } | null | void>;
  onError: (err: unknown) => void;
  /** Told which authors a batch moved (the user-counter reconciler checks them first). */
  onApplied?: (userIds: number[]) => void;
  now?: () => number;
  /** `HOLE_WAIT_MS` by default; longer when the counter repair job waits longer before it republishes. */
  holeWaitMs?: number;
}

/** An event of the batch, or one set aside earlier (`parked`). */
type Pending = ParkedEvent & { parked: boolean };

/**
 * The `user-likes-received` consumer: each like or favourite a post gains or loses moves its
 * author's `likesReceived` or `favsReceived` by the same amount.
 *
 * Idempotent twice over: deltas carry the counter event's sequenced id (`knowpost:<id>#<seq>`),
 * which the user-counter store applies once per author, keeping one mark per (author, post) in the
 * same atomic step as the counts; and each post has a mark in the database, the highest seq applied,
 * at or below which events are not even sent.
 *
 * Each post's events are applied in seq order, with no seq skipped, so the marks mean "everything up
 * to here is counted". Events of one post normally arrive in that order. When one arrives before an
 * earlier one (two API processes published one hot post's events in another order), it and the
 * post's later events are set aside in the database (`likes_received_parked`) and the batch goes on;
 * when the missing one arrives, the post's events are applied from it on, in order. Nothing is
 * rebuilt for that, and no batch waits. Should the missing one not come within `holeWaitMs` (its
 * publisher let it go and the repair job rebuilt the post instead), the author is rebuilt from the
 * facts, which count every event assigned so far, and the post's mark moves over what was set aside.
 * A rebuild refused (deltas kept landing on the author) or failed leaves the events waiting and is
 * tried again twice as late each time (up to 10 minutes apart; `likes_received_holes` keeps when),
 * by the next batch with the post or by the sweep that looks for posts whose rebuild is due (a
 * sweep takes each such post from the other workers' sweeps first). Each gap gets its own wait: a
 * post whose mark moved on and that waits again, for a later seq, starts a new one. What waits is
 * read only when it may move (the batch brings the next seq, or the rebuild is due), not again by
 * every batch that only adds to it.
 *
 * Crash safety: the store's deltas go first, then the database marks, then the post's hole, then
 * what is set aside, then what was set aside and is now applied is forgotten, then holes closed; a
 * batch cut short anywhere is delivered again and finds each step done or to do. Events set aside
 * with no hole recorded (a hole closed by one consumer while another set events aside) are found
 * by the sweep too.
 */
export class LikesReceivedConsumer {
  private subscription: Subscription | undefined;
  private sweeper: PeriodicTask | undefined;
  private readonly now: () => number;
  private readonly holeWaitMs: number;

  constructor(private readonly deps: LikesReceivedConsumerDeps) {
    this.now = deps.now ?? Date.now;
    this.holeWaitMs = deps.holeWaitMs ?? HOLE_WAIT_MS;
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
    this.sweeper = new PeriodicTask(
      'likes-received-holes',
      Math.max(1_000, Math.floor(this.holeWaitMs / 2)),
      () => this.sweep(),
      (_name, err) => this.deps.onError(err),
    );
    this.sweeper.start();
  }

  async stop(): Promise<void> {
    await this.sweeper?.stop();
    this.sweeper = undefined;
    await this.subscription?.close();
    this.subscription = undefined;
  }

  /** Applies a batch of counter events; idempotent (exported for tests). */
  async apply(events: readonly CounterEvent[]): Promise<void> {
    const byPost = new Map<string, Pending[]>();
    for (const e of events) {
      const pending: Pending = { seq: e.seq, metric: e.metric, delta: e.delta, parked: false };
      const list = byPost.get(e.entityId);
      if (list) list.push(pending);
      else byPost.set(e.entityId, [pending]);
    }
    await this.settle(byPost);
  }

  /**
   * Handles the posts whose author's rebuild is due (their events waited for an earlier one longer
   * than `holeWaitMs`, or since the last refusal) and that have had no batch since, taking each from
   * the other workers' sweeps first; and posts with events set aside but no hole. How many posts it
   * looked at. Runs periodically in every worker.
   */
  async sweep(): Promise<number> {
    const { repo } = this.deps;
    const now = this.now();
    const due = await repo.dueHoles(now, SWEEP_LIMIT);
    const taken = await repo.claimHoles(due, now + this.holeWaitMs);
    const orphans = await repo.orphans(SWEEP_LIMIT);
    const posts = [...new Set([...taken, ...orphans])];
    await this.settle(new Map(posts.map((id) => [id, []])), new Set(taken));
    return posts.length;
  }

  /**
   * Applies what can be applied of these posts' events (given, and set aside earlier). `due`: posts
   * whose rebuild is due whatever their hole says (taken by a sweep).
   */
  private async settle(
    byPost: ReadonlyMap<string, readonly Pending[]>,
    due: ReadonlySet<string> = new Set(),
  ): Promise<void> {
    if (byPost.size === 0) return;
    const { repo, metrics } = this.deps;
    // In id order, so that every statement below takes its row locks in one order (no deadlocks
    // between a batch and a sweep on two posts).
    const postIds = [...byPost.keys()].sort(compareIds);
    const [authors, marks, holes] = await Promise.all([
      repo.authorsOf(postIds),
      repo.marks(postIds),
      repo.holes(postIds),
    ]);
    const now = this.now();
    const isDue = (postId: string): boolean => {
      const hole = holes.get(postId);
      return due.has(postId) || (hole !== undefined && hole.retryAt <= now);
    };
    // Events set aside are read only for posts they may move now: a post without a hole (normally
    // none are set aside), one whose batch brings the next seq, or one whose rebuild is due. A hot
    // post's long wait is not read again by every batch.
    const read = postIds.filter((postId) => {
      const next = (marks.get(postId) ?? 0) + 1;
      return !holes.has(postId) || isDue(postId) || byPost.get(postId)!.some((e) => e.seq === next);
    });
    const parked = await repo.parked(read);
    const wasRead = new Set(read);

    const deltas: UserCounterDelta[] = [];
    /** Posts' marks to raise, and up to which seq each post's events set aside are forgotten. */
    const raised = new Map<string, number>();
    const forget = new Map<string, number>();
    /** Per post, the events still waiting for an earlier one (seq order). */
    const waiting = new Map<string, { author: number; events: Pending[] }>();
    const dueAuthors = new Set<number>();
    let skipped = 0;
    let unknown = 0;
    for (const postId of postIds) {
      const fresh = byPost.get(postId)!;
      const held = parked.get(postId) ?? [];
      const author = authors.get(postId);
      if (author === undefined) {
        unknown += fresh.length + held.length;
        if (held.length > 0) forget.set(postId, Number.MAX_SAFE_INTEGER);
        continue;
      }
      const bySeq = new Map<number, Pending>();
      for (const e of fresh) if (!bySeq.has(e.seq)) bySeq.set(e.seq, e);
      for (const e of held) bySeq.set(e.seq, { ...e, parked: true });
      const ordered = [...bySeq.values()].sort((x, y) => x.seq - y.seq);
      const start = marks.get(postId) ?? 0;
      let mark = start;
      let i = 0;
      for (; i < ordered.length; i++) {
        const e = ordered[i]!;
        if (e.seq <= mark) {
          if (!e.parked) skipped++;
          continue;
        }
        if (e.seq > mark + 1) break;
        deltas.push({
          eventId: eventIdOf(postId, e.seq),
          userId: author,
          field: e.metric === 'like' ? 'likesReceived' : 'favsReceived',
          delta: e.delta,
        });
        mark = e.seq;
      }
      if (mark > start) raised.set(postId, mark);
      if (held.length > 0) forget.set(postId, mark);
      if (i < ordered.length) {
        waiting.set(postId, { author, events: ordered.slice(i) });
        // A post that moved on waits for a later seq now: a new gap, with a wait of its own.
        if (mark === start && isDue(postId)) dueAuthors.add(author);
      }
    }

    // Authors whose wait ran out are rebuilt from the facts before anything else moves: a rebuild
    // counts every event assigned so far, so the post's mark may then pass over what waited (and the
    // event missing, when it comes, is skipped).
    const rebuilt = new Set<number>();
    for (const author of dueAuthors) {
      try {
        const result = await this.deps.onGap(author);
        if (result && !result.written) metrics.likesReceivedEvents.inc({ outcome: 'rebuild-refused' });
        else rebuilt.add(author);
      } catch (err) {
        this.deps.onError(err);
      }
    }
    const toPark: (ParkedEvent & { postId: string })[] = [];
    const opened = new Map<string, Hole>();
    const renewed = new Map<string, Hole>();
    const backOff: { postId: string; from: Hole; to: Hole }[] = [];
    const closed: string[] = [];
    let waitedOut = 0;
    for (const postId of postIds) {
      const hole = holes.get(postId);
      const wait = waiting.get(postId);
      if (!wait || rebuilt.has(wait.author)) {
        if (wait) {
          const last = wait.events[wait.events.length - 1]!.seq;
          raised.set(postId, last);
          if (forget.has(postId)) forget.set(postId, last);
          waitedOut += wait.events.length;
        }
        // Only when what waited was read: a post whose events set aside were not (a batch of
        // repeats only) keeps its hole, and its wait.
        if (hole && wasRead.has(postId)) closed.push(postId);
        continue;
      }
      for (const e of wait.events)
        if (!e.parked) toPark.push({ seq: e.seq, metric: e.metric, delta: e.delta, postId });
      const fresh: Hole = { retryAt: now + this.holeWaitMs, tries: 0 };
      if (raised.has(postId)) renewed.set(postId, fresh);
      else if (!hole) opened.set(postId, fresh);
      else if (dueAuthors.has(wait.author)) {
        // Refused or failed: tried again later, each time twice as late.
        const tries = hole.tries + 1;
        backOff.push({
          postId,
          from: hole,
          to: { retryAt: now + Math.min(this.holeWaitMs * 2 ** tries, MAX_RETRY_MS), tries },
        });
      }
    }

    // A new gap's wait before the mark that makes it one moves: a batch cut short after the mark
    // and delivered again must not find the old gap's (due) timer.
    await repo.putHoles(renewed, true);
    const result = await this.deps.store.apply(deltas, this.now());
    await repo.raiseMarks(raised);
    // The hole before what waits: a post with events set aside has one, so the sweep finds it.
    await repo.putHoles(opened, false);
    for (const b of backOff) {
      await repo.backOff(b.postId, b.from, b.to);
      if (b.to.tries === TRIES_TO_TELL)
        this.deps.onError(
          new Error(
            `likes received: post ${b.postId} has waited for a missing event through ${b.to.tries} refused or failed rebuilds of its author; they go on, ever further apart`,
          ),
        );
    }
    await repo.park(toPark);
    await repo.unpark(forget);
    await repo.deleteHoles(closed);

    metrics.likesReceivedEvents.inc({ outcome: 'applied' }, result.applied);
    if (result.skipped + skipped > 0)
      metrics.likesReceivedEvents.inc({ outcome: 'skipped' }, result.skipped + skipped);
    if (unknown > 0) metrics.likesReceivedEvents.inc({ outcome: 'unknown-post' }, unknown);
    if (toPark.length > 0) metrics.likesReceivedEvents.inc({ outcome: 'parked' }, toPark.length);
    if (waitedOut > 0) metrics.likesReceivedEvents.inc({ outcome: 'rebuilt-over' }, waitedOut);
    if (deltas.length > 0) this.deps.onApplied?.([...new Set(deltas.map((d) => d.userId))]);
  }
}

/** Orders decimal ids as numbers. */
function compareIds(a: string, b: string): number {
  return a.length - b.length || (a < b ? -1 : a > b ? 1 : 0);
}

/** Posts of one author whose facts a rebuild inspects at once. */
const INSPECT_AT_ONCE = 64;

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
    // A bounded number at a time: an author of thousands of posts must not send them all at once.
    const inspections: Inspection[] = [];
    for (let i = 0; i < posts.length; i += INSPECT_AT_ONCE) {
      inspections.push(
        ...(await Promise.all(
          posts
            .slice(i, i + INSPECT_AT_ONCE)
            .map((eid) => this.counters.inspect({ etype: 'knowpost', eid } satisfies EntityRef)),
        )),
      );
    }
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
    // Facts being restored (Redis lost them; a replay runs) count short: not to be kept.
    const provisional = inspections.some((inspection) => !inspection.sealed);
    return provisional
      ? { counts: { likesReceived, favsReceived }, unapplied, provisional: true as const }
      : { counts: { likesReceived, favsReceived }, unapplied };
  }
}
