import { parseArgs } from 'node:util';
import { Registry } from 'prom-client';
import { CounterMetrics } from './counter/counter.metrics.js';
import { flushPending, rebuildAll, verifyAll } from './counter/maintenance.js';
import { restoreCounters } from './counter/restore.js';
import { DataDirBusyError, holdDataDir } from './platform/db/data-dir-lock.js';
import { COUNTER_TOPIC, entityKey, parseEntityKey, type EntityRef } from './counter/model.js';
import { ConfigError, loadConfig, unknownSettings, type Config } from './platform/config/config.js';
import { createLogger } from './platform/logging/logger.js';
import { checkEmbeddedDeployment, createPlatform } from './platform/wiring.js';
import { counterRestoreParts, VIEW_TOPIC } from './knowpost/views.js';
import { KnowpostVisibilityRepository } from './knowpost/visibility.repository.js';
import { relationUserCountParts } from './relation/user-count-parts.js';
import { runUsersCommand, USERS_USAGE } from './user-counter/admin.js';
import { RELATIONS_USAGE, runRelationsCommand } from './relation/admin.js';
import { isDependencyOutage } from './platform/errors/outage.js';
import { sameSignal } from './platform/signals.js';

/** What a verify command exits with when it found drift, so a scheduled run can raise an alarm. */
const DRIFT_EXIT = 3;

const USAGE = `usage: zhiguang counters|users|relations <command> [options]

  counters verify [--fix]             compare every snapshot with its facts (those with deltas still
                                      on their way again after a flush interval and 0.5 s, at least
                                      1.5 s, twice); --fix rebuilds the drifted ones
  counters rebuild [--entity T:ID]…   rebuild snapshots from facts (all entities, or the ones named)
  counters replay --yes [--force] [--drop-old-views]
                                      empty the counter store and rebuild it from counter-events,
                                      earliest record to the end captured at the start, then add
                                      back the views read-events holds, each record once also
                                      beside running workers (likes are refused while it runs;
                                      workers run it by themselves when ZG_COUNTER_AUTO_REPLAY
                                      is true; toggles that never reached the log are published
                                      to it first; refused,
                                      changing nothing, when the log no longer holds its earliest events,
                                      or, unless --force, when the store holds changes the log does not
                                      or an embedded server runs on the data directory, or, unless
                                      --drop-old-views, when the store is whole and read-events may
                                      no longer hold every view: the older views would be lost)
  counters flush                      fold all pending deltas into snapshots now
${USERS_USAGE}
${RELATIONS_USAGE}

Exit status: 0 done (for verify: every user or entity checked, none drifted); ${DRIFT_EXIT} verify found
drift (with --fix: and healed all of it); 1 verify could not check some (busy: changes kept landing)
or --fix could not heal some (the summary counts them: run it again), or counters verify found the
store being restored (unsealedGroups: a replay is due or under way), or any other failure; 2 usage
or an entity that does not exist.
Configuration comes from the environment, as for the server (see .env.example).`;

/** The options each command takes; any other is refused rather than ignored. */
const COMMAND_OPTIONS: Record<string, readonly string[]> = {
  'counters verify': ['fix'],
  'counters rebuild': ['entity'],
  'counters replay': ['yes', 'force', 'drop-old-views'],
  'counters flush': [],
  'users verify': ['fix'],
  'relations verify': ['fix'],
  'relations rebuild': [],
};

/**
 * Progress on stderr: one line rewritten in place on a terminal; otherwise (a file, a pipe, a log
 * collector) a plain line per message, without control characters.
 */
let progressShown = false;
function progress(message: string): void {
  if (process.stderr.isTTY) process.stderr.write(`\r${message}\u001b[K`);
  else process.stderr.write(`${message}\n`);
  progressShown = true;
}

/** Ends the line progress was rewriting, if any, before the summary. */
function endProgress(): void {
  if (progressShown && process.stderr.isTTY) process.stderr.write('\n');
  progressShown = false;
}

