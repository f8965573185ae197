import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { RecipientRefusedError, type CodeMessage } from './code-sender.js';
import { WebhookCodeSender } from './webhook-code-sender.js';

const message: CodeMessage = {
  identifierType: 'PHONE',
  identifier: '13800138000',
  scene: 'LOGIN',
  code: '042917',
  expireSeconds: 300,
};

describe(WebhookCodeSender.name, () => {
  let server: Server | undefined;
  async function stop() {
    server?.closeAllConnections();
    await new Promise<void>((ok) => (server ? server.close(() => ok()) : ok()));
    server = undefined;
  }
  afterEach(stop);

  /** A gateway that answers with `answer` and keeps what it was sent. */
  async function gateway(answer: (req: IncomingMessage, res: ServerResponse) => void) {
    const received: { headers: IncomingMessage['headers']; body: unknown }[] = [];
    server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        received.push({ headers: req.headers, body: JSON.parse(Buffer.concat(chunks).toString('utf8')) });
        answer(req, res);
      });
    });
    await new Promise<void>((ok) => server!.listen(0, '127.0.0.1', ok));
    return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/sms`, received };
  }

  it('posts the code as JSON with the bearer token and resolves on a 2xx answer', async () => {
    const { url, received } = await gateway((_req, res) => res.writeHead(202).end('queued'));
    await new WebhookCodeSender({ url, token: 's3cret' }).send(message);
    expect(received).toHaveLength(1);
    expect(received[0]!.headers).toMatchObject({
      authorization: 'Bearer s3cret',
      'content-type': 'application/json',
    });
    expect(received[0]!.body).toEqual({
      to: '13800138000',
      identifierType: 'PHONE',
      scene: 'LOGIN',
      code: '042917',
      expireSeconds: 300,
      text: '【知光】您的登录验证码是 042917，5 分钟内有效。',
    });
  });

  it('rejects any other answer, a redirect, a lost connection and a gateway that does not answer in time', async () => {
    for (const status of [400, 401, 404, 422, 429, 500, 503]) {
      const { url } = await gateway((_req, res) => res.writeHead(status).end());
      const failure = await new WebhookCodeSender({ url }).send(message).then(
        () => null,
        (err: unknown) => err as Error,
      );
      expect(failure?.message).toContain(String(status));
      // Only a refusal of the message itself is told apart from a failing gateway.
      expect(failure instanceof RecipientRefusedError, `status ${status}`).toBe(
        status === 400 || status === 422,
      );
      await stop();
    }
    const moved = await gateway((_req, res) => res.writeHead(302, { location: 'http://127.0.0.1:9/' }).end());
    await expect(new WebhookCodeSender({ url: moved.url }).send(message)).rejects.toThrow('302');
    expect(moved.received).toHaveLength(1);
    await stop();

    const dropped = await gateway((req) => req.socket.destroy());
    await expect(new WebhookCodeSender({ url: dropped.url }).send(message)).rejects.toThrow();
    await stop();

    const silent = await gateway(() => undefined);
    const started = Date.now();
    await expect(new WebhookCodeSender({ url: silent.url, timeoutMs: 200 }).send(message)).rejects.toThrow();
    expect(Date.now() - started).toBeLessThan(2_000);
  });
});
