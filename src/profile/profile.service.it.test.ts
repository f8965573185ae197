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
