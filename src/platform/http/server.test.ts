import { connect, type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { Type } from 'typebox';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { plainHttpServer } from '../../../test/rig/fakes.js';
import { Metrics } from '../metrics/metrics.js';
import { opsRoutes } from './ops.routes.js';
import { bareAddress, clientAddress, closeWithin } from './server.js';

describe('the HTTP server while it closes', () => {
  it('finishes a request in flight, answers later ones 503 in the contract shape, and ends their connections', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    app.get('/slow', async () => {
      await held;
      return { done: true };
    });
    app.get('/fast', async () => ({ fast: true }));
    await app.register(opsRoutes(new Metrics(), {}, () => false));
    await app.listen({ host: '127.0.0.1', port: 0 });
    const { port } = app.server.address() as AddressInfo;

    const open = (): { send: (text: string) => boolean; received: () => string; ended: Promise<void> } => {
      const socket = connect(port, '127.0.0.1');
      let received = '';
      socket.on('data', (chunk: Buffer) => (received += chunk.toString('utf8')));
      const ended = new Promise<void>((resolve) => socket.on('close', () => resolve()));
      return { send: (text) => socket.write(text), received: () => received, ended };
    };
    // One request in flight when the close begins; another whose headers are still arriving.
    const busy = open();
    busy.send('GET /slow HTTP/1.1\r\nHost: x\r\n\r\n');
    const late = open();
    late.send('GET /fast HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\n');
    const poll = open();
    poll.send('GET /readyz HTTP/1.1\r\nHost: x\r\n');
    await sleep(50);
    const closed = app.close();
    await sleep(50);
    late.send('\r\n');
    poll.send('\r\n');
    await sleep(50);
    release();
    // Both answers end their connections, so the close does not wait for a keep-alive timeout.
    await Promise.all([busy.ended, late.ended, poll.ended, closed]);

    expect(busy.received()).toMatch(/^HTTP\/1\.1 200 /);
    expect(busy.received()).toContain('{"done":true}');
    expect(late.received()).toMatch(/^HTTP\/1\.1 503 /);
    for (const answer of [busy.received(), late.received()]) {
      expect(answer).toMatch(/\r\nconnection: close\r\n/i);
    }
    expect(late.received()).toMatch(/\r\nretry-after: 1\r\n/i);
    // A web page can read the refusal (and retry) rather than see a network error.
    expect(late.received()).toMatch(/\r\naccess-control-allow-origin: https:\/\/app\.example\r\n/i);
    const text = late.received();
    expect(JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4))).toEqual({
      code: 'UNAVAILABLE',
      message: 'This server is shutting down; try again',
      requestId: expect.any(String),
    });
    // A load balancer's readiness poll is told the server is draining, in that route's shape.
    const polled = poll.received();
    expect(polled).toMatch(/^HTTP\/1\.1 503 /);
    expect(JSON.parse(polled.slice(polled.indexOf('\r\n\r\n') + 4))).toEqual({
      code: 'UNAVAILABLE',
      message: 'This server is shutting down; try again',
      requestId: expect.any(String),
      status: 'draining',
      checks: {},
    });
  });
});

describe('clients that keep their connections busy while the server closes', () => {
  it('get an answer to every request, none a cut connection', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    app.post('/work', async () => {
      await sleep(2);
      return { done: true };
    });
    await app.listen({ host: '127.0.0.1', port: 0 });
    const { port } = app.server.address() as AddressInfo;
    const answers = new Map<number, number>();
    const failures: string[] = [];
    let running = true;
    // Each client sends its next request as soon as it has the answer, on the kept-alive connection.
    const clients = Array.from({ length: 10 }, async () => {
      while (running) {
        try {
          const res = await fetch(`http://127.0.0.1:${port}/work`, { method: 'POST' });
          await res.arrayBuffer();
          answers.set(res.status, (answers.get(res.status) ?? 0) + 1);
        } catch (err) {
          const cause = (err as { cause?: { code?: string } }).cause;
          // Refused: the listener is closed and the request never reached a server; fine.
          if (cause?.code === 'ECONNREFUSED') break;
          failures.push(cause?.code ?? String(err));
          break;
        }
      }
    });
    await sleep(300);
    await closeWithin(app, 5_000);
    running = false;
    await Promise.all(clients);
    expect(failures).toEqual([]);
    expect(answers.get(200)).toBeGreaterThan(0);
  });
});

