import { isUserField, USER_FIELD_INDEX, type UserCounterDelta } from '../model.js';
import { checkUserId } from './user-counter-store.js';

/** The deltas one event makes to one user, repeats removed: field index → delta. */
export interface EventRun {
  userId: number;
  eventId: string;
  deltas: Map<number, number>;
}

/**
 * Groups a batch by (user, event) in first-seen order. A delta repeating an earlier one of the
 * batch (same event, user and field) is a duplicate delivery and counted in `repeats`.
 */
export function eventRuns(deltas: readonly UserCounterDelta[]): { runs: EventRun[]; repeats: number } {
  const runs = new Map<string, EventRun>();
  let repeats = 0;
  for (const d of deltas) {
    checkUserId(d.userId);
    if (!isUserField(d.field)) throw new RangeError(`invalid field: ${String(d.field)}`);
    if (!Number.isSafeInteger(d.delta)) throw new RangeError(`invalid delta: ${d.delta}`);
    if (typeof d.eventId !== 'string' || d.eventId === '') throw new RangeError('an event id is required');
    const key = `${d.userId}:${d.eventId}`;
    let run = runs.get(key);
    if (!run) {
      run = { userId: d.userId, eventId: d.eventId, deltas: new Map() };
      runs.set(key, run);
    }
    const idx = USER_FIELD_INDEX[d.field];
    if (run.deltas.has(idx)) repeats++;
    else run.deltas.set(idx, d.delta);
  }
  return { runs: [...runs.values()], repeats };
}
