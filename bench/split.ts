/**
 * Where a request's CPU goes when API and workers run as separate processes: each request mix runs
 * alone (no baseline slices) against `--role api` and `--role worker` servers of one throwaway
 * cluster deployment, and the CPU time of each process and of the backing services is divided by
 * the answers. A diagnostic beside `bench/run.ts`, which reports ratios.
 *
 *   npx tsx bench/split.ts                      # like, then the bare route
 *   SPLIT_MIX=like,counts,feed,feedu,detail SPLIT_SECONDS=10 npx tsx bench/split.ts
 *   SPLIT_CPU_PROF=/tmp/prof SPLIT_BASELINE=0 npx tsx bench/split.ts   # V8 CPU profile of the API
 *                                               # process, without the bare route
 *   SPLIT_SERVER_ENV='ZG_POST_CACHE_MS=5000' npx tsx bench/split.ts   # other server settings
 *   SPLIT_MIX=follow npx tsx bench/split.ts     # follow/unfollow among 200 phone sign-ups
 *
 * Needs what `npm run bench` needs (Redis, MariaDB, the Kafka broker of scripts/kafka-broker.sh, the
 * S3 test server); cleans up everything it created.
 */
import type autocannon from 'autocannon';
import {
  cpuBetween,
  cpuMark,
  detailMix,
  feedMix,
  fire,
  healthz,
  likeMix,
  scrape,
  SERVICE_NAMES,
  singleCountsMix,
} from './load.js';
import { followMix, RELATION_BENCH_ENV, signUpPhoneUsers } from './relations.js';

/** Group commit of follows: requests and transactions (`zg_relation_commit_changes`). */
const COMMIT_METRICS = ['zg_relation_commit_changes_sum', 'zg_relation_commit_changes_count'];
/** The worker's outbox relay: rows published and relay rounds (`zg_outbox_round_rows`). */
const RELAY_METRICS = ['zg_outbox_round_rows_sum', 'zg_outbox_round_rows_count'];
import {
  Cleanups,
  createClusterStack,
  insertPosts,
  newPostIds,
  signUpUsers,
  spawnServer,
} from './servers.js';

const mixNames = (process.env.SPLIT_MIX ?? 'like').split(',').map((m) => m.trim());
const seconds = Number(process.env.SPLIT_SECONDS ?? 8);
const cleanups = new Cleanups();
try {
  const serverEnv = Object.fromEntries(
    (process.env.SPLIT_SERVER_ENV ?? '')
      .split(/\s+/)
      .filter((kv) => kv.includes('='))
      .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
  );
  const follows = mixNames.includes('follow');
  const stack = await createClusterStack(
    cleanups,
    follows ? { ...RELATION_BENCH_ENV, ...serverEnv } : serverEnv,
  );
  const api = await spawnServer(stack.env, 'api', stack.inbox, cleanups, process.env.SPLIT_CPU_PROF);
  const worker = await spawnServer(stack.env, 'worker', stack.inbox, cleanups);
  const users = await signUpUsers(api.baseUrl, stack.inbox, 20);
  const posts = newPostIds(2000);
  await insertPosts(stack, posts, users[0]!.userId);
  const mixes: Record<string, autocannon.Request[]> = {
    like: likeMix(users, posts),
    counts: singleCountsMix(posts),
    feed: feedMix(null),
    feedu: feedMix(users),
    detail: detailMix(posts),
    healthz,
  };
  if (follows) mixes.follow = followMix(await signUpPhoneUsers(api.baseUrl, stack.inbox, 200));
  for (const name of mixNames) if (!mixes[name]) throw new Error(`unknown mix ${name}`);
  await fire({ url: api.baseUrl, connections: 50, seconds: 2, requests: healthz });
  console.log(
    'mix       req/s   API µs/req  worker µs/req  ' + SERVICE_NAMES.map((n) => `${n} µs/req`).join('  '),
  );
  // SPLIT_BASELINE=0 leaves the bare route out (a CPU profile then shows the mixes alone).
  for (const name of process.env.SPLIT_BASELINE === '0' ? mixNames : [...mixNames, 'healthz']) {
    const before = { api: cpuMark([api.pid]), worker: cpuMark([worker.pid]) };
    const commits = await scrape(api.baseUrl, COMMIT_METRICS);
    const relayed = await scrape(worker.baseUrl, RELAY_METRICS);
    const r = await fire({ url: api.baseUrl, connections: 50, seconds, requests: mixes[name]! });
    const a = cpuBetween(before.api, cpuMark([api.pid]));
    const w = cpuBetween(before.worker, cpuMark([worker.pid]));
    const per = (cores: number) => ((cores / r.rps) * 1e6).toFixed(0).padStart(6);
    console.log(
      `${name.padEnd(8)} ${r.rps.toFixed(0).padStart(6)}   ${per(a.server)}      ${per(w.server)}        ` +
        SERVICE_NAMES.map((n) => per(a.services[n]).padStart(n.length + 7)).join('  ') +
        (r.non2xx + r.errors > 0 ? `   (${r.non2xx} non-2xx, ${r.errors} errors)` : ''),
    );
    const [sum, count] = (await scrape(api.baseUrl, COMMIT_METRICS)).map((v, i) => v - commits[i]!);
    if (count! > 0) {
      console.log(
        `         ${(sum! / count!).toFixed(1)} follow/unfollow requests per transaction (${count} transactions)`,
      );
    }
    const [rows, rounds] = (await scrape(worker.baseUrl, RELAY_METRICS)).map((v, i) => v - relayed[i]!);
    if (rounds! > 0) {
      console.log(
        `         ${(rows! / rounds!).toFixed(1)} outbox rows per relay round (${rounds} rounds, ${rows} rows)`,
      );
    }
  }
} finally {
  await cleanups.runAll((line) => console.error(line));
}