describe('requests that stop arriving', () => {
  const stalled = (port: number) => {
    const socket = connect(port, '127.0.0.1');
    socket.on('error', () => undefined);
    const ended = new Promise<void>((resolve) => socket.on('close', () => resolve()));
    // A body of 100 bytes, of which one ever comes.
    socket.write(
      'POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{',
    );
    return ended;
  };

  it('have their connections closed once the request timeout passes', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }), {
      requestTimeoutMs: 300,
      timeoutCheckIntervalMs: 50,
    });
    app.post('/echo', async (request) => request.body);
    await app.listen({ host: '127.0.0.1', port: 0 });
    try {
      const started = Date.now();
      await stalled((app.server.address() as AddressInfo).port);
      expect(Date.now() - started).toBeLessThan(2_000);
    } finally {
      await app.close();
    }
  });

  it('hold up a shutdown for the grace given at most', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    app.post('/echo', async (request) => request.body);
    await app.listen({ host: '127.0.0.1', port: 0 });
    const ended = stalled((app.server.address() as AddressInfo).port);
    await sleep(50);
    const started = Date.now();
    await closeWithin(app, 300);
    await ended;
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    expect(Date.now() - started).toBeLessThan(2_000);
  });
});

describe('query parameters sent empty', () => {
  it('take the default when optional, and are refused when required', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    app.get(
      '/page',
      {
        schema: {
          querystring: Type.Object({
            ids: Type.String({ minLength: 1 }),
            page: Type.Optional(Type.Integer({ minimum: 1, default: 1 })),
            cursor: Type.Optional(Type.String({ minLength: 1 })),
          }),
        },
      },
      async (request) => request.query,
    );
    try {
      const answer = await app.inject({ url: '/page?ids=1&page=&cursor=' });
      expect(answer.statusCode).toBe(200);
      expect(answer.json()).toEqual({ ids: '1', page: 1 });
      expect((await app.inject({ url: '/page?ids=1&page=3' })).json()).toEqual({ ids: '1', page: 3 });
      const refused = await app.inject({ url: '/page?ids=&page=2' });
      expect(refused.statusCode).toBe(400);
      expect(refused.json()).toMatchObject({ code: 'BAD_REQUEST' });
    } finally {
      await app.close();
    }
  });
});

describe('JSON bodies', () => {
  it('name prototype keys as the reason a valid JSON body is refused', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    app.post('/echo', async (request) => ({ got: request.body ?? null }));
    try {
      const post = (payload: string) =>
        app.inject({
          method: 'POST',
          url: '/echo',
          payload,
          headers: { 'content-type': 'application/json' },
        });
      const poisoned = await post('{"__proto__":{"admin":true},"bio":"ok"}');
      expect(poisoned.statusCode).toBe(400);
      expect(poisoned.json()).toMatchObject({
        code: 'BAD_REQUEST',
        message: 'body must not contain the keys __proto__ or constructor.prototype',
      });
      const broken = await post('{"bio":');
      expect(broken.statusCode).toBe(400);
      expect(broken.json<{ message: string }>().message).toMatch(/not valid JSON/);
      expect((await post('{"bio":"ok"}')).json()).toEqual({ got: { bio: 'ok' } });
    } finally {
      await app.close();
    }
  });
});

