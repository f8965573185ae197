/**
 * `npm run bench`: builds, then measures the interaction layer end to end and prints a table followed
 * by a markdown section for docs/benchmarks.md (progress goes to stderr).
 *
 * Every HTTP figure comes with the throughput of `GET /healthz` measured against the same server
 * process in slices that alternate with the request's own (the load generator shares the machine with
 * the server and its services, so only ratios travel).
 *
 * Parts (all by default; `BENCH_ONLY=like,counts` runs a subset, `BENCH_SKIP=memory` leaves some out):
 *   like, counts, batch, feed, detail,    cluster profile, server in a child process
 *   rtt, staleness
 *   aggregator, replay                    counter pipeline in process against Redis and Kafka
 *   embedded                              embedded profile, like endpoint against its own baseline
 *   relations                             cluster profile, follow endpoint and outbox lag (bench/relations.ts)
 *   memory                                bench/counter-memory.ts, included verbatim
 *
 * Settings (environment): BENCH_SECONDS (10: measured seconds of each request, and as many of its
 * baseline, in BENCH_ROUNDS (5) alternating slices), BENCH_WARMUP (2), BENCH_CONNECTIONS (50),
 * BENCH_USERS (20), BENCH_POSTS (2000), BENCH_ROLES (`all`, or `api+worker` for two processes),
 * BENCH_EVENTS (300000), BENCH_ENTITIES (20000), BENCH_PARTITIONS (6), BENCH_FLUSH_MS (1000),
 * BENCH_PIPELINE_FACTS (1: also write fact sets consistent with the events before aggregating),
 * BENCH_AGG_BATCH (20000, the aggregator's maxBatch as the app configures it; other values are diagnostic),
 * BENCH_STALENESS_RATE (5000), BENCH_STALENESS_SECONDS (10), BENCH_PROBES (10), BENCH_POLL_MS (20),
 * BENCH_CPU_PROF (directory: the cluster and embedded servers write V8 CPU profiles there, and the
 * pipeline part profiles its measured phases), BENCH_SERVER_ENV (space-separated VAR=value pairs added
 * to every server's environment, for diagnostic runs; reported with the results), BENCH_SERVER_ENTRY
 * (another build's main.js to run instead of dist/main.js, for A/B comparisons; reported too).
 * Relations: BENCH_RELATION_USERS (200), BENCH_RELATION_RATE (1000), BENCH_RELATION_SECONDS (10).
 * Services: ZG_REDIS_URL, ZG_MYSQL_ROOT_URL, ZG_KAFKA_BROKERS (default: local, broker started by
 * scripts/kafka-broker.sh).
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import os from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import type autocannon from 'autocannon';
import { Redis } from 'ioredis';
import { createConnection } from 'mysql2/promise';
import {
  batchCountsMix,
  batchPath,
  detailMix,
  feedMix,
  healthz,
  interleaved,
  likeMix,
  scrape,
  singleCountsMix,
  TOGGLES_CHANGED,
  TOGGLES_UNCHANGED,
  SERVICE_NAMES,
  type Cpu,
  type LoadResult,
} from './load.js';
import { runPipeline, type PipelineResult } from './pipeline.js';
import { RedisCountingProxy, summarize, type TrafficSummary } from './redis-proxy.js';
import {
  Cleanups,
  createClusterStack,
  createEmbeddedStack,
  insertPosts,
  newPostIds,
  ROOT,
  SERVER_ENTRY,
  services,
  signUpUsers,
  spawnServer,
  type BenchUser,
  type CodeInbox,
  type ServerProcess,
} from './servers.js';
import { measureStaleness, type StalenessResult } from './staleness.js';
import {
  followMix,
  measureOutboxLag,
  outboxLagCells,
  outboxLagMarkdown,
  RELATION_BENCH_ENV,
  relationChanges,
  signUpPhoneUsers,
  type OutboxLagResult,
} from './relations.js';

const PARTS = [
  'like',
  'counts',
  'batch',
  'feed',
  'detail',
  'rtt',
  'staleness',
  'aggregator',
  'replay',
  'embedded',
  'memory',
  'relations',
] as const;
type Part = (typeof PARTS)[number];

function num(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${name} must be a positive number (got ${raw})`);
  return n;
}

function partList(raw: string | undefined): Set<Part> | null {
  if (!raw) return null;
  const names = raw
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  for (const n of names)
    if (!(PARTS as readonly string[]).includes(n))
      throw new Error(`unknown part "${n}"; parts: ${PARTS.join(', ')}`);
  return new Set(names as Part[]);
}

const only = partList(process.env.BENCH_ONLY);
const skip = partList(process.env.BENCH_SKIP) ?? new Set<Part>();
const wanted = (p: Part): boolean => (only === null || only.has(p)) && !skip.has(p);

const cfg = {
  seconds: num('BENCH_SECONDS', 10),
  rounds: Math.round(num('BENCH_ROUNDS', 5)),
  warmup: process.env.BENCH_WARMUP === '0' ? 0 : num('BENCH_WARMUP', 2),
  connections: num('BENCH_CONNECTIONS', 50),
  users: num('BENCH_USERS', 20),
  posts: num('BENCH_POSTS', 2000),
  roles: process.env.BENCH_ROLES === 'api+worker' ? ('api+worker' as const) : ('all' as const),
  events: num('BENCH_EVENTS', 300_000),
  entities: num('BENCH_ENTITIES', 20_000),
  partitions: num('BENCH_PARTITIONS', 6),
  flushMs: num('BENCH_FLUSH_MS', 1000),
  stalenessRate: num('BENCH_STALENESS_RATE', 5000),
  stalenessSeconds: num('BENCH_STALENESS_SECONDS', 10),
  probes: num('BENCH_PROBES', 10),
  pollMs: num('BENCH_POLL_MS', 20),
  cpuProf: process.env.BENCH_CPU_PROF || undefined,
  pipelineFacts: process.env.BENCH_PIPELINE_FACTS === '1',
  aggBatch: Math.round(num('BENCH_AGG_BATCH', 20_000)),
  /** Extra server environment for diagnostic runs, e.g. `ZG_ENTITY_CACHE_MS=60000`. */
  serverEnv: Object.fromEntries(
    (process.env.BENCH_SERVER_ENV ?? '')
      .split(/\s+/)
      .filter(Boolean)
      .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
  ) as Record<string, string>,
};
for (const key of Object.keys(cfg.serverEnv))
  if (!/^[A-Z_][A-Z0-9_]*$/.test(key)) throw new Error(`BENCH_SERVER_ENV: bad variable "${key}"`);
