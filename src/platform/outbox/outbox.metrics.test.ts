import { Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { OutboxMetrics } from './outbox.metrics.js';

describe('OutboxMetrics', () => {
  it('counts published rows and records each round and the age of its oldest row', async () => {
    const registry = new Registry();
    const metrics = new OutboxMetrics(registry);
    metrics.round(3, 40);
    metrics.round(5, 1_500);
    metrics.failedRounds.inc();
    const text = await registry.metrics();
    expect(text).toContain('zg_outbox_published_total 8');
    expect(text).toContain('zg_outbox_failed_rounds_total 1');
    expect(text).toContain('zg_outbox_round_rows_count 2');
    expect(text).toContain('zg_outbox_round_rows_sum 8');
    expect(text).toContain('zg_outbox_publish_age_seconds_bucket{le="0.05"} 1');
    expect(text).toContain('zg_outbox_publish_age_seconds_bucket{le="2.5"} 2');
  });
});
