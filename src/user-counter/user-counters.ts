import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { Db } from '../platform/db/database.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import type { KeyValueStore } from '../platform/kv/kv.js';
import { PeriodicTask } from '../platform/workers/periodic.js';
import { postEventsFeed, UserCounterConsumer, type UserCounterFeed } from './consumer.js';
import { PostCountPart } from './post-count.part.js';
import { UserCounterReconciler } from './reconciler.js';
import { DbUserCountSource, type UserCountPart } from './source.js';
import { DEFAULT_RETENTION_MS, type UserCounterStore } from './store/user-counter-store.js';
import { UserCounterMetrics } from './user-counter.metrics.js';
import { UserCounterService } from './user-counter.service.js';

export interface UserCountersDeps {
  db: Db;
  store: UserCounterStore;
  events: EventLog;
  registry: Registry;
  log: Logger;
  reconcileIntervalMs: number;
  /** Slices of the truth besides posts (relations add followings and followers). */
  parts?: readonly UserCountPart[];
  /** Topics besides `post-events` that move user counts. */
  feeds?: readonly UserCounterFeed[];
  now?: () => number;
}

export interface Worker {
  start(): void | Promise<void>;
  stop(): Promise<void>;
}

export interface UserCounters {
  service: UserCounterService;
  reconciler: UserCounterReconciler;
  metrics: UserCounterMetrics;
  /** Topics the consumer reads (to create at start). */
  topics: string[];
  /** The `user-counters` consumer and the periodic reconciler (worker roles). */
  workers: Worker[];
}

/** Where a deployment records that its snapshots count public posts only. */
export const PUBLIC_POSTS_MARK = 'meta:user-counts:public-posts';

/**
 * `posts` counted every published post before it counted public ones only: the snapshots of a
 * deployment are forgotten once, at the first start of a release that knows, and rebuilt from the
 * database as they are read. Two processes starting together may both forget them; that is harmless.
 */
export async function forgetEarlierPostCounts(
  kv: KeyValueStore,
  store: Pick<UserCounterStore, 'removeAll'>,
  log: Logger,
): Promise<boolean> {
  if ((await kv.get(PUBLIC_POSTS_MARK)) !== null) return false;
  const forgot = await store.removeAll();
  await kv.set(PUBLIC_POSTS_MARK, '1');
  // A new deployment has none: nothing to say then.
  if (forgot)
    log.info(
      'user counts: the snapshots from before posts counted public posts only were forgotten (once per deployment); reads rebuild them',
    );
  return true;
}

/** Wires the user counters: the truth (posts, plus the parts given), the service, the consumer and the reconciler. */
export function createUserCounters(deps: UserCountersDeps): UserCounters {
  const now = deps.now ?? Date.now;
  const metrics = new UserCounterMetrics(deps.registry);
  const source = new DbUserCountSource(
    deps.db,
    [new PostCountPart(deps.db), ...(deps.parts ?? [])],
    DEFAULT_RETENTION_MS,
  );
  const service = new UserCounterService(deps.store, source, metrics, now);
  const reconciler = new UserCounterReconciler(deps.store, source, service, metrics, undefined, now);
  const log = deps.log.child({ worker: 'user-counters' });
  const consumer = new UserCounterConsumer(
    deps.events,
    deps.store,
    [postEventsFeed, ...(deps.feeds ?? [])],
    metrics,
    {
      maxBatch: 2_000,
      maxWaitMs: 50,
      onMalformed: (record) =>
        log.warn(
          { topic: record.topic, partition: record.partition, offset: String(record.offset) },
          'skipping a malformed record',
        ),
      onError: (err) => log.warn({ err }, 'user counter batch failed; it will be delivered again'),
      onApplied: (userIds) => reconciler.touched(userIds),
      now,
    },
  );
  const reconcile = new PeriodicTask(
    'user-counter-reconcile',
    deps.reconcileIntervalMs,
    async () => {
      const round = await reconciler.runOnce();
      if (round.drifted === 0) return;
      if (round.healed === round.drifted) log.warn(round, 'user counter drift found and healed');
      else
        log.warn(
          round,
          'user counter drift found, not all of it healed (deltas kept landing while rebuilding); the next round checks again',
        );
    },
    (_name, err) => log.warn({ err }, 'user counter reconcile failed; will retry'),
  );
  return { service, reconciler, metrics, topics: consumer.topics, workers: [consumer, reconcile] };
}
