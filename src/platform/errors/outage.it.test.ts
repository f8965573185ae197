import { sql } from 'kysely';
import { describe, expect, it } from 'vitest';
import { createMysqlDatabase } from '../../../test/rig/resources.js';
import { tcpProxy } from '../../../test/rig/tcp-proxy.js';
import { openMysql } from '../db/database.js';
import { isDependencyOutage } from './outage.js';

describe('a MySQL connection lost in a transaction', () => {
  it('is an outage (503), though the failed ROLLBACK is what the transaction throws', async () => {
    const database = await createMysqlDatabase();
    const proxy = await tcpProxy(new URL(database.url));
    const db = await openMysql(proxy.url, 1);
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
