/**
 * A cluster server whose Redis goes away and comes back (empty, as after a restart without
 * persistence): requests that need Redis answer 503 `UNAVAILABLE` within about the command timeout
 * instead of waiting for Redis to return, readiness says so, and the server serves again once Redis
 * is back, without a restart. The Redis here is a throwaway `redis-server` of the test's own.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { clusterDeployment, runCli } from '../fault/processes.js';
import { Client, eventually, freePort, signUp, startServer, type Server, type SignedUp } from './harness.js';

const COMMAND_TIMEOUT_MS = 500;
const ROOT = resolve(import.meta.dirname, '../..');

/** Starts `redis-server` on `port`, without persistence, and waits for PING. */
async function startRedis(port: number): Promise<ChildProcess> {
  const child = spawn(
    'redis-server',
    ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'],
    {
      stdio: 'ignore',
    },
  );
  const probe = new Redis({
    port,
    host: '127.0.0.1',
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
  });
  probe.on('error', () => {});
  try {
    for (let i = 0; ; i++) {
      try {
        await probe.connect();
        await probe.ping();
        return child;
      } catch (err) {
        if (i >= 100) throw err;
        await sleep(50);
      }
    }
  } finally {
    probe.disconnect();
  }
}

async function stopRedis(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((ok) => child.once('exit', ok));
  child.kill('SIGKILL');
  await exited;
}

/** A `redis-server` of the test's own and a cluster server on it, commands timed out quickly. */
async function startOnOwnRedis(
  extra: Record<string, string> = {},
): Promise<{ port: number; redis: ChildProcess; server: Server; client: Client }> {
  const port = await freePort();
  const redis = await startRedis(port);
  const server = await startServer('cluster', {
    ZG_REDIS_URL: `redis://127.0.0.1:${port}`,
    ZG_REDIS_COMMAND_TIMEOUT_MS: String(COMMAND_TIMEOUT_MS),
    ZG_ENTITY_CACHE_MS: '0',
    ...extra,
  });
  return { port, redis, server, client: new Client(server.baseUrl) };
}

