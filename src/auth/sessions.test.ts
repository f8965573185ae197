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

  it('refuses a rotated token presented again within the grace, ending the session only after it', async () => {
    const graced = new SessionStore(createSqliteKv(db, { now: () => now }), 7 * DAY, 10_000, () => now);
    const { sid, ver } = await graced.open(1);
    await graced.allowRefresh(sid, 'rt-0');
    expect(await graced.takeRefresh(sid, 'rt-0', 1, ver)).toBe('ok');
    await graced.allowRefresh(sid, 'rt-1');
    // The other tab, a moment later: graced (it may be given the winner's answer), and the
    // winner's session goes on.
    now += 9_999;
    expect(await graced.takeRefresh(sid, 'rt-0', 1, ver)).toBe('graced');
    expect(await graced.isActive(sid, 1, ver)).toBe(true);
    expect(await graced.takeRefresh(sid, 'rt-1', 1, ver)).toBe('ok');
    await graced.allowRefresh(sid, 'rt-2');
    // Past the grace, the first token again: a replay, which ends the session.
    now += 1;
    expect(await graced.takeRefresh(sid, 'rt-0', 1, ver)).toBe('reused');
    expect(await graced.isActive(sid, 1, ver)).toBe(false);
    expect(await graced.takeRefresh(sid, 'rt-2', 1, ver)).toBe('invalid');
  });

  it('graces a rotation under way or done, not one refused or never made, and keeps an answer for the grace', async () => {
    const kv = createSqliteKv(db, { now: () => now });
    const graced = new SessionStore(kv, 7 * DAY, 10_000, () => now);
    const { sid, ver } = await graced.open(1);
    await graced.allowRefresh(sid, 'rt-0');
    expect(await graced.takeRefresh(sid, 'rt-0', 1, ver)).toBe('ok');
    expect(await graced.takeRefresh(sid, 'rt-0', 1, ver)).toBe('graced');
    // Marked by a rotation still under way (in another process): graced, its answer awaited.
    await kv.set('auth:rtu:rt-u', `${sid} ${now}`, DAY);
    expect(await graced.takeRefresh(sid, 'rt-u', 1, ver)).toBe('graced');
    // A rotation in another process that took the token and has not marked it yet: the mark is
    // read again, briefly, and found.
    const between = graced.takeRefresh(sid, 'rt-y', 1, ver);
    setTimeout(() => void kv.set('auth:rtu:rt-y', `${sid} ${now}`, DAY), 30);
    expect(await between).toBe('graced');
    // Neither current nor marked, in a family that has no current token on record (opened by an
    // earlier release and not rotated since): refused after a few brief reads, the family going on.
    const older = await graced.open(1);
    expect(await graced.takeRefresh(older.sid, 'rt-x', 1, older.ver)).toBe('invalid');
    expect(await graced.isActive(older.sid, 1, older.ver)).toBe(true);
    // A rotation refused because the session ended: its token is refused at once, not graced.
    await graced.allowRefresh(sid, 'rt-1');
    await graced.end(sid);
    expect(await graced.takeRefresh(sid, 'rt-1', 1, ver)).toBe('invalid');
    expect(await graced.takeRefresh(sid, 'rt-1', 1, ver)).toBe('invalid');
    expect(await kv.get('auth:rtu:rt-1')).toBe(`${sid} ${now} refused`);
    expect(await graced.keptAnswer('rt-1')).toBe('refused');

    await graced.keepAnswer('rt-0', 'sealed');
    now += 9_999;
    expect(await graced.keptAnswer('rt-0')).toEqual({ sealed: 'sealed' });
    now += 1;
    expect(await graced.keptAnswer('rt-0')).toBeNull();
    // Without a grace nothing is kept.
    await sessions.keepAnswer('rt-2', 'sealed');
    expect(await sessions.keptAnswer('rt-2')).toBeNull();
  });

  it('ends the session at once on reuse without a grace, and for records that carry no time', async () => {
    const { sid, ver } = await sessions.open(1);
    await sessions.allowRefresh(sid, 'rt-0');
    expect(await sessions.takeRefresh(sid, 'rt-0', 1, ver)).toBe('ok');
    expect(await sessions.takeRefresh(sid, 'rt-0', 1, ver)).toBe('reused');
    expect(await sessions.isActive(sid, 1, ver)).toBe(false);

    const kv = createSqliteKv(db, { now: () => now });
    const graced = new SessionStore(kv, 7 * DAY, 10_000, () => now);
    const other = await graced.open(1);
    await kv.set('auth:rtu:old', other.sid, DAY);
    expect(await graced.takeRefresh(other.sid, 'old', 1, other.ver)).toBe('reused');
    expect(await graced.isActive(other.sid, 1, other.ver)).toBe(false);
  });

  it('tells a token rotated away long ago by the current one, keeping marks only for the grace', async () => {
    const kv = createSqliteKv(db, { now: () => now });
    const graced = new SessionStore(kv, 7 * DAY, 10_000, () => now);
    const { sid, ver } = await graced.open(1);
    for (let i = 0; i < 20; i++) {
      await graced.allowRefresh(sid, `rt-${i}`);
      expect(await graced.takeRefresh(sid, `rt-${i}`, 1, ver)).toBe('ok');
      expect(await kv.ttl(`auth:rtu:rt-${i}`)).toBeLessThanOrEqual(70_000);
      now += 15 * 60_000;
    }
    await graced.allowRefresh(sid, 'rt-20');
    expect(await kv.get('auth:rtu:rt-3')).toBeNull();
    expect(await graced.takeRefresh(sid, 'rt-20', 1, ver)).toBe('ok');
    await graced.allowRefresh(sid, 'rt-21');
    // A token of the session rotated hours ago, its mark long gone: a replay, which ends the session.
    expect(await graced.takeRefresh(sid, 'rt-3', 1, ver)).toBe('reused');
    expect(await graced.isActive(sid, 1, ver)).toBe(false);
    expect(await graced.takeRefresh(sid, 'rt-21', 1, ver)).toBe('invalid');
  });

  it('does not bring back a session ended while its token was being rotated', async () => {
    const { sid, ver } = await sessions.open(1);
    await sessions.allowRefresh(sid, 'rt');
    await sessions.end(sid);
    expect(await sessions.takeRefresh(sid, 'rt', 1, ver)).toBe('invalid');
    expect(await sessions.isActive(sid, 1, ver)).toBe(false);
  });

  it('puts a token back after a failed rotation without taking the mark of a rotation of it that came in between', async () => {
    const kv = createSqliteKv(db, { now: () => now });
    let between: (() => Promise<void>) | undefined;
    const deleteIfEquals = kv.deleteIfEquals.bind(kv);
    kv.deleteIfEquals = async (key, value) => {
      const run = between;
      between = undefined;
      await run?.();
      return deleteIfEquals(key, value);
    };
    const graced = new SessionStore(kv, 7 * DAY, 10_000, () => now);
    const { sid, ver } = await graced.open(1);
    await graced.allowRefresh(sid, 'rt-0');
    const first = await graced.takeForRotation(sid, 'rt-0', 1, ver);
    expect(first.outcome).toBe('ok');
    // Its new token could not be allowed: the token goes back, and a second tab rotates it before
    // the first rotation's mark is dropped.
    between = async () => {
      now += 5;
      expect((await graced.takeForRotation(sid, 'rt-0', 1, ver)).outcome).toBe('ok');
    };
    await first.undo();
    expect(between).toBeUndefined();
    // The second rotation's mark stays: the first tab's retry waits for its answer.
    expect(await graced.takeRefresh(sid, 'rt-0', 1, ver)).toBe('graced');
    expect(await graced.isActive(sid, 1, ver)).toBe(true);
  });
});
