import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { DataDirBusyError, holdDataDir } from './data-dir-lock.js';

describe(holdDataDir.name, () => {
  const dirs: string[] = [];
  afterEach(() => {
    for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
  });
  const tempDir = () => {
    const dir = mkdtempSync(join(tmpdir(), 'zg-lock-'));
    dirs.push(dir);
    return dir;
  };

  it('lets one holder at a time take a directory', () => {
    const dir = join(tempDir(), 'data');
    const release = holdDataDir(dir);
    // A directory it makes is the user's alone, whatever the umask.
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(() => holdDataDir(dir)).toThrow(DataDirBusyError);
    release();
    release();
    holdDataDir(dir)();
  });

  it('is let go of when the holding process dies, however it dies', async () => {
    const dir = tempDir();
    const lockModule = new URL('./data-dir-lock.ts', import.meta.url).pathname;
    // The holder drops the release: the lock stays while it runs all the same (a garbage-collected
    // database would let go of it; about one run in three did before the lock kept its database).
    const child = spawn(
      process.execPath,
      [
        '--experimental-strip-types',
        '--no-warnings',
        '-e',
        `import(${JSON.stringify(lockModule)}).then((m) => { m.holdDataDir(${JSON.stringify(dir)}); console.log('held'); setInterval(() => {}, 1000); })`,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const exited = new Promise((resolve) => child.on('exit', resolve));
    try {
      await new Promise<void>((resolve, reject) => {
        child.stdout.on('data', (chunk: Buffer) => chunk.toString().includes('held') && resolve());
        child.on('exit', (code) => reject(new Error(`holder exited with ${code}`)));
      });
      expect(() => holdDataDir(dir)).toThrow(DataDirBusyError);
    } finally {
      // A failed expectation must not leave the holder running after the suite.
      child.kill('SIGKILL');
      await exited;
    }
    holdDataDir(dir)();
  });
});
