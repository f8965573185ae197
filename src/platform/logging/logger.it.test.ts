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

  it("leaves the mailboxes of a refused mail out, keeping the server's answer and codes", () => {
    const { lines, log } = capture();
    // As nodemailer reports a message whose every recipient the server refused.
    const answer = '550 5.1.1 <someone.private@mail.example.test>: Recipient address rejected';
    const refused = Object.assign(new Error(`Can't send mail - all recipients were rejected: ${answer}`), {
      code: 'EENVELOPE',
      command: 'RCPT TO',
      response: answer,
      responseCode: 550,
      rejected: ['someone.private@mail.example.test'],
      rejectedErrors: [
        Object.assign(new Error(`Recipient command failed: ${answer}`), {
          recipient: 'someone.private@mail.example.test',
        }),
      ],
      envelope: { from: 'codes@zhiguang.test', to: ['someone.private@mail.example.test'] },
    });
    log.error(
      { err: new Error('The verification code could not be delivered', { cause: refused }) },
      'first',
    );
    log.error({ err: refused }, 'second');
    const text = lines.join('');
    expect(text).not.toContain('someone.private');
    expect(JSON.parse(lines[0]!)).toMatchObject({
      err: { message: expect.stringContaining('<…@mail.example.test>') },
    });
    const second = JSON.parse(lines[1]!) as { err: Record<string, unknown> };
    expect(second.err).toMatchObject({
      code: 'EENVELOPE',
      responseCode: 550,
      response: '550 5.1.1 <…@mail.example.test>: Recipient address rejected',
    });
    expect(Object.keys(second.err)).not.toContain('rejected');
  });

  it('looks for addresses in time linear in the text, however long a run without one', () => {
    const { lines, log } = capture();
    const started = performance.now();
    log.error({ err: new Error(`${'x'.repeat(200_000)} ${'y'.repeat(200_000)}@example.test`) }, 'long');
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(lines[0]).toContain(' …@example.test');
    expect(lines[0]).not.toContain('yyyy');
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
