import { createServer, type AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import Fastify, { type FastifyInstance } from 'fastify';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openMysql } from '../db/database.js';
import { UnavailableError } from '../errors/errors.js';
import { S3ObjectStorage } from '../storage/s3-object-storage.js';
import { installErrorHandling } from './error-handler.js';

/** A loopback port nothing listens on: connections to it are refused at once. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

/** The error `action` rejects with. */
async function failureOf(action: () => Promise<unknown>): Promise<Error> {
  return action().then(
    () => {
      throw new Error('expected a failure');
    },
    (err: unknown) => (err instanceof Error ? err : new Error(String(err))),
  );
}

describe('errors of unreachable dependencies', () => {
  let app: FastifyInstance;
  const thrown = new Map<string, Error>();

  beforeAll(async () => {
    const port = await closedPort();
    const s3 = new S3ObjectStorage({
      endpoint: `http://127.0.0.1:${port}`,
      region: 'us-east-1',
      bucket: 'zhiguang',
      accessKeyId: 'a',
      secretAccessKey: 'b',
      forcePathStyle: true,
    });
    const redis = new Redis({ port, host: '127.0.0.1', maxRetriesPerRequest: 0, lazyConnect: true });
    redis.on('error', () => undefined);
    const mysql = await openMysql(`mysql://root@127.0.0.1:${port}/zhiguang`, 1);
    try {
      thrown.set('object storage', await failureOf(() => s3.head('avatars/u1.png')));
      thrown.set('redis', await failureOf(() => redis.get('k')));
      thrown.set('database', await failureOf(() => mysql.kysely.selectFrom('users').select('id').execute()));
    } finally {
      s3.close();
      redis.disconnect();
      await mysql.close();
    }
    // The store answered, but is overloaded (S3's SlowDown) or not there (a proxy's 502).
    thrown.set(
      'an overloaded object store',
      Object.assign(new Error('Please reduce your request rate.'), {
        name: 'SlowDown',
        $metadata: { httpStatusCode: 503 },
      }),
    );
    thrown.set('a wrapped refusal', new Error('could not load', { cause: thrown.get('database') }));

    app = Fastify({ logger: false });
    installErrorHandling(app);
    app.get('/fail/:what', async (request) => {
      const { what } = request.params as { what: string };
      throw thrown.get(what) ?? new Error(`a bug: ${what}`);
    });
    app.get('/denied', async () => {
      throw Object.assign(new Error('Access Denied'), {
        name: 'AccessDenied',
        $metadata: { httpStatusCode: 403 },
      });
    });
    await app.ready();
  }, 30_000);
  afterAll(async () => {
    await app?.close();
  });

  it.each(['object storage', 'redis', 'database', 'an overloaded object store', 'a wrapped refusal'])(
    'answers 503 UNAVAILABLE with Retry-After when %s cannot be reached',
    async (what) => {
      const res = await app.inject({ method: 'GET', url: `/fail/${encodeURIComponent(what)}` });
      expect(res.statusCode).toBe(503);
      expect(res.headers['retry-after']).toBe('1');
      const body = res.json<{ code: string; message: string; requestId: string }>();
      expect(body.code).toBe('UNAVAILABLE');
      expect(body.message).toBe('Service temporarily unavailable');
      expect(body.requestId).toBeTruthy();
    },
  );

  it('answers 500 for anything else, a store refusing its credentials included', async () => {
    for (const url of ['/fail/bug', '/denied']) {
      const res = await app.inject({ method: 'GET', url });
      expect(res.statusCode, url).toBe(500);
      expect(res.json<{ code: string; message: string }>()).toMatchObject({
        code: 'INTERNAL_ERROR',
        message: 'Internal error',
      });
      expect(res.headers['retry-after']).toBeUndefined();
    }
  });
});

/** A server with the error handling installed, whose log lines are kept (parsed) in `lines`. */
function loggingApp<Line>(): { app: ReturnType<typeof Fastify>; lines: Line[] } {
  const lines: Line[] = [];
  const app = Fastify({
    logger: {
      level: 'info',
      stream: { write: (line: string) => void lines.push(JSON.parse(line) as Line) },
    },
  });
  installErrorHandling(app);
  return { app, lines };
}

