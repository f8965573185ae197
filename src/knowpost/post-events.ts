import type { OutboxMessage } from '../platform/outbox/outbox.js';

/**
 * What the post module tells the rest of the system.
 *
 * 1. `PostEvent`s travel through the transactional outbox to the `post-events` topic, keyed by the
 *    author, so the author's `posts` count in the user snapshot (their public posts: published and
 *    `public`) moves exactly once per transition: the outbox row is written in the transaction that
 *    changes the post, and consumers deduplicate by `eventId`. `published` is a post becoming one of
 *    the author's public posts (published while public, or a published post made public),
 *    `unpublished` one ceasing to be (deleted, or made anything but public). A post may do so
 *    again and again, so the post counts its entries (`public_epoch`) and `eventId` is derived from
 *    the post, the transition and that number; the post also keeps its latest crossings with their
 *    times (`public_crossings`), so a count rebuilt from the database can name the events of a
 *    window that it includes (`PostCountPart`).
 *    Every other change of who may see a post that is not a draft (publishing or deleting a post
 *    that is not public, a visibility change within the non-public ones), and a new body or new
 *    pictures of a published post (whose old ones are deleted next), writes a `changed` event the
 *    same way: it moves no count, but the `post-cache` consumer drops the post from the shared
 *    caches when it arrives, so a post made private, or a cached copy pointing at deleted objects,
 *    leaves every cache even if the request's own invalidation failed (see `PostCacheConsumer`).
 *    Its `eventId` is unique per change, not per post.
 * 2. `PostChange`s are announced in process after a change commits, so caches (detail, feeds, the
 *    counter module's entity directory) drop what they hold for the post, in every process.
 */
export const POST_TOPIC = 'post-events';

export type PostTransition = 'published' | 'unpublished';
export type PostEventType = PostTransition | 'changed';

export interface PostEvent {
  eventId: string;
  type: PostEventType;
  postId: string;
  authorId: number;
  ts: number;
}

/**
 * The `epoch`-th entry into (`published`) or exit from (`unpublished`) the author's public posts.
 * Their ids (`…:entered:n`, `…:left:n`) are never those of the events an earlier release wrote
 * (`knowpost:{id}:published`, `…:unpublished`, when every published post counted).
 */
export function postEvent(
  type: PostTransition,
  postId: string,
  authorId: number,
  ts: number,
  epoch: number,
): PostEvent {
  const eventId = `knowpost:${postId}:${type === 'published' ? 'entered' : 'left'}:${epoch}`;
  return { eventId, type, postId, authorId, ts };
}

/** One entry (+1) or exit (-1) of a post into or out of its author's public posts: [epoch, delta, time]. */
export type PublicCrossing = [epoch: number, delta: 1 | -1, at: number];

/**
 * How long a post keeps a crossing: longer than the user counters remember an applied event (7
 * days), so a rebuild can name every event of its window.
 */
export const CROSSINGS_KEPT_MS = 8 * 86_400_000;
/**
 * At most this many, the latest: a bound on the row, far beyond any author's use. A post that
 * crossed more often within a week could see an older event counted twice, which the reconciler
 * then heals.
 */
export const CROSSINGS_MAX = 1_000;

/** A post's kept crossings (`public_crossings`); none for anything unreadable. */
export function parseCrossings(json: string): PublicCrossing[] {
  try {
    const value: unknown = JSON.parse(json);
    if (!Array.isArray(value)) return [];
    return value.filter(
      (c): c is PublicCrossing =>
        Array.isArray(c) &&
        c.length === 3 &&
        Number.isSafeInteger(c[0]) &&
        (c[1] === 1 || c[1] === -1) &&
        Number.isFinite(c[2]),
    );
  } catch {
    return [];
  }
}

/** The kept crossings with `crossing` added, and without those it outlived. */
export function withCrossing(json: string, crossing: PublicCrossing): string {
  const kept = parseCrossings(json).filter(([, , at]) => at >= crossing[2] - CROSSINGS_KEPT_MS);
  return JSON.stringify([...kept, crossing].slice(-CROSSINGS_MAX));
}

/** The event of a kept crossing. */
export function crossingEvent(
  postId: string,
  authorId: number,
  [epoch, delta, at]: PublicCrossing,
): PostEvent {
  return postEvent(delta === 1 ? 'published' : 'unpublished', postId, authorId, at, epoch);
}

/** A visibility change; `changeId` makes the event id unique (the outbox row's own id is not known yet). */
export function postChangedEvent(postId: string, authorId: number, ts: number, changeId: string): PostEvent {
  return { eventId: `knowpost:${postId}:changed:${changeId}`, type: 'changed', postId, authorId, ts };
}

export function postEventMessage(event: PostEvent): OutboxMessage {
  return { topic: POST_TOPIC, key: String(event.authorId), payload: JSON.stringify(event) };
}

/** Parses a `post-events` payload; null for anything malformed (logged and skipped by consumers). */
export function parsePostEvent(payload: string): PostEvent | null {
  try {
    const v = JSON.parse(payload) as Partial<PostEvent>;
    if (
      typeof v.eventId === 'string' &&
      v.eventId !== '' &&
      (v.type === 'published' || v.type === 'unpublished' || v.type === 'changed') &&
      typeof v.postId === 'string' &&
      /^\d{1,20}$/.test(v.postId) &&
      typeof v.authorId === 'number' &&
      Number.isSafeInteger(v.authorId) &&
      typeof v.ts === 'number'
    )
      return { eventId: v.eventId, type: v.type, postId: v.postId, authorId: v.authorId, ts: v.ts };
  } catch {
    // fall through
  }
  return null;
}

export type PostChangeKind = 'created' | 'updated' | 'published' | 'visibility' | 'top' | 'deleted';

export interface PostChange {
  id: string;
  authorId: number;
  kind: PostChangeKind;
  /**
   * The post was a draft before and after the change (also for `created`): no cache of published
   * posts held it or holds it now.
   */
  draft: boolean;
  /**
   * Neither before nor after the change was the post published and public (a draft, or a published
   * post only some may read): no shared cache held it or holds it now, and no feed page lists it.
   */
  unlisted: boolean;
}

/** Told after a post change has committed. Must not throw; failures are the listener's to log. */
export type PostChangeListener = (change: PostChange) => void | Promise<void>;
