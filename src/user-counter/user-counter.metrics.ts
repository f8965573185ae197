import { Counter, Gauge, type Registry } from 'prom-client';

/** What the user counters export; one instance per app, registered on the app's registry. */
export class UserCounterMetrics {
  readonly events: Counter<'outcome'>;
  readonly consumerLag: Gauge;
  readonly rebuilds: Counter<'reason'>;
  readonly rebuildConflicts: Counter;
  readonly driftFound: Counter;
  readonly driftHealed: Counter;

  constructor(registry: Registry) {
    const registers = [registry];
    this.events = new Counter({
      name: 'zg_user_counter_deltas_total',
      help: 'User counter deltas consumed by user-counters, by outcome: applied, duplicate (already applied) or malformed (records)',
      labelNames: ['outcome'],
      registers,
    });
    this.consumerLag = new Gauge({
      name: 'zg_user_counter_consumer_lag_ms',
      help: 'Age of the newest record of the batch user-counters is applying (grows while a batch fails and comes again)',
      registers,
    });
    this.rebuilds = new Counter({
      name: 'zg_user_counter_rebuilds_total',
      help: 'User snapshots rebuilt from the database, by reason',
      labelNames: ['reason'],
      registers,
    });
    this.rebuildConflicts = new Counter({
      name: 'zg_user_counter_rebuild_conflicts_total',
      help: 'Rebuild writes retried because a delta was applied while the database was read',
      registers,
    });
    this.driftFound = new Counter({
      name: 'zg_user_counter_drift_found_total',
      help: 'Users whose snapshot disagreed with the database when checked',
      registers,
    });
    this.driftHealed = new Counter({
      name: 'zg_user_counter_drift_healed_total',
      help: 'Users healed after drift was found',
      registers,
    });
  }
}
