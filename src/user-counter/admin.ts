import { Registry } from 'prom-client';
import type { Logger } from 'pino';
import type { Config } from '../platform/config/config.js';
import type { Db } from '../platform/db/database.js';
import { createPlatform, type Platform } from '../platform/wiring.js';
import type { UserVerifyReport } from './reconciler.js';
import type { UserCountPart } from './source.js';
import { createUserCounters } from './user-counters.js';

export const USERS_USAGE = `  users verify [--fix]                compare every user's counts with the database; --fix heals the drifted ones`;

export interface AdminIo {
  /** Progress lines (overwritten in place on a terminal). */
  progress(message: string): void;
  /** The one-line JSON summary. */
  summary(line: string): void;
  /** A line for the operator, kept on screen. */
  note(message: string): void;
}

/**
 * How `users verify` ends: 1 when not every user could be verified (`busy`) or, with --fix, some
 * drift could not be healed (`notFixed`), whatever else it found; 'drift' when drift was found (and
 * with --fix all of it healed); 0 when every user was verified and none drifted.
 */
export function verifyOutcome(
  report: Pick<UserVerifyReport, 'busy' | 'notFixed' | 'driftedUsers'>,
): 0 | 1 | 'drift' {
  if (report.busy > 0 || report.notFixed > 0) return 1;
  return report.driftedUsers > 0 ? 'drift' : 0;
}

/**
 * `zhiguang users verify [--fix]`: pages through every user, compares each snapshot with the
 * database (allowing for deltas still on their way) and, with --fix, overwrites the drifted ones.
 * Users without a snapshot are counted, not created: the first read rebuilds them. `parts` must be
 * the same slices of the truth the server uses (see app.ts), or fields it leaves out would be
 * compared with, and healed to, zero. Resolves with the exit code (see `verifyOutcome`), or 'drift'.
 */
export async function runUsersCommand(
  config: Config,
  log: Logger,
  command: string,
  options: { fix: boolean; parts: (db: Db, platform: Platform) => UserCountPart[] },
  io: AdminIo,
): Promise<number | 'drift'> {
  if (command !== 'verify') return 2;
  const platform = await createPlatform(config, log, { existing: true });
  const started = Date.now();
  try {
    const counters = createUserCounters({
      db: platform.db,
      store: platform.userCounterStore,
      events: platform.events,
      registry: new Registry(),
      log,
      reconcileIntervalMs: config.counters.reconcileIntervalMs,
      parts: options.parts(platform.db, platform),
    });
    // Likes and favourites received are counted from the counter store's facts, which are not
    // whole while it is being restored: agreeing with them proves nothing (see counters verify).
    const unsealedBefore = await platform.counterStore.unsealedGroups();
    const report = await counters.reconciler.verifyAll(options.fix, (message) => io.progress(message));
    const restoring = Math.max(unsealedBefore, await platform.counterStore.unsealedGroups()) > 0;
    io.summary(
      JSON.stringify({
        command: `users verify${options.fix ? ' --fix' : ''}`,
        ...report,
        seconds: (Date.now() - started) / 1000,
      }),
    );
    const outcome = verifyOutcome(report);
    if (restoring) {
      io.note(
        `likes and favourites received could not be verified: the counter store is being restored (see counters verify); run this again once \`zhiguang counters replay --yes\` has completed`,
      );
      return 1;
    }
    if (outcome === 1)
      io.note(
        `not every user could be verified and healed (busy ${report.busy}, notFixed ${report.notFixed}; see the summary): run the command again`,
      );
    return outcome;
  } finally {
    await platform.close();
  }
}