describe('requests the HTTP parser refuses', () => {
  it('are answered in the contract shape and their connections closed', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    app.get('/ok', async () => ({ ok: true }));
    app.get('/slow', async () => {
      await sleep(100);
      return { slow: true };
    });
    await app.listen({ host: '127.0.0.1', port: 0 });
    const { port } = app.server.address() as AddressInfo;
    const exchange = (text: string) =>
      new Promise<string>((resolve) => {
        const socket = connect(port, '127.0.0.1');
        let received = '';
        socket.on('data', (chunk: Buffer) => (received += chunk.toString('utf8')));
        socket.on('error', () => undefined);
        socket.on('close', () => resolve(received));
        socket.write(text);
      });
    const body = (answer: string) => JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as unknown;
    try {
      const framing = await exchange(
        'POST /ok HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n{"a":1}',
      );
      expect(framing).toMatch(/^HTTP\/1\.1 400 /);
      expect(framing).toMatch(/\r\nconnection: close\r\n/i);
      expect(body(framing)).toEqual({
        code: 'BAD_REQUEST',
        message: 'Malformed HTTP request',
        requestId: expect.any(String),
      });
      const big = await exchange(
        `GET /ok HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${'a'.repeat(20_000)}\r\n\r\n`,
      );
      // Behind a request still being answered: no refusal to be read as its answer, the connection ends.
      const behind = await exchange('GET /slow HTTP/1.1\r\nHost: x\r\n\r\nNOT HTTP\r\n\r\n');
      expect(behind).not.toMatch(/Malformed HTTP request/);
      expect(big).toMatch(/^HTTP\/1\.1 431 /);
      expect(body(big)).toEqual({
        code: 'HEADERS_TOO_LARGE',
        message: 'Request headers are too large',
        requestId: expect.any(String),
      });
    } finally {
      await app.close();
    }
  });
});

describe('requests through a proxy', () => {
  const serve = async (trustProxy?: boolean | number) => {
    const lines: { level: number; msg: string }[] = [];
    const app = await plainHttpServer(
      pino({ level: 'info' }, { write: (line: string) => void lines.push(JSON.parse(line)) }),
      trustProxy === undefined ? {} : { trustProxy },
    );
    app.get('/ip', async (request) => ({ ip: request.ip }));
    app.get('/client', async (request) => ({ client: clientAddress(request) }));
    await app.ready();
    return { app, lines };
  };
  const forwarded = { 'x-forwarded-for': '198.51.100.7' };

  it('warns once that a proxy is not trusted, and not when it is', async () => {
    const untrusted = await serve();
    for (let i = 0; i < 3; i++) await untrusted.app.inject({ method: 'GET', url: '/ip', headers: forwarded });
    await untrusted.app.close();
    expect(untrusted.lines.filter((l) => l.msg.includes('not trusted')).map((l) => l.level)).toEqual([40]);

    const trusted = await serve(1);
    const res = await trusted.app.inject({ method: 'GET', url: '/ip', headers: forwarded });
    await trusted.app.close();
    expect(res.json()).toEqual({ ip: '198.51.100.7' });
    expect(trusted.lines.filter((l) => l.msg.includes('not trusted'))).toEqual([]);
  });

  it('takes the client from a forwarded address with a port or in brackets', async () => {
    const { app, lines } = await serve(1);
    const client = async (forwardedFor: string) =>
      (
        await app.inject({
          method: 'GET',
          url: '/client',
          headers: { 'x-forwarded-for': forwardedFor },
          remoteAddress: '10.0.0.9',
        })
      ).json<{ client: string }>().client;
    try {
      expect(await client('198.51.100.7:5555')).toBe('198.51.100.7');
      expect(await client('[2001:db8::1]:443')).toBe('2001:db8::1');
      expect(await client('[2001:db8::2]')).toBe('2001:db8::2');
      expect(await client('2001:db8::3')).toBe('2001:db8::3');
      expect(lines.filter((l) => l.msg.includes('cannot be read'))).toEqual([]);
      // Anything else is the proxy's own address, said once.
      expect(await client('unknown')).toBe('10.0.0.9');
      expect(await client('[198.51.100.7]:80')).toBe('10.0.0.9');
      expect(lines.filter((l) => l.msg.includes('cannot be read')).map((l) => l.level)).toEqual([40]);
    } finally {
      await app.close();
    }
    // With no proxy trusted the header is not read at all: the peer, and no word of it beyond the
    // warning that a proxy is not trusted.
    const untrusted = await serve();
    try {
      const res = await untrusted.app.inject({
        method: 'GET',
        url: '/client',
        headers: { 'x-forwarded-for': 'junk' },
        remoteAddress: '10.0.0.8',
      });
      expect(res.json()).toEqual({ client: '10.0.0.8' });
      expect(untrusted.lines.filter((l) => l.msg.includes('cannot be read'))).toEqual([]);
    } finally {
      await untrusted.app.close();
    }
  });

  it('reads addresses as proxies forward them', () => {
    expect(bareAddress('198.51.100.7')).toBe('198.51.100.7');
    expect(bareAddress('198.51.100.7:1')).toBe('198.51.100.7');
    expect(bareAddress('::ffff:198.51.100.7')).toBe('::ffff:198.51.100.7');
    expect(bareAddress('[::1]:8080')).toBe('::1');
    for (const text of ['', 'unknown', '198.51.100.7:', '1.2.3:4', '[::1]:x', '[::1', '::1]:80', '_hidden'])
      expect({ text, address: bareAddress(text) }).toEqual({ text, address: null });
  });
});