/** The admin command line: maintenance jobs with progress on stderr and a JSON summary on stdout. */
async function main(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        fix: { type: 'boolean' },
        yes: { type: 'boolean' },
        force: { type: 'boolean' },
        'drop-old-views': { type: 'boolean' },
        entity: { type: 'string', multiple: true },
        help: { type: 'boolean', short: 'h' },
      },
    });
  } catch (err) {
    process.stderr.write(`${(err as Error).message}\n\n${USAGE}\n`);
    return 2;
  }
  const { values, positionals } = parsed;
  const [area, command] = positionals;
  const takes = COMMAND_OPTIONS[`${area} ${command}`];
  const misplaced = Object.keys(values).find((name) => name !== 'help' && !takes?.includes(name));
  if (takes && !values.help && (misplaced !== undefined || positionals.length > 2)) {
    const what = misplaced !== undefined ? `--${misplaced}` : `"${positionals[2]}"`;
    process.stderr.write(`${area} ${command} takes no ${what}\n\n${USAGE}\n`);
    return 2;
  }
  if (area === 'users' && command === 'verify' && !values.help) {
    const config = configFromEnv();
    const log = createLogger(config.logLevel === 'info' ? 'warn' : config.logLevel);
    const code = await runUsersCommand(
      config,
      log,
      command,
      {
        fix: values.fix ?? false,
        // The same slices of the truth as the server's (app.ts).
        parts: (db, platform) => relationUserCountParts(db, platform.counterStore),
      },
      {
        progress,
        summary: (line) => {
          endProgress();
          process.stdout.write(`${line}\n`);
        },
        note: (message) => process.stderr.write(`${message}\n`),
      },
    );
    return code === 'drift' ? DRIFT_EXIT : code;
  }
  if (area === 'relations' && (command === 'verify' || command === 'rebuild') && !values.help) {
    const config = configFromEnv();
    const log = createLogger(config.logLevel === 'info' ? 'warn' : config.logLevel);
    const code = await runRelationsCommand(
      config,
      log,
      command,
      { fix: values.fix ?? false },
      {
        progress,
        summary: (line) => {
          endProgress();
          process.stdout.write(`${line}\n`);
        },
        note: (message) => process.stderr.write(`${message}\n`),
      },
    );
    return code === 'drift' ? DRIFT_EXIT : code;
  }
  if (values.help || area !== 'counters' || takes === undefined) {
    process.stderr.write(`${USAGE}\n`);
    return values.help ? 0 : 2;
  }
  if (command === 'replay' && !values.yes) {
    process.stderr.write('replay empties the counter store first; run it again with --yes to go ahead\n');
    return 2;
  }
  let refs: EntityRef[] | null = null;
  if (values.entity) {
    refs = [];
    for (const raw of values.entity) {
      const ref = parseEntityKey(raw);
      if (!ref) {
        process.stderr.write(`not an entity: ${raw} (expected knowpost:<id>)\n`);
        return 2;
      }
      refs.push(ref);
    }
  }

  const config = configFromEnv();
  // An embedded server's workers would fold and flush while the replay empties and refills the
  // store: the replay holds the data directory, so no server starts before it is done.
  let releaseDataDir = (): void => undefined;
  if (command === 'replay' && config.profile === 'embedded') {
    // Before the lock, which would make the directory.
    checkEmbeddedDeployment(config);
    try {
      releaseDataDir = holdDataDir(config.dataDir);
    } catch (err) {
      if (!(err instanceof DataDirBusyError)) throw err;
      if (!values.force) {
        process.stderr.write(
          `${err.message}: stop it before a replay (--force replays anyway); nothing was changed\n`,
        );
        return 1;
      }
      process.stderr.write(
        `warning: ${err.message}; replaying beside it (--force): its likes and favourites are refused until the store is whole again\n`,
      );
    }
  }
  const log = createLogger(config.logLevel === 'info' ? 'warn' : config.logLevel);
  // The replay refills Redis: once done, it seals the groups and sets the deployment's mark (see markCountersRestored).
  const platform = await createPlatform(config, log, { replaying: command === 'replay', existing: true });
  const metrics = new CounterMetrics(new Registry());
  const started = Date.now();
  try {
    if (refs) {
      // A snapshot is kept for every entity named, so a mistyped id would leave one behind for good.
      const known = await new KnowpostVisibilityRepository(platform.db).load(refs);
      const unknown = refs.filter((ref) => !known.has(entityKey(ref)));
      if (unknown.length > 0) {
        process.stderr.write(`no such post: ${unknown.map(entityKey).join(', ')}; nothing rebuilt\n`);
        return 2;
      }
    }
    let summary: unknown;
    let code = 0;
    let note: string | undefined;
    if (command === 'verify') {
      // Busy entities are checked again once a flush has had time to fold their deltas.
      const recheckMs = Math.max(1_500, config.counters.flushIntervalMs + 500);
      // Groups whose facts are being restored (or were lost) compare their counts with facts that
      // are not whole: agreeing, they prove nothing. Asked before and after, so that a restore
      // that ended while the check ran still counts.
      const unsealedBefore = await platform.counterStore.unsealedGroups();
      const report = await verifyAll(platform.counterStore, values.fix ?? false, progress, recheckMs);
      const unsealedGroups = Math.max(unsealedBefore, await platform.counterStore.unsealedGroups());
      // The report lists the first drifted entities and counts them all (`driftedEntities`).
      summary = { ...report, drifted: report.drifted.map(entityKey), unsealedGroups };
      if (unsealedGroups > 0) {
        code = 1;
        note = `the counter store is being restored in ${unsealedGroups} group(s), or was while this ran (a replay under way, or one stopped before it was done; on the cluster profile also Redis having lost its data, or a deployment no server has started yet): likes and favourites are refused there until \`zhiguang counters replay --yes\` completes; the counts compared prove nothing`;
      }
      // Busy entities (deltas not folded yet) were not compared: not verified, whatever else was found.
      else if (report.busy > 0) {
        code = 1;
        note = `not every entity could be verified (busy ${report.busy}: deltas still on their way; see the summary): run the command again`;
      } else if (report.driftedEntities > 0) code = DRIFT_EXIT;
    } else if (command === 'rebuild') {
      summary = { rebuilt: await rebuildAll(platform.counterStore, refs, progress) };
    } else if (command === 'replay') {
      // The only command that reads the event log: the others work while Kafka is down.
      await platform.events.ensureTopics([COUNTER_TOPIC, VIEW_TOPIC], { keepForever: [COUNTER_TOPIC] });
      // Views are not facts: a replay empties them with the rest and adds back only what read-events
      // holds. A store that lost them already (unsealed) has nothing more to lose; a whole one would
      // lose every view older than the topic's retention, which no other command takes away.
      if (
        !values['drop-old-views'] &&
        (await platform.counterStore.unsealedGroups()) === 0 &&
        !(await platform.events.holdsEveryRecord(VIEW_TOPIC))
      ) {
        process.stderr.write(
          `${VIEW_TOPIC} may no longer hold every view (its retention removes them, after 7 days by default; the embedded ` +
            "log cannot tell once views were consumed): a replay would set every post's views back to those " +
            'it holds. `counters verify --fix` and `counters rebuild` heal likes and favourites and keep views; ' +
            'run the replay with --drop-old-views to go ahead all the same. Nothing was changed.\n',
        );
        return 1;
      }
      // Exact beside running workers (a server of role `all` is its own): their folds are
      // idempotent, and toggles and `view-agg`'s views are refused until the store is whole, views
      // included, after which `view-agg` skips the records the replay added back.
      // A first Ctrl-C (or SIGTERM) before the store is emptied stops it, changing nothing (toggles
      // are taken again); a second one ends it at its next step, within half a second.
      const stop = new AbortController();
      let firstAt: number | undefined;
      /** The status a process ended by `signal` has by default. */
      const exitFor = (signal: NodeJS.Signals) => (signal === 'SIGINT' ? 130 : 143);
      let stoppedBy: NodeJS.Signals | undefined;
      /** Set by a second signal: the replay's next step throws it (see `replayProgress`). */
      let halted: Error | undefined;
      let haltedAt = 0;
      let haltedBy: NodeJS.Signals | undefined;
      let haltTimer: NodeJS.Timeout | undefined;
      const onSignal = (signal: NodeJS.Signals) => {
        // A third signal ends the process at once, unless it is the second one again.
        if (halted) {
          if (!sameSignal(haltedAt)) process.exit(exitFor(signal));
          return;
        }
        if (firstAt !== undefined) {
          // Whichever comes next, SIGINT or SIGTERM, ends the replay at its next step, unless it is
          // the first one again (see `sameSignal`): it lets the deployment's claim go (so the replay
          // run next need not wait 20 s for it to lapse) once every write it issued went out, and
          // the flow below says so and exits with the signal's status (or, done meanwhile, with
          // its summary). A step that takes longer than half a second is not waited for.
          if (sameSignal(firstAt)) return;
          halted = new Error('replay ended by a second signal');
          haltedAt = performance.now();
          haltedBy = signal;
          const code = exitFor(signal);
          haltTimer = setTimeout(() => {
            endProgress();
            process.stderr.write(
              'replay ended by a second signal in the middle of a step: its claim on the deployment lapses within 20 s; likes and favourites are refused until a replay completes\n',
            );
            process.exit(code);
          }, 500);
          return;
        }
        firstAt = performance.now();
        stoppedBy = signal;
        // Past the reset the replay goes on: said, so that the signal does not look ignored.
        process.stderr.write(
          'stopping: a replay that has not emptied the store yet stops, changing nothing; one that has goes on until the store is whole (a second signal ends it at its next step, leaving likes and favourites refused until a replay completes)\n',
        );
        stop.abort(new Error('replay stopped by a signal; nothing was changed'));
      };
      process.on('SIGINT', onSignal).on('SIGTERM', onSignal);
      // One replay at a time in a deployment (`restoreCounters` holds its lease): a second one's
      // reset, views and seals would interleave with the first's.
      let restored: Awaited<ReturnType<typeof restoreCounters>>;
      try {
        const replayProgress = (message: string): void => {
          if (halted) throw halted;
          progress(message);
        };
        restored = await restoreCounters(counterRestoreParts(platform), replayProgress, {
          force: values.force ?? false,
          signal: stop.signal,
          onLeaseLost: () =>
            process.stderr.write(
              'warning: this replay could not keep its claim on the deployment (the key-value store was out of reach for a minute, or the claim was taken): another replay could start beside it\n',
            ),
        });
      } catch (err) {
        // Stopped as asked, before the reset (said as such), or ended by a second signal: the
        // status the signal gives.
        if (stoppedBy !== undefined && err === stop.signal.reason) {
          endProgress();
          process.stderr.write(`${(err as Error).message}\n`);
          return exitFor(stoppedBy);
        }
        if (halted === undefined || err !== halted) throw err;
        endProgress();
        process.stderr.write(
          `${halted.message}: likes and favourites are refused until a replay completes\n`,
        );
        return exitFor(haltedBy!);
      } finally {
        // Settled: what follows says how, closing the stores however long that takes.
        clearTimeout(haltTimer);
      }
      // The listeners stay: a copy of the first signal arriving after the replay settled is taken
      // for it, not left to end the process by default before it says what was done.
      if (restored.outcome !== 'restored') {
        process.stderr.write(
          'another counters replay is running in this deployment (a worker restoring the store, or one run by hand; or one stopped less than 20 s ago); nothing was changed\n',
        );
        return 1;
      }
      summary = restored.report;
    } else {
      summary = { folded: await flushPending(platform.counterStore, metrics, 512, 1_000_000) };
    }
    endProgress();
    const name = `counters ${command}${command === 'verify' && values.fix ? ' --fix' : ''}`;
    process.stdout.write(
      `${JSON.stringify({ command: name, ...(summary as object), seconds: (Date.now() - started) / 1000 })}\n`,
    );
    if (note) process.stderr.write(`${note}\n`);
    return code;
  } finally {
    await platform.close();
    releaseDataDir();
  }
}

/** The deployment's configuration, as the server reads it; settings it does not know are named. */
function configFromEnv(): Config {
  // Named first, also for a configuration refused: a misspelt setting may be why it is.
  const unknown = unknownSettings(process.env);
  if (unknown.length > 0)
    process.stderr.write(
      `settings not known to this release were ignored (misspelt?): ${unknown.join(', ')}\n`,
    );
  return loadConfig(process.env);
}

/** An outage's message, or its code where it has none (a refusal of every address of a name). */
function outageText(err: unknown): string {
  const e = err as { message?: unknown; code?: unknown };
  if (typeof e?.message === 'string' && e.message !== '') return e.message;
  return typeof e?.code === 'string' ? e.code : String(err);
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(
      err instanceof ConfigError
        ? `${err.message}\n`
        : isDependencyOutage(err)
          ? `zhiguang: a store or the event log could not be reached or stopped answering ` +
            `(${outageText(err)}); run the command again once it is back ` +
            '(a replay that stopped after emptying the counter store leaves likes refused until one completes)\n'
          : `zhiguang: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`,
    );
    process.exit(1);
  },
);
