import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { DatabaseSync } from 'node:sqlite';

/**
 * The lock an embedded server holds on its data directory while it runs, and a counters replay
 * while it replays: an exclusive transaction on a database file of its own, which the operating
 * system lets go of when the process ends, however it ends. Neither starts while the other (or a
 * second server) holds it.
 */
export const SERVER_LOCK_FILE = 'server.lock';

export class DataDirBusyError extends Error {
  readonly dir: string;

  constructor(dir: string) {
    super(`the data directory ${dir} is in use by an embedded server or a counters replay`);
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
 * The databases holding a lock: a database the garbage collector takes is closed, which would let
 * go of the lock while the process still runs, so they are kept here until released.
 */
const holding = new Set<DatabaseSync>();

/**
 * Takes `dir` for this process (creating it when missing); throws `DataDirBusyError` while another
 * holds it. Returns the release; until it is called, the lock is held as long as the process runs,
 * whether or not the caller keeps the release.
 */
export function holdDataDir(dir: string): () => void {
  // Private, as the rest of the data directory (see keepDataPrivate), which the lock comes before.
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const db = take(dir);
  if (!db) throw new DataDirBusyError(dir);
  holding.add(db);
  return () => {
    if (!holding.delete(db)) return;
    db.exec('ROLLBACK');
    db.close();
  };
}
