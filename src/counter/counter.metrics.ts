import { Counter, Gauge, Histogram, type Registry } from 'prom-client';

/** What the counter pipeline exports; one instance per app, registered on the app's registry. */
export class CounterMetrics {
  readonly toggles: Counter<'metric' | 'changed'>;
  readonly eventsPublished: Counter;
  readonly eventsPublishFailed: Counter;
  readonly eventsRepublished: Counter;
  readonly eventsDropped: Counter;
  readonly publishBuffered: Gauge;
  readonly eventsApplied: Counter<'outcome'>;
  readonly consumerLag: Gauge;
  readonly clampedFields: Counter;
  readonly flushDuration: Histogram;
  readonly flushSize: Histogram;
  readonly rebuilds: Counter<'reason'>;
  readonly driftFound: Counter;
  readonly driftHealed: Counter;
  readonly staleVisibility: Counter;

  /** How many events wait in this process's publisher; set by whoever owns the publisher. */
  buffered: () => number = () => 0;

  constructor(registry: Registry) {
    const registers = [registry];
    this.toggles = new Counter({
      name: 'zg_counter_toggles_total',
      help: 'Like/fav toggles by metric and whether the state changed',
      labelNames: ['metric', 'changed'],
      registers,
    });
    this.eventsPublished = new Counter({
      name: 'zg_counter_events_published_total',
      help: 'Counter events acknowledged by the event log',
      registers,
    });
    this.eventsPublishFailed = new Counter({
      name: 'zg_counter_events_publish_failed_total',
      help: 'Counter events whose publish failed (retried, or repaired from facts)',
      registers,
    });
    this.eventsRepublished = new Counter({
      name: 'zg_counter_events_republished_total',
      help: 'Unacknowledged counter events published again by the repair job',
      registers,
    });
    this.eventsDropped = new Counter({
      name: 'zg_counter_publish_dropped_total',
      help: 'Counter events let go of from memory while the log was down or at shutdown (left to the repair job)',
      registers,
    });
    const buffered = (): number => this.buffered();
    this.publishBuffered = new Gauge({
      name: 'zg_counter_publish_buffered',
      help: 'Counter events waiting in this process for the event log',
      registers,
      collect() {
        this.set(buffered());
      },
    });
    this.eventsApplied = new Counter({
      name: 'zg_counter_events_consumed_total',
      help: 'Counter events consumed by counter-agg',
      labelNames: ['outcome'],
      registers,
    });
    this.consumerLag = new Gauge({
      name: 'zg_counter_consumer_lag_ms',
      help: 'Age of the newest counter event of the batch being applied (grows while a batch fails and comes again)',
      registers,
    });
    this.clampedFields = new Counter({
      name: 'zg_counter_clamped_fields_total',
      help: 'Snapshot fields a fold clamped at zero (a count went below zero: an increment was lost upstream)',
      registers,
    });
    this.flushDuration = new Histogram({
      name: 'zg_counter_flush_duration_seconds',
      help: 'Duration of a flush round',
      buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5],
      registers,
    });
    this.flushSize = new Histogram({
      name: 'zg_counter_flush_entities',
      help: 'Entities folded per flush round',
      buckets: [0, 1, 10, 100, 1000, 10_000, 100_000],
      registers,
    });
    this.rebuilds = new Counter({
      name: 'zg_counter_rebuilds_total',
      help: 'Snapshots rebuilt from facts, by reason',
      labelNames: ['reason'],
      registers,
    });
    this.driftFound = new Counter({
      name: 'zg_counter_drift_found_total',
      help: 'Entities whose snapshot disagreed with facts when checked',
      registers,
    });
    this.driftHealed = new Counter({
      name: 'zg_counter_drift_healed_total',
      help: 'Entities healed after drift was found',
      registers,
    });
    this.staleVisibility = new Counter({
      name: 'zg_counter_stale_visibility_total',
      help: 'Likes, favourites and count reads answered from a post visibility kept past its cache time, because the database could not be read',
      registers,
    });
  }
}