describe('refusals the service decides on', () => {
  it('answers 503 in the contract shape and logs a warning without a stack, not an error', async () => {
    const { app, lines } = loggingApp<{ level: number; msg: string; err?: unknown; reason?: string }>();
    app.get('/refused', async () => {
      throw new UnavailableError('Likes and favourites are being restored; try again later');
    });
    app.get('/undelivered', async () => {
      throw new UnavailableError('The verification code could not be delivered', {
        cause: new Error('535 authentication failed'),
      });
    });
    app.get('/not-here', async () => {
      throw new UnavailableError('Codes cannot be sent to phone numbers here', { retryAfterSeconds: null });
    });
    app.get('/restoring', async () => {
      throw new UnavailableError('Likes and favourites are being restored', { retryAfterSeconds: 5 });
    });
    try {
      const res = await app.inject({ method: 'GET', url: '/refused' });
      expect(res.statusCode).toBe(503);
      expect(res.headers['retry-after']).toBe('1');
      expect(res.json()).toMatchObject({ code: 'UNAVAILABLE', message: expect.stringContaining('restored') });
      const told = lines.filter((l) => l.msg.startsWith('request refused'));
      expect(told).toHaveLength(1);
      expect(told[0]).toMatchObject({ level: 40, reason: expect.stringContaining('restored') });
      expect(told[0]!.err).toBeUndefined();
      expect(lines.filter((l) => l.level >= 50)).toEqual([]);
      // With a failure behind it, the failure is logged, cause and all.
      expect((await app.inject({ method: 'GET', url: '/undelivered' })).statusCode).toBe(503);
      const failed = lines.filter((l) => l.level >= 50);
      expect(failed).toHaveLength(1);
      expect(JSON.stringify(failed[0]!.err)).toContain('535 authentication failed');
      // How long to wait is the refusal's to say: by default a second, never when waiting will not help.
      expect((await app.inject({ method: 'GET', url: '/not-here' })).headers['retry-after']).toBeUndefined();
      expect((await app.inject({ method: 'GET', url: '/restoring' })).headers['retry-after']).toBe('5');
    } finally {
      await app.close();
    }
  });
});

describe('a flood of 503s', () => {
  it('logs the first at once and then a line a second, each with how many it held back, the last when the flood stops', async () => {
    const { app, lines } = loggingApp<{ level: number; msg: string; heldBack?: number }>();
    app.get('/down', async () => {
      throw Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED' });
    });
    app.get('/restoring', async () => {
      throw new UnavailableError('Likes and favourites are being restored; try again later');
    });
    app.get('/bug', async () => {
      throw new Error('a bug');
    });
    app.get('/looped', async () => {
      // A cause chain that comes back on itself, and a thrown value that is no Error.
      const looped: Error & { cause?: unknown } = Object.assign(new Error('timed out'), {
        name: 'TimeoutError',
      });
      looped.cause = looped;
      throw looped;
    });
    app.get('/plain', async () => {
      // What some libraries throw: a plain object.
      // eslint-disable-next-line @typescript-eslint/only-throw-error
      throw { name: 'TimeoutError' };
    });
    app.get('/locked', async () => {
      throw Object.assign(new Error('Lock wait timeout exceeded'), { code: 'ER_LOCK_WAIT_TIMEOUT' });
    });
    const said = (msg: string) => lines.filter((l) => l.msg === msg);
    try {
      for (let i = 0; i < 50; i++) {
        expect((await app.inject({ method: 'GET', url: '/down' })).statusCode).toBe(503);
        expect((await app.inject({ method: 'GET', url: '/restoring' })).statusCode).toBe(503);
      }
      expect(said('a backing service is unavailable')).toMatchObject([{ level: 50, heldBack: 0 }]);
      expect(said('request refused: unavailable')).toMatchObject([{ level: 40, heldBack: 0 }]);
      for (const url of ['/looped', '/plain'])
        expect((await app.inject({ method: 'GET', url })).statusCode, url).toBe(503);
      // Another kind of failure in the flood is told at once, apart.
      expect((await app.inject({ method: 'GET', url: '/locked' })).statusCode).toBe(503);
      expect(said('a backing service is unavailable')).toHaveLength(4);
      // Bugs are not floods to damp: every one is told.
      for (let i = 0; i < 3; i++) await app.inject({ method: 'GET', url: '/bug' });
      expect(said('unhandled error')).toHaveLength(3);
      // When the flood stops, the last line held back is written with how many others were.
      await sleep(1_050);
      expect(said('a backing service is unavailable').map((l) => l.heldBack)).toEqual([0, 0, 0, 0, 48]);
      expect(said('request refused: unavailable').map((l) => l.heldBack)).toEqual([0, 48]);
    } finally {
      await app.close();
    }
  });
});