if (process.env.BENCH_ROLES && !['all', 'api+worker'].includes(process.env.BENCH_ROLES))
  throw new Error('BENCH_ROLES must be all or api+worker');

const log = (line: string): void => void process.stderr.write(`[bench] ${line}\n`);
const fmt = (n: number, digits = 0): string =>
  Number.isFinite(n)
    ? n.toLocaleString('en-US', { minimumFractionDigits: digits, maximumFractionDigits: digits })
    : 'n/a';

// ---------------------------------------------------------------------------------------------
// Results

interface HttpRow {
  profile: 'cluster' | 'embedded';
  name: string;
  detail: string;
  load: LoadResult;
  /** `GET /healthz` on the same server, interleaved with `load` in alternating slices. */
  baseline: LoadResult;
  ratio: number;
  target: number | null;
  /** Cores busy on average while the request ran, and while its baseline ran. */
  cpu: Cpu;
  baselineCpu: Cpu;
}

interface RttRow {
  name: string;
  samples: TrafficSummary[];
  after: TrafficSummary;
  note: string;
}

const results: {
  started: Date;
  machine: Record<string, string>;
  http: HttpRow[];
  changedShare?: number;
  likeServerStats?: string;
  rtt: RttRow[];
  staleness?: StalenessResult;
  relations?: { lag?: OutboxLagResult; changedShare?: number; users: number };
  pipeline?: PipelineResult;
  memory?: { output: string; seconds: number } | { skipped: string };
  notes: string[];
  cpuProfiles: string[];
} = { started: new Date(), machine: {}, http: [], rtt: [], notes: [], cpuProfiles: [] };

// ---------------------------------------------------------------------------------------------
// Parts

const allCleanups: Cleanups[] = [];
function newCleanups(): Cleanups {
  const c = new Cleanups();
  allCleanups.push(c);
  return c;
}

async function httpRun(
  profile: 'cluster' | 'embedded',
  servers: readonly ServerProcess[],
  name: string,
  detail: string,
  requests: autocannon.Request[],
  target: number | null,
): Promise<HttpRow> {
  log(
    `${profile}: ${name} against GET /healthz, ${cfg.rounds} alternating rounds of ${cfg.seconds / cfg.rounds} s each after ${cfg.warmup} s of warm-up, ${cfg.connections} connections`,
  );
  const r = await interleaved({
    url: servers[0]!.baseUrl,
    connections: cfg.connections,
    seconds: cfg.seconds,
    rounds: cfg.rounds,
    warmupSeconds: cfg.warmup,
    subject: requests,
    baseline: healthz,
    serverPids: servers.map((s) => s.pid),
  });
  const row: HttpRow = {
    profile,
    name,
    detail,
    load: r.subject,
    baseline: r.baseline,
    ratio: r.subject.rps / r.baseline.rps,
    target,
    cpu: r.subjectCpu,
    baselineCpu: r.baselineCpu,
  };
  results.http.push(row);
  const bad =
    r.subject.non2xx +
    r.subject.errors +
    r.subject.timeouts +
    r.baseline.non2xx +
    r.baseline.errors +
    r.baseline.timeouts;
  log(
    `  ${fmt(r.subject.rps)} req/s (p99 ${fmt(r.subject.p99, 1)} ms) against ${fmt(r.baseline.rps)} (p99 ${fmt(r.baseline.p99, 1)} ms): ${row.ratio.toFixed(2)}× baseline; ` +
      `server CPU ${fmt(perRequest(row.cpu, r.subject))} µs/req vs ${fmt(perRequest(row.baselineCpu, r.baseline))}; machine ${row.cpu.machine.toFixed(2)} cores busy; ` +
      `Redis/MariaDB/Kafka ${SERVICE_NAMES.map((n) => fmt((row.cpu.services[n] / r.subject.rps) * 1e6)).join('/')} µs/req` +
      `${bad > 0 ? `; ${bad} non-2xx/errors/timeouts` : ''}`,
  );
  return row;
}

/** GETs every path once, a few at a time; any answer but 200 fails the run. */
async function readEach(baseUrl: string, paths: readonly string[], parallel = 16): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: parallel }, async () => {
      while (next < paths.length) {
        const path = paths[next++]!;
        const res = await fetch(`${baseUrl}${path}`);
        await res.text();
        if (res.status !== 200) throw new Error(`GET ${path}: ${res.status}`);
      }
    }),
  );
}

function perRequest(cpu: Cpu, load: LoadResult): number {
  return (cpu.server / load.rps) * 1e6;
}

