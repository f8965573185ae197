/**
 * Follow relations: the request mixes for the follow endpoint and the outbox lag measurement (time
 * from a follow's answer to its `follower` projection row), with their report lines.
 */
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type autocannon from 'autocannon';
import { createConnection } from 'mysql2/promise';
import { fire, percentile, scrape, type LoadResult } from './load.js';
import type { BenchUser, CodeInbox } from './servers.js';

/** What the relations part sets on its servers: every follow of the benchmark must pass the per-user limit. */
export const RELATION_BENCH_ENV = { ZG_RELATION_CHANGE_LIMIT: '1000000' };

export const RELATION_CHANGED = 'zg_relation_changes_total{action="follow",changed="true"}';
const CHANGES = [
  RELATION_CHANGED,
  'zg_relation_changes_total{action="unfollow",changed="true"}',
  'zg_relation_changes_total{action="follow",changed="false"}',
  'zg_relation_changes_total{action="unfollow",changed="false"}',
];

function pick<T>(items: readonly T[]): T {
  return items[Math.floor(Math.random() * items.length)]!;
}

/**
 * Phone sign-ups (no password, so no hashing: users are set-up work) through the public API; the
 * server logs codes sent to phones, and `spawnServer` hands them to `inbox`.
 */
export async function signUpPhoneUsers(
  baseUrl: string,
  inbox: CodeInbox,
  count: number,
  parallel = 16,
): Promise<BenchUser[]> {
  const post = async (path: string, body: unknown): Promise<unknown> => {
    const res = await fetch(`${baseUrl}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status !== 200) throw new Error(`POST ${path}: ${res.status} ${text}`);
    return JSON.parse(text) as unknown;
  };
  const base = 1_000_000 + randomBytes(3).readUIntBE(0, 3) * 100;
  const users: BenchUser[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(parallel, count) }, async () => {
      while (next < count) {
        const identifier = `1${String(base + next++).padStart(10, '0')}`;
        await post('/api/v1/auth/send-code', { scene: 'REGISTER', identifierType: 'PHONE', identifier });
        const code = await inbox.take(identifier);
        const reg = (await post('/api/v1/auth/register', {
          identifierType: 'PHONE',
          identifier,
          code,
          agreeTerms: true,
        })) as { user: { id: number }; token: { accessToken: string } };
        users.push({ userId: reg.user.id, accessToken: reg.token.accessToken });
      }
    }),
  );
  return users;
}

/**
 * `POST /api/v1/relation/follow|unfollow?toUserId=` for a random pair of distinct users, follow or
 * unfollow with equal chance: a real change about half of the time (measured from the server's
 * `zg_relation_changes_total`), as the like mix.
 */
export function followMix(users: readonly BenchUser[]): autocannon.Request[] {
  return [
    {
      method: 'POST',
      setupRequest: (req) => {
        const a = pick(users);
        let b = pick(users);
        while (b === a) b = pick(users);
        return {
          ...req,
          method: 'POST',
          path: `/api/v1/relation/${Math.random() < 0.5 ? 'follow' : 'unfollow'}?toUserId=${b.userId}`,
          headers: { authorization: `Bearer ${a.accessToken}` },
        };
      },
    },
  ];
}

/**
 * Like `followMix`, but each request flips its pair's state as the generator last left it (follow
 * when not following, else unfollow), starting from the `following` pairs (`from:to`) given, so
 * nearly every request is a change with an outbox event.
 */
export function flipFollowMix(
  users: readonly BenchUser[],
  initial: Iterable<string> = [],
): autocannon.Request[] {
  const following = new Set<string>(initial);
  return [
    {
      method: 'POST',
      setupRequest: (req) => {
        const a = pick(users);
        let b = pick(users);
        while (b === a) b = pick(users);
        const key = `${a.userId}:${b.userId}`;
        const follow = !following.has(key);
        if (follow) following.add(key);
        else following.delete(key);
        return {
          ...req,
          method: 'POST',
          path: `/api/v1/relation/${follow ? 'follow' : 'unfollow'}?toUserId=${b.userId}`,
          headers: { authorization: `Bearer ${a.accessToken}` },
        };
      },
    },
  ];
}

/** Sums of `zg_relation_changes_total` by outcome: [changed, unchanged]. */
export async function relationChanges(baseUrl: string): Promise<[number, number]> {
  const [f, u, fs, us] = await scrape(baseUrl, CHANGES);
  return [f! + u!, fs! + us!];
}

export interface OutboxLagResult {
  /** The paced load (autocannon) and the real changes it made per second. */
  load: LoadResult;
  changesPerSecond: number;
  rate: number;
  seconds: number;
  /** Probe samples: follow or unfollow answered → first poll of `follower` that shows it. */
  samples: number;
  timedOut: number;
  p50: number;
  p99: number;
  max: number;
  pollMs: number;
  probes: number;
  /** `zg_relation_projection_lag_seconds` over the run (every event the consumer applied). */
  histogram: { count: number; withinOneSecond: number; p99UpperBound: string };
}

export interface OutboxLagOptions {
  baseUrl: string;
  /** Every server process of the deployment (the histogram lives in the worker's). */
  serverUrls: readonly string[];
  mysqlUrl: string;
  users: readonly BenchUser[];
  /** One probe loop per pair; probe users take no part in the paced load. */
  probes: readonly { from: BenchUser; to: BenchUser }[];
  rate: number;
  seconds: number;
  connections: number;
  pollMs: number;
  pauseMaxMs: number;
}

const LAG_BUCKET = 'zg_relation_projection_lag_seconds_bucket{le="';

async function lagBuckets(urls: readonly string[]): Promise<Map<string, number>> {
  const sums = new Map<string, number>();
  for (const url of urls) {
    const text = await (await fetch(`${url}/metrics`)).text();
    for (const line of text.split('\n')) {
      if (!line.startsWith(LAG_BUCKET)) continue;
      const le = line.slice(LAG_BUCKET.length, line.indexOf('"', LAG_BUCKET.length));
      sums.set(le, (sums.get(le) ?? 0) + Number(line.slice(line.lastIndexOf(' ') + 1)));
    }
  }
  return sums;
}

async function probeLoop(
  o: OutboxLagOptions,
  probe: { from: BenchUser; to: BenchUser },
  query: (from: number, to: number) => Promise<boolean>,
  until: number,
  out: number[],
  timeouts: { n: number },
): Promise<void> {
  let following = await query(probe.from.userId, probe.to.userId);
  await sleep(Math.random() * o.pauseMaxMs);
  while (performance.now() < until) {
    following = !following;
    const res = await fetch(
      `${o.baseUrl}/api/v1/relation/${following ? 'follow' : 'unfollow'}?toUserId=${probe.to.userId}`,
      { method: 'POST', headers: { authorization: `Bearer ${probe.from.accessToken}` } },
    );
    const answer = await res.text();
    if (res.status !== 200 || answer !== 'true')
      throw new Error(`probe change failed: ${res.status} ${answer}`);
    const answered = performance.now();
    for (;;) {
      const seen = await query(probe.from.userId, probe.to.userId);
      const now = performance.now();
      if (seen === following) {
        out.push(now - answered);
        break;
      }
      if (now - answered > 10_000) {
        timeouts.n++;
        break;
      }
      await sleep(o.pollMs);
    }
    await sleep(Math.random() * o.pauseMaxMs);
  }
}

/**
 * Paced follows and unfollows (`flipFollowMix`) while probes change pairs of their own and poll the
 * `follower` table until the projection shows the change; the consumer's own lag histogram is read
 * before and after.
 */
export async function measureOutboxLag(o: OutboxLagOptions): Promise<OutboxLagResult> {
  const db = await createConnection({ uri: o.mysqlUrl });
  const query = async (from: number, to: number): Promise<boolean> => {
    const [rows] = await db.execute('SELECT 1 FROM follower WHERE to_user_id = ? AND from_user_id = ?', [
      to,
      from,
    ]);
    return (rows as unknown[]).length > 0;
  };
  try {
    // Earlier parts of the run left follows behind: the generator starts from the table.
    const [existing] = await db.query('SELECT from_user_id, to_user_id FROM following');
    const initial = (existing as { from_user_id: number; to_user_id: number }[]).map(
      (r) => `${r.from_user_id}:${r.to_user_id}`,
    );
    const before = await lagBuckets(o.serverUrls);
    const [changed0] = await relationChanges(o.baseUrl);
    const samples: number[] = [];
    const timeouts = { n: 0 };
    const load = fire({
      url: o.baseUrl,
      connections: o.connections,
      seconds: o.seconds,
      requests: flipFollowMix(o.users, initial),
      overallRate: o.rate,
    });
    // Probe only while the load runs at its rate: after a second of ramp-up, until a second before the end.
    await sleep(1000);
    const until = performance.now() + (o.seconds - 2) * 1000;
    await Promise.all(o.probes.map((p) => probeLoop(o, p, query, until, samples, timeouts)));
    const loadResult = await load;
    const [changed1] = await relationChanges(o.baseUrl);
    // Let the projection of the last changes land before the histogram is read.
    await sleep(2000);
    const after = await lagBuckets(o.serverUrls);
    samples.sort((a, b) => a - b);
    const count = (after.get('+Inf') ?? 0) - (before.get('+Inf') ?? 0);
    const withinOne = (after.get('1') ?? 0) - (before.get('1') ?? 0);
    let p99UpperBound = 'n/a';
    for (const [le, n] of after) {
      if (count > 0 && n - (before.get(le) ?? 0) >= 0.99 * count) {
        p99UpperBound = le === '+Inf' ? '> 60 s' : `≤ ${Number(le) * 1000} ms`;
        break;
      }
    }
    return {
      load: loadResult,
      changesPerSecond: (changed1 - changed0) / loadResult.seconds,
      rate: o.rate,
      seconds: o.seconds,
      samples: samples.length,
      timedOut: timeouts.n,
      p50: percentile(samples, 50),
      p99: percentile(samples, 99),
      max: samples[samples.length - 1] ?? Number.NaN,
      pollMs: o.pollMs,
      probes: o.probes.length,
      histogram: { count, withinOneSecond: count > 0 ? withinOne / count : Number.NaN, p99UpperBound },
    };
  } finally {
    await db.end();
  }
}

const fmt = (n: number, digits = 0): string =>
  Number.isFinite(n)
    ? n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits })
    : 'n/a';

/** Met only when the load ran at (95 % of) the asked rate, no probe timed out, and p99 ≤ 1 s. */
export function outboxLagVerdict(r: OutboxLagResult): string {
  if (r.timedOut > 0) return `**MISSED** (${r.timedOut} probes never saw their change)`;
  const met = r.p99 <= 1000 ? 'met' : '**MISSED**';
  if (r.load.rps < r.rate * 0.95)
    return `**not shown**: the server answered only ${fmt(r.load.rps)} follows/s (p99 ${met.replace(/\*/g, '').toLowerCase()} at that rate)`;
  return met;
}

/** The row for the plain-text table (columns as in bench/run.ts). */
export function outboxLagCells(r: OutboxLagResult): string[] {
  return [
    `outbox lag at ${fmt(r.load.rps)} follows/s (p99 ms)`,
    '',
    '',
    fmt(r.p50),
    fmt(r.p99),
    '≤1,000',
    outboxLagVerdict(r).replace(/\*/g, '').split(':')[0]!,
  ];
}

export function outboxLagMarkdown(r: OutboxLagResult, connections: number, pauseMaxMs: number): string[] {
  return [
    '### Follow outbox lag (cluster)',
    '',
    `autocannon paced at ${fmt(r.rate)} follow/unfollow requests/s (${connections} connections, random pairs, each request flipping its pair's state as the generator last left it) for ${r.seconds} s; ` +
      `achieved ${fmt(r.load.rps)} 2xx/s (p99 ${fmt(r.load.p99, 1)} ms), of which ${fmt(r.changesPerSecond)}/s changed state (outbox events). ` +
      `Meanwhile ${r.probes} probes, each with a pair of users of its own, followed or unfollowed and polled the \`follower\` table (the projection) every ${r.pollMs} ms until it showed the change, ` +
      `then paused a random 0–${fmt(pauseMaxMs)} ms; time from the API's answer (the commit) to the first poll showing it:`,
    '',
    '| samples | timed out (>10 s) | p50 ms | p99 ms | max ms | target | met |',
    '|---:|---:|---:|---:|---:|---|---|',
    `| ${r.samples} | ${r.timedOut} | ${fmt(r.p50)} | ${fmt(r.p99)} | ${fmt(r.max)} | p99 ≤ 1,000 ms at ${fmt(r.rate)} follows/s | ${outboxLagVerdict(r)} |`,
    '',
    `The consumer's own \`zg_relation_projection_lag_seconds\` (event time → batch applied, every event of the run: ${fmt(r.histogram.count)}) had ` +
      `${(r.histogram.withinOneSecond * 100).toFixed(1)} % within 1 s; its p99 is ${r.histogram.p99UpperBound} (histogram bucket bound).`,
    '',
  ];
}
