import { setTimeout as sleep } from 'node:timers/promises';
import { inspect, parseArgs } from 'node:util';
import { buildApp } from './app.js';
import { ConfigError, loadConfig, unknownSettings } from './platform/config/config.js';
import { DataDirBusyError, holdDataDir } from './platform/db/data-dir-lock.js';
import { createLogger } from './platform/logging/logger.js';
import { sameSignal } from './platform/signals.js';

/** `node dist/main.js [--role api|worker|all]`: the service, configured from the environment. */
async function main(): Promise<void> {
  let values: { role?: string | undefined };
  try {
    ({ values } = parseArgs({ options: { role: { type: 'string' } }, allowPositionals: false }));
  } catch (err) {
    // Settings come from the environment; the command line takes only the role.
    process.stderr.write(`${(err as Error).message}\nusage: node dist/main.js [--role api|worker|all]\n`);
    process.exit(2);
  }
  // Named even when the configuration is refused: a misspelt setting may be why it is.
  const unknown = unknownSettings(process.env);
  let config;
  try {
    config = loadConfig(process.env, values.role === undefined ? {} : { role: values.role });
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      if (unknown.length > 0)
        process.stderr.write(`settings not known to this release (misspelt?): ${unknown.join(', ')}\n`);
      process.exit(2);
    }
    throw err;
  }

  // Named before anything can fail: a misspelt setting may be why it does.
  if (unknown.length > 0)
    createLogger(config.logLevel).warn(
      { names: unknown },
      'settings not known to this release were ignored (misspelt?)',
    );

  // One embedded server per data directory, and none during a counters replay (src/cli.ts).
  if (config.profile === 'embedded') {
    try {
      process.on('exit', holdDataDir(config.dataDir));
    } catch (err) {
      if (!(err instanceof DataDirBusyError)) throw err;
      process.stderr.write(`${err.message}: wait for it or stop it, or give this one another ZG_DATA_DIR\n`);
      process.exit(1);
    }
  }

  // A signal while the app is built (migrations run then, and MariaDB's DDL is not transactional)
  // waits for the build to finish, then stops the process before it starts; a second one does not.
  let early: string | undefined;
  let earlyAt = 0;
  const onEarlySignal = (signal: string) => {
    if (early === undefined) {
      early = signal;
      earlyAt = performance.now();
    } else if (!sameSignal(earlyAt)) process.exit(1);
  };
  process.on('SIGTERM', onEarlySignal);
  process.on('SIGINT', onEarlySignal);
  const app = await buildApp(config);
  if (early !== undefined) {
    app.log.info({ signal: early }, 'stopped before starting');
    await app.close();
    process.exit(0);
  }
  process.off('SIGTERM', onEarlySignal);
  process.off('SIGINT', onEarlySignal);
  let stopping = false;
  let stoppingAt = 0;
  const shutdown = (signal: string) => {
    // A second signal cuts the shutdown short, as it does before the server starts.
    if (stopping) {
      if (sameSignal(stoppingAt)) return;
      app.log.warn({ signal }, 'second signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    stoppingAt = performance.now();
    app.log.info({ signal, drainMs: config.shutdownDrainMs }, 'shutting down');
    const force = setTimeout(() => {
      app.log.error('graceful shutdown timed out; exiting');
      process.exit(1);
    }, config.shutdownDrainMs + config.shutdownTimeoutMs);
    force.unref();
    // Load balancers see "draining" and stop sending requests; those that still come are served.
    app.drain();
    sleep(config.shutdownDrainMs)
      .then(() => app.close())
      .then(
        () => {
          app.log.info('stopped');
          process.exit(0);
        },
        (err: unknown) => {
          app.log.error({ err }, 'shutdown failed');
          process.exit(1);
        },
      );
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
  await app.start();
}

main().catch((err: unknown) => {
  // inspect shows the causes (a migration's connection error) and an AggregateError's errors too.
  process.stderr.write(`zhiguang failed to start: ${inspect(err, { depth: 4 })}\n`);
  process.exit(1);
});
