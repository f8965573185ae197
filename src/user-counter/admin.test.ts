import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { publishedPostRow, userRow } from '../../test/rig/resources.js';
import { loadConfig } from '../platform/config/config.js';
import { createLogger } from '../platform/logging/logger.js';
import { createPlatform } from '../platform/wiring.js';
import { relationUserCountParts } from '../relation/user-count-parts.js';
import { runUsersCommand, verifyOutcome } from './admin.js';
import { ZERO_USER_COUNTS } from './model.js';

describe(verifyOutcome.name, () => {
  it.each([
    ['everything verified, nothing drifted', { busy: 0, notFixed: 0, driftedUsers: 0 }, 0],
    ['drift found (with --fix: all healed)', { busy: 0, notFixed: 0, driftedUsers: 2 }, 'drift'],
    ['some users busy', { busy: 1, notFixed: 0, driftedUsers: 0 }, 1],
    ['some users busy, drift found too', { busy: 1, notFixed: 0, driftedUsers: 2 }, 1],
    ['drift not healed', { busy: 0, notFixed: 1, driftedUsers: 2 }, 1],
  ] as const)('%s', (_, report, expected) => {
    expect(verifyOutcome(report)).toBe(expected);
  });
});

describe(runUsersCommand.name, () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  it('exits 1 and says how many users it could not verify while a like is in flight; --fix rewrites them', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'zg-users-admin-'));
    dirs.push(dir);
    const config = loadConfig({ ZG_DATA_DIR: dir });
    const log = createLogger('silent');
    const platform = await createPlatform(config, log);
    const now = Date.now();
    try {
      await platform.db.kysely
        .insertInto('users')
        .values(userRow({ id: 1, nickname: 'author' }))
        .execute();
      await platform.db.kysely
        .insertInto('knowposts')
        .values(publishedPostRow('5', 1, { created_at: now, updated_at: now }))
        .execute();
      await platform.userCounterStore.write(1, { ...ZERO_USER_COUNTS, posts: 1 }, {}, now);
      // Liked, and the event not consumed: the author's likes received are not known yet.
      await platform.counterStore.toggle({ etype: 'knowpost', eid: '5' }, 'like', 2, true, now);
    } finally {
      await platform.close();
    }

    const verify = async (fix: boolean) => {
      const lines = { summary: [] as string[], notes: [] as string[] };
      const code = await runUsersCommand(
        config,
        log,
        'verify',
        { fix, parts: (db, p) => relationUserCountParts(db, p.counterStore) },
        {
          progress: () => undefined,
          summary: (line) => lines.summary.push(line),
          note: (message) => lines.notes.push(message),
        },
      );
      return { code, summary: JSON.parse(lines.summary[0]!) as unknown, notes: lines.notes };
    };
    expect(await verify(false)).toMatchObject({
      code: 1,
      summary: { command: 'users verify', checked: 1, busy: 1, busyUsers: [1], driftedUsers: 0, notFixed: 0 },
      notes: [
        'not every user could be verified and healed (busy 1, notFixed 0; see the summary): run the command again',
      ],
    });
    // --fix cannot verify it either, but rewrites it from the database, so the next run can.
    expect(await verify(true)).toMatchObject({
      code: 1,
      summary: { command: 'users verify --fix', busy: 1, busyRewritten: 1, driftedUsers: 0 },
    });
    expect(await verify(false)).toMatchObject({
      code: 0,
      summary: { checked: 1, ok: 1, busy: 0 },
      notes: [],
    });
  });
});
