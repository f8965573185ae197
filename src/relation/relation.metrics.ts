import { Counter, Histogram, type Registry } from 'prom-client';

/** What the relation module exports; one instance per app, registered on the app's registry. */
export class RelationMetrics {
  readonly changes: Counter<'action' | 'changed'>;
  readonly eventsConsumed: Counter<'outcome'>;
  readonly projectionLag: Histogram;
  readonly cacheReads: Counter<'cache' | 'result'>;
  readonly driftFound: Counter<'kind'>;
  readonly driftHealed: Counter<'kind'>;
  readonly likesReceivedEvents: Counter<'outcome'>;
  readonly commitBatch: Histogram;

  constructor(registry: Registry) {
    const registers = [registry];
    this.changes = new Counter({
      name: 'zg_relation_changes_total',
      help: 'Follow and unfollow requests by action and whether the state changed',
      labelNames: ['action', 'changed'],
      registers,
    });
    this.eventsConsumed = new Counter({
      name: 'zg_relation_events_consumed_total',
      help: 'Relation events consumed by relation-proj, by outcome: applied, redelivered (already applied) or malformed',
      labelNames: ['outcome'],
      registers,
    });
    this.projectionLag = new Histogram({
      name: 'zg_relation_projection_lag_seconds',
      help: 'Time from the commit of a follow or unfollow to its projection being applied',
      buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    this.cacheReads = new Counter({
      name: 'zg_relation_cache_reads_total',
      help: 'List reads by cache tier (list, first-page) and result (hit, miss, bypass, error)',
      labelNames: ['cache', 'result'],
      registers,
    });
    this.driftFound = new Counter({
      name: 'zg_relation_drift_found_total',
      help: 'Drift found by the relation reconciler, by kind (projection, counters, cache, lost-event: a change whose event the log lost)',
      labelNames: ['kind'],
      registers,
    });
    this.driftHealed = new Counter({
      name: 'zg_relation_drift_healed_total',
      help: 'Drift healed by the relation reconciler, by kind',
      labelNames: ['kind'],
      registers,
    });
    this.commitBatch = new Histogram({
      name: 'zg_relation_commit_changes',
      help: 'Follow and unfollow requests committed together in one transaction (group commit)',
      buckets: [1, 2, 5, 10, 20, 50, 100, 200],
      registers,
    });
    this.likesReceivedEvents = new Counter({
      name: 'zg_user_likes_received_events_total',
      help: 'Counter events consumed by user-likes-received: applied, skipped (applied already), unknown-post, malformed, parked (set aside behind an earlier event not come yet), rebuilt-over (set aside, then counted by a rebuild of the author), rebuild-refused (rebuilds tried for overdue events that deltas kept refusing)',
      labelNames: ['outcome'],
      registers,
    });
  }
}
