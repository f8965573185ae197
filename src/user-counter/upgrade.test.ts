import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { openTempSqlite } from '../../test/rig/resources.js';
import { createSqliteKv } from '../platform/kv/create.js';
import { SqliteUserCounterStore } from './store/sqlite-user-counter-store.js';
import { ZERO_USER_COUNTS } from './model.js';
import { forgetEarlierPostCounts, PUBLIC_POSTS_MARK } from './user-counters.js';

describe('snapshots from before posts counted public posts only', () => {
  it('are forgotten once per deployment, at the first start that knows', async () => {
    const { db, dispose } = await openTempSqlite();
    try {
      const kv = createSqliteKv(db);
      const store = new SqliteUserCounterStore(db);
      const lines: string[] = [];
      const log = pino({ level: 'info' }, { write: (line: string) => void lines.push(line) });
      await store.write(7, { ...ZERO_USER_COUNTS, posts: 3 }, {}, Date.now());
      expect(await forgetEarlierPostCounts(kv, store, log)).toBe(true);
      expect(lines).toHaveLength(1);
      expect(await store.read([7])).toEqual([null]);
      expect(await kv.get(PUBLIC_POSTS_MARK)).toBe('1');

      // Written by this release: kept at the next start.
      await store.write(7, { ...ZERO_USER_COUNTS, posts: 1 }, {}, Date.now());
      expect(await forgetEarlierPostCounts(kv, store, log)).toBe(false);
      expect(await store.read([7])).toEqual([{ ...ZERO_USER_COUNTS, posts: 1 }]);
      expect(lines).toHaveLength(1);
    } finally {
      await dispose();
    }
  });

  it('are not spoken of on a new deployment, which has none', async () => {
    const { db, dispose } = await openTempSqlite();
    try {
      const lines: string[] = [];
      const log = pino({ level: 'info' }, { write: (line: string) => void lines.push(line) });
      expect(await forgetEarlierPostCounts(createSqliteKv(db), new SqliteUserCounterStore(db), log)).toBe(
        true,
      );
      expect(lines).toEqual([]);
    } finally {
      await dispose();
    }
  });
});
