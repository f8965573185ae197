/**
 * What reading the snapshots of a batch of posts costs the caller and Redis, the two ways
 * `RedisCounterStore.readSnapshots` can: an `HMGET` per group (Redis Cluster mode, and on one node
 * for batches of fewer than `SNAPSHOTS_SCRIPT_GROUPS` groups) and one script for the whole batch
 * (one node). 50 concurrent loops read batches of SNAP_IDS consecutive posts (20) of 2,000, each
 * with a snapshot, 200 batches a loop; the two ways alternate for SNAP_ROUNDS rounds (6).
 *
 *   npx tsx bench/snapshot-reads.ts
 *   SNAP_IDS=4 npx tsx bench/snapshot-reads.ts
 *
 * Prints batches/s and CPU per batch of this process and of Redis. Uses its own key prefix and
 * deletes every key it wrote.
 */
import { Redis } from 'ioredis';
import type { EntityRef } from '../src/counter/model.js';
import { RedisCounterStore } from '../src/counter/store/redis-counter-store.js';
import { deleteRedisKeys, redisCpuSeconds, services } from './servers.js';

const ids = Number(process.env.SNAP_IDS ?? 20);
const rounds = Number(process.env.SNAP_ROUNDS ?? 6);
const prefix = `zgsnapreads${Date.now()}:`;
const admin = new Redis(services.redisUrl);
const clients: Redis[] = [];
const store = (singleNode: boolean): RedisCounterStore => {
  const client = new Redis(services.redisUrl, { enableAutoPipelining: true });
  clients.push(client);
  return new RedisCounterStore(client, { prefix, singleNode });
};

try {
  const posts: EntityRef[] = Array.from({ length: 2000 }, (_, i) => ({
    etype: 'knowpost',
    eid: String(7_300_000_000_000_000_000n + BigInt(i * 7919)),
  }));
  const ways = { 'HMGET per group': store(false), 'one script': store(true) };
  for (let i = 0; i < posts.length; i += 100)
    await Promise.all(posts.slice(i, i + 100).map((p) => ways['one script'].rebuild(p)));
  const results = new Map<string, string[]>();
  for (let round = 0; round < rounds; round++) {
    const order = Object.entries(ways);
    if (round % 2 === 1) order.reverse();
    for (const [name, way] of order) {
      const redis0 = await redisCpuSeconds(admin);
      const node0 = process.cpuUsage();
      const start = performance.now();
      let batches = 0;
      await Promise.all(
        Array.from({ length: 50 }, async (_, loop) => {
          for (let k = 0; k < 200; k++) {
            const from = (loop * 37 + k * 13) % (posts.length - ids);
            const snapshots = await way.readSnapshots(posts.slice(from, from + ids));
            if (snapshots.some((s) => s === null)) throw new Error('a snapshot is missing');
            batches++;
          }
        }),
      );
      const seconds = (performance.now() - start) / 1000;
      const node = process.cpuUsage(node0);
      const redis = (await redisCpuSeconds(admin)) - redis0;
      const line =
        `${Math.round(batches / seconds)} batches/s, CPU per batch: this process ` +
        `${((node.user + node.system) / batches).toFixed(1)} µs, Redis ${((redis * 1e6) / batches).toFixed(1)} µs`;
      results.set(name, [...(results.get(name) ?? []), line]);
    }
  }
  console.log(
    `batches of ${ids} posts (${new Set(posts.slice(0, ids).map((p) => ways['one script'].groupOf(p))).size} groups in the first):`,
  );
  for (const [name, lines] of results) console.log(`${name}:\n  ${lines.join('\n  ')}`);
} finally {
  await deleteRedisKeys(prefix);
  await Promise.all([admin, ...clients].map((c) => c.quit()));
}
