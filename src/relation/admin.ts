import type { Logger } from 'pino';
import { Registry } from 'prom-client';
import type { Config } from '../platform/config/config.js';
import { OutboxWriter } from '../platform/outbox/outbox.js';
import { createPlatform } from '../platform/wiring.js';
import { createUserCounters } from '../user-counter/user-counters.js';
import { rebuildRelations, verifyRelations } from './maintenance.js';
import { ORPHAN_AFTER_MS, RelationReconciler } from './reconciler.js';
import { RelationMetrics } from './relation.metrics.js';
import { RelationRepository } from './relation.repository.js';
import { relationUserCountParts } from './user-count-parts.js';

export const RELATIONS_USAGE = `  relations verify [--fix]            compare every user's follower projection, followings/followers counters
                                      and cached lists with the following table (what differs is checked
                                      again 2 s later) and find changes whose events were lost (over a day
                                      unapplied); --fix heals what differs both times and settles those
  relations rebuild                   re-derive the follower projection, every user's counters and the list
                                      caches from the following table`;

export interface AdminIo {
  /** Progress lines (overwritten in place on a terminal). */
  progress(message: string): void;
  /** The one-line JSON summary. */
  summary(line: string): void;
  /** A line for the operator, kept on screen. */
  note(message: string): void;
}

/** What the command cannot reach on the embedded profile. */
export const EMBEDDED_CACHES_NOTE =
  'embedded profile: a running server keeps its cached lists in its own memory, which this command ' +
  'neither compares nor clears; they follow the table once they expire (ZG_RELATION_LIST_CACHE_TTL_MS) ' +
  'or the server restarts';

/** `zhiguang relations verify [--fix] | rebuild`; resolves with the exit code, or 'drift' when verify found some. */
export async function runRelationsCommand(
  config: Config,
  log: Logger,
  command: string,
  options: { fix: boolean },
  io: AdminIo,
): Promise<number | 'drift'> {
  if (command !== 'verify' && command !== 'rebuild') return 2;
  const platform = await createPlatform(config, log, { existing: true });
  const started = Date.now();
  try {
    const repo = new RelationRepository(platform.db, new OutboxWriter());
    const counters = createUserCounters({
      db: platform.db,
      store: platform.userCounterStore,
      events: platform.events,
      registry: new Registry(),
      log,
      reconcileIntervalMs: config.counters.reconcileIntervalMs,
      parts: relationUserCountParts(platform.db, platform.counterStore),
    });
    const rebuildCounters = (userId: number) => counters.service.rebuild(userId, 'overwrite', 'admin');
    let summary: object;
    let drifted = false;
    let incomplete = false;
    const reconciler = new RelationReconciler({
      repo,
      counters: platform.userCounterStore,
      lists: platform.relationLists,
      bus: platform.invalidation,
      rebuildCounters,
      metrics: new RelationMetrics(new Registry()),
      maxCompare: Number.MAX_SAFE_INTEGER,
      settleMs: 0,
      sampleSize: 0,
    });
    if (command === 'verify') {
      const report = await verifyRelations(repo, reconciler, options.fix, (message) => io.progress(message));
      drifted = report.driftedUsers > 0 || report.lostEvents > 0;
      incomplete = report.notFixed > 0;
      summary = report;
    } else {
      const report = await rebuildRelations(
        { repo, lists: platform.relationLists, bus: platform.invalidation, rebuildCounters },
        (message) => io.progress(message),
      );
      // The counters now count the changes whose events were lost; their marks go too, or else
      // they would look in flight for ever.
      const lostEventsSettled = await reconciler.settleAllOrphans();
      const lostEventsLeft = (await repo.unappliedSummary(Date.now(), Date.now() - ORPHAN_AFTER_MS)).orphaned;
      incomplete = report.countersBusy > 0 || report.firstPagesNotAnnounced > 0 || lostEventsLeft > 0;
      summary = { ...report, lostEventsSettled, lostEventsLeft };
    }
    io.summary(
      JSON.stringify({
        command: `relations ${command}${options.fix ? ' --fix' : ''}`,
        ...summary,
        seconds: (Date.now() - started) / 1000,
      }),
    );
    if (config.profile === 'embedded') io.note(EMBEDDED_CACHES_NOTE);
    if (incomplete) {
      io.note('not everything could be done (see the summary): run the command again');
      return 1;
    }
    return drifted ? 'drift' : 0;
  } finally {
    await platform.close();
  }
}
