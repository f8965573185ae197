/**
 * Load generation with autocannon (in the benchmark's own process) and the request mixes the
 * benchmarks send.
 */
import { readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import autocannon from 'autocannon';
import type { BenchUser } from './servers.js';

export interface LoadResult {
  /** 2xx answers per second over the measured time. */
  rps: number;
  /** Latency percentiles of 2xx answers, ms (from every response's own time, not a bucketed histogram). */
  p50: number;
  p99: number;
  ok: number;
  non2xx: number;
  errors: number;
  timeouts: number;
  seconds: number;
}

export interface LoadOptions {
  url: string;
  connections: number;
  seconds: number;
  requests: autocannon.Request[];
  /** Paces all connections together to this many requests per second. */
  overallRate?: number;
}

/** Adds up slices of load: counts, time, and every 2xx latency. */
class Tally {
  ok = 0;
  non2xx = 0;
  errors = 0;
  timeouts = 0;
  seconds = 0;
  latencies: number[] = [];

  result(): LoadResult {
    const sorted = Float64Array.from(this.latencies).sort();
    return {
      rps: this.seconds > 0 ? this.ok / this.seconds : 0,
      p50: percentile(sorted, 50),
      p99: percentile(sorted, 99),
      ok: this.ok,
      non2xx: this.non2xx,
      errors: this.errors,
      timeouts: this.timeouts,
      seconds: this.seconds,
    };
  }
}

export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

async function slice(options: LoadOptions, into: Tally): Promise<void> {
  const opts: autocannon.Options = {
    url: options.url,
    connections: options.connections,
    duration: options.seconds,
    requests: options.requests,
    timeout: 10,
  };
  if (options.overallRate !== undefined) opts.overallRate = options.overallRate;
  const latencies = into.latencies;
  const result = await new Promise<autocannon.Result>((resolve, reject) => {
    const instance = autocannon(opts, (err: unknown, res: autocannon.Result) =>
      err ? reject(err instanceof Error ? err : new Error('autocannon failed')) : resolve(res),
    );
    instance.on('response', (_client, statusCode, _bytes, responseTime) => {
      if (statusCode >= 200 && statusCode < 300) latencies.push(responseTime);
    });
  });
  into.ok += result['2xx'];
  into.non2xx += result.non2xx;
  into.errors += result.errors;
  into.timeouts += result.timeouts;
  into.seconds += result.duration;
}

export async function fire(options: LoadOptions): Promise<LoadResult> {
  const tally = new Tally();
  await slice(options, tally);
  return tally.result();
}

export interface Cpu {
  server: number;
  generator: number;
  machine: number;
  /** Cores used by each backing service's processes (shared with anything else using them). */
  services: Record<ServiceName, number>;
}

export interface Interleaved {
  subject: LoadResult;
  baseline: LoadResult;
  /** Cores busy on average while each ran. */
  subjectCpu: Cpu;
  baselineCpu: Cpu;
}

/**
 * Measures `subject` against `baseline` on the same server in alternating slices (baseline, subject,
 * subject, baseline, …: `rounds` of each, `seconds / rounds` long), so that whatever else loads the
 * machine weighs on both alike. A warm-up of each comes first and is not counted.
 */
export async function interleaved(o: {
  url: string;
  connections: number;
  seconds: number;
  rounds: number;
  warmupSeconds: number;
  subject: autocannon.Request[];
  baseline: autocannon.Request[];
  serverPids: readonly number[];
}): Promise<Interleaved> {
  const sliceSeconds = Math.max(1, Math.round(o.seconds / o.rounds));
  if (o.warmupSeconds > 0) {
    await fire({
      url: o.url,
      connections: o.connections,
      seconds: Math.max(1, Math.round(o.warmupSeconds / 2)),
      requests: o.baseline,
    });
    await fire({ url: o.url, connections: o.connections, seconds: o.warmupSeconds, requests: o.subject });
  }
  const tallies = { subject: new Tally(), baseline: new Tally() };
  const cpu = { subject: new CpuSum(), baseline: new CpuSum() };
  for (let r = 0; r < o.rounds; r++) {
    const order = r % 2 === 0 ? (['baseline', 'subject'] as const) : (['subject', 'baseline'] as const);
    for (const which of order) {
      const before = cpuMark(o.serverPids);
      await slice(
        { url: o.url, connections: o.connections, seconds: sliceSeconds, requests: o[which] },
        tallies[which],
      );
      cpu[which].add(before, cpuMark(o.serverPids));
    }
  }
  return {
    subject: tallies.subject.result(),
    baseline: tallies.baseline.result(),
    subjectCpu: cpu.subject.average(),
    baselineCpu: cpu.baseline.average(),
  };
}

class CpuSum {
  private seconds = 0;
  private server = 0;
  private generator = 0;
  private machine = 0;
  private readonly services = noServices();

  add(a: CpuMark, b: CpuMark): void {
    const c = cpuBetween(a, b);
    const s = (b.at - a.at) / 1000;
    this.seconds += s;
    this.server += c.server * s;
    this.generator += c.generator * s;
    this.machine += c.machine * s;
    for (const name of SERVICE_NAMES) this.services[name] += c.services[name] * s;
  }

  average(): Cpu {
    const d = this.seconds || 1;
    const services = noServices();
    for (const name of SERVICE_NAMES) services[name] = this.services[name] / d;
    return { server: this.server / d, generator: this.generator / d, machine: this.machine / d, services };
  }
}

function pick<T>(items: readonly T[]): T {
  return items[Math.floor(Math.random() * items.length)]!;
}

export const healthz: autocannon.Request[] = [{ method: 'GET', path: '/healthz' }];

/**
 * Each request picks a (user, post) pair at random from users × posts and, with equal chance, likes
 * (`POST /api/v1/action/like`) or unlikes (`POST /api/v1/action/unlike`) it: a real state change about
 * half of the time, as measured from the server's `zg_counter_toggles_total`.
 */
export function likeMix(users: readonly BenchUser[], posts: readonly string[]): autocannon.Request[] {
  const auth = users.map((u) => `Bearer ${u.accessToken}`);
  const bodies = posts.map((id) => JSON.stringify({ entityType: 'knowpost', entityId: id }));
  return [
    {
      method: 'POST',
      setupRequest: (req) => ({
        ...req,
        method: 'POST',
        path: Math.random() < 0.5 ? '/api/v1/action/like' : '/api/v1/action/unlike',
        headers: { 'content-type': 'application/json', authorization: pick(auth) },
        body: pick(bodies),
      }),
    },
  ];
}

/** Anonymous `GET /api/v1/counter/knowpost/{id}` for a random post. */
export function singleCountsMix(posts: readonly string[]): autocannon.Request[] {
  const paths = posts.map((id) => `/api/v1/counter/knowpost/${id}`);
  return [{ method: 'GET', setupRequest: (req) => ({ ...req, method: 'GET', path: pick(paths) }) }];
}

/** Anonymous `GET /api/v1/counter/knowpost?ids=…` for 20 consecutive posts from a random start. */
export function batchCountsMix(posts: readonly string[], size = 20): autocannon.Request[] {
  const paths: string[] = [];
  for (let i = 0; i + size <= posts.length; i++) paths.push(batchPath(posts.slice(i, i + size)));
  return [{ method: 'GET', setupRequest: (req) => ({ ...req, method: 'GET', path: pick(paths) }) }];
}

/**
 * `GET /api/v1/knowposts/feed?page=…&size=20` for a random one of the first `pages` pages; signed in
 * as a random user when `users` are given (the answer then carries that user's liked/faved flags).
 */
export function feedMix(users: readonly BenchUser[] | null, pages = 10): autocannon.Request[] {
  const paths = Array.from({ length: pages }, (_, i) => `/api/v1/knowposts/feed?page=${i + 1}&size=20`);
  const auth = users?.map((u) => `Bearer ${u.accessToken}`) ?? null;
  return [
    {
      method: 'GET',
      setupRequest: (req) => ({
        ...req,
        method: 'GET',
        path: pick(paths),
        ...(auth ? { headers: { authorization: pick(auth) } } : {}),
      }),
    },
  ];
}

/** Anonymous `GET /api/v1/knowposts/detail/{id}` for a random post (each read also counts a view). */
export function detailMix(posts: readonly string[]): autocannon.Request[] {
  const paths = posts.map((id) => `/api/v1/knowposts/detail/${id}`);
  return [{ method: 'GET', setupRequest: (req) => ({ ...req, method: 'GET', path: pick(paths) }) }];
}

export function batchPath(ids: readonly string[]): string {
  return `/api/v1/counter/knowpost?ids=${ids.join(',')}`;
}

/** Sums of Prometheus samples from `/metrics` whose line starts with each given prefix. */
export async function scrape(baseUrl: string, prefixes: readonly string[]): Promise<number[]> {
  const text = await (await fetch(`${baseUrl}/metrics`)).text();
  return prefixes.map((prefix) =>
    text
      .split('\n')
      .filter((line) => line.startsWith(prefix))
      .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0),
  );
}

