import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../platform/config/config.js';
import { createLogger } from '../platform/logging/logger.js';
import { createPlatform } from '../platform/wiring.js';
import { EMBEDDED_CACHES_NOTE, runRelationsCommand } from './admin.js';

describe(runRelationsCommand.name, () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });

  it.each(['verify', 'rebuild'])(
    'says on the embedded profile that a running server keeps its own cached lists (%s)',
    async (command) => {
      const dir = mkdtempSync(join(tmpdir(), 'zg-relations-admin-'));
      dirs.push(dir);
      // A deployment a server made.
      await (await createPlatform(loadConfig({ ZG_DATA_DIR: dir }), createLogger('silent'))).close();
      const lines = { summary: [] as string[], notes: [] as string[] };
      const code = await runRelationsCommand(
        loadConfig({ ZG_DATA_DIR: dir }),
        createLogger('silent'),
        command,
        { fix: false },
        {
          progress: () => undefined,
          summary: (line) => lines.summary.push(line),
          note: (message) => lines.notes.push(message),
        },
      );
      expect(code).toBe(0);
      expect(JSON.parse(lines.summary[0]!)).toMatchObject({ command: `relations ${command}` });
      expect(lines.notes).toEqual([EMBEDDED_CACHES_NOTE]);
    },
  );

  it('refuses a data directory no server ran in, and creates nothing there', async () => {
    const parent = mkdtempSync(join(tmpdir(), 'zg-relations-admin-'));
    dirs.push(parent);
    const dir = join(parent, 'data');
    const run = runRelationsCommand(
      loadConfig({ ZG_DATA_DIR: dir }),
      createLogger('silent'),
      'verify',
      { fix: false },
      { progress: () => undefined, summary: () => undefined, note: () => undefined },
    );
    await expect(run).rejects.toThrow(ConfigError);
    await expect(run).rejects.toThrow(/no embedded deployment/);
    expect(existsSync(dir)).toBe(false);
  });
});
