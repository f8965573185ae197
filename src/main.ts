import { setTimeout as sleep } from 'node:timers/promises';
import { inspect, parseArgs } from 'node:util';
import { buildApp } from './app.js';
import { ConfigError, loadConfig } from './platform/config/config.js';

/** `node dist/main.js [--role api|worker|all]`: the service, configured from the environment. */
async function main(): Promise<void> {
  const { values } = parseArgs({ options: { role: { type: 'string' } }, allowPositionals: false });
  let config;
  try {
    config = loadConfig(process.env, values.role === undefined ? {} : { role: values.role });
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`${err.message}\n`);
      process.exit(2);
    }
    throw err;
  }

  const app = await buildApp(config);
  let stopping = false;
  const shutdown = (signal: string) => {
    if (stopping) return;
    stopping = true;
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
