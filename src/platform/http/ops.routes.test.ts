import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { Metrics } from '../metrics/metrics.js';
import { plainHttpServer } from '../../../test/rig/fakes.js';
import { opsRoutes } from './ops.routes.js';

describe('readiness', () => {
  it('logs when it changes, not every 503 a load balancer polls', async () => {
    const lines: { level: number; msg: string; checks?: Record<string, string>; status?: string }[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => void lines.push(JSON.parse(line) as (typeof lines)[number]) },
    );
    let kafkaUp = true;
    let draining = false;
    const app = await plainHttpServer(logger);
    await app.register(
      opsRoutes(new Metrics(), { database: async () => true, kafka: async () => kafkaUp }, () => draining),
    );
    await app.ready();
    const poll = async () => (await app.inject({ method: 'GET', url: '/readyz' })).statusCode;
    try {
      expect(await poll()).toBe(200);
      kafkaUp = false;
      for (let i = 0; i < 5; i++) expect(await poll()).toBe(503);
      const down = await app.inject({ method: 'GET', url: '/readyz' });
      expect(down.json()).toEqual({
        code: 'UNAVAILABLE',
        message: 'Not ready: kafka unreachable',
        requestId: expect.any(String),
        status: 'unavailable',
        checks: { database: 'ok', kafka: 'down' },
      });
      kafkaUp = true;
      expect(await poll()).toBe(200);
      draining = true;
      for (let i = 0; i < 3; i++) expect(await poll()).toBe(503);
      expect((await app.inject({ method: 'GET', url: '/readyz' })).json()).toMatchObject({
        code: 'UNAVAILABLE',
        status: 'draining',
      });
    } finally {
      await app.close();
    }
    const readiness = lines.filter((l) => l.msg.startsWith('readiness'));
    expect(readiness.map((l) => [l.level, l.msg, l.status])).toEqual([
      [30, 'readiness changed', 'ok'],
      [40, 'readiness changed', 'unavailable'],
      [30, 'readiness changed', 'ok'],
      [30, 'readiness changed', 'draining'],
    ]);
    expect(readiness[1]?.checks).toEqual({ database: 'ok', kafka: 'down' });
    expect(lines.filter((l) => l.msg === 'request failed')).toEqual([]);
  });

  it('stays ready while an advisory dependency is down, saying it is degraded', async () => {
    let kafkaUp = false;
    let databaseUp = true;
    const app = await plainHttpServer(pino({ level: 'silent' }));
    await app.register(
      opsRoutes(
        new Metrics(),
        { database: async () => databaseUp, kafka: async () => kafkaUp },
        () => false,
        undefined,
        new Set(['kafka']),
      ),
    );
    await app.ready();
    const readyz = () => app.inject({ method: 'GET', url: '/readyz' });
    try {
      const degraded = await readyz();
      expect(degraded.statusCode).toBe(200);
      expect(degraded.json()).toEqual({ status: 'degraded', checks: { database: 'ok', kafka: 'down' } });
      databaseUp = false;
      const down = await readyz();
      expect(down.statusCode).toBe(503);
      expect(down.json()).toMatchObject({
        message: 'Not ready: database unreachable',
        status: 'unavailable',
        checks: { database: 'down', kafka: 'down' },
      });
      databaseUp = true;
      kafkaUp = true;
      expect((await readyz()).json()).toEqual({ status: 'ok', checks: { database: 'ok', kafka: 'ok' } });
    } finally {
      await app.close();
    }
  });
});
