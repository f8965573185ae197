import { sql } from 'kysely';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createMysqlDatabase } from '../../../test/rig/resources.js';
import { tcpProxy } from '../../../test/rig/tcp-proxy.js';
import { isContention, isDependencyOutage } from '../errors/outage.js';
import { openMysql, type Db } from './database.js';
import { MysqlDeadlineError } from './mysql-deadlines.js';

const TIMEOUT_MS = 400;

/** How long `work` took to settle, and its error (undefined when it resolved). */
async function timed(work: () => Promise<unknown>): Promise<{ ms: number; error: unknown }> {
  const started = performance.now();
  const error = await work().then(
    () => undefined,
    (err: unknown) => err,
  );
  return { ms: performance.now() - started, error };
}

describe('MySQL deadlines: a primary that vanishes without resetting its connections', () => {
  let database: Awaited<ReturnType<typeof createMysqlDatabase>>;
  let proxy: Awaited<ReturnType<typeof tcpProxy>>;
  let db: Db;

  beforeEach(async () => {
    database = await createMysqlDatabase();
    proxy = await tcpProxy(new URL(database.url));
    db = await openMysql(proxy.url, 1, TIMEOUT_MS);
  });

  afterEach(async () => {
    await db.close().catch(() => undefined);
    await proxy.close();
    await database.drop();
  });

  it('fails a statement with no answer within the deadline as an outage, then serves again once it is back', async () => {
    await sql`SELECT 1`.execute(db.kysely);
    proxy.freeze();
    const lost = await timed(() => sql`SELECT 2`.execute(db.kysely));
    expect(lost.error).toBeInstanceOf(MysqlDeadlineError);
    expect(isDependencyOutage(lost.error)).toBe(true);
    expect(lost.ms).toBeGreaterThanOrEqual(TIMEOUT_MS - 20);
    expect(lost.ms).toBeLessThan(TIMEOUT_MS + 1_000);

    // The only connection went with its statement; a new one cannot be made while the host is gone.
    const waiting = await timed(() => sql`SELECT 3`.execute(db.kysely));
    expect(waiting.error).toBeInstanceOf(MysqlDeadlineError);
    expect(waiting.ms).toBeLessThan(TIMEOUT_MS + 1_000);

    proxy.thaw();
    // Back once the connection attempt made while it was gone has timed out too.
    const started = performance.now();
    await expect
      .poll(() => sql<{ n: number }>`SELECT 4 AS n`.execute(db.kysely).then((r) => r.rows, String), {
        timeout: 3_000,
      })
      .toEqual([{ n: 4 }]);
    expect(performance.now() - started).toBeLessThan(2 * TIMEOUT_MS + 1_000);
  });

  it('ends a transaction whose statement has no answer within about twice the deadline, as an outage', async () => {
    await db.kysely.schema
      .createTable('t')
      .addColumn('id', 'integer', (c) => c.primaryKey())
      .execute();
    const lost = await timed(() =>
      db.kysely.transaction().execute(async (trx) => {
        await sql`INSERT INTO t (id) VALUES (1)`.execute(trx);
        proxy.freeze();
        await sql`INSERT INTO t (id) VALUES (2)`.execute(trx);
      }),
    );
    expect(isDependencyOutage(lost.error)).toBe(true);
    expect(lost.ms).toBeLessThan(2 * TIMEOUT_MS + 1_000);

    proxy.thaw();
    // The server rolled back the transaction of the connection that went away.
    await expect
      .poll(async () => (await sql<{ n: number }>`SELECT COUNT(*) AS n FROM t`.execute(db.kysely)).rows[0]?.n)
      .toBe(0);
  });

  it('bounds the wait for a pooled connection and hands one that comes late back to the pool', async () => {
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const holder = db.kysely.transaction().execute(async (trx) => {
      await sql`SELECT 1`.execute(trx);
      await held;
    });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const waiting = await timed(() => sql`SELECT 2`.execute(db.kysely));
    expect(waiting.error).toBeInstanceOf(MysqlDeadlineError);
    expect((waiting.error as Error).message).toMatch(/no MySQL connection of the pool came free/);
    expect(waiting.ms).toBeLessThan(TIMEOUT_MS + 1_000);

    release();
    await holder;
    // The pool's only connection was handed to the request that gave up; it must be free again.
    const rows = await sql<{ n: number }>`SELECT 5 AS n`.execute(db.kysely);
    expect(rows.rows).toEqual([{ n: 5 }]);
  });

  it('leaves statements alone when no deadline is set', async () => {
    const patient = await openMysql(proxy.url, 1, 0);
    try {
      await sql`SELECT 1`.execute(patient.kysely);
      proxy.freeze();
      const pending = sql`SELECT 2`.execute(patient.kysely);
      const outcome = await Promise.race([
        pending.then(
          () => 'answered',
          () => 'failed',
        ),
        new Promise((resolve) => setTimeout(() => resolve('still waiting'), TIMEOUT_MS * 2)),
      ]);
      expect(outcome).toBe('still waiting');
      pending.catch(() => undefined);
    } finally {
      proxy.cut();
      await patient.close().catch(() => undefined);
    }
  });
});

describe('MySQL deadlines: statements on a server that answers', () => {
  it('has the server end a statement at the deadline, so it does not run on after the 503', async () => {
    const database = await createMysqlDatabase();
    const db = await openMysql(database.url, 1, TIMEOUT_MS);
    const direct = await openMysql(database.url, 1);
    try {
      const lost = await timed(() => sql`SELECT SLEEP(30)`.execute(db.kysely));
      expect(isDependencyOutage(lost.error)).toBe(true);
      expect(lost.ms).toBeLessThan(TIMEOUT_MS + 1_000);
      const running = async () =>
        Number(
          (
            await sql<{ n: number }>`SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST
              WHERE INFO LIKE 'SELECT SLEEP(30)%'`.execute(direct.kysely)
          ).rows[0]?.n,
        );
      await expect.poll(running, { timeout: 3_000 }).toBe(0);
    } finally {
      await direct.close();
      await db.close();
      await database.drop();
    }
  });
});

describe('MySQL deadlines: lock waits', () => {
  it('end a wait for a row lock as contention, well before the deadline gives the connection up', async () => {
    const database = await createMysqlDatabase();
    // Lock waits of half the deadline: 2 s.
    const db = await openMysql(database.url, 2, 4_000);
    try {
      await db.kysely.schema
        .createTable('t')
        .addColumn('id', 'integer', (c) => c.primaryKey())
        .execute();
      await sql`INSERT INTO t (id) VALUES (1)`.execute(db.kysely);
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      let locked!: () => void;
      const lockTaken = new Promise<void>((resolve) => (locked = resolve));
      const holder = db.kysely.transaction().execute(async (trx) => {
        await sql`SELECT id FROM t WHERE id = 1 FOR UPDATE`.execute(trx);
        locked();
        await held;
      });
      await lockTaken;
      const waited = await timed(() => sql`UPDATE t SET id = 2 WHERE id = 1`.execute(db.kysely));
      release();
      await holder;
      expect(isContention(waited.error)).toBe(true);
      expect(waited.ms).toBeGreaterThan(1_500);
      expect(waited.ms).toBeLessThan(3_500);
    } finally {
      await db.close();
      await database.drop();
    }
  });
});
