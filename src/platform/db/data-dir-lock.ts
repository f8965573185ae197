import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { DatabaseSync } from 'node:sqlite';

/**
 * The lock an embedded server holds on its data directory while it runs: an exclusive transaction
 * on a database file of its own, which the operating system lets go of when the process ends, however
 * it ends. A second server on the same directory refuses to start, and the commands that must not
 * run beside a server (a counters replay) can tell one is running.
 */
export const SERVER_LOCK_FILE = 'server.lock';

export class DataDirBusyError extends Error {
  readonly dir: string;

  constructor(dir: string) {
    super(`an embedded server runs on the data directory ${dir}`);
    this.name = 'DataDirBusyError';
    this.dir = dir;
  }
}

function isBusy(err: unknown): boolean {
  const e = err as { errcode?: number; message?: string };
  // SQLITE_BUSY (5), SQLITE_LOCKED (6), extended codes included.
  return (
    (e.errcode !== undefined && [5, 6].includes(e.errcode & 0xff)) || /locked|busy/i.test(e.message ?? '')
  );
}

/** Tries to take the lock of `dir`: the open database holding it, or null when another holds it. */
function take(dir: string): DatabaseSync | null {
  const db = new DatabaseSync(join(dir, SERVER_LOCK_FILE));
  try {
    db.exec('PRAGMA busy_timeout = 0');
    db.exec('BEGIN EXCLUSIVE');
    return db;
  } catch (err) {
    db.close();
    if (isBusy(err)) return null;
    throw err;
  }
}

/**
 * Takes `dir` for this process (creating it when missing); throws `DataDirBusyError` while another
 * holds it. Returns the release.
 */
export function holdDataDir(dir: string): () => void {
  mkdirSync(dir, { recursive: true });
  const db = take(dir);
  if (!db) throw new DataDirBusyError(dir);
  let held = true;
  return () => {
    if (!held) return;
    held = false;
    db.exec('ROLLBACK');
    db.close();
  };
}

/** Whether a server (this process's or another's) holds `dir`. */
export function dataDirHeld(dir: string): boolean {
  if (!existsSync(join(dir, SERVER_LOCK_FILE))) return false;
  const db = take(dir);
  if (!db) return true;
  db.exec('ROLLBACK');
  db.close();
  return false;
}
