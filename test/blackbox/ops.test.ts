import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, startServer, type ProfileName, type Server } from './harness.js';
import { runCli } from '../fault/processes.js';

describe.each<ProfileName>(['embedded', 'cluster'])('operations (%s profile)', (profile) => {
  let server: Server;
  let client: Client;

  beforeAll(async () => {
    server = await startServer(profile);
    client = new Client(server.baseUrl);
  });
  afterAll(async () => server?.stop());

  it('reports liveness and readiness of every dependency', async () => {
    expect((await client.call('GET', '/healthz')).body).toEqual({ status: 'ok' });
    const ready = await client.call('GET', '/readyz');
    expect(ready.status).toBe(200);
    const expected = profile === 'embedded' ? ['database'] : ['database', 'kafka', 'redis'];
    expect(Object.keys(ready.body.checks).sort()).toEqual(expected);
    expect(Object.values(ready.body.checks).every((s) => s === 'ok')).toBe(true);
  });

  it('exports Prometheus metrics, including request durations by route', async () => {
    await client.call('GET', '/healthz');
    const res = await fetch(`${server.baseUrl}/metrics`);
    const text = await res.text();
    expect(res.headers.get('content-type')).toContain('text/plain');
    expect(text).toMatch(
      /zg_http_request_duration_seconds_count\{method="GET",route="\/healthz",status="200"\} \d+/,
    );
    expect(text).toContain('process_cpu_seconds_total');
  });

  it('serves the OpenAPI document and its UI', async () => {
    const doc = await client.call('GET', '/openapi.json');
    expect(doc.status).toBe(200);
    expect(doc.body.openapi).toMatch(/^3\./);
    for (const path of [
      '/api/v1/auth/register',
      '/api/v1/auth/login',
      '/api/v1/auth/me',
      '/api/v1/profile',
      '/api/v1/profile/{userId}',
      '/.well-known/jwks.json',
    ]) {
      expect(Object.keys(doc.body.paths)).toContain(path);
    }
    // Parameters with a default are optional for clients; only userId must be given.
    for (const path of ['/api/v1/relation/following', '/api/v1/relation/followers']) {
      const parameters = doc.body.paths[path].get.parameters as { name: string; required?: boolean }[];
      expect(parameters.filter((p) => p.required).map((p) => p.name)).toEqual(['userId']);
    }
    const ui = await fetch(`${server.baseUrl}/docs/`);
    expect(ui.status).toBe(200);
    expect(await ui.text()).toContain('<html');
  });

  it('carries a request id on every answer, also in errors', async () => {
    const res = await client.call('GET', '/api/v1/auth/me', { headers: { 'x-request-id': 'trace-abc-123' } });
    expect(res.headers.get('x-request-id')).toBe('trace-abc-123');
    expect(res.body.requestId).toBe('trace-abc-123');
    const cors = await fetch(`${server.baseUrl}/api/v1/auth/login`, {
      method: 'OPTIONS',
      headers: { origin: 'http://example.test', 'access-control-request-method': 'PATCH' },
    });
    expect(cors.status).toBeLessThan(300);
    expect(cors.headers.get('access-control-allow-methods')).toContain('PATCH');
  });
});

describe('metrics behind a token', () => {
  let server: Server;
  beforeAll(async () => {
    server = await startServer('embedded', { ZG_METRICS_TOKEN: 'm3trics-t0ken' });
  });
  afterAll(async () => server?.stop());

  it('answers only the token', async () => {
    const read = (authorization?: string) =>
      fetch(`${server.baseUrl}/metrics`, authorization ? { headers: { authorization } } : {});
    for (const authorization of [undefined, 'Bearer wrong', 'm3trics-t0ken', 'Bearer m3trics-t0ke']) {
      const res = await read(authorization);
      expect({ authorization, status: res.status }).toEqual({ authorization, status: 401 });
      expect(await res.json()).toMatchObject({ code: 'UNAUTHORIZED' });
    }
    const res = await read('Bearer m3trics-t0ken');
    expect(res.status).toBe(200);
    expect(await res.text()).toContain('process_cpu_seconds_total');
    expect((await fetch(`${server.baseUrl}/healthz`)).status).toBe(200);
  });
});

describe('a graceful stop', () => {
  it('keeps serving while readiness says draining, then exits', async () => {
    // The embedded profile drains too when told to; it starts in a fraction of a cluster's time.
    const server = await startServer('embedded', { ZG_SHUTDOWN_DRAIN_MS: '2000' });
    try {
      const client = new Client(server.baseUrl);
      expect((await client.call('GET', '/readyz')).status).toBe(200);
      const signalled = Date.now();
      server.terminate();
      await new Promise((resolve) => setTimeout(resolve, 300));
      const ready = await client.call('GET', '/readyz');
      expect([ready.status, ready.body.status]).toEqual([503, 'draining']);
      expect((await client.call('GET', '/api/v1/knowposts/feed')).status).toBe(200);
      expect(Date.now() - signalled).toBeLessThan(2_000);
    } finally {
      await server.stop();
    }
  });
});

describe('the admin command line', () => {
  it('refuses options a command does not take, before it connects to anything', async () => {
    const env = { PATH: process.env.PATH ?? '' };
    for (const args of [
      ['users', 'verify', '--entity', 'knowpost:1'],
      ['counters', 'verify', '--yes'],
      ['counters', 'flush', '--fix'],
      ['relations', 'rebuild', 'now'],
    ]) {
      const result = await runCli(env, args, 30_000);
      expect({ args, code: result.code }).toEqual({ args, code: 2 });
      expect(result.stderr).toContain(`${args[0]} ${args[1]} takes no`);
    }
  });
});
