import { randomUUID } from 'node:crypto';
import type { OutboxMessage } from '../platform/outbox/outbox.js';

/**
 * The relation module's vocabulary.
 *
 * A `RelationEvent` is written to the transactional outbox in the transaction that really changed
 * the `following` table (a repeated follow or unfollow writes nothing), relayed to `relation-events`
 * keyed by the followed user, so every event of one pair travels on one key, in commit order.
 * `eventId` is random and made once, before the insert: redeliveries carry the same id, and two
 * follow→unfollow cycles never share one.
 */
export const RELATION_TOPIC = 'relation-events';

export type RelationEventType = 'follow' | 'unfollow';

export interface RelationEvent {
  eventId: string;
  type: RelationEventType;
  fromUserId: number;
  toUserId: number;
  /** When the change committed (ms since epoch): the start of the outbox lag. */
  ts: number;
}

export function relationEvent(
  type: RelationEventType,
  fromUserId: number,
  toUserId: number,
  ts: number,
): RelationEvent {
  return { eventId: randomUUID(), type, fromUserId, toUserId, ts };
}

export function relationEventMessage(event: RelationEvent): OutboxMessage {
  return { topic: RELATION_TOPIC, key: String(event.toUserId), payload: JSON.stringify(event) };
}

const isUserId = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v > 0;

/** Parses a `relation-events` payload; null for anything malformed (reported and skipped). */
export function parseRelationEvent(payload: string): RelationEvent | null {
  try {
    const v = JSON.parse(payload) as Partial<RelationEvent>;
    if (
      typeof v.eventId === 'string' &&
      v.eventId.length > 0 &&
      v.eventId.length <= 64 &&
      (v.type === 'follow' || v.type === 'unfollow') &&
      isUserId(v.fromUserId) &&
      isUserId(v.toUserId) &&
      typeof v.ts === 'number' &&
      Number.isFinite(v.ts)
    )
      return { eventId: v.eventId, type: v.type, fromUserId: v.fromUserId, toUserId: v.toUserId, ts: v.ts };
  } catch {
    // fall through
  }
  return null;
}

/** Which list of a user: whom they follow, or who follows them. */
export type ListKind = 'following' | 'followers';

/** One member of a list: the other user and when the follow happened. */
export interface ListEntry {
  userId: number;
  createdAt: number;
}

/**
 * Lists are ordered newest first: `createdAt` descending, then `userId` descending, a total order,
 * so an exclusive cursor (the last entry seen) names one position exactly.
 */
export type ListPosition = { offset: number } | { after: ListEntry };

/** True when `a` comes before `b` in list order. */
export function precedes(a: ListEntry, b: ListEntry): boolean {
  return a.createdAt > b.createdAt || (a.createdAt === b.createdAt && a.userId > b.userId);
}

export function compareEntries(a: ListEntry, b: ListEntry): number {
  return precedes(a, b) ? -1 : precedes(b, a) ? 1 : 0;
}

/** Opaque to clients: `<createdAt>.<userId>` of the last entry of a page. */
export function encodeCursor(entry: ListEntry): string {
  return `${entry.createdAt}.${entry.userId}`;
}

export function decodeCursor(raw: string): ListEntry | null {
  const match = /^(\d{1,15})\.(\d{1,16})$/.exec(raw);
  if (!match) return null;
  const createdAt = Number(match[1]);
  const userId = Number(match[2]);
  if (!Number.isSafeInteger(createdAt) || !isUserId(userId)) return null;
  return { createdAt, userId };
}

/** The part of a sorted list a position and limit select, plus whether more entries follow. */
export function slicePage(
  sorted: readonly ListEntry[],
  position: ListPosition,
  limit: number,
): { entries: ListEntry[]; more: boolean } {
  let start: number;
  if ('offset' in position) start = position.offset;
  else {
    const after = position.after;
    // Binary search for the first entry that comes after the cursor.
    let lo = 0;
    let hi = sorted.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (precedes(after, sorted[mid]!)) hi = mid;
      else lo = mid + 1;
    }
    start = lo;
  }
  const entries = sorted.slice(start, start + limit);
  return { entries, more: start + limit < sorted.length };
}
