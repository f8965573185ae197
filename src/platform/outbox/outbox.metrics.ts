import { Counter, Histogram, type Registry } from 'prom-client';

/** What the outbox relay exports; one instance per app, registered on the app's registry. */
export class OutboxMetrics {
  readonly published: Counter;
  readonly failedRounds: Counter;
  readonly roundRows: Histogram;
  readonly publishAge: Histogram;

  constructor(registry: Registry) {
    const registers = [registry];
    this.published = new Counter({
      name: 'zg_outbox_published_total',
      help: 'Outbox rows the relay published and deleted',
      registers,
    });
    this.failedRounds = new Counter({
      name: 'zg_outbox_failed_rounds_total',
      help: 'Relay rounds that failed (publish or database); their rows stay and are retried',
      registers,
    });
    this.roundRows = new Histogram({
      name: 'zg_outbox_round_rows',
      help: 'Rows published by one relay round (one claim)',
      buckets: [1, 2, 5, 10, 20, 50, 100, 200],
      registers,
    });
    this.publishAge = new Histogram({
      name: 'zg_outbox_publish_age_seconds',
      help: "Age of a round's oldest row when it was published: how long committed events waited in the outbox",
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
  }

  /** Hooks for `OutboxRelay`'s `onPublished`. */
  round(count: number, oldestAgeMs: number): void {
    this.published.inc(count);
    this.roundRows.observe(count);
    this.publishAge.observe(oldestAgeMs / 1000);
  }
}
