/**
 * What `ZG_REDIS_COMMAND_TIMEOUT_MS` costs the client: 200,000 auto-pipelined GETs, 50 at a time,
 * with and without ioredis's `commandTimeout` (a timer per command), alternating three times. A
 * diagnostic beside `bench/run.ts`; needs Redis (`ZG_REDIS_URL`, default redis://127.0.0.1:6379) and
 * reads keys that do not exist.
 *
 *   npx tsx bench/redis-command-timeout.ts
 */
import { Redis } from 'ioredis';

const COMMANDS = 200_000;
const url = process.env.ZG_REDIS_URL ?? 'redis://127.0.0.1:6379';
const key = `zgb_${Date.now()}_absent:`;

for (const timeout of [0, 1_000, 0, 1_000, 0, 1_000]) {
  const redis = new Redis(url, {
    enableAutoPipelining: true,
    maxRetriesPerRequest: 2,
    ...(timeout > 0 ? { commandTimeout: timeout } : {}),
  });
  try {
    await redis.ping();
    const cpu = process.cpuUsage();
    const start = process.hrtime.bigint();
    for (let i = 0; i < COMMANDS; i += 50) {
      await Promise.all(Array.from({ length: 50 }, (_, k) => redis.get(`${key}${(i + k) % 100}`)));
    }
    const used = process.cpuUsage(cpu);
    const wall = Number(process.hrtime.bigint() - start) / 1e3 / COMMANDS;
    const label = timeout > 0 ? `timeout ${timeout} ms` : 'no timeout';
    console.log(
      `${label.padEnd(16)} ${((used.user + used.system) / COMMANDS).toFixed(2)} µs CPU, ${wall.toFixed(2)} µs wall per command`,
    );
  } finally {
    redis.disconnect();
  }
}