describe('requests from web pages (CORS)', () => {
  const preflight = (origin: string) => ({
    method: 'OPTIONS' as const,
    url: '/thing',
    headers: { origin, 'access-control-request-method': 'POST' },
  });

  it('lets pages of any origin read the answers by default', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    app.post('/thing', async () => ({ ok: true }));
    await app.ready();
    const pre = await app.inject(preflight('https://elsewhere.example'));
    const res = await app.inject({
      method: 'POST',
      url: '/thing',
      headers: { origin: 'https://elsewhere.example' },
    });
    await app.close();
    expect(pre.headers['access-control-allow-origin']).toBe('https://elsewhere.example');
    expect(res.headers['access-control-allow-origin']).toBe('https://elsewhere.example');
    expect(res.headers['access-control-allow-credentials']).toBeUndefined();
    // No answer is to be read as another type than it says it is.
    expect(res.headers['x-content-type-options']).toBe('nosniff');
  });

  it('says a flood of 503s in a line a second, and every 500', async () => {
    const lines: { msg: string; status?: number; heldBack?: number }[] = [];
    const log = pino(
      { level: 'info' },
      { write: (line: string) => void lines.push(JSON.parse(line) as never) },
    );
    const app = await plainHttpServer(log);
    app.get('/down', async () => {
      throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED' });
    });
    app.get('/bug', async () => {
      throw new Error('a bug');
    });
    await app.ready();
    for (let i = 0; i < 20; i++) await app.inject({ method: 'GET', url: '/down' });
    for (let i = 0; i < 2; i++) await app.inject({ method: 'GET', url: '/bug' });
    await app.close();
    const failed = lines.filter((l) => l.msg === 'request failed');
    expect(failed.map((l) => [l.status, l.heldBack])).toEqual([
      [503, 0],
      [500, undefined],
      [500, undefined],
    ]);
  });

  it('marks answers for no cache to keep, unless the route says otherwise', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    app.get('/mine', async () => ({ phone: '13800000000' }));
    app.get('/kept', async (_request, reply) => {
      void reply.header('cache-control', 'public, max-age=300');
      return { key: 'k' };
    });
    await app.ready();
    const mine = await app.inject({ method: 'GET', url: '/mine', headers: { authorization: 'Bearer x' } });
    const anonymous = await app.inject({ method: 'GET', url: '/mine' });
    const missing = await app.inject({ method: 'GET', url: '/nothing' });
    const malformed = await app.inject({ method: 'GET', url: '/mine%zz' });
    const kept = await app.inject({ method: 'GET', url: '/kept' });
    await app.close();
    for (const res of [mine, anonymous, missing, malformed])
      expect(res.headers['cache-control']).toBe('no-store');
    expect(malformed.statusCode).toBe(400);
    expect(kept.headers['cache-control']).toBe('public, max-age=300');
  });

  it('with a list of origins, answers only those', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }), {
      corsOrigins: ['https://zhiguang.example', 'http://localhost:5173'],
    });
    app.post('/thing', async () => ({ ok: true }));
    await app.ready();
    const listed = await app.inject(preflight('http://localhost:5173'));
    const other = await app.inject(preflight('https://elsewhere.example'));
    const otherPost = await app.inject({
      method: 'POST',
      url: '/thing',
      headers: { origin: 'https://elsewhere.example' },
    });
    await app.close();
    expect(listed.headers['access-control-allow-origin']).toBe('http://localhost:5173');
    expect(listed.headers['access-control-allow-methods']).toContain('POST');
    expect(other.headers['access-control-allow-origin']).toBeUndefined();
    // The request itself still runs (browsers enforce CORS); its page just cannot read the answer.
    expect(otherPost.headers['access-control-allow-origin']).toBeUndefined();
  });
});
