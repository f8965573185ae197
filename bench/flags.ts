/**
 * What reading the flags of a feed page costs the caller and Redis: 50 concurrent loops each call
 * `RedisCounterStore.flags` for 20 posts of 200 (each liked by a few other users, and a share of
 * them, `FLAGS_LIKED`, by each of the 20 readers), after an optional busy wait standing in for the
 * rest of a request's work.
 *
 *   npx tsx bench/flags.ts                         (Redis at ZG_REDIS_URL, default redis://127.0.0.1:6379)
 *   FLAGS_WORK_US=150 FLAGS_CLIENT=all npx tsx bench/flags.ts
 *   FLAGS_LIKED=0.03 FLAGS_STORE=/path/to/other/dist/counter/store/redis-counter-store.js npx tsx bench/flags.ts
 *
 * FLAGS_CLIENT: `cluster` (default) is the client as the cluster profile configures it
 * (`clusterRedisOptions`: auto-pipelined, but the flags script sent at once); `all` auto-pipelines
 * every command, the flags script too; `none` auto-pipelines nothing. FLAGS_LIKED: the share of the
 * posts each reader liked or favourited (0.3). FLAGS_STORE: another build's store module to measure
 * instead of this checkout's (A/B runs; the data are written by this checkout's store either way).
 *
 * Prints calls/s, this process's CPU per call (busy wait included), Redis' CPU per call and the time
 * Redis spent in the flags scripts per call (`INFO commandstats`, `evalsha`, which counts whatever
 * else ran `EVALSHA` on the same Redis meanwhile). Uses its own key prefix and deletes every key it
 * wrote.
 */
import { pathToFileURL } from 'node:url';
import { Redis } from 'ioredis';
import type { EntityRef } from '../src/counter/model.js';
import { RedisCounterStore } from '../src/counter/store/redis-counter-store.js';
import { clusterRedisOptions } from '../src/platform/wiring.js';
import { deleteRedisKeys, redisCpuSeconds, services } from './servers.js';

const REDIS_URL = services.redisUrl;
const clientKind = process.env.FLAGS_CLIENT ?? 'cluster';
const workUs = Number(process.env.FLAGS_WORK_US ?? 0);
const seconds = Number(process.env.FLAGS_SECONDS ?? 5);
const likedShare = Number(process.env.FLAGS_LIKED ?? 0.3);
const prefix = `zgflags${Date.now()}:`;

const admin = new Redis(REDIS_URL);
const clientOptions = {
  cluster: await clusterRedisOptions(),
  all: { enableAutoPipelining: true },
  none: { enableAutoPipelining: false },
}[clientKind];
if (!clientOptions) throw new Error(`FLAGS_CLIENT must be cluster, all or none, not ${clientKind}`);
if (!(likedShare >= 0 && likedShare <= 1))
  throw new Error(`FLAGS_LIKED must be within 0–1, not ${likedShare}`);
const client = new Redis(REDIS_URL, clientOptions);
// Its own client: a client keeps the first script defined under a name, so sharing one with the
// measured store would measure this checkout's flags script whatever FLAGS_STORE says.
const writerClient = new Redis(REDIS_URL);
const writer = new RedisCounterStore(writerClient, { prefix });
const Measured: typeof RedisCounterStore = process.env.FLAGS_STORE
  ? (
      (await import(pathToFileURL(process.env.FLAGS_STORE).href)) as {
        RedisCounterStore: typeof RedisCounterStore;
      }
    ).RedisCounterStore
  : RedisCounterStore;
const store = new Measured(client, { prefix });

/** Calls of `EVALSHA` and the microseconds Redis spent in them since it started. */
async function scriptTime(): Promise<{ calls: number; usec: number }> {
  const match = /cmdstat_evalsha:calls=(\d+),usec=(\d+)/.exec(await admin.info('commandstats'));
  return { calls: Number(match?.[1] ?? 0), usec: Number(match?.[2] ?? 0) };
}

function busy(us: number): void {
  const end = performance.now() + us / 1000;
  while (performance.now() < end);
}

try {
  const posts: EntityRef[] = Array.from({ length: 200 }, (_, i) => ({
    etype: 'knowpost',
    eid: String(7_300_000_000_000_000_000n + BigInt(i * 7919)),
  }));
  for (const [i, ref] of posts.entries()) {
    const others = [100_001, 100_002, 100_003 + i];
    await Promise.all(others.map((user) => writer.toggle(ref, 'like', user, true, Date.now())));
  }
  for (let user = 1; user <= 20; user++) {
    const liked = posts.filter((_, i) => ((i * 31 + user * 17) % 100) / 100 < likedShare);
    const metric = user % 2 === 0 ? 'like' : 'fav';
    await Promise.all(liked.map((ref) => writer.toggle(ref, metric, user, true, Date.now())));
  }
  let calls = 0;
  const until = performance.now() + seconds * 1000;
  const redis0 = await redisCpuSeconds(admin);
  const scripts0 = await scriptTime();
  const node0 = process.cpuUsage();
  await Promise.all(
    Array.from({ length: 50 }, async (_, loop) => {
      let k = loop;
      while (performance.now() < until) {
        await new Promise((resolve) => setImmediate(resolve));
        busy(workUs);
        const start = (k++ % 10) * 20;
        await store.flags(1 + (k % 20), posts.slice(start, start + 20));
        calls++;
      }
    }),
  );
  const node = process.cpuUsage(node0);
  const redis = (await redisCpuSeconds(admin)) - redis0;
  const scripts1 = await scriptTime();
  console.log(
    `client ${clientKind}, busy wait ${workUs} µs, ${likedShare * 100} % liked` +
      `${process.env.FLAGS_STORE ? `, store ${process.env.FLAGS_STORE}` : ''}: ` +
      `${Math.round(calls / seconds)} calls/s; CPU per call: this process ` +
      `${((node.user + node.system) / calls).toFixed(1)} µs, Redis ${((redis * 1e6) / calls).toFixed(1)} µs; ` +
      `Redis in the script ${((scripts1.usec - scripts0.usec) / Math.max(1, scripts1.calls - scripts0.calls)).toFixed(1)} µs per call`,
  );
} finally {
  await deleteRedisKeys(prefix);
  await Promise.all([admin.quit(), client.quit(), writerClient.quit()]);
}