describe('a cluster server while its Redis is down', () => {
  let port: number;
  let redis: ChildProcess | undefined;
  let server: Server;
  let client: Client;
  let user: SignedUp;
  const postId = String(BigInt(Date.now()) * 1_000_000n + 7n);

  beforeAll(async () => {
    // The restore is run by hand here; the suite below leaves it to the server.
    ({ port, redis, server, client } = await startOnOwnRedis({ ZG_COUNTER_AUTO_REPLAY: 'false' }));
    user = await signUp(server, client);
    await server.insertPost({ id: postId, authorId: user.userId });
  }, 120_000);

  afterAll(async () => {
    await server?.stop();
    await stopRedis(redis);
  });

  const like = (token: string) =>
    client.call('POST', '/api/v1/action/like', { token, body: { entityType: 'knowpost', entityId: postId } });

  it('answers 503 UNAVAILABLE at once rather than waiting, and serves again once Redis is back', async () => {
    expect((await like(user.accessToken)).body).toEqual({ changed: true, liked: true });

    // A dropped connection to a Redis that kept its data is no data loss.
    const admin = new Redis({ port, host: '127.0.0.1' });
    try {
      expect(await admin.call('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes')).toBeGreaterThan(0);
    } finally {
      admin.disconnect();
    }
    // Reopened at the first attempt, it queues rather than refuses meanwhile.
    const afterKill = await client.call('GET', `/api/v1/counter/knowpost/${postId}`);
    expect([afterKill.status, afterKill.body?.counts?.like]).toEqual([200, 1]);

    await stopRedis(redis);
    const probes: [string, () => ReturnType<Client['call']>][] = [
      ['like', () => like(user.accessToken)],
      ['counts', () => client.call('GET', `/api/v1/counter/knowpost/${postId}`)],
      ['me', () => client.call('GET', '/api/v1/auth/me', { token: user.accessToken })],
      ['feed', () => client.call('GET', '/api/v1/knowposts/feed')],
    ];
    for (let round = 0; round < 2; round++) {
      // The second round once the client has tried to reconnect a few times.
      if (round === 1) await sleep(1_500);
      for (const [name, probe] of probes) {
        const started = Date.now();
        const res = await probe();
        const ms = Date.now() - started;
        expect({ name, status: res.status, code: res.body?.code }).toEqual({
          name,
          status: 503,
          code: 'UNAVAILABLE',
        });
        // A few commands in a row at most, each given up after the timeout.
        expect({ name, fast: ms < 4 * COMMAND_TIMEOUT_MS + 1_000 }).toEqual({ name, fast: true });
      }
    }
    expect((await client.call('GET', '/readyz')).status).toBe(503);

    // Back, empty: sessions went with it, so the user signs up anew; the server needs no restart.
    redis = await startRedis(port);
    expect(
      await eventually(
        async () => (await client.call('GET', '/readyz')).status,
        (status) => status === 200,
        20_000,
      ),
    ).toBe(200);
    const again = await signUp(server, client);
    // The facts of likes went with it: likes are refused, not counted from nothing, until a replay.
    const refused = await like(again.accessToken);
    expect([refused.status, refused.body?.code]).toEqual([503, 'UNAVAILABLE']);
    expect(refused.body?.message).toContain('being restored');
    // Still in rotation (all else is served), and says why likes are refused.
    const restoring = await eventually(
      async () => await client.call('GET', '/readyz'),
      (r) => r.body?.checks?.counters === 'down',
      5_000,
    );
    expect([restoring.status, restoring.body?.status]).toEqual([200, 'degraded']);
    const replay = await runCli(server.env, ['counters', 'replay', '--yes'], 60_000);
    expect([replay.code, replay.json]).toMatchObject([0, { command: 'counters replay', entities: 1 }]);
    expect((await like(again.accessToken)).body).toEqual({ changed: true, liked: true });
    // The like made before the loss is back, with the new one.
    const counted = await eventually(
      async () => (await client.call('GET', `/api/v1/counter/knowpost/${postId}`)).body?.counts?.like,
      (n) => n === 2,
      5_000,
    );
    expect(counted).toBe(2);
    const restored = await eventually(
      async () => await client.call('GET', '/readyz'),
      (r) => r.body?.status === 'ok',
      5_000,
    );
    expect(restored.body?.checks?.counters).toBe('ok');

    // The loss and the return are told once each, not once per reconnection attempt.
    const told = server.logLines().map((line) => line.msg);
    expect(
      told.filter(
        (msg) => msg === 'Redis connection lost; requests that need it answer 503 until it is back',
      ),
    ).toHaveLength(1);
    expect(told.filter((msg) => msg === 'Redis connection back')).toHaveLength(1);
    // It came back empty, and the server says so, once, with what to run.
    const empty = told.filter((msg) => String(msg).startsWith('Redis holds no data of this deployment'));
    expect(empty).toHaveLength(1);
    expect(empty[0]).toContain('counters replay --yes');
  }, 120_000);

  it('answers 503 at once also while Redis is stopped without closing anything, and serves again after', async () => {
    const counts = () => client.call('GET', `/api/v1/counter/knowpost/${postId}`);
    expect((await counts()).status).toBe(200);
    // Stopped: it neither answers nor resets a connection.
    redis!.kill('SIGSTOP');
    try {
      // The next PING (one a second) goes unanswered within the command timeout.
      await sleep(1_000 + COMMAND_TIMEOUT_MS + 500);
      for (const probe of [
        counts,
        () => client.call('GET', '/api/v1/auth/me', { token: user.accessToken }),
      ]) {
        const started = Date.now();
        const res = await probe();
        expect([res.status, res.body?.code]).toEqual([503, 'UNAVAILABLE']);
        expect(Date.now() - started).toBeLessThan(COMMAND_TIMEOUT_MS);
      }
      // Redis is down; nothing says a replay is needed.
      const ready = await client.call('GET', '/readyz');
      expect([ready.status, ready.body?.checks?.redis, ready.body?.checks?.counters]).toEqual([
        503,
        'down',
        'ok',
      ]);
    } finally {
      redis!.kill('SIGCONT');
    }
    const back = await eventually(
      async () => (await counts()).status,
      (status) => status === 200,
      20_000,
    );
    expect(back).toBe(200);
  }, 60_000);
});

