import Fastify, { type FastifyRequest } from 'fastify';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { AuthGuards } from '../auth/auth.guard.js';
import type { RateLimiter } from '../platform/ratelimit/ratelimit.js';
import { descriptionRoutes } from './description.routes.js';

const signedIn: AuthGuards = {
  required: async (request: FastifyRequest) => {
    (request as unknown as { principal: unknown }).principal = { userId: 7 };
  },
  optional: async () => undefined,
};
const unlimited = { hit: async () => ({ allowed: true, retryAfterMs: 0 }) } as unknown as RateLimiter;

describe(descriptionRoutes.name, () => {
  const apps: ReturnType<typeof Fastify>[] = [];
  afterEach(async () => {
    for (const app of apps.splice(0)) await app.close();
  });

  async function serve(suggest: (signal: AbortSignal | undefined) => Promise<string>) {
    const app = Fastify();
    apps.push(app);
    app.decorateRequest('principal', null);
    await app.register(
      descriptionRoutes({
        describer: {
          suggest: async (_content, signal) => ({ description: await suggest(signal), source: 'extractive' }),
        },
        guards: signedIn,
        limiter: unlimited,
        perUserPerMinute: 10,
      }),
    );
    await app.listen({ host: '127.0.0.1', port: 0 });
    return (app.server.address() as AddressInfo).port;
  }

  it('stops the model call when the caller hangs up, and only then', async () => {
    let signal: AbortSignal | undefined;
    let aborted!: () => void;
    const abortSeen = new Promise<void>((resolve) => (aborted = resolve));
    const port = await serve(async (s) => {
      signal = s;
      s?.addEventListener('abort', () => aborted());
      await new Promise((resolve) => setTimeout(resolve, 5_000));
      return 'late';
    });
    const body = JSON.stringify({ content: '# A post\n\nSome text.' });
    const req = httpRequest({
      port,
      method: 'POST',
      path: '/api/v1/knowposts/description/suggest',
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
    });
    req.on('error', () => undefined);
    req.end(body);
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(signal?.aborted).toBe(false); // the body was read long ago: still running
    req.destroy();
    await abortSeen;
    expect(signal?.aborted).toBe(true);
  });

  it('answers a caller who waits', async () => {
    let signal: AbortSignal | undefined;
    const port = await serve(async (s) => {
      signal = s;
      return 'A post';
    });
    const res = await fetch(`http://127.0.0.1:${port}/api/v1/knowposts/description/suggest`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ content: '# A post' }),
    });
    expect(await res.json()).toEqual({ description: 'A post' });
    expect(signal?.aborted).toBe(false);
  });
});
