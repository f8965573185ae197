import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { Worker } from 'node:worker_threads';
import { CompiledQuery, Kysely, sql } from 'kysely';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { createNodeSqliteDialect, nodeSqliteDatabase } from './node-sqlite-dialect.js';

interface Tables {
  t: { id: number; v: string };
}

describe(createNodeSqliteDialect.name, () => {
  let kysely: Kysely<Tables> | undefined;

  afterEach(async () => {
    vi.restoreAllMocks();
    await kysely?.destroy();
    kysely = undefined;
  });

  const open = async (cacheSize?: number) => {
    const prepare = vi.spyOn(DatabaseSync.prototype, 'prepare');
    const { dialect } = createNodeSqliteDialect(':memory:', cacheSize);
    kysely = new Kysely<Tables>({ dialect });
    await sql`CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`.execute(kysely);
    for (let id = 1; id <= 5; id++)
      await kysely
        .insertInto('t')
        .values({ id, v: `v${id}` })
        .execute();
    prepare.mockClear();
    return { db: kysely, prepare };
  };

  it('prepares a query once and reuses it with other parameters', async () => {
    const { db, prepare } = await open();
    const byId = (id: number) => db.selectFrom('t').select('v').where('id', '=', id).executeTakeFirst();
    expect(await byId(1)).toEqual({ v: 'v1' });
    expect(await byId(2)).toEqual({ v: 'v2' });
    expect(await byId(9)).toBeUndefined();
    expect(prepare).toHaveBeenCalledTimes(1);
    await db.updateTable('t').set({ v: 'x' }).where('id', '=', 3).execute();
    await db.updateTable('t').set({ v: 'y' }).where('id', '=', 4).execute();
    expect(prepare).toHaveBeenCalledTimes(2);
    expect(await byId(3)).toEqual({ v: 'x' });
  });

  it('evicts the least recently used statement beyond its bound', async () => {
    const { db, prepare } = await open(2);
    const q = (n: number) => db.executeQuery(CompiledQuery.raw(`SELECT ${n} AS n`));
    await q(1);
    await q(2);
    await q(1); // 1 is now the most recently used
    await q(3); // evicts 2
    expect(prepare).toHaveBeenCalledTimes(3);
    await q(1);
    expect(prepare).toHaveBeenCalledTimes(3);
    await q(2);
    expect(prepare).toHaveBeenCalledTimes(4);
  });
});

describe(nodeSqliteDatabase.name, () => {
  it('gives an iteration its own statement, so running the same SQL meanwhile does not reset it', () => {
    const raw = new DatabaseSync(':memory:');
    raw.exec('CREATE TABLE t (id INTEGER PRIMARY KEY)');
    raw.exec('INSERT INTO t (id) VALUES (1), (2), (3), (4)');
    const sut = nodeSqliteDatabase(raw);
    const text = 'SELECT id FROM t WHERE id > ? ORDER BY id';
    const seen: unknown[] = [];
    for (const row of sut.prepare(text).iterate([0])) {
      seen.push((row as { id: number }).id);
      expect(sut.prepare(text).all([2])).toEqual([{ id: 3 }, { id: 4 }]);
    }
    expect(seen).toEqual([1, 2, 3, 4]);
    sut.close();
  });

  it('keeps at most its bound and drops every statement on close', () => {
    const raw = new DatabaseSync(':memory:');
    const sut = nodeSqliteDatabase(raw, 3);
    for (let n = 0; n < 10; n++) sut.prepare(`SELECT ${n % 5} AS n`).all([]);
    expect(sut.cachedStatements).toBe(3);
    sut.close();
    expect(sut.cachedStatements).toBe(0);
    expect(raw.isOpen).toBe(false);
  });

  it('has a transaction that reads and then writes wait for a write lock another connection holds', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'zg-sqlite-'));
    const path = join(dir, 'db.sqlite');
    let holder: Worker | undefined;
    const kysely = new Kysely<Tables>({ dialect: createNodeSqliteDialect(path).dialect });
    try {
      await sql`CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)`.execute(kysely);
      // Another connection (a CLI command beside the server) holds the write lock for 300 ms.
      holder = new Worker(
        `const { DatabaseSync } = require('node:sqlite');
         const { parentPort, workerData } = require('node:worker_threads');
         const db = new DatabaseSync(workerData);
         db.exec('BEGIN IMMEDIATE');
         db.exec("INSERT INTO t (id, v) VALUES (1, 'other')");
         parentPort.postMessage('locked');
         setTimeout(() => { db.exec('COMMIT'); db.close(); parentPort.postMessage('committed'); }, 300);`,
        { eval: true, workerData: path },
      );
      const messages: string[] = [];
      await new Promise<void>((resolve, reject) => {
        holder!.on('message', (m: string) => {
          messages.push(m);
          if (m === 'locked') resolve();
        });
        holder!.on('error', reject);
      });
      const wrote = await kysely.transaction().execute(async (trx) => {
        const seen = await trx.selectFrom('t').select('id').execute();
        await trx
          .insertInto('t')
          .values({ id: 2, v: `after ${seen.length}` })
          .execute();
        return seen.length;
      });
      // The transaction began once the other one had committed, and saw its row.
      expect(wrote).toBe(1);
      expect(await kysely.selectFrom('t').select(['id', 'v']).orderBy('id').execute()).toEqual([
        { id: 1, v: 'other' },
        { id: 2, v: 'after 1' },
      ]);
    } finally {
      await holder?.terminate();
      await kysely.destroy();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
