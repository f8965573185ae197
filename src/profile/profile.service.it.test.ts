import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { openTempSqlite, userRow } from '../../test/rig/resources.js';
import type { Db } from '../platform/db/database.js';
import { MemoryRateLimiter } from '../platform/ratelimit/memory-ratelimit.js';
import { LocalObjectStorage } from '../platform/storage/local-object-storage.js';
import { AVATAR_SWEEP_AGE_MS, ProfileService } from './profile.service.js';
import { UsersRepository } from './users.repository.js';

const PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==',
  'base64',
);

describe('ProfileService avatars', () => {
  let db: Db;
  let dispose: () => Promise<void>;
  let dir: string;
  let storage: LocalObjectStorage;
  let users: UsersRepository;
  let userId: number;

  beforeEach(async () => {
    ({ db, dispose } = await openTempSqlite());
    dir = mkdtempSync(join(tmpdir(), 'zg-avatars-'));
    storage = new LocalObjectStorage(dir, 'http://files.test');
    users = new UsersRepository(db);
    userId = Number((await users.insert(userRow())).id);
  });
  afterEach(async () => {
    await dispose();
    rmSync(dir, { recursive: true, force: true });
  });

  const service = (now: () => number = Date.now) =>
    new ProfileService(users, storage, 65_536, new MemoryRateLimiter(), undefined, now);
  const stored = async () => (await storage.listPrefix(`avatars/${userId}`)).map((o) => o.key);

  it('keeps one stored avatar when uploads of one user overlap', async () => {
    // Both uploads have stored their object before either sets it.
    const put = storage.put.bind(storage);
    let waiting: (() => void)[] = [];
    storage.put = async (...args) => {
      const object = await put(...args);
      await new Promise<void>((resolve) => {
        waiting.push(resolve);
        if (waiting.length === 3) for (const go of waiting.splice(0)) go();
      });
      return object;
    };
    const sut = service();
    const answers = await Promise.all([1, 2, 3].map(() => sut.setAvatar(userId, PNG, 'image/png')));
    waiting = [];
    const current = (await users.findById(userId))!.avatar;
    expect(answers.map((a) => a.avatar)).toContain(current);
    const keys = await stored();
    expect(keys).toHaveLength(1);
    expect(current.endsWith(keys[0]!)).toBe(true);
  });

  it('refuses, storing nothing, a picture of more pixels than a browser should decode', async () => {
    // A PNG that says 40000 × 40000: what it holds is never read, only its header.
    const huge = Buffer.from(PNG);
    huge.writeUInt32BE(40_000, 16);
    huge.writeUInt32BE(40_000, 20);
    await expect(service().setAvatar(userId, huge, 'image/png')).rejects.toMatchObject({
      status: 400,
      code: 'BAD_REQUEST',
      message: 'file image is 40000 × 40000 pixels; at most 16384 a side and 64 Mi in all',
    });
    expect(await stored()).toEqual([]);
  });

  it('takes a birthday that is today anywhere on earth, and none later', async () => {
    // 23:30 UTC on 14 December: already the 15th in Beijing and Kiribati, not yet the 16th anywhere.
    const now = () => Date.parse('2026-12-14T23:30:00Z');
    expect((await service(now).update(userId, { birthday: '2026-12-15' })).birthday).toBe('2026-12-15');
    await expect(service(now).update(userId, { birthday: '2026-12-16' })).rejects.toMatchObject({
      status: 400,
      message: 'body.birthday must not be in the future',
    });
  });

  it('sweeps what an upload cut short left once it is old enough, and nothing younger', async () => {
    const stray = `avatars/${userId}/0123456789abcdef.png`;
    await storage.put(stray, PNG, 'image/png');
    await service().setAvatar(userId, PNG, 'image/png');
    expect(await stored()).toContain(stray);
    await service(() => Date.now() + AVATAR_SWEEP_AGE_MS + 1_000).setAvatar(userId, PNG, 'image/png');
    const keys = await stored();
    expect(keys).toHaveLength(1);
    expect(keys).not.toContain(stray);
    expect((await users.findById(userId))!.avatar.endsWith(keys[0]!)).toBe(true);
  });
});
