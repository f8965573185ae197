/**
 * In-process CPU profiles of measured phases, written as `<dir>/<name>.cpuprofile` (open them in
 * Chrome DevTools or VS Code). Off unless a directory is given.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { join } from 'node:path';

export async function startProfile(
  dir: string | undefined,
  name: string,
): Promise<() => Promise<string | null>> {
  if (!dir) return async () => null;
  const session = new Session();
  session.connect();
  await session.post('Profiler.enable');
  await session.post('Profiler.start');
  return async () => {
    const { profile } = await session.post('Profiler.stop');
    session.disconnect();
    mkdirSync(dir, { recursive: true });
    const file = join(dir, `${name}.cpuprofile`);
    writeFileSync(file, JSON.stringify(profile));
    return file;
  };
}
