import { describe, expect, it } from 'vitest';
import { postChangedEvent, postEvent } from '../knowpost/post-events.js';
import { postEventsFeed } from './consumer.js';

describe('post-events as user counter deltas', () => {
  it('moves the author’s posts on transitions only', () => {
    const value = (event: object) => JSON.stringify(event);
    expect(postEventsFeed.toDeltas(value(postEvent('published', '42', 7, 1)))).toEqual([
      { eventId: 'knowpost:42:published', userId: 7, field: 'posts', delta: 1 },
    ]);
    expect(postEventsFeed.toDeltas(value(postEvent('unpublished', '42', 7, 2)))).toEqual([
      { eventId: 'knowpost:42:unpublished', userId: 7, field: 'posts', delta: -1 },
    ]);
    expect(postEventsFeed.toDeltas(value(postChangedEvent('42', 7, 3, '99')))).toEqual([]);
    expect(
      postEventsFeed.toDeltas(value({ ...postEvent('published', '42', 7, 1), type: 'edited' })),
    ).toBeNull();
    expect(postEventsFeed.toDeltas('not json')).toBeNull();
  });
});
