import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { migrate, openSqlite, type Db } from '../platform/db/database.js';
import { createSqliteKv } from '../platform/kv/create.js';
import { SessionStore } from './sessions.js';

const DAY = 86_400_000;

describe(SessionStore.name, () => {
  let dir: string;
  let db: Db;
  let now: number;
  let sessions: SessionStore;

  beforeEach(async () => {
    dir = mkdtempSync(join(tmpdir(), 'zg-sessions-'));
    db = openSqlite(join(dir, 'kv.db'));
    await migrate(db);
    now = Date.parse('2030-01-01T00:00:00Z');
    sessions = new SessionStore(createSqliteKv(db, { now: () => now }), 7 * DAY);
  });
  afterEach(async () => {
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  });

  /** Signs in, then rotates after each of `gaps`; the outcome of every rotation. */
  async function rotations(gaps: number[]): Promise<string[]> {
    const { sid, ver } = await sessions.open(1);
    let jti = 'rt-0';
    await sessions.allowRefresh(sid, jti);
    const outcomes: string[] = [];
    for (const [i, gap] of gaps.entries()) {
      now += gap;
      const outcome = await sessions.takeRefresh(sid, jti, 1, ver);
      outcomes.push(outcome);
      jti = `rt-${i + 1}`;
      if (outcome === 'ok') await sessions.allowRefresh(sid, jti);
    }
    return outcomes;
  }

  it('keeps a session in use alive as long as the refresh token it was last given', async () => {
    expect(await rotations([6 * DAY, 6 * DAY, 6 * DAY])).toEqual(['ok', 'ok', 'ok']);
  });

  it('ends a session left unused for a refresh-token lifetime', async () => {
    expect(await rotations([6 * DAY, 7 * DAY + 1])).toEqual(['ok', 'invalid']);
  });

  it('does not bring back a session ended while its token was being rotated', async () => {
    const { sid, ver } = await sessions.open(1);
    await sessions.allowRefresh(sid, 'rt');
    await sessions.end(sid);
    expect(await sessions.takeRefresh(sid, 'rt', 1, ver)).toBe('invalid');
    expect(await sessions.isActive(sid, 1, ver)).toBe(false);
  });
});