async function startServers(
  env: Record<string, string>,
  inbox: CodeInbox,
  cleanups: Cleanups,
  profile: string,
): Promise<ServerProcess[]> {
  const prof = cfg.cpuProf ? `${cfg.cpuProf}/${profile}` : undefined;
  if (prof) results.cpuProfiles.push(prof);
  if (profile === 'cluster' && cfg.roles === 'api+worker') {
    return [
      await spawnServer(env, 'api', inbox, cleanups, prof),
      await spawnServer(env, 'worker', inbox, cleanups, prof),
    ];
  }
  return [await spawnServer(env, 'all', inbox, cleanups, prof)];
}

async function clusterHttp(): Promise<void> {
  const cleanups = newCleanups();
  try {
    log('cluster: creating database, key and topic prefixes, SMTP sink');
    const stack = await createClusterStack(cleanups, cfg.serverEnv);
    const servers = await startServers(stack.env, stack.inbox, cleanups, 'cluster');
    const api = servers[0]!;
    log(
      `cluster: server${servers.length > 1 ? 's' : ''} up (role ${cfg.roles}) at ${api.baseUrl}; signing up ${cfg.users} users`,
    );
    const users = await signUpUsers(api.baseUrl, stack.inbox, cfg.users);
    const posts = newPostIds(cfg.posts);
    const probePosts = newPostIds(cfg.probes);
    const rttPost = newPostIds(1)[0]!;
    await insertPosts(stack, [...posts, ...probePosts, rttPost], users[0]!.userId);
    log(`cluster: ${posts.length + probePosts.length + 1} posts inserted`);

    if (wanted('like')) {
      const [c0, u0] = await scrape(api.baseUrl, [TOGGLES_CHANGED, TOGGLES_UNCHANGED]);
      await httpRun(
        'cluster',
        servers,
        'POST /api/v1/action/like|unlike',
        `${users.length} users × ${posts.length} posts, random pair, like or unlike 50/50`,
        likeMix(users, posts),
        0.6,
      );
      const [c1, u1, published, failed] = await scrape(api.baseUrl, [
        TOGGLES_CHANGED,
        TOGGLES_UNCHANGED,
        'zg_counter_events_published_total',
        'zg_counter_events_publish_failed_total',
      ]);
      const changed = c1! - c0!;
      const unchanged = u1! - u0!;
      results.changedShare = changed / (changed + unchanged);
      results.likeServerStats = `${fmt(changed)} toggles changed state, ${fmt(unchanged)} did not (warm-up included); events published so far ${fmt(published!)}, publish failures ${fmt(failed!)}`;
    }
    if (wanted('counts')) {
      await httpRun(
        'cluster',
        servers,
        'GET /api/v1/counter/knowpost/{id}',
        `anonymous, random post of ${posts.length}`,
        singleCountsMix(posts),
        0.7,
      );
    }
    if (wanted('batch')) {
      await httpRun(
        'cluster',
        servers,
        'GET /api/v1/counter/knowpost?ids=(20)',
        '20 consecutive posts from a random start, anonymous',
        batchCountsMix(posts),
        null,
      );
    }
    if (wanted('feed')) {
      await httpRun(
        'cluster',
        servers,
        'GET /api/v1/knowposts/feed?size=20',
        'anonymous, random page of the first 10',
        feedMix(null),
        0.4,
      );
      await httpRun(
        'cluster',
        servers,
        'GET /api/v1/knowposts/feed?size=20 (signed in)',
        `random one of ${users.length} users (liked/faved filled), random page of the first 10`,
        feedMix(users),
        0.4,
      );
    }
    if (wanted('detail')) {
      // One read of every post first: what is measured is a running site, not the first read of each
      // post (a database load, two presigned URLs and a snapshot rebuild, once per post).
      log(`cluster: reading each of ${posts.length} posts once`);
      await readEach(
        api.baseUrl,
        posts.map((id) => `/api/v1/knowposts/detail/${id}`),
      );
      await httpRun(
        'cluster',
        servers,
        'GET /api/v1/knowposts/detail/{id}',
        `anonymous, random post of ${posts.length} (each read counts a view; every post read once before)`,
        detailMix(posts),
        0.5,
      );
    }
    if (wanted('staleness')) {
      log(
        `cluster: staleness at ${cfg.stalenessRate} likes/s for ${cfg.stalenessSeconds} s, ${cfg.probes} probes`,
      );
      const probes = probePosts.map((post, i) => ({ user: users[i % users.length]!, post }));
      results.staleness = await measureStaleness({
        baseUrl: api.baseUrl,
        users,
        posts,
        probes,
        rate: cfg.stalenessRate,
        seconds: cfg.stalenessSeconds,
        connections: cfg.connections,
        pollMs: cfg.pollMs,
        pauseMaxMs: Math.round(cfg.flushMs * 1.2),
      });
      const s = results.staleness;
      log(`  ${s.samples} samples: p50 ${fmt(s.p50)} ms, p99 ${fmt(s.p99)} ms at ${fmt(s.load.rps)} likes/s`);
    }
    if (wanted('rtt')) await redisRoundTrips(stack.env, stack.inbox, cleanups, users[0]!, posts, rttPost);
    for (const s of servers) {
      const w = s.warnings();
      if (w.length > 0)
        results.notes.push(`cluster server ${s.pid} logged ${w.length} warnings; first: ${w[0]}`);
    }
  } finally {
    await cleanups.runAll(log);
  }
}

