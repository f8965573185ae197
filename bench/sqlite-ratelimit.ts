/**
 * The embedded rate limiter's cost per hit, one at a time and 50 at once (as concurrent requests
 * make them), on a fresh database file. A diagnostic beside `bench/run.ts`.
 *
 *   npx tsx bench/sqlite-ratelimit.ts
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { migrate, openSqlite } from '../src/platform/db/database.js';
import { SqliteRateLimiter } from '../src/platform/ratelimit/sqlite-ratelimit.js';

const HITS = 20_000;
const dir = mkdtempSync(join(tmpdir(), 'zg-bench-rl-'));
const db = openSqlite(join(dir, 'zhiguang.db'));
try {
  await migrate(db);
  const limiter = new SqliteRateLimiter(db);
  const hit = (i: number) => limiter.hit(`toggle:${i % 20}`, 1e9, 60_000);
  const measure = async (label: string, run: () => Promise<void>) => {
    const cpu = process.cpuUsage();
    const start = process.hrtime.bigint();
    await run();
    const used = process.cpuUsage(cpu);
    const wall = Number(process.hrtime.bigint() - start) / 1e3 / HITS;
    const cpuPerHit = (used.user + used.system) / HITS;
    console.log(`${label.padEnd(12)} ${wall.toFixed(1)} µs wall, ${cpuPerHit.toFixed(1)} µs CPU per hit`);
  };
  for (let round = 1; round <= 3; round++) {
    await measure('one by one', async () => {
      for (let i = 0; i < HITS; i++) await hit(i);
    });
    await measure('50 at once', async () => {
      for (let i = 0; i < HITS; i += 50) await Promise.all(Array.from({ length: 50 }, (_, k) => hit(i + k)));
    });
  }
} finally {
  await db.close();
  rmSync(dir, { recursive: true, force: true });
}
