/**
 * What the embedded counter store's seal check (a replay under way or stopped half-way refuses
 * toggles: one `SELECT` of `counter_meta` per group commit) costs next to a toggle: times the check
 * alone, then toggles one at a time (each alone in its commit, the case where the check weighs
 * most), SEAL_ROUNDS rounds (3) of SEAL_TOGGLES toggles (20,000).
 *
 *   npx tsx bench/seal-check.ts
 *
 * Uses a database of its own in a temporary directory, removed at the end.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SqliteCounterStore } from '../src/counter/store/sqlite-counter-store.js';
import { migrate, openSqlite } from '../src/platform/db/database.js';

const rounds = Number(process.env.SEAL_ROUNDS ?? 3);
const toggles = Number(process.env.SEAL_TOGGLES ?? 20_000);
const dir = mkdtempSync(join(tmpdir(), 'zg-seal-bench-'));
const db = openSqlite(join(dir, 'zhiguang.db'));
try {
  await migrate(db);
  const store = new SqliteCounterStore(db);
  const check = db.raw!.prepare(`SELECT 1 AS one FROM counter_meta WHERE k = 'unsealed'`);
  const nsPer = (started: bigint, n: number) => Number(process.hrtime.bigint() - started) / n;
  for (let round = 1; round <= rounds; round++) {
    let started = process.hrtime.bigint();
    for (let i = 0; i < toggles; i++) check.get();
    const checkNs = nsPer(started, toggles);
    started = process.hrtime.bigint();
    for (let i = 0; i < toggles; i++)
      await store.toggle(
        { etype: 'knowpost', eid: String(1_000 + (i % 200)) },
        'like',
        1 + (i % 2_000),
        i % 3 !== 0,
        Date.now(),
      );
    const toggleNs = nsPer(started, toggles);
    console.log(
      `round ${round}: check ${(checkNs / 1000).toFixed(2)} µs, toggle alone in its commit ${(toggleNs / 1000).toFixed(1)} µs (check ${((100 * checkNs) / toggleNs).toFixed(1)} %)`,
    );
  }
} finally {
  await db.close();
  rmSync(dir, { recursive: true, force: true });
}
