import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { InvalidationBus } from '../platform/cache/invalidation-bus.js';
import type { EventLog } from '../platform/eventlog/eventlog.js';
import type { RateLimiter } from '../platform/ratelimit/ratelimit.js';
import { PeriodicTask } from '../platform/workers/periodic.js';
import type { UserCounterStore } from '../user-counter/store/user-counter-store.js';
import type { ListCache } from './list-cache/list-cache.js';
import { RELATION_TOPIC } from './model.js';
import { RelationProjector } from './projector.js';
import { RelationReconciler } from './reconciler.js';
import { RelationMetrics } from './relation.metrics.js';
import type { RelationRepository } from './relation.repository.js';
import { RelationService, type UserCountsReader, type UserDirectory } from './relation.service.js';

export interface RelationsConfig {
  changesPerMinute: number;
  bigAccountFollowers: number;
  firstPageCacheMs: number;
  listCacheMaxEntries: number;
  reconcileIntervalMs: number;
}

export interface RelationsDeps {
  repo: RelationRepository;
  users: UserDirectory;
  limiter: RateLimiter;
  lists: ListCache;
  events: EventLog;
  bus: InvalidationBus;
  userCounterStore: UserCounterStore;
  /** The user counters' reads (list sizes) and overwriting rebuild (healing counter drift). */
  userCounters: UserCountsReader & {
    rebuild(userId: number, mode: 'overwrite', reason: 'drift'): Promise<{ written: boolean } | null>;
  };
  registry: Registry;
  /** The module's metrics when the caller made them already (to observe `repo`); else made here. */
  metrics?: RelationMetrics;
  log: Logger;
  config: RelationsConfig;
  /** Told after a change committed (e.g. to wake the outbox relay). */
  onCommitted?: () => void;
  now?: () => number;
}

export interface Worker {
  start(): void | Promise<void>;
  stop(): Promise<void>;
}

export interface Relations {
  service: RelationService;
  projector: RelationProjector;
  reconciler: RelationReconciler;
  metrics: RelationMetrics;
  /** Topics the workers read (to create at start). */
  topics: string[];
  /** The relation-proj consumer and the periodic reconciler (worker roles). */
  workers: Worker[];
}

/** Wires the relation module: the service for the routes, the consumer and the reconciler for workers. */
export function createRelations(deps: RelationsDeps): Relations {
  const now = deps.now ?? Date.now;
  const log = deps.log.child({ module: 'relation' });
  const metrics = deps.metrics ?? new RelationMetrics(deps.registry);
  const service = new RelationService({
    repo: deps.repo,
    users: deps.users,
    limiter: deps.limiter,
    lists: deps.lists,
    counts: deps.userCounters,
    bus: deps.bus,
    metrics,
    limits: {
      changesPerMinute: deps.config.changesPerMinute,
      bigAccountFollowers: deps.config.bigAccountFollowers,
      firstPageTtlMs: deps.config.firstPageCacheMs,
      listCacheMaxEntries: deps.config.listCacheMaxEntries,
    },
    log,
    ...(deps.onCommitted ? { onCommitted: deps.onCommitted } : {}),
    now,
  });
  const reconciler = new RelationReconciler({
    repo: deps.repo,
    counters: deps.userCounterStore,
    lists: deps.lists,
    bus: deps.bus,
    rebuildCounters: (userId) => deps.userCounters.rebuild(userId, 'overwrite', 'drift'),
    metrics,
    maxCompare: Math.max(1_000, deps.config.listCacheMaxEntries),
    settleMs: 2_000,
    sampleSize: 200,
  });
  const projector = new RelationProjector({
    events: deps.events,
    repo: deps.repo,
    counters: deps.userCounterStore,
    lists: deps.lists,
    bus: deps.bus,
    metrics,
    onError: (err) => log.warn({ err }, 'relation projection batch failed; it will be delivered again'),
    onApplied: (userIds) => reconciler.touched(userIds),
    now,
  });
  const reconcile = new PeriodicTask(
    'relation-reconcile',
    deps.config.reconcileIntervalMs,
    async () => {
      const round = await reconciler.runOnce();
      if (round.drifted > 0 || round.lostEvents > 0) log.warn(round, 'relation drift found and healed');
    },
    (_name, err) => log.warn({ err }, 'relation reconcile failed; will retry'),
  );
  return {
    service,
    projector,
    reconciler,
    metrics,
    topics: [RELATION_TOPIC],
    workers: [projector, reconcile],
  };
}