describe('a cluster server whose Redis comes back without its data', () => {
  let port: number;
  let redis: ChildProcess | undefined;
  let server: Server;
  let client: Client;
  const postId = String(BigInt(Date.now()) * 1_000_000n + 11n);

  beforeAll(async () => {
    ({ port, redis, server, client } = await startOnOwnRedis());
  }, 120_000);

  afterAll(async () => {
    await server?.stop();
    await stopRedis(redis);
  });

  const counts = async () => (await client.call('GET', `/api/v1/counter/knowpost/${postId}`)).body?.counts;

  it('restores likes, favourites and views from the event log by itself and takes likes again', async () => {
    const first = await signUp(server, client);
    await server.insertPost({ id: postId, authorId: first.userId });
    const act = (action: string, token: string) =>
      client.call('POST', `/api/v1/action/${action}`, {
        token,
        body: { entityType: 'knowpost', entityId: postId },
      });
    expect((await act('like', first.accessToken)).body).toEqual({ changed: true, liked: true });
    expect((await act('fav', first.accessToken)).status).toBe(200);
    for (let i = 0; i < 3; i++)
      expect((await client.call('GET', `/api/v1/knowposts/detail/${postId}`)).status).toBe(200);
    const before = await eventually(counts, (c) => c?.like === 1 && c?.fav === 1 && c?.read === 3, 10_000);
    expect(before).toMatchObject({ like: 1, fav: 1, read: 3 });

    // Restarted without persistence: every key gone, sessions with them.
    await stopRedis(redis);
    redis = await startRedis(port);
    await eventually(
      async () => (await client.call('GET', '/readyz')).status,
      (status) => status === 200,
      20_000,
    );
    const again = await signUp(server, client);
    // Refused while the store is restored, taken once the server replayed the log.
    const liked = await eventually(
      async () => await act('like', again.accessToken),
      (res) => res.status === 200,
      30_000,
    );
    expect(liked.body).toEqual({ changed: true, liked: true });
    const after = await eventually(counts, (c) => c?.like === 2 && c?.read === 3, 10_000);
    expect(after).toMatchObject({ like: 2, fav: 1, read: 3 });
    const told = server.logLines().map((line) => String(line.msg));
    expect(told.filter((msg) => msg.startsWith('counter store restored from the event log'))).toHaveLength(1);
    const ready = await eventually(
      async () => await client.call('GET', '/readyz'),
      (r) => r.body?.status === 'ok',
      5_000,
    );
    expect(ready.body?.checks?.counters).toBe('ok');
    // More views after the restore are counted once, on top of those restored.
    expect((await client.call('GET', `/api/v1/knowposts/detail/${postId}`)).status).toBe(200);
    expect(await eventually(counts, (c) => c?.read === 4, 10_000)).toMatchObject({ read: 4 });
  }, 120_000);
});

describe('a cluster server started while its Redis is down', () => {
  it('exits 1 saying which service it could not reach, and where', async () => {
    const port = await freePort();
    const deployment = await clusterDeployment('127.0.0.1:9', { ZG_REDIS_URL: `redis://127.0.0.1:${port}` });
    try {
      const started = spawnSync(process.execPath, [join(ROOT, 'dist/main.js')], {
        env: deployment.env,
        encoding: 'utf8',
        timeout: 60_000,
      });
      expect(started.status).toBe(1);
      expect(started.stderr).toContain(`Redis could not be reached at 127.0.0.1:${port}`);
    } finally {
      await deployment.dispose();
    }
  }, 90_000);
});