export const TOGGLES_CHANGED = 'zg_counter_toggles_total{metric="like",changed="true"}';
export const TOGGLES_UNCHANGED = 'zg_counter_toggles_total{metric="like",changed="false"}';

export const SERVICE_NAMES = ['redis', 'mariadb', 'kafka'] as const;
export type ServiceName = (typeof SERVICE_NAMES)[number];

function noServices(): Record<ServiceName, number> {
  return { redis: 0, mariadb: 0, kafka: 0 };
}

/** Which backing service a process belongs to, by its command line; null for anything else. */
function serviceOf(cmdline: string): ServiceName | null {
  const program = cmdline.split('\0')[0] ?? '';
  if (/(^|\/)redis-server$/.test(program) || cmdline.startsWith('redis-server')) return 'redis';
  if (/(^|\/)(mariadbd|mysqld)$/.test(program)) return 'mariadb';
  if (/(^|\/)java$/.test(program) && /kafka\.Kafka|kafka-server|kafka_2\./.test(cmdline)) return 'kafka';
  return null;
}

let servicePids: { pid: number; service: ServiceName }[] | undefined;

/** The backing services' processes on this machine, found once (Kafka is started before any load). */
function findServicePids(): { pid: number; service: ServiceName }[] {
  if (servicePids) return servicePids;
  const found: { pid: number; service: ServiceName }[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const service = serviceOf(readFileSync(`/proc/${entry}/cmdline`, 'utf8'));
      if (service) found.push({ pid: Number(entry), service });
    } catch {
      // The process ended while being looked at.
    }
  }
  servicePids = found;
  return found;
}

