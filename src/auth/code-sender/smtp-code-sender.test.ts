import type { AddressInfo } from 'node:net';
import { networkInterfaces } from 'node:os';
import { SMTPServer } from 'smtp-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { minutesLeft } from './code-sender.js';
import { isLoopback, refusesRecipient, SmtpCodeSender } from './smtp-code-sender.js';

/** An error as nodemailer's SMTP connection formats one (`_formatError`). */
function smtpError(command: string, response: string, code = 'EENVELOPE') {
  const responseCode = Number(/^\d+/.exec(response)?.[0]);
  return Object.assign(new Error(`failed: ${response}`), { code, command, response, responseCode });
}

describe(refusesRecipient.name, () => {
  it('tells a refused recipient from a mail server failing as a whole', () => {
    expect(refusesRecipient(smtpError('RCPT TO', '550 5.1.1 <nobody@b.cd>: user unknown'))).toBe(true);
    expect(refusesRecipient(smtpError('RCPT TO', '450 4.2.0 greylisted, try again later'))).toBe(true);
    expect(refusesRecipient(smtpError('RCPT TO', '554 5.7.1 relay access denied'))).toBe(true);
    // The sender, the message or the connection: the channel's trouble whoever the recipient is.
    expect(refusesRecipient(smtpError('MAIL FROM', '550 5.7.0 sender not allowed'))).toBe(false);
    expect(refusesRecipient(smtpError('MAIL FROM', '530 5.7.0 authentication required'))).toBe(false);
    expect(refusesRecipient(smtpError('DATA', '554 transaction failed'))).toBe(false);
    expect(refusesRecipient(Object.assign(new Error('connect ECONNREFUSED'), { code: 'ESOCKET' }))).toBe(
      false,
    );
    expect(refusesRecipient(null)).toBe(false);
  });
});

describe(minutesLeft.name, () => {
  it('says the whole minutes a code has left, never more', () => {
    expect([300, 299, 120, 119, 90, 60, 59].map(minutesLeft)).toEqual([5, 4, 2, 1, 1, 1, 1]);
  });
});

/** The first address of this machine that is not a loopback one, to reach a server as a remote one would. */
function outsideAddress(): string | undefined {
  for (const addresses of Object.values(networkInterfaces()))
    for (const a of addresses ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  return undefined;
}

describe('SMTP without STARTTLS', () => {
  const address = outsideAddress();
  let server: SMTPServer;
  let port = 0;
  const seen: string[] = [];

  beforeAll(async () => {
    server = new SMTPServer({
      disabledCommands: ['STARTTLS'],
      allowInsecureAuth: true,
      logger: false,
      onAuth(auth, _session, callback) {
        seen.push(`auth ${auth.username}`);
        callback(null, { user: auth.username });
      },
      onData(stream, _session, callback) {
        stream.resume();
        stream.on('end', () => {
          seen.push('data');
          callback();
        });
      },
    });
    await new Promise<void>((ok) => server.listen(0, '0.0.0.0', ok));
    port = (server.server.address() as AddressInfo).port;
  });
  afterAll(() => new Promise<void>((ok) => server.close(() => ok())));

  const send = async (url: string) => {
    const sender = await SmtpCodeSender.create(url, 'Zhiguang <no-reply@zhiguang.test>');
    try {
      await sender.send({
        identifierType: 'EMAIL',
        identifier: 'a@example.test',
        scene: 'LOGIN',
        code: '123456',
        expireSeconds: 300,
      });
    } finally {
      await sender.close();
    }
  };

  it('neither signs in nor sends to a server elsewhere', async () => {
    // Another machine is played by this one's outside address: without one, say so rather than skip.
    if (address === undefined) throw new Error('this test needs a non-loopback IPv4 address on this machine');
    seen.length = 0;
    await expect(send(`smtp://mailer:s3cret@${address}:${port}`)).rejects.toThrow(/STARTTLS/);
    expect(seen).toEqual([]);
    // Unless plaintext is allowed in so many words.
    await send(`smtp://mailer:s3cret@${address}:${port}?tls=optional`);
    expect(seen).toEqual(['auth mailer', 'data']);
  });

  it('sends to this machine itself', async () => {
    seen.length = 0;
    await send(`smtp://mailer:s3cret@127.0.0.1:${port}`);
    expect(seen).toEqual(['auth mailer', 'data']);
    const local = [
      'localhost',
      'LOCALHOST',
      'localhost.',
      '127.0.0.2',
      '127.0.0.1.',
      '[::1]',
      '[::ffff:7f00:1]',
    ];
    expect(local.filter((host) => !isLoopback(host))).toEqual([]);
    const elsewhere = [
      '192.0.2.2',
      '[fd00::2]',
      'mail',
      'localhost.example',
      '[::ffff:c000:202]',
      '128.0.0.1',
    ];
    expect(elsewhere.filter(isLoopback)).toEqual([]);
  });
});
