import { describe, expect, it } from 'vitest';
import { parseCounterEvent } from './aggregator.js';
import { eventFor } from './model.js';

describe(parseCounterEvent.name, () => {
  const event = eventFor({ etype: 'knowpost', eid: '42' }, 'fav', 7, 1, 3, 1_700_000_000_000);

  it('reads an event as written', () => {
    expect(parseCounterEvent(JSON.stringify(event))).toEqual(event);
  });

  it('takes the snapshot field from the metric, not from the record', () => {
    expect(parseCounterEvent(JSON.stringify({ ...event, idx: 4 }))?.idx).toBe(2);
    expect(parseCounterEvent(JSON.stringify({ ...event, idx: undefined }))?.idx).toBe(2);
  });

  it('refuses records that are not counter events', () => {
    for (const value of [
      '',
      'null',
      '{}',
      JSON.stringify({ ...event, metric: 'read' }),
      JSON.stringify({ ...event, delta: 2 }),
      JSON.stringify({ ...event, seq: 0 }),
      // Well-formed JSON the stores would refuse: no entity or user they take.
      JSON.stringify({ ...event, entityType: 'user' }),
      JSON.stringify({ ...event, entityId: 'abc' }),
      JSON.stringify({ ...event, entityId: '' }),
      // Another spelling of a post's id would be another post to the stores.
      JSON.stringify({ ...event, entityId: '007' }),
      JSON.stringify({ ...event, entityId: '0' }),
      JSON.stringify({ ...event, userId: -1 }),
      JSON.stringify({ ...event, userId: 1.5 }),
      JSON.stringify({ ...event, userId: '7' }),
    ])
      expect(parseCounterEvent(value), value).toBeNull();
  });
});
