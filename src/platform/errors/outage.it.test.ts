import { createServer, connect, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { createMysqlDatabase } from '../../../test/rig/resources.js';
import { openMysql } from '../db/database.js';
import { isDependencyOutage } from './outage.js';

/** A TCP proxy to MariaDB whose connections can be cut. */
async function cuttableProxy(target: URL) {
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    const upstream = connect(Number(target.port || 3306), target.hostname);
    for (const [a, b] of [
      [client, upstream],
      [upstream, client],
    ] as const) {
      a.on('error', () => b.destroy());
      a.on('close', () => b.destroy());
      a.pipe(b);
      sockets.add(a);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    cut: () => {
      for (const socket of sockets) socket.resetAndDestroy();
      sockets.clear();
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

describe('a MySQL connection lost in a transaction', () => {
  it('is an outage (503), though the failed ROLLBACK is what the transaction throws', async () => {
    const database = await createMysqlDatabase();
    const target = new URL(database.url);
    const proxy = await cuttableProxy(target);
    const url = new URL(database.url);
    url.hostname = '127.0.0.1';
    url.port = String(proxy.port);
    const db = await openMysql(url.toString(), 1);
    try {
      const failure = await db.kysely
        .transaction()
        .execute(async (trx) => {
          await sql`SELECT 1`.execute(trx);
          proxy.cut();
          await sql`SELECT 2`.execute(trx);
        })
        .catch((err: unknown) => err);
      expect(failure).toBeInstanceOf(Error);
      expect({ message: (failure as Error).message, outage: isDependencyOutage(failure) }).toEqual({
        message: expect.any(String),
        outage: true,
      });
    } finally {
      await db.close().catch(() => undefined);
      await proxy.close();
      await database.drop();
    }
  });
});
