/**
 * What reading the flags of a feed page costs the caller and Redis: 50 concurrent loops each call
 * `RedisCounterStore.flags` for 20 posts of 200 (about 30 % liked by each of 20 users), after an
 * optional busy wait standing in for the rest of a request's work.
 *
 *   npx tsx bench/flags.ts                         (Redis at ZG_REDIS_URL, default redis://127.0.0.1:6379)
 *   FLAGS_WORK_US=150 FLAGS_CLIENT=all npx tsx bench/flags.ts
 *
 * FLAGS_CLIENT: `cluster` (default) is the client as the cluster profile configures it
 * (`clusterRedisOptions`: auto-pipelined, but the flags script sent at once); `all` auto-pipelines
 * every command, the flags script too; `none` auto-pipelines nothing.
 *
 * Prints calls/s, this process's CPU per call (busy wait included) and Redis' CPU per call. Uses its
 * own key prefix and deletes every key it wrote.
 */
import { Redis } from 'ioredis';
import type { EntityRef } from '../src/counter/model.js';
import { RedisCounterStore } from '../src/counter/store/redis-counter-store.js';
import { clusterRedisOptions } from '../src/platform/wiring.js';
import { deleteRedisKeys, services } from './servers.js';

const REDIS_URL = services.redisUrl;
const clientKind = process.env.FLAGS_CLIENT ?? 'cluster';
const workUs = Number(process.env.FLAGS_WORK_US ?? 0);
const seconds = Number(process.env.FLAGS_SECONDS ?? 5);
const prefix = `zgflags${Date.now()}:`;

const admin = new Redis(REDIS_URL);
const clientOptions = {
  cluster: await clusterRedisOptions(),
  all: { enableAutoPipelining: true },
  none: { enableAutoPipelining: false },
}[clientKind];
if (!clientOptions) throw new Error(`FLAGS_CLIENT must be cluster, all or none, not ${clientKind}`);
const client = new Redis(REDIS_URL, clientOptions);
const store = new RedisCounterStore(client, { prefix });

async function redisCpu(): Promise<number> {
  const info = await admin.info('cpu');
  const field = (name: string): number => Number(new RegExp(`${name}:([\\d.]+)`).exec(info)?.[1] ?? NaN);
  return field('used_cpu_user') + field('used_cpu_sys');
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
  for (let user = 1; user <= 20; user++) {
    const liked = posts.filter((_, i) => (i * 31 + user * 17) % 10 < 3);
    await Promise.all(liked.map((ref) => store.toggle(ref, 'like', user, true, Date.now())));
  }
  let calls = 0;
  const until = performance.now() + seconds * 1000;
  const redis0 = await redisCpu();
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
  const redis = (await redisCpu()) - redis0;
  console.log(
    `client ${clientKind}, busy wait ${workUs} µs: ${Math.round(calls / seconds)} calls/s; ` +
      `CPU per call: this process ${((node.user + node.system) / calls).toFixed(1)} µs, ` +
      `Redis ${((redis * 1e6) / calls).toFixed(1)} µs`,
  );
} finally {
  await deleteRedisKeys(prefix);
  await Promise.all([admin.quit(), client.quit()]);
}
