import { Writable } from 'node:stream';
import { Redis } from 'ioredis';
import { describe, expect, it } from 'vitest';
import { createConnection } from 'mysql2/promise';
import { services } from '../../../test/rig/resources.js';
import { createLogger } from './logger.js';

function capture() {
  const lines: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      lines.push(chunk.toString());
      done();
    },
  });
  return { lines, log: createLogger('info', stream) };
}

describe(createLogger.name, () => {
  it("keeps a failed Redis command's name and drops its arguments, also from causes", () => {
    const { lines, log } = capture();
    const failed = Object.assign(new Error('READONLY You can not write against a read only replica.'), {
      command: { name: 'set', args: ['zg:vc:code:REGISTER:someone@example.test', '123456'] },
    });
    log.error({ err: new Error('request failed', { cause: failed }) }, 'first');
    log.error({ err: failed }, 'second');
    const text = lines.join('');
    expect(text).not.toContain('someone@example.test');
    expect(text).not.toContain('123456');
    expect(JSON.parse(lines[1]!)).toMatchObject({ err: { command: { name: 'set' }, message: /READONLY/ } });
  });

  it('drops the arguments of an error as ioredis reports it', async () => {
    const { lines, log } = capture();
    const redis = new Redis(services.redisUrl(), {
      lazyConnect: true,
      maxRetriesPerRequest: 0,
    });
    try {
      // A wrong-type reply: ioredis attaches the command, arguments included.
      const err = await redis
        .call('HGET', 'zg-logger-test-secret-key-1f9c', 'secret-field-77ab', 'extra')
        .catch((e: unknown) => e);
      expect((err as { command?: { args?: unknown } }).command?.args).toBeDefined();
      log.error({ err }, 'failed');
    } finally {
      redis.disconnect();
    }
    expect(lines.join('')).not.toContain('secret-field-77ab');
    expect(lines.join('')).not.toContain('zg-logger-test-secret-key-1f9c');
  });

  it("drops a duplicate key's value from MySQL's message", () => {
    const { lines, log } = capture();
    const message = "Duplicate entry '13812345678' for key 'users.uk_phone'";
    const duplicate = Object.assign(new Error(message), {
      code: 'ER_DUP_ENTRY',
      errno: 1062,
      sqlMessage: message,
      sql: "insert into `users` (`phone`) values ('13812345678')",
    });
    log.error({ err: new Error('request failed', { cause: duplicate }) }, 'first');
    log.error({ err: duplicate }, 'second');
    expect(lines.join('')).not.toContain('13812345678');
    expect(JSON.parse(lines[1]!)).toMatchObject({
      err: { code: 'ER_DUP_ENTRY', message: "Duplicate entry '…' for key 'users.uk_phone'" },
    });
  });

  it('drops the statement of an error as mysql2 reports it, values written in', async () => {
    const { lines, log } = capture();
    const conn = await createConnection({ uri: services.mysqlRootUrl() });
    try {
      // A statement the server refuses: mysql2 attaches it with the values in place.
      const err = await conn
        .query('SELECT * FROM zg_logger_no_such_db.users WHERE password_hash = ?', [
          '$scrypt$secret-hash-5d1e',
        ])
        .catch((e: unknown) => e);
      expect((err as { sql?: string }).sql).toContain('secret-hash-5d1e');
      log.error({ err: new Error('request failed', { cause: err }) }, 'first');
      log.error({ err }, 'second');
    } finally {
      await conn.end();
    }
    const text = lines.join('');
    expect(text).not.toContain('secret-hash-5d1e');
    expect(JSON.parse(lines[1]!)).toMatchObject({
      err: { code: 'ER_NO_SUCH_TABLE', errno: expect.any(Number) },
    });
  });
});
