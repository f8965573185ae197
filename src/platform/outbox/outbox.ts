import type { Kysely, Transaction } from 'kysely';
import type { Database } from '../db/schema.js';

/** An event to publish once the transaction that wrote it commits. */
export interface OutboxMessage {
  topic: string;
  /**
   * Event-log key: messages with the same topic and key are published in the order they were
   * appended, provided the transactions appending them commit in that order too. On MySQL an id is
   * given at insert, not at commit, so two writers of one key that do not serialise on a row lock
   * may see the later row commit, and go out, first. Relation events are keyed by the followed
   * user: changes of one pair serialise on its `following` row, so they keep their order; changes
   * of different pairs may swap, which their consumer does not mind (each is applied by its id).
   */
  key: string;
  payload: string;
}

export interface OutboxRow extends OutboxMessage {
  id: number;
  createdAt: number;
}

/**
 * Writes outbox rows inside the caller's transaction, so the event exists exactly when the state
 * change that caused it does. The SQL is the same on both dialects.
 */
export class OutboxWriter {
  constructor(private readonly now: () => number = Date.now) {}

  async append(
    db: Transaction<Database> | Kysely<Database>,
    message: OutboxMessage | OutboxMessage[],
  ): Promise<void> {
    const messages = Array.isArray(message) ? message : [message];
    if (messages.length === 0) return;
    const createdAt = this.now();
    await db
      .insertInto('outbox')
      .values(
        messages.map((m) => ({ topic: m.topic, msg_key: m.key, payload: m.payload, created_at: createdAt })),
      )
      .execute();
  }
}

/** What a claim did. */
export interface ClaimResult {
  /** Rows handed to `work`. */
  handed: number;
  /**
   * The claim took `limit` rows and handed some of them, so more are probably waiting. Rows held
   * back behind another claimer's do not make it less full: the rows after them are still there.
   */
  full: boolean;
}

/** What the relay needs from the outbox table; one adapter per dialect. */
export interface OutboxStore {
  /**
   * Claims up to `limit` of the oldest rows and hands the claimable ones to `work` in id order.
   * `work` returns the ids it is done with (published); those rows are deleted, the rest stay for
   * a later claim. When `work` throws, nothing is deleted. While `work` runs, no other claimer gets
   * these rows, nor a later row with the same topic and key.
   */
  claim(limit: number, work: (rows: OutboxRow[]) => Promise<number[]>): Promise<ClaimResult>;
}

export function toOutboxRow(row: {
  id: number | string;
  topic: string;
  msg_key: string;
  payload: string;
  created_at: number | string;
}): OutboxRow {
  return {
    id: Number(row.id),
    topic: row.topic,
    key: row.msg_key,
    payload: row.payload,
    createdAt: Number(row.created_at),
  };
}