/** Redis traffic of single requests, through a counting proxy, on an idle API-only server of the same deployment. */
async function redisRoundTrips(
  env: Record<string, string>,
  inbox: CodeInbox,
  cleanups: Cleanups,
  user: BenchUser,
  posts: readonly string[],
  likePost: string,
): Promise<void> {
  const upstream = new URL(services.redisUrl);
  const proxy = await RedisCountingProxy.start(upstream);
  cleanups.add('redis proxy', () => proxy.close());
  const server = await spawnServer({ ...env, ZG_REDIS_URL: proxy.urlFor(upstream) }, 'api', inbox, cleanups);
  log(`rtt: API-only server through the counting proxy at ${server.baseUrl}`);
  const get = (path: string) => async (): Promise<void> => {
    const res = await fetch(`${server.baseUrl}${path}`);
    await res.text();
    if (res.status !== 200) throw new Error(`GET ${path}: ${res.status}`);
  };
  let liked = false;
  const like = async (): Promise<void> => {
    liked = !liked;
    const res = await fetch(`${server.baseUrl}/api/v1/action/${liked ? 'like' : 'unlike'}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${user.accessToken}` },
      body: JSON.stringify({ entityType: 'knowpost', entityId: likePost }),
    });
    await res.text();
    if (res.status !== 200) throw new Error(`like: ${res.status}`);
  };
  const sample = async (
    send: () => Promise<void>,
  ): Promise<{ onPath: TrafficSummary; after: TrafficSummary }> => {
    proxy.record();
    const t0 = performance.now();
    await send();
    const t1 = performance.now();
    await sleep(300);
    const t2 = performance.now();
    proxy.recording = false;
    return { onPath: summarize(proxy.between(t0, t1)), after: summarize(proxy.between(t1, t2)) };
  };
  const measureOne = async (
    name: string,
    send: () => Promise<void>,
    note: string,
    coldAfterMs = 0,
  ): Promise<void> => {
    for (let i = 0; i < 3; i++) await send();
    await sleep(200);
    const samples: TrafficSummary[] = [];
    let after: TrafficSummary | undefined;
    for (let i = 0; i < 5; i++) {
      const s = await sample(send);
      samples.push(s.onPath);
      after ??= s.after;
    }
    results.rtt.push({ name, samples, after: after!, note });
    if (coldAfterMs > 0) {
      await sleep(coldAfterMs);
      const s = await sample(send);
      results.rtt.push({
        name: `${name}, session re-checked`,
        samples: [s.onPath],
        after: s.after,
        note: `after ${coldAfterMs} ms idle (ZG_SESSION_CHECK_CACHE_MS default 1000)`,
      });
    }
  };
  await measureOne(
    'GET /api/v1/counter/knowpost?ids=(20)',
    get(batchPath(posts.slice(100, 120))),
    'anonymous, 20 posts with snapshots',
  );
  await measureOne(
    'GET /api/v1/counter/knowpost/{id}',
    get(`/api/v1/counter/knowpost/${posts[5]!}`),
    'anonymous',
  );
  await measureOne(
    'GET /api/v1/knowposts/feed?size=20',
    get('/api/v1/knowposts/feed?page=1&size=20'),
    'anonymous; posts and the page cached in process (warm)',
  );
  await measureOne(
    'GET /api/v1/knowposts/feed?size=20 (signed in)',
    async () => {
      const res = await fetch(`${server.baseUrl}/api/v1/knowposts/feed?page=1&size=20`, {
        headers: { authorization: `Bearer ${user.accessToken}` },
      });
      await res.text();
      if (res.status !== 200) throw new Error(`feed: ${res.status}`);
    },
    'liked/faved filled; posts and the page cached in process (warm)',
  );
  await measureOne(
    'GET /api/v1/knowposts/detail/{id}',
    get(`/api/v1/knowposts/detail/${posts[7]!}`),
    'anonymous, post cached in process (warm); the view is published after the answer',
  );
  await measureOne(
    'POST /api/v1/action/like|unlike',
    like,
    'alternating, every request changes state; session liveness cached',
    1100,
  );
  for (const r of results.rtt) log(`  ${r.name}: ${describeTraffic(r.samples)}`);
  await server.stop();
}

async function pipeline(): Promise<void> {
  const cleanups = newCleanups();
  try {
    if (cfg.cpuProf) results.cpuProfiles.push(`${cfg.cpuProf}/pipeline`);
    results.pipeline = await runPipeline(
      {
        events: cfg.events,
        entities: cfg.entities,
        partitions: cfg.partitions,
        flushMs: cfg.flushMs,
        maxBatch: cfg.aggBatch,
        writeFacts: cfg.pipelineFacts,
        log,
        cpuProfDir: cfg.cpuProf ? `${cfg.cpuProf}/pipeline` : undefined,
      },
      cleanups,
      { aggregate: wanted('aggregator'), replay: wanted('replay') },
    );
  } finally {
    await cleanups.runAll(log);
  }
}