/** CPU time of the server processes, of this process (the load generator) and of the whole machine. */
export interface CpuMark {
  at: number;
  serverTicks: number;
  serviceTicks: Record<ServiceName, number>;
  generator: NodeJS.CpuUsage;
  machineBusy: number;
  machineTotal: number;
}

/** Linux clock ticks per second (USER_HZ), which /proc reports CPU time in. */
const TICKS_PER_SECOND = 100;

function processTicks(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // utime and stime are fields 14 and 15 of the full line, 12 and 13 after "pid (comm) ".
    return Number(fields[11]) + Number(fields[12]);
  } catch {
    return 0;
  }
}

export function cpuMark(serverPids: readonly number[]): CpuMark {
  const cpu = (readFileSync('/proc/stat', 'utf8').split('\n')[0] ?? '')
    .trim()
    .split(/\s+/)
    .slice(1)
    .map(Number);
  const total = cpu.reduce((a, b) => a + b, 0);
  const idle = (cpu[3] ?? 0) + (cpu[4] ?? 0);
  const serviceTicks = noServices();
  for (const { pid, service } of findServicePids()) serviceTicks[service] += processTicks(pid);
  return {
    at: performance.now(),
    serverTicks: serverPids.reduce((sum, pid) => sum + processTicks(pid), 0),
    serviceTicks,
    generator: process.cpuUsage(),
    machineBusy: total - idle,
    machineTotal: total,
  };
}

/** Cores used on average between two marks: by the server, by the load generator, by the whole machine. */
export function cpuBetween(a: CpuMark, b: CpuMark): Cpu {
  const seconds = (b.at - a.at) / 1000;
  const cores = os.cpus().length;
  const services = noServices();
  for (const name of SERVICE_NAMES)
    services[name] = (b.serviceTicks[name] - a.serviceTicks[name]) / TICKS_PER_SECOND / seconds;
  return {
    services,
    server: (b.serverTicks - a.serverTicks) / TICKS_PER_SECOND / seconds,
    generator:
      (b.generator.user + b.generator.system - a.generator.user - a.generator.system) / 1e6 / seconds,
    machine:
      b.machineTotal === a.machineTotal
        ? 0
        : ((b.machineBusy - a.machineBusy) / (b.machineTotal - a.machineTotal)) * cores,
  };
}
