import { describe, expect, it } from 'vitest';
import {
  compareEntries,
  decodeCursor,
  encodeCursor,
  parseRelationEvent,
  relationEvent,
  relationEventMessage,
  slicePage,
  type ListEntry,
} from './model.js';

describe('relation events', () => {
  it('round-trips through the outbox message, keyed by the followed user', () => {
    const event = relationEvent('follow', 3, 7, 1_700_000_000_000);
    const message = relationEventMessage(event);
    expect(message).toMatchObject({ topic: 'relation-events', key: '7' });
    expect(parseRelationEvent(message.payload)).toEqual(event);
    expect(relationEvent('follow', 3, 7, 1).eventId).not.toBe(event.eventId);
  });

  it('rejects malformed payloads', () => {
    for (const bad of [
      '',
      'null',
      '{"eventId":"x","type":"like","fromUserId":1,"toUserId":2,"ts":1}',
      '{"eventId":"x","type":"follow","fromUserId":0,"toUserId":2,"ts":1}',
      '{"eventId":"x","type":"follow","fromUserId":1.5,"toUserId":2,"ts":1}',
      '{"eventId":"","type":"follow","fromUserId":1,"toUserId":2,"ts":1}',
      '{"type":"unfollow","fromUserId":1,"toUserId":2,"ts":1}',
    ]) {
      expect(parseRelationEvent(bad)).toBeNull();
    }
  });
});

describe('list positions', () => {
  const entries: ListEntry[] = [
    { userId: 1, createdAt: 10 },
    { userId: 5, createdAt: 30 },
    { userId: 2, createdAt: 20 },
    { userId: 9, createdAt: 20 },
  ].sort(compareEntries);

  it('orders newest first, ties by id descending', () => {
    expect(entries.map((e) => e.userId)).toEqual([5, 9, 2, 1]);
  });

  it('encodes cursors it can decode and refuses anything else', () => {
    const cursor = encodeCursor({ userId: 9, createdAt: 20 });
    expect(decodeCursor(cursor)).toEqual({ userId: 9, createdAt: 20 });
    for (const bad of ['', 'x', '1', '1.', '.1', '1.0', '-1.2', '1.2.3', '1.99999999999999999', '１.２']) {
      expect(decodeCursor(bad)).toBeNull();
    }
  });

  it('slices by offset and after an exclusive cursor, also one no longer in the list', () => {
    expect(slicePage(entries, { offset: 1 }, 2)).toEqual({ entries: entries.slice(1, 3), more: true });
    expect(slicePage(entries, { offset: 3 }, 2)).toEqual({ entries: entries.slice(3), more: false });
    expect(slicePage(entries, { after: { userId: 9, createdAt: 20 } }, 5)).toEqual({
      entries: entries.slice(2),
      more: false,
    });
    expect(slicePage(entries, { after: { userId: 7, createdAt: 20 } }, 1)).toEqual({
      entries: [{ userId: 2, createdAt: 20 }],
      more: true,
    });
    expect(slicePage(entries, { after: { userId: 1, createdAt: 10 } }, 5)).toEqual({
      entries: [],
      more: false,
    });
  });
});