async function relations(): Promise<void> {
  const cleanups = newCleanups();
  try {
    const stack = await createClusterStack(cleanups, { ...RELATION_BENCH_ENV, ...cfg.serverEnv });
    const servers = await startServers(stack.env, stack.inbox, cleanups, 'cluster');
    const api = servers[0]!;
    const count = Math.round(num('BENCH_RELATION_USERS', 200));
    log(
      `relations: server${servers.length > 1 ? 's' : ''} up at ${api.baseUrl}; signing up ${count} + ${2 * cfg.probes} users`,
    );
    const all = await signUpPhoneUsers(api.baseUrl, stack.inbox, count + 2 * cfg.probes);
    const users = all.slice(0, count);
    const probeUsers = all.slice(count);
    results.relations = { users: users.length };
    const [c0, u0] = await relationChanges(api.baseUrl);
    await httpRun(
      'cluster',
      servers,
      'POST /api/v1/relation/follow|unfollow',
      `${users.length} users, random pair, follow or unfollow 50/50`,
      followMix(users),
      0.4,
    );
    const [c1, u1] = await relationChanges(api.baseUrl);
    results.relations.changedShare = (c1 - c0) / (c1 - c0 + u1 - u0);
    const rate = num('BENCH_RELATION_RATE', 1000);
    const seconds = num('BENCH_RELATION_SECONDS', 10);
    log(`relations: outbox lag at ${rate} follows/s for ${seconds} s, ${cfg.probes} probes`);
    results.relations.lag = await measureOutboxLag({
      baseUrl: api.baseUrl,
      serverUrls: servers.map((s) => s.baseUrl),
      mysqlUrl: stack.mysqlUrl,
      users,
      probes: Array.from({ length: cfg.probes }, (_, i) => ({
        from: probeUsers[2 * i]!,
        to: probeUsers[2 * i + 1]!,
      })),
      rate,
      seconds,
      connections: cfg.connections,
      pollMs: cfg.pollMs,
      pauseMaxMs: 300,
    });
    const l = results.relations.lag;
    log(`  ${l.samples} samples: p50 ${fmt(l.p50)} ms, p99 ${fmt(l.p99)} ms at ${fmt(l.load.rps)} follows/s`);
    for (const s of servers) {
      const w = s.warnings();
      if (w.length > 0)
        results.notes.push(`relations server ${s.pid} logged ${w.length} warnings; first: ${w[0]}`);
    }
  } finally {
    await cleanups.runAll(log);
  }
}

async function embedded(): Promise<void> {
  const cleanups = newCleanups();
  try {
    const stack = createEmbeddedStack(cleanups, cfg.serverEnv);
    const [server] = await startServers(stack.env, stack.inbox, cleanups, 'embedded');
    log(`embedded: server up at ${server!.baseUrl}; signing up ${cfg.users} users`);
    const users = await signUpUsers(server!.baseUrl, stack.inbox, cfg.users);
    const posts = newPostIds(cfg.posts);
    await insertPosts(stack, posts, users[0]!.userId);
    await httpRun(
      'embedded',
      [server!],
      'POST /api/v1/action/like|unlike',
      `${users.length} users × ${posts.length} posts, random pair, like or unlike 50/50`,
      likeMix(users, posts),
      0.4,
    );
    const w = server!.warnings();
    if (w.length > 0) results.notes.push(`embedded server logged ${w.length} warnings; first: ${w[0]}`);
  } finally {
    await cleanups.runAll(log);
  }
}

async function memory(): Promise<void> {
  if (!existsSync(`${ROOT}/bench/counter-memory.ts`)) {
    results.memory = { skipped: 'Skipped: bench/counter-memory.ts does not exist in this checkout.' };
    return;
  }
  log('memory: running bench/counter-memory.ts');
  const started = performance.now();
  const output = await new Promise<string>((ok, fail) => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'bench/counter-memory.ts'], {
      cwd: ROOT,
      env: { ...process.env, ZG_REDIS_URL: services.redisUrl },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const timer = setTimeout(() => child.kill('SIGTERM'), 240_000);
    child.on('exit', (code) => {
      clearTimeout(timer);
      if (code === 0) ok(out.trimEnd());
      else fail(new Error(`bench/counter-memory.ts exited with ${code}\n${err.slice(-2000)}`));
    });
  });
  results.memory = { output, seconds: (performance.now() - started) / 1000 };
}

async function describeMachine(): Promise<void> {
  const cpus = os.cpus();
  const m = results.machine;
  m.cpu = `${cpus.length} × ${cpus[0]?.model.trim() ?? 'unknown'}`;
  m.memory = `${(os.totalmem() / 2 ** 30).toFixed(1)} GiB`;
  m.os = `${os.type()} ${os.release()}`;
  m.node = process.version;
  m.load = os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');
  try {
    const redis = new Redis(services.redisUrl, { maxRetriesPerRequest: 1 });
    m.redis = /redis_version:(\S+)/.exec(await redis.info('server'))?.[1] ?? '?';
    redis.disconnect();
  } catch {
    m.redis = 'unreachable';
  }
  try {
    const c = await createConnection({ uri: services.mysqlRootUrl });
    const [rows] = await c.query('SELECT VERSION() AS v');
    m.mariadb = String((rows as { v: string }[])[0]?.v ?? '?');
    await c.end();
  } catch {
    m.mariadb = 'unreachable';
  }
  m.kafka = process.env.ZG_KAFKA_BROKERS
    ? `external (${process.env.ZG_KAFKA_BROKERS})`
    : `${process.env.ZG_KAFKA_VERSION ?? '4.2.2'}, single local broker (scripts/kafka-broker.sh)`;
}

// ---------------------------------------------------------------------------------------------
// Output

function describeTraffic(samples: readonly TrafficSummary[]): string {
  const patterns = new Map<string, number>();
  for (const s of samples) {
    const names = Object.entries(s.byName)
      .map(([n, c]) => `${n}×${c}`)
      .join(', ');
    const key = `${s.roundTrips} round trip${s.roundTrips === 1 ? '' : 's'}, ${s.commands} command${s.commands === 1 ? '' : 's'}${names ? ` (${names})` : ''}`;
    patterns.set(key, (patterns.get(key) ?? 0) + 1);
  }
  return [...patterns]
    .map(([key, n]) => (samples.length > 1 ? `${n} of ${samples.length}: ${key}` : key))
    .join('; ');
}

