import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import { describe, expect, it, vi } from 'vitest';
import { Metrics } from '../metrics/metrics.js';
import { plainHttpServer } from '../../../test/rig/fakes.js';
import { opsRoutes, READINESS_CHECK_TIMEOUT_MS, READINESS_PROBE_ABANDON_MS } from './ops.routes.js';

describe('readiness', () => {
  it('answers within a probe timeout when a dependency hangs, counting it down', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    await app.register(
      opsRoutes(
        new Metrics(),
        { database: () => new Promise<boolean>(() => undefined), redis: async () => true },
        () => false,
        undefined,
        new Set(['database']),
        0,
      ),
    );
    await app.ready();
    try {
      const started = performance.now();
      const ready = await app.inject({ method: 'GET', url: '/readyz' });
      expect(performance.now() - started).toBeLessThan(READINESS_CHECK_TIMEOUT_MS + 200);
      expect(READINESS_CHECK_TIMEOUT_MS).toBeLessThan(1_000);
      expect({ status: ready.statusCode, body: ready.json() }).toEqual({
        status: 200,
        body: { status: 'degraded', checks: { database: 'down', redis: 'ok' } },
      });
    } finally {
      await app.close();
    }
  });

  it('logs when it changes, not every 503 a load balancer polls, and warns only once it was ready', async () => {
    const lines: { level: number; msg: string; checks?: Record<string, string>; status?: string }[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => void lines.push(JSON.parse(line) as (typeof lines)[number]) },
    );
    // Not ready at first, as a process whose consumers are still joining.
    let kafkaUp = false;
    let draining = false;
    const app = await plainHttpServer(logger);
    await app.register(
      opsRoutes(
        new Metrics(),
        { database: async () => true, kafka: async () => kafkaUp },
        () => draining,
        undefined,
        new Set(),
        0,
      ),
    );
    await app.ready();
    const poll = async () => (await app.inject({ method: 'GET', url: '/readyz' })).statusCode;
    try {
      expect(await poll()).toBe(503);
      kafkaUp = true;
      expect(await poll()).toBe(200);
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
      // Told, but not as a warning: the process was never ready yet.
      [30, 'readiness changed', 'unavailable'],
      [30, 'readiness changed', 'ok'],
      [40, 'readiness changed', 'unavailable'],
      [30, 'readiness changed', 'ok'],
      [30, 'readiness changed', 'draining'],
    ]);
    expect(readiness[2]?.checks).toEqual({ database: 'ok', kafka: 'down' });
    expect(lines.filter((l) => l.msg === 'request failed')).toEqual([]);
  });

  it('warns of a process never ready once its start has taken longer than the grace', async () => {
    const lines: { level: number; msg: string; status?: string }[] = [];
    const logger = pino(
      { level: 'info' },
      { write: (line: string) => void lines.push(JSON.parse(line) as (typeof lines)[number]) },
    );
    const app = await plainHttpServer(logger);
    await app.register(
      opsRoutes(new Metrics(), { kafka: async () => false }, () => false, undefined, new Set(), 0, 200),
    );
    await app.ready();
    try {
      for (let i = 0; i < 3; i++)
        expect((await app.inject({ method: 'GET', url: '/readyz' })).statusCode).toBe(503);
      await sleep(250);
      for (let i = 0; i < 3; i++)
        expect((await app.inject({ method: 'GET', url: '/readyz' })).statusCode).toBe(503);
    } finally {
      await app.close();
    }
    const readiness = lines.filter((l) => l.msg.startsWith('readiness'));
    expect(readiness.map((l) => [l.level, l.status])).toEqual([
      [30, 'unavailable'],
      [40, 'unavailable'],
    ]);
  });

  it('checks the dependencies once for the polls of a short while, however many', async () => {
    let checked = 0;
    const app = await plainHttpServer(pino({ level: 'silent' }));
    const database = async () => {
      checked++;
      await sleep(20);
      return true;
    };
    await app.register(opsRoutes(new Metrics(), { database }, () => false, undefined, new Set(), 200));
    await app.ready();
    try {
      const polls = await Promise.all(Array.from({ length: 20 }, () => app.inject({ url: '/readyz' })));
      expect(polls.map((p) => p.statusCode)).toEqual(Array(20).fill(200));
      expect((await app.inject({ url: '/readyz' })).json()).toEqual({
        status: 'ok',
        checks: { database: 'ok' },
      });
      expect(checked).toBe(1);
      await sleep(250);
      await app.inject({ url: '/readyz' });
      expect(checked).toBe(2);
    } finally {
      await app.close();
    }
  });

  it('calls a check that still runs no more, however many rounds count it down meanwhile', async () => {
    let calls = 0;
    let release = (_ok: boolean): void => undefined;
    let hanging = true;
    const database = () => {
      calls++;
      return hanging ? new Promise<boolean>((resolve) => (release = resolve)) : Promise.resolve(true);
    };
    const app = await plainHttpServer(pino({ level: 'silent' }));
    await app.register(
      opsRoutes(new Metrics(), { database }, () => false, undefined, new Set(['database']), 0),
    );
    await app.ready();
    try {
      for (let round = 0; round < 3; round++) {
        const polls = await Promise.all(Array.from({ length: 5 }, () => app.inject({ url: '/readyz' })));
        expect(polls.map((p) => p.json().checks.database)).toEqual(Array(5).fill('down'));
      }
      expect(calls).toBe(1);
      // One that never settles is called anew after a while, or the check would stay down for good.
      const now = performance.now.bind(performance);
      const later = vi.spyOn(performance, 'now').mockImplementation(() => now() + READINESS_PROBE_ABANDON_MS);
      try {
        expect((await app.inject({ url: '/readyz' })).json().checks.database).toBe('down');
        expect(calls).toBe(2);
        hanging = false;
        release(true);
        await sleep(10);
        expect((await app.inject({ url: '/readyz' })).json().checks.database).toBe('ok');
        expect(calls).toBe(3);
      } finally {
        later.mockRestore();
      }
    } finally {
      await app.close();
    }
  });

  it('counts a check that answers past its time limit down, also in the round that sees the answer', async () => {
    const database = async () => {
      await sleep(READINESS_CHECK_TIMEOUT_MS + 250);
      return true;
    };
    const app = await plainHttpServer(pino({ level: 'silent' }));
    await app.register(
      opsRoutes(new Metrics(), { database }, () => false, undefined, new Set(['database']), 0),
    );
    await app.ready();
    try {
      const states: string[] = [];
      for (let round = 0; round < 3; round++)
        states.push((await app.inject({ url: '/readyz' })).json().checks.database);
      expect(states).toEqual(['down', 'down', 'down']);
    } finally {
      await app.close();
    }
  });

  it('answers /metrics to the token only, however the scheme is written', async () => {
    const app = await plainHttpServer(pino({ level: 'silent' }));
    await app.register(opsRoutes(new Metrics(), {}, () => false, 's3cret'));
    const spaced = await plainHttpServer(pino({ level: 'silent' }));
    await spaced.register(opsRoutes(new Metrics(), {}, () => false, 'two words'));
    const spacedStatus = async (authorization: string) =>
      (await spaced.inject({ url: '/metrics', headers: { authorization } })).statusCode;
    await app.ready();
    const scrape = async (authorization?: string) =>
      (await app.inject({ url: '/metrics', headers: authorization === undefined ? {} : { authorization } }))
        .statusCode;
    try {
      for (const ok of ['Bearer s3cret', 'bearer s3cret', 'Bearer  s3cret ', 'BEARER\ts3cret'])
        expect({ ok, status: await scrape(ok) }).toEqual({ ok, status: 200 });
      for (const refused of [
        undefined,
        '',
        'Bearer',
        'Bearer s3cre',
        'Bearer s3cret x',
        'Basic s3cret',
        's3cret',
      ])
        expect({ refused, status: await scrape(refused) }).toEqual({ refused, status: 401 });
      // A token with a space in it, as before the scheme was read apart.
      expect(await spacedStatus('Bearer two words')).toBe(200);
      expect(await spacedStatus('Bearer two')).toBe(401);
    } finally {
      await app.close();
      await spaced.close();
    }
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
        0,
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
