/**
 * Staleness under load: while autocannon drives likes at a fixed rate, probe loops toggle a like on
 * posts of their own and poll the post's count until it shows the change.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { fire, likeMix, percentile, scrape, type LoadResult } from './load.js';
import type { BenchUser } from './servers.js';

export interface StalenessResult {
  load: LoadResult;
  samples: number;
  timedOut: number;
  p50: number;
  p99: number;
  max: number;
  pollMs: number;
  probes: number;
  /** `zg_counter_consumer_lag_ms` (age of the newest event of the batch last applied), sampled every 250 ms. */
  consumerLagMs: { p50: number; max: number; samples: number };
  /** Flush rounds during the run and their mean duration (from `zg_counter_flush_duration_seconds`). */
  flushes: { count: number; meanMs: number };
}

export interface StalenessOptions {
  baseUrl: string;
  users: readonly BenchUser[];
  posts: readonly string[];
  /** One probe loop per entry: a post nobody else touches, and the user who toggles it. */
  probes: readonly { user: BenchUser; post: string }[];
  rate: number;
  seconds: number;
  connections: number;
  pollMs: number;
  /** Upper bound of the random pause between a probe's samples (should exceed the flush period). */
  pauseMaxMs: number;
}

async function probeLoop(
  o: StalenessOptions,
  probe: { user: BenchUser; post: string },
  until: number,
  out: number[],
  timeouts: { n: number },
): Promise<void> {
  let liked = false;
  const countUrl = `${o.baseUrl}/api/v1/counter/knowpost/${probe.post}?metrics=like`;
  const body = JSON.stringify({ entityType: 'knowpost', entityId: probe.post });
  await sleep(Math.random() * o.pauseMaxMs);
  while (performance.now() < until) {
    liked = !liked;
    const res = await fetch(`${o.baseUrl}/api/v1/action/${liked ? 'like' : 'unlike'}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${probe.user.accessToken}` },
      body,
    });
    const answer = (await res.json()) as { changed?: boolean };
    if (res.status !== 200 || answer.changed !== true)
      throw new Error(`probe toggle failed: ${res.status} ${JSON.stringify(answer)}`);
    const toggled = performance.now();
    const want = liked ? 1 : 0;
    for (;;) {
      const r = await fetch(countUrl);
      const seen = ((await r.json()) as { counts?: { like?: number } }).counts?.like;
      const now = performance.now();
      if (seen === want) {
        out.push(now - toggled);
        break;
      }
      if (now - toggled > 10_000) {
        timeouts.n++;
        break;
      }
      await sleep(o.pollMs);
    }
    // Without this, the next toggle would follow a flush closely and every sample would wait out a
    // whole flush period; a random pause longer than the period puts toggles at random phases of it.
    await sleep(Math.random() * o.pauseMaxMs);
  }
}

export async function measureStaleness(o: StalenessOptions): Promise<StalenessResult> {
  const samples: number[] = [];
  const timeouts = { n: 0 };
  const flushMetrics = ['zg_counter_flush_duration_seconds_sum', 'zg_counter_flush_duration_seconds_count'];
  const [flushSum0, flushCount0] = await scrape(o.baseUrl, flushMetrics);
  const load = fire({
    url: o.baseUrl,
    connections: o.connections,
    seconds: o.seconds,
    requests: likeMix(o.users, o.posts),
    overallRate: o.rate,
  });
  const lags: number[] = [];
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const [lag] = await scrape(o.baseUrl, ['zg_counter_consumer_lag_ms ']);
      lags.push(lag!);
      await sleep(250);
    }
  })();
  // Probe only while the load runs at its rate: after a second of ramp-up, until a second before the end.
  await sleep(1000);
  const until = performance.now() + (o.seconds - 2) * 1000;
  await Promise.all(o.probes.map((p) => probeLoop(o, p, until, samples, timeouts)));
  const loadResult = await load;
  sampling = false;
  await sampler;
  const [flushSum1, flushCount1] = await scrape(o.baseUrl, flushMetrics);
  const flushCount = flushCount1! - flushCount0!;
  samples.sort((a, b) => a - b);
  lags.sort((a, b) => a - b);
  return {
    load: loadResult,
    samples: samples.length,
    timedOut: timeouts.n,
    p50: percentile(samples, 50),
    p99: percentile(samples, 99),
    max: samples[samples.length - 1] ?? Number.NaN,
    pollMs: o.pollMs,
    probes: o.probes.length,
    consumerLagMs: {
      p50: percentile(lags, 50),
      max: lags[lags.length - 1] ?? Number.NaN,
      samples: lags.length,
    },
    flushes: {
      count: flushCount,
      meanMs: flushCount > 0 ? ((flushSum1! - flushSum0!) / flushCount) * 1000 : Number.NaN,
    },
  };
}