const verdict = (value: number, target: number | null, atMost = false): string =>
  target === null ? '—' : (atMost ? value <= target : value >= target) ? 'met' : '**MISSED**';

/** Met only when the load ran at (95 % of) the asked rate and no probe timed out. */
function stalenessVerdict(s: StalenessResult): string {
  if (s.timedOut > 0) return `**MISSED** (${s.timedOut} probes never saw their change)`;
  if (s.load.rps < cfg.stalenessRate * 0.95)
    return `**not shown**: the server sustained only ${fmt(s.load.rps)} likes/s (p99 ${verdict(s.p99, 1500, true)} at that rate)`;
  return verdict(s.p99, 1500, true);
}

function textTable(): string {
  const lines: string[] = [];
  const row = (cells: string[], widths: number[]): string =>
    cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  const widths = [50, 10, 10, 8, 8, 8, 8, 8, 12];
  lines.push(
    row(
      ['measurement', 'req/s', 'base req/s', '×base', 'p50 ms', 'p99 ms', 'target', 'met', 'srv µs/req'],
      widths,
    ),
  );
  for (const r of results.http) {
    lines.push(
      row(
        [
          `${r.profile}: ${r.name}`,
          fmt(r.load.rps),
          fmt(r.baseline.rps),
          r.ratio.toFixed(2),
          fmt(r.load.p50, 1),
          fmt(r.load.p99, 1),
          r.target === null ? '' : `≥${r.target}`,
          r.target === null ? '' : verdict(r.ratio, r.target).replace(/\*/g, ''),
          `${fmt(perRequest(r.cpu, r.load))}/${fmt(perRequest(r.baselineCpu, r.baseline))}`,
        ],
        widths,
      ),
    );
  }
  const p = results.pipeline;
  if (p?.aggregate) {
    const a = p.aggregate;
    lines.push(
      row(
        [
          'aggregator Kafka→snapshots (events/s, incl. join)',
          fmt(p.events / a.totalSeconds),
          '',
          '',
          '',
          '≥50,000',
          verdict(p.events / a.totalSeconds, 50_000).replace(/\*/g, ''),
        ],
        widths,
      ),
    );
  }
  if (p?.replay)
    lines.push(
      row(
        [
          'replayAll (events/s)',
          fmt(p.replay.events / p.replay.seconds),
          '',
          '',
          '',
          '≥50,000',
          verdict(p.replay.events / p.replay.seconds, 50_000).replace(/\*/g, ''),
        ],
        widths,
      ),
    );
  const s = results.staleness;
  if (s)
    lines.push(
      row(
        [
          `staleness at ${fmt(s.load.rps)} likes/s (p99 ms)`,
          '',
          '',
          fmt(s.p50),
          fmt(s.p99),
          '≤1,500',
          stalenessVerdict(s).replace(/\*/g, '').split(':')[0]!,
        ],
        widths,
      ),
    );
  if (results.relations?.lag) lines.push(row(outboxLagCells(results.relations.lag), widths));
  for (const r of results.rtt) lines.push(`redis: ${r.name}: ${describeTraffic(r.samples)}`);
  return lines.join('\n');
}

