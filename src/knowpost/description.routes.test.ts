import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify';
import { request as httpRequest } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { AuthGuards } from '../auth/auth.guard.js';
import { installErrorHandling } from '../platform/http/error-handler.js';
import type { RateLimiter } from '../platform/ratelimit/ratelimit.js';
import { descriptionRoutes } from './description.routes.js';

const signedIn: AuthGuards = {
  required: async (request: FastifyRequest) => {
    (request as unknown as { principal: unknown }).principal = { userId: 7 };
  },
  optional: async () => undefined,
};
const unlimited = { hit: async () => ({ allowed: true, retryAfterMs: 0 }) } as unknown as RateLimiter;
const ROUTE = '/api/v1/knowposts/description/suggest';

/** Asks the route on `port` for a description of `content` (or sends `raw` as the body). */
function ask(port: number, content: string, raw?: string): Promise<Response> {
  return fetch(`http://127.0.0.1:${port}${ROUTE}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: raw ?? JSON.stringify({ content }),
  });
}

/** Sends a whole request for `content` and hangs up `afterMs` later, after calling `before`. */
async function askAndHangUp(
  port: number,
  content: string,
  afterMs: number,
  before?: () => void,
): Promise<void> {
  const body = JSON.stringify({ content });
  const req = httpRequest({
    port,
    method: 'POST',
    path: ROUTE,
    headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
  });
  req.on('error', () => undefined);
  req.end(body);
  await new Promise((resolve) => setTimeout(resolve, afterMs));
  before?.();
  req.destroy();
}

describe(descriptionRoutes.name, () => {
  const apps: ReturnType<typeof Fastify>[] = [];
  afterEach(async () => {
    for (const app of apps.splice(0)) await app.close();
  });

  async function serve(
    suggest: (signal: AbortSignal | undefined, content: string) => Promise<string>,
    options: {
      maxBodyBytes?: number;
      limiter?: RateLimiter;
      logs?: object[];
      maxInFlight?: number;
      guards?: AuthGuards;
      bodyDeadlineMs?: number;
      onRequest?: (request: FastifyRequest, reply: FastifyReply) => Promise<void>;
    } = {},
  ) {
    const logs = options.logs;
    const app = logs
      ? Fastify({
          logger: { level: 'info', stream: { write: (line: string) => logs.push(JSON.parse(line)) } },
        })
      : Fastify();
    apps.push(app);
    installErrorHandling(app);
    if (options.onRequest) app.addHook('onRequest', options.onRequest);
    app.decorateRequest('principal', null);
    await app.register(
      descriptionRoutes({
        describer: {
          suggest: async (content, signal) => ({
            description: await suggest(signal, content),
            source: 'extractive',
          }),
        },
        guards: options.guards ?? signedIn,
        limiter: options.limiter ?? unlimited,
        perUserPerMinute: 10,
        perUserPerDay: 3,
        maxBodyBytes: options.maxBodyBytes ?? 1024 * 1024,
        ...(options.maxInFlight !== undefined && { maxInFlight: options.maxInFlight }),
        ...(options.bodyDeadlineMs !== undefined && { bodyDeadlineMs: options.bodyDeadlineMs }),
      }),
    );
    await app.listen({ host: '127.0.0.1', port: 0 });
    return (app.server.address() as AddressInfo).port;
  }

  it('stops the model call when the caller hangs up, and only then', async () => {
    let signal: AbortSignal | undefined;
    let aborted!: () => void;
    const abortSeen = new Promise<void>((resolve) => (aborted = resolve));
    const logs: { level?: number; msg?: string }[] = [];
    const port = await serve(
      (s) => {
        signal = s;
        return new Promise<string>((resolve, reject) => {
          const timer = setTimeout(() => resolve('late'), 5_000);
          s?.addEventListener('abort', () => {
            clearTimeout(timer);
            reject(s.reason as Error); // as the suggesters do
            aborted();
          });
        });
      },
      { logs },
    );
    await askAndHangUp(port, '# A post\n\nSome text.', 200, () =>
      // The body was read long ago: still running.
      expect(signal?.aborted).toBe(false),
    );
    await abortSeen;
    expect(signal?.aborted).toBe(true);
    // Logged as what it is, not as a failure of the service.
    await expect
      .poll(() => logs.some((l) => l.msg === 'description request abandoned by its caller'))
      .toBe(true);
    expect(logs.filter((l) => (l.level ?? 0) >= 50)).toEqual([]);
  });

  it('writes only so many descriptions at once, and takes more once those are done', async () => {
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const port = await serve(
      async (_signal, content) => {
        if (content === 'slow') await held;
        return content;
      },
      { maxInFlight: 1 },
    );
    const first = ask(port, 'slow');
    await new Promise((resolve) => setTimeout(resolve, 100));
    const refused = await ask(port, 'fast');
    expect(refused.status).toBe(429);
    expect(refused.headers.get('retry-after')).toBe('1');
    expect(await refused.json()).toMatchObject({ code: 'RATE_LIMITED' });
    release();
    expect(await (await first).json()).toEqual({ description: 'slow' });
    expect(await (await ask(port, 'fast')).json()).toEqual({ description: 'fast' });
    // A refused body (not JSON) frees its place too.
    const bad = await ask(port, '', '{');
    expect(bad.status).toBe(400);
    expect(await (await ask(port, 'again')).json()).toEqual({ description: 'again' });
  });

  it('answers 408 to a body that does not arrive in time, and gives its place back', async () => {
    const logs: object[] = [];
    const port = await serve(async (_signal, content) => content, {
      maxInFlight: 1,
      bodyDeadlineMs: 300,
      logs,
      // As the server's own hooks set headers every answer carries (CORS, request id).
      onRequest: async (_request, reply) => void reply.header('x-seen', 'yes'),
    });
    // A body announced whole but sent a byte at a time.
    const socket = connect(port, '127.0.0.1');
    // Reset by the server while still sending.
    socket.on('error', () => undefined);
    await new Promise((resolve) => socket.once('connect', resolve));
    let answer = '';
    socket.on('data', (chunk: Buffer) => (answer += chunk.toString()));
    const closed = new Promise((resolve) => socket.once('close', resolve));
    socket.write(
      `POST ${ROUTE} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{`,
    );
    const trickle = setInterval(() => socket.writable && socket.write(' '), 50);
    const refused = await ask(port, 'meanwhile');
    expect(refused.status).toBe(429);
    await closed;
    clearInterval(trickle);
    expect(answer).toMatch(/^HTTP\/1\.1 408 /);
    expect(answer).toMatch(/\r\nx-seen: yes\r\n/i);
    expect(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))).toMatchObject({
      code: 'REQUEST_TIMEOUT',
    });
    expect(await (await ask(port, 'after')).json()).toEqual({ description: 'after' });
    // A body that came in time is answered, however long the answer took.
    const slow = await serve(
      async (_signal, content) => {
        await new Promise((resolve) => setTimeout(resolve, 500));
        return content;
      },
      { bodyDeadlineMs: 300 },
    );
    expect(await (await ask(slow, 'thought over')).json()).toEqual({ description: 'thought over' });
    expect(logs.filter((l) => (l as { level: number }).level >= 50)).toEqual([]);
  });

  it('keeps no place for a caller who left while being signed in, and asks no model for it', async () => {
    const calls: string[] = [];
    let asUser = 7;
    const slowGuard: AuthGuards = {
      required: async (request: FastifyRequest) => {
        (request as unknown as { principal: unknown }).principal = { userId: asUser++ };
        await new Promise((resolve) => setTimeout(resolve, 100));
      },
      optional: async () => undefined,
    };
    const port = await serve(
      async (_signal, content) => {
        calls.push(content);
        return content;
      },
      { maxInFlight: 1, guards: slowGuard },
    );
    for (let i = 0; i < 3; i++) {
      await askAndHangUp(port, `left ${i}`, 30);
      await new Promise((resolve) => setTimeout(resolve, 150));
    }
    const res = await ask(port, 'stayed');
    expect(await res.json()).toEqual({ description: 'stayed' });
    expect(calls).toEqual(['stayed']);
  });

  it('answers requests sent one after another on one connection (pipelined), and frees their places', async () => {
    const calls: string[] = [];
    const port = await serve(
      async (signal, content) => {
        signal?.throwIfAborted(); // as the suggesters do
        calls.push(content);
        await new Promise((resolve) => setTimeout(resolve, 50));
        return content;
      },
      { maxInFlight: 2 },
    );
    const request = (content: string) => {
      const body = JSON.stringify({ content });
      return (
        `POST /api/v1/knowposts/description/suggest HTTP/1.1\r\nHost: x\r\n` +
        `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`
      );
    };
    const received = await new Promise<string>((resolve) => {
      const socket = connect(port, '127.0.0.1');
      let text = '';
      socket.on('data', (chunk: Buffer) => {
        text += chunk.toString('utf8');
        if ((text.match(/HTTP\/1\.1 /g) ?? []).length === 2 && text.endsWith('}')) socket.end();
      });
      socket.on('close', () => resolve(text));
      socket.write(request('first') + request('second'));
    });
    expect(received.match(/HTTP\/1\.1 \d+/g)).toEqual(['HTTP/1.1 200', 'HTTP/1.1 200']);
    expect(received).toContain('{"description":"second"}');
    expect(calls.sort()).toEqual(['first', 'second']);
    const again = await ask(port, 'third');
    expect(await again.json()).toEqual({ description: 'third' });
  });

  it('gives one caller at most two places, and a refusal for want of one does not count against their limits', async () => {
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let hits = 0;
    const counting = {
      hit: async () => {
        hits++;
        return { allowed: true, retryAfterMs: 0 };
      },
    } as unknown as RateLimiter;
    const port = await serve(
      async (_signal, content) => {
        if (content === 'slow') await held;
        return content;
      },
      { limiter: counting },
    );
    const first = [ask(port, 'slow'), ask(port, 'slow')];
    await new Promise((resolve) => setTimeout(resolve, 100));
    const hitsBefore = hits;
    const third = await ask(port, 'fast');
    expect(third.status).toBe(429);
    expect(hits).toBe(hitsBefore); // the per-minute and per-day limits were not charged
    release();
    for (const answer of await Promise.all(first)) expect(answer.status).toBe(200);
    expect(await (await ask(port, 'fast')).json()).toEqual({ description: 'fast' });
  });

  it('answers a caller who waits', async () => {
    let signal: AbortSignal | undefined;
    const port = await serve(async (s) => {
      signal = s;
      return 'A post';
    });
    const res = await ask(port, '# A post');
    expect(await res.json()).toEqual({ description: 'A post' });
    expect(signal?.aborted).toBe(false);
  });

  it('takes a post as long as a post body may be, and refuses a body over the limit with 413', async () => {
    const lengths: number[] = [];
    const port = await serve(
      async (_signal, content) => {
        lengths.push(content.length);
        return 'A post';
      },
      { maxBodyBytes: 3 * 1024 * 1024 },
    );
    const post = (content: string) => ask(port, content);
    const long = `# A post\n\n${'Some text about counters.\n'.repeat(100_000)}`;
    const accepted = await post(long);
    expect(accepted.status).toBe(200);
    expect(lengths).toEqual([long.length]);
    const tooLong = await post('x'.repeat(3 * 1024 * 1024));
    expect(tooLong.status).toBe(413);
    expect(lengths.length).toBe(1);
  });

  it('holds a caller to the daily limit too', async () => {
    const hits: { key: string; limit: number; windowMs: number }[] = [];
    const counting = {
      hit: async (key: string, limit: number, windowMs: number) => {
        hits.push({ key, limit, windowMs });
        return { allowed: !(key.startsWith('describe-day:') && hits.length > 4), retryAfterMs: 1_000 };
      },
    } as unknown as RateLimiter;
    const port = await serve(async () => 'A post', { limiter: counting });
    const status = async () => (await ask(port, '# A post\n\nSome text.')).status;
    expect([await status(), await status(), await status()]).toEqual([200, 200, 429]);
    expect(hits.slice(0, 2)).toEqual([
      { key: 'describe:7', limit: 10, windowMs: 60_000 },
      { key: 'describe-day:7', limit: 3, windowMs: 86_400_000 },
    ]);
  });

  it('refuses a caller over the rate before reading the body', async () => {
    let asked = 0;
    const refusing = {
      hit: async () => ({ allowed: false, retryAfterMs: 30_000 }),
    } as unknown as RateLimiter;
    const port = await serve(
      async () => {
        asked++;
        return 'A post';
      },
      { limiter: refusing },
    );
    // The headers promise a body that never comes: only an answer given before reading it arrives.
    const status = await new Promise<number>((resolve, reject) => {
      const req = httpRequest({
        port,
        method: 'POST',
        path: '/api/v1/knowposts/description/suggest',
        headers: { 'content-type': 'application/json', 'content-length': 1_000_000 },
      });
      req.on('response', (res) => {
        resolve(res.statusCode ?? 0);
        req.destroy();
      });
      req.on('error', reject);
      setTimeout(() => {
        req.destroy();
        reject(new Error('no answer before the body'));
      }, 3_000).unref();
      req.write('{"content":"');
    });
    expect(status).toBe(429);
    expect(asked).toBe(0);
  });
});
