import type { CounterStore } from '../counter/store/counter-store.js';
import type { Db } from '../platform/db/database.js';
import { OutboxWriter } from '../platform/outbox/outbox.js';
import type { UserCountPart } from '../user-counter/source.js';
import { LikesReceivedPart, LikesReceivedRepository } from './likes-received.js';
import { RelationCountPart } from './relation-count.part.js';
import { RelationRepository } from './relation.repository.js';

/**
 * The slices of the user-count truth this module knows: `followings` and `followers` (the
 * `following` table) and `likesReceived` and `favsReceived` (the fact sets of the user's posts).
 * Every place that rebuilds or verifies user counters must use them all, or it would compare those
 * fields with, and heal them to, zero.
 */
export function relationUserCountParts(db: Db, counterStore: CounterStore): UserCountPart[] {
  return [
    new RelationCountPart(new RelationRepository(db, new OutboxWriter())),
    new LikesReceivedPart(new LikesReceivedRepository(db), counterStore),
  ];
}