function markdown(): string {
  const out: string[] = [];
  const m = results.machine;
  const date = results.started.toISOString().slice(0, 16).replace('T', ' ');
  out.push(`## Results of ${date} UTC`, '');
  const env = Object.entries(process.env)
    .filter(([k]) => k.startsWith('BENCH_'))
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k}=${/\s/.test(v ?? '') ? `'${v}'` : v} `)
    .join('');
  out.push('```', `${env}npm run bench`, '```', '');
  out.push(
    `Machine: ${m.cpu}, ${m.memory}, ${m.os}; Node ${m.node}; Redis ${m.redis}; MariaDB ${m.mariadb}; Kafka ${m.kafka}. ` +
      `Load average at start: ${m.load}. Load generator (autocannon 9), Redis, MariaDB, Kafka and the server share the machine.`,
    '',
    `Settings: per request ${cfg.seconds} s measured and ${cfg.seconds} s of baseline in ${cfg.rounds} alternating rounds after ${cfg.warmup} s of warm-up, ${cfg.connections} connections, ${cfg.users} users signed up through the API, ` +
      `${cfg.posts} published public posts inserted into \`knowposts\`; cluster server role \`${cfg.roles}\`` +
      `${cfg.roles === 'all' ? ' (API and workers in one process)' : ' (one API and one worker process)'}; server configuration at production defaults otherwise ` +
      `(flush every 1000 ms, session check cache 1000 ms, entity cache 5000 ms, LOG_LEVEL info)` +
      `${
        Object.keys(cfg.serverEnv).length > 0
          ? `, **except ${Object.entries(cfg.serverEnv)
              .map(([k, v]) => `${k}=${v}`)
              .join(', ')} (diagnostic run)**`
          : ''
      }.` +
      `${process.env.BENCH_SERVER_ENTRY ? ` **Server build: ${SERVER_ENTRY}, not this checkout's dist/main.js.**` : ''}`,
    '',
  );
  if (results.http.length > 0) {
    out.push("### HTTP throughput against the same run's baseline", '');
    out.push(
      `Each request was measured in ${cfg.rounds} slices alternating with slices of \`GET /healthz\` (a bare Fastify route returning \`{status:'ok'}\`) on the same server process ` +
        `(baseline, request, request, baseline, …; ${cfg.seconds} s of each in total), so load from anything else on the machine weighs on both alike. ` +
        "Latencies are of 2xx answers, computed from every response. Server CPU per request is the server process's CPU time (user + system, role `all` includes the workers) divided by the answers.",
      '',
      '| profile | request | mix | req/s | baseline req/s | × baseline | p50 ms | p99 ms | baseline p99 ms | target | met | server CPU µs/req (request / baseline) | cores busy during request: server / load gen / machine | backing services µs/req: Redis / MariaDB / Kafka |',
      '|---|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|',
    );
    for (const r of results.http) {
      const bad = r.load.non2xx + r.load.errors + r.load.timeouts;
      out.push(
        `| ${r.profile} | \`${r.name.replace(/\|/g, '\\|')}\` | ${r.detail}${bad > 0 ? ` (${r.load.non2xx} non-2xx, ${r.load.errors} errors, ${r.load.timeouts} timeouts)` : ''} ` +
          `| ${fmt(r.load.rps)} | ${fmt(r.baseline.rps)} | ${r.ratio.toFixed(2)} | ${fmt(r.load.p50, 1)} | ${fmt(r.load.p99, 1)} | ${fmt(r.baseline.p99, 1)} ` +
          `| ${r.target === null ? '—' : `≥ ${r.target}× baseline`} | ${r.target === null ? '—' : verdict(r.ratio, r.target)} ` +
          `| ${fmt(perRequest(r.cpu, r.load))} / ${fmt(perRequest(r.baselineCpu, r.baseline))} | ${r.cpu.server.toFixed(2)} / ${r.cpu.generator.toFixed(2)} / ${r.cpu.machine.toFixed(2)} ` +
          `| ${SERVICE_NAMES.map((n) => fmt((r.cpu.services[n] / r.load.rps) * 1e6)).join(' / ')} |`,
      );
    }
    out.push('');
    if (results.changedShare !== undefined)
      out.push(
        `Like mix: ${(results.changedShare * 100).toFixed(1)} % of toggles changed state (${results.likeServerStats}).`,
        '',
      );
  }
  if (results.rtt.length > 0) {
    out.push('### Redis traffic per request', '');
    out.push(
      'Measured through a counting TCP proxy in front of Redis, on an idle API-only server of the same deployment, five samples per request after three warm-ups. ' +
        'A round trip is a client write that follows a reply (a pipeline of N commands written at once is one round trip).',
      '',
    );
    out.push('| request | on the request path | after the answer (300 ms) | note |', '|---|---|---|---|');
    for (const r of results.rtt)
      out.push(
        `| \`${r.name.replace(/\|/g, '\\|')}\` | ${describeTraffic(r.samples)} | ${describeTraffic([r.after])} | ${r.note} |`,
      );
    out.push('');
  }
  const s = results.staleness;
  if (s) {
    out.push('### Staleness (cluster)', '');
    out.push(
      `autocannon paced at ${fmt(cfg.stalenessRate)} likes/s (same like mix, ${cfg.connections} connections) for ${cfg.stalenessSeconds} s; achieved ${fmt(s.load.rps)} 2xx/s, p99 ${fmt(s.load.p99, 1)} ms. ` +
        `Meanwhile ${s.probes} probes each toggled a like on a post of its own and polled \`GET /api/v1/counter/knowpost/{id}?metrics=like\` every ${s.pollMs} ms until the count showed the change, ` +
        `then paused a random 0–${fmt(Math.round(cfg.flushMs * 1.2))} ms (longer than a flush period, so toggles fall at random phases of the flush cycle) before toggling again; ` +
        `time from the toggle's answer to the first poll showing it (resolution: the poll interval plus a poll's own latency):`,
      '',
      '| samples | timed out (>10 s) | p50 ms | p99 ms | max ms | target | met |',
      '|---:|---:|---:|---:|---:|---|---|',
      `| ${s.samples} | ${s.timedOut} | ${fmt(s.p50)} | ${fmt(s.p99)} | ${fmt(s.max)} | p99 ≤ 1,500 ms at ${fmt(cfg.stalenessRate)} toggles/s | ${stalenessVerdict(s)} |`,
      '',
      `Meanwhile the server's \`zg_counter_consumer_lag_ms\` (age of the newest event of the batch last applied; ${s.consumerLagMs.samples} samples) was ${fmt(s.consumerLagMs.p50)} ms at the median and ${fmt(s.consumerLagMs.max)} ms at most; ` +
        `${fmt(s.flushes.count)} flush rounds took ${fmt(s.flushes.meanMs, 1)} ms on average (at a fixed rate: the next one starts ${fmt(cfg.flushMs)} ms after the previous one started, or at once when it took longer).`,
      '',
    );
  }
  const p = results.pipeline;
  if (p) {
    out.push('### Counter pipeline throughput (in process, Redis + Kafka)', '');
    out.push(
      `${fmt(p.events)} valid counter events (consistent history: per post seq 1, 2, 3…; 80 % likes, 20 % favourites; adds for users who do not hold the fact, ` +
        `20 % removals of holders) over ${fmt(p.entities)} posts drawn Zipf-like (exponent 0.8), published to a fresh topic with ${p.partitions} partitions ` +
        `(${p.publishSeconds.toFixed(1)} s, not measured). Before that every post got a zero snapshot ` +
        (p.factsWritten
          ? `and fact sets consistent with the events were written with \`replayFacts\` (${p.setupSeconds.toFixed(1)} s, not measured).`
          : `(${p.setupSeconds.toFixed(1)} s, not measured); fact sets were not written: the aggregator reads them only to rebuild after a gap, and a rebuild from the empty facts would show up as inexact, so "exact" also shows that only the delta path ran.`),
      '',
      '| measurement | events | seconds | events/s | target | met | exact |',
      '|---|---:|---:|---:|---|---|---|',
    );
    if (p.aggregate) {
      const a = p.aggregate;
      out.push(
        `| \`CounterAggregator\` (maxBatch ${fmt(cfg.aggBatch)}${cfg.aggBatch === 20_000 ? ', as in app.ts' : ', diagnostic; app.ts uses 20,000'}, maxWait 50 ms) + \`flushPending\` every ${cfg.flushMs} ms, from \`start()\` (group join ${a.joinSeconds.toFixed(2)} s) to the last fold | ${fmt(p.events)} | ${a.totalSeconds.toFixed(2)} | ${fmt(p.events / a.totalSeconds)} | ≥ 50,000 | ${verdict(p.events / a.totalSeconds, 50_000)} | ${a.mismatches === 0 ? 'yes' : `no: ${a.mismatches} snapshots differ`} |`,
        `| of which: first batch → all applied | ${fmt(p.events)} | ${a.applySeconds.toFixed(2)} | ${fmt(p.events / a.applySeconds)} | | | |`,
        `| of which: all applied → last fold done | | ${a.tailSeconds.toFixed(2)} | | | | |`,
      );
    }
    if (p.replay) {
      const r = p.replay;
      out.push(
        `| \`replayAll\` over the same topic (reset, read, ${fmt(r.facts)} facts, ${fmt(r.rebuilt)} rebuilds) | ${fmt(r.events)} | ${r.seconds.toFixed(2)} | ${fmt(r.events / r.seconds)} | ≥ 50,000 | ${verdict(r.events / r.seconds, 50_000)} | ${r.mismatches === 0 ? 'yes' : `no: ${r.mismatches} snapshots differ`} |`,
      );
    }
    out.push(
      '',
      '"Exact": every post\'s like and favourite counts in the snapshots equal the counts implied by the events.',
      '',
    );
    const secs = (r: Record<string, number>): string =>
      Object.entries(r)
        .map(([k, v]) => `${k} ${v.toFixed(2)} s`)
        .join(', ');
    if (p.aggregate) {
      const a = p.aggregate;
      out.push(
        `Where the aggregator's time went: CPU ${a.cpu.node.toFixed(1)} s in the Node process (consumer, parsing, store calls), ${a.cpu.redis.toFixed(1)} s in Redis; ` +
          `wall time inside store calls (the consumer's \`applyEvents\` one batch at a time; \`flush\` beside it from the periodic flusher, so the sums overlap): ${secs(a.inStore)}.`,
        '',
      );
    }
    if (p.replay) {
      const r = p.replay;
      out.push(
        `Where replay's time went: CPU ${r.cpu.node.toFixed(1)} s in the Node process, ${r.cpu.redis.toFixed(1)} s in Redis; wall time per step: ${secs(r.phases)} (\`readRange\` includes folding the records in its handler).`,
        '',
      );
    }
  }
  if (results.relations?.changedShare !== undefined)
    out.push(
      `Follow mix: ${(results.relations.changedShare * 100).toFixed(1)} % of follow/unfollow requests changed state (${results.relations.users} users; the relations part runs its own deployment with \`${Object.entries(
        RELATION_BENCH_ENV,
      )
        .map(([k, v]) => `${k}=${v}`)
        .join(' ')}\`, so the per-user limit never answers 429).`,
      '',
    );
  if (results.relations?.lag) out.push(...outboxLagMarkdown(results.relations.lag, cfg.connections, 300));
  const mem = results.memory;
  if (mem) {
    out.push('### Memory (bench/counter-memory.ts)', '');
    if ('skipped' in mem) out.push(mem.skipped, '');
    else
      out.push(
        `Output of \`npx tsx bench/counter-memory.ts\` run by the benchmark (${mem.seconds.toFixed(0)} s):`,
        '',
        '```',
        mem.output,
        '```',
        '',
      );
  }
  if (results.notes.length > 0) out.push('### Notes', '', ...results.notes.map((n) => `- ${n}`), '');
  return out.join('\n');
}

