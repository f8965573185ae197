import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { Metrics } from '../../src/platform/metrics/metrics.js';
import { createHttpServer, type HttpServerOptions } from '../../src/platform/http/server.js';
import type { Batch, EventLog, SubscribeOptions } from '../../src/platform/eventlog/eventlog.js';

/**
 * An event log whose one subscription hands its handler to the test, which then delivers batches
 * itself (again, after a failure, as the real logs do).
 */
export function handedLog(): { events: EventLog; deliver(batch: Batch): Promise<void> } {
  let handler: SubscribeOptions['handler'] | undefined;
  const events = {
    subscribe: async (options: SubscribeOptions) => {
      handler = options.handler;
      return { close: async () => {} };
    },
  } as unknown as EventLog;
  return {
    events,
    deliver: (batch) => {
      if (!handler) throw new Error('nothing subscribed yet');
      return handler(batch);
    },
  };
}

/** A batch of one record of `topic`, written at `timestamp`. */
export function oneRecord(topic: string, value: string, timestamp: number): Batch {
  return { topic, records: [{ topic, partition: 0, offset: 0n, key: 'k', value, timestamp }] };
}

/** The value of an unlabelled metric, or undefined when it has none yet. */
export async function metricOf(registry: Registry, name: string): Promise<number | undefined> {
  return (await registry.getSingleMetric(name)?.get())?.values[0]?.value;
}

/** The app's HTTP server with small limits and no API docs, for tests of its plumbing. */
export function plainHttpServer(
  logger: Logger,
  options: Partial<HttpServerOptions> = {},
): Promise<FastifyInstance> {
  return createHttpServer({
    logger,
    metrics: new Metrics(),
    bodyLimitBytes: 1024,
    uploadLimitBytes: 1024,
    version: 'test',
    docs: false,
    ...options,
  });
}

/** Counts the turns of the event loop from now until `stop()`: whether work in between gave any. */
export function turnCounter(): { readonly turns: number; stop(): void } {
  let turns = 0;
  let counting = true;
  const turn = (): void => {
    turns++;
    if (counting) setImmediate(turn);
  };
  setImmediate(turn);
  return {
    get turns() {
      return turns;
    },
    stop: () => void (counting = false),
  };
}