// ---------------------------------------------------------------------------------------------

let interrupted = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, () => {
    if (interrupted) return;
    interrupted = true;
    log(`${signal}: cleaning up`);
    void Promise.all(allCleanups.map((c) => c.runAll(log))).finally(() => process.exit(130));
  });
}

async function main(): Promise<void> {
  const t0 = performance.now();
  await describeMachine();
  const clusterParts = (['like', 'counts', 'batch', 'feed', 'detail', 'rtt', 'staleness'] as const).filter(
    wanted,
  );
  if (clusterParts.length > 0) await clusterHttp();
  if (wanted('aggregator') || wanted('replay')) await pipeline();
  if (wanted('embedded')) await embedded();
  if (wanted('relations')) await relations();
  if (wanted('memory')) await memory();
  log(`done in ${((performance.now() - t0) / 1000).toFixed(0)} s`);
  if (results.cpuProfiles.length > 0)
    results.notes.push(`CPU profiles written under ${results.cpuProfiles.join(', ')}`);
  process.stdout.write(`${textTable()}\n\n${markdown()}\n`);
}

main().then(
  () => process.exit(0),
  async (err: unknown) => {
    log(`failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    await Promise.all(allCleanups.map((c) => c.runAll(log)));
    process.exit(1);
  },
);
