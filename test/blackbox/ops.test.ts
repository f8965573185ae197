import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, signUp, startServer, type ProfileName, type Server } from './harness.js';
import { runCli } from '../fault/processes.js';
import { migrate, openSqlite } from '../../src/platform/db/database.js';

/** A data directory as an embedded server leaves it: its database, migrated. */
async function deploy(dataDir: string): Promise<void> {
  const db = openSqlite(join(dataDir, 'zhiguang.db'));
  try {
    await migrate(db);
  } finally {
    await db.close();
  }
}

const ROOT = resolve(import.meta.dirname, '../..');

/** Writes `likes` like events (a user each, over 1,000 posts) and `views` view records into an embedded log. */
function fillLog(dataDir: string, likes: number, views: number): void {
  const db = new DatabaseSync(join(dataDir, 'zhiguang.db'));
  try {
    db.exec('BEGIN');
    const insert = db.prepare(`INSERT INTO event_log (topic, key, value, ts) VALUES (?, ?, ?, 1)`);
    for (let i = 0; i < likes; i++) {
      const eid = String(1 + (i % 1_000));
      const event = { eventId: `e${i}`, entityType: 'knowpost', entityId: eid, metric: 'like', idx: 0 };
      const value = { ...event, userId: i + 1, delta: 1, ts: 1, seq: 1 + Math.floor(i / 1_000) };
      insert.run('counter-events', `knowpost:${eid}`, JSON.stringify(value));
    }
    for (let i = 0; i < views; i++) {
      const eid = String(1 + (i % 1_000));
      insert.run('read-events', `knowpost:${eid}`, JSON.stringify({ etype: 'knowpost', eid, n: 1, ts: 1 }));
    }
    db.exec('COMMIT');
  } finally {
    db.close();
  }
}

interface SignalledRun {
  code: number | null;
  stdout: string;
  stderr: string;
  /** From the last signal sent to the exit. */
  exitedAfterMs: number;
}

/**
 * Runs `counters replay --yes` and sends each signal that many milliseconds after the first line of
 * its stderr that matches the signal's anchor.
 */
function replayWithSignals(
  env: Record<string, string>,
  signals: readonly (readonly [NodeJS.Signals, number, RegExp])[],
): Promise<SignalledRun> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [join(ROOT, 'dist/cli.js'), 'counters', 'replay', '--yes'], {
      env,
    });
    let stdout = '';
    let stderr = '';
    let lastSentAt = Number.NaN;
    const waiting = new Set(signals);
    const killer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.stdout.on('data', (chunk) => (stdout += String(chunk)));
    child.stderr.on('data', (chunk) => {
      stderr += String(chunk);
      for (const entry of waiting) {
        const [signal, afterMs, anchor] = entry;
        if (!anchor.test(stderr)) continue;
        waiting.delete(entry);
        setTimeout(() => {
          lastSentAt = performance.now();
          child.kill(signal);
        }, afterMs);
      }
    });
    child.on('error', reject);
    child.on('exit', (code) => {
      clearTimeout(killer);
      resolve({ code, stdout, stderr, exitedAfterMs: performance.now() - lastSentAt });
    });
  });
}

const METRICS_OPEN = 'GET /metrics answers anyone who reaches this port; set ZG_METRICS_TOKEN';

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
    const expected =
      profile === 'embedded'
        ? ['consumers', 'counters', 'database']
        : ['consumers', 'counters', 'database', 'kafka', 'redis'];
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

  it('warns at start-up when it serves its metrics to anyone', () => {
    const warned = server.logLines().some((line) => line.msg === METRICS_OPEN);
    expect(warned).toBe(true);
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
    // Answers any route may give are documented on every route; with a body, 413 and 415 too.
    const answers = (path: string, method: string) => Object.keys(doc.body.paths[path][method].responses);
    expect(answers('/api/v1/auth/login', 'post')).toEqual(
      expect.arrayContaining(['413', '415', '500', '503']),
    );
    expect(answers('/api/v1/knowposts/feed', 'get')).toEqual(expect.arrayContaining(['500', '503']));
    expect(answers('/api/v1/knowposts/feed', 'get')).not.toContain('415');
    expect(answers('/readyz', 'get')).toEqual(expect.arrayContaining(['200', '503']));
    // The avatar upload's file part, for a client made from the document (and the UI's file picker).
    expect(
      doc.body.paths['/api/v1/profile/avatar'].post.requestBody.content['multipart/form-data'].schema,
    ).toMatchObject({
      required: ['file'],
      properties: { file: { type: 'string', format: 'binary' } },
    });
    // A list page names the header that carries the next page's cursor.
    expect(doc.body.paths['/api/v1/relation/followers'].get.responses['200'].headers).toMatchObject({
      'X-Next-Cursor': { schema: { type: 'string' } },
    });
    // A token is optional on the feed: sent, it fills the caller's flags.
    expect(doc.body.paths['/api/v1/knowposts/feed'].get.security).toEqual([{}, { bearerAuth: [] }]);
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
    expect(server.logLines().some((line) => line.msg === METRICS_OPEN)).toBe(false);
  });
});

describe('a graceful stop', () => {
  it('keeps serving while readiness says draining, then exits', async () => {
    // The embedded profile drains too when told to; it starts in a fraction of a cluster's time.
    const server = await startServer('embedded', { ZG_SHUTDOWN_DRAIN_MS: '3000' });
    try {
      const client = new Client(server.baseUrl);
      expect((await client.call('GET', '/readyz')).status).toBe(200);
      const signalled = Date.now();
      server.terminate();
      // The same Ctrl-C again, as npm passes it on: taken for the first one.
      server.terminate();
      await new Promise((resolve) => setTimeout(resolve, 300));
      const ready = await client.call('GET', '/readyz');
      expect([ready.status, ready.body.status]).toEqual([503, 'draining']);
      expect((await client.call('GET', '/api/v1/knowposts/feed')).status).toBe(200);
      expect(Date.now() - signalled).toBeLessThan(2_000);
      // A second signal, a second or more after the first, cuts the drain short.
      await new Promise((resolve) => setTimeout(resolve, Math.max(0, signalled + 1_500 - Date.now())));
      const again = Date.now();
      server.terminate();
      expect(await server.exited).toBe(1);
      expect(Date.now() - again).toBeLessThan(1_000);
      expect(server.logLines().some((line) => line.msg === 'second signal: exiting now')).toBe(true);
    } finally {
      await server.stop();
    }
  });
});

describe('a graceful stop of the embedded profile', () => {
  it('carries what the requests wrote through before it exits: the admin checks find nothing on its way', async () => {
    const server = await startServer('embedded', { ZG_COUNTER_FLUSH_MS: '60000' });
    try {
      const client = new Client(server.baseUrl);
      const [author, reader] = [await signUp(server, client), await signUp(server, client)];
      const posts = Array.from({ length: 10 }, (_, i) => String(8_100_000_000_000 + i));
      for (const id of posts) await server.insertPost({ id, authorId: author.userId });
      // Likes and a follow, then at once the signal: the flush (a minute apart here) has not run.
      for (const id of posts) {
        const liked = await client.call('POST', '/api/v1/action/like', {
          token: reader.accessToken,
          body: { entityType: 'knowpost', entityId: id },
        });
        expect(liked.status).toBe(200);
      }
      const followed = await client.call('POST', `/api/v1/relation/follow?toUserId=${author.userId}`, {
        token: reader.accessToken,
      });
      expect(followed.status).toBe(200);
      server.terminate();
      expect(await server.exited).toBe(0);
      const settled = { counters: { busy: 0 }, users: { busy: 0 }, relations: { inFlight: 0 } };
      for (const [area, nothingOnItsWay] of Object.entries(settled)) {
        const result = await runCli(server.env, [area, 'verify']);
        expect([area, result.code, result.json]).toMatchObject([
          area,
          0,
          { ...nothingOnItsWay, drifted: [] },
        ]);
      }
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

  it('refuses a server argument it does not take with its usage, exit 2 and no stack', () => {
    for (const args of [['--port', '9000'], ['extra']]) {
      const server = spawnSync(process.execPath, [join(ROOT, 'dist/main.js'), ...args], {
        env: { PATH: process.env.PATH ?? '' },
        encoding: 'utf8',
        timeout: 30_000,
      });
      expect({ args, code: server.status }).toEqual({ args, code: 2 });
      expect(server.stderr).toContain('usage: node dist/main.js [--role api|worker|all]');
      expect(server.stderr).not.toContain('    at ');
    }
  });

  it('names settings it does not know, also when the configuration is refused (server and command)', async () => {
    // A misspelt name is why the required one is missing: both are said.
    const env = {
      PATH: process.env.PATH ?? '',
      ZG_PROFILE: 'cluster',
      ZG_REDIS_ULR: 'redis://127.0.0.1:6379',
    };
    const cli = await runCli(env, ['counters', 'verify'], 30_000);
    const server = spawnSync(process.execPath, [join(ROOT, 'dist/main.js')], {
      env,
      encoding: 'utf8',
      timeout: 30_000,
    });
    for (const [name, code, stderr] of [
      ['cli', cli.code, cli.stderr],
      ['server', server.status, server.stderr],
    ] as const) {
      expect({ name, code }).toEqual({ name, code: name === 'cli' ? 1 : 2 });
      expect(stderr).toContain('ZG_REDIS_URL: required on the cluster profile');
      expect(stderr).toMatch(/settings not known to this release.*\(misspelt\?\): ZG_REDIS_ULR/);
    }
  });

  it('stops a replay at a signal before it empties the store; past that, goes on, taking a signal repeated at once for the same one, and ends at a later one, letting its claim go', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'zg-cli-'));
    try {
      const env = { PATH: process.env.PATH ?? '', ZG_DATA_DIR: dataDir, LOG_LEVEL: 'warn' };
      await deploy(dataDir);
      // Enough that reading the log (about a second here), and refilling the store after its
      // reset (views mostly, about two), take a while.
      fillLog(dataDir, 200_000, 400_000);
      const verify = async () => (await runCli(env, ['counters', 'verify'])).json;
      const reading = /^read \d+ events$/m;
      const refilling = /^replayed \d+ of/m;
      const stopping = /^stopping: /m;

      // While it reads the log: stopped, the store as it was (whole), the status the signal gives.
      const early = await replayWithSignals(env, [['SIGINT', 0, reading]]);
      expect([early.code, early.stdout]).toEqual([130, '']);
      expect(early.stderr).toContain('replay stopped by a signal; nothing was changed');
      expect(early.stderr).not.toContain('    at ');
      expect(await verify()).toMatchObject({ unsealedGroups: 0 });

      // Past the reset: the copy 20 ms later is the same signal; one 1.3 s after the first was
      // taken ends it within a second.
      const cut = await replayWithSignals(env, [
        ['SIGINT', 0, refilling],
        ['SIGINT', 20, refilling],
        ['SIGTERM', 1_300, stopping],
      ]);
      expect([cut.code, cut.stdout, cut.stderr.slice(-400)]).toEqual([
        143,
        '',
        expect.stringContaining(
          'replay ended by a second signal: likes and favourites are refused until a replay completes',
        ),
      ]);
      expect(cut.exitedAfterMs).toBeLessThan(1_000);
      expect(await verify()).toMatchObject({ unsealedGroups: 1 });

      // Taken at once (the claim was let go, not left to lapse), and past the reset a signal (twice
      // at once) lets it finish: the store is whole again.
      const whole = await replayWithSignals(env, [
        ['SIGINT', 0, refilling],
        ['SIGINT', 20, refilling],
      ]);
      expect([whole.code, whole.stderr.slice(-300)]).toEqual([0, expect.any(String)]);
      expect(JSON.parse(whole.stdout)).toMatchObject({ events: 200_000, entities: 1_000, views: 400_000 });
      expect(await verify()).toMatchObject({ checked: 1_000, drifted: [], unsealedGroups: 0 });
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  }, 120_000);

  it('exits 3 when verify finds drift, also once --fix healed it, and refuses to rebuild posts that do not exist', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'zg-cli-'));
    try {
      const env = { PATH: process.env.PATH ?? '', ZG_DATA_DIR: dataDir, LOG_LEVEL: 'warn' };
      // A directory no server ran in: refused, and left as it was.
      const nowhere = await runCli(env, ['counters', 'verify']);
      expect([nowhere.code, nowhere.json]).toEqual([1, undefined]);
      expect(nowhere.stderr).toContain(`no embedded deployment in ${dataDir}`);
      expect(existsSync(join(dataDir, 'zhiguang.db'))).toBe(false);
      await deploy(dataDir);
      const empty = await runCli(env, ['counters', 'verify']);
      expect([empty.code, empty.json]).toMatchObject([0, { checked: 0, drifted: [] }]);

      const db = new DatabaseSync(join(dataDir, 'zhiguang.db'));
      try {
        db.exec(`INSERT INTO knowposts (id, author_id, status, created_at, updated_at)
                 VALUES ('5', 1, 'published', 0, 0)`);
        // One like among the facts, none in the snapshot.
        db.exec(`INSERT INTO counter_facts VALUES ('knowpost', '5', 'like', 42)`);
        db.exec(`INSERT INTO counter_entities (etype, eid) VALUES ('knowpost', '5')`);
        db.exec(`INSERT INTO counter_snapshots VALUES ('knowpost', '5', zeroblob(20))`);
      } finally {
        db.close();
      }

      const found = await runCli(env, ['counters', 'verify']);
      expect([found.code, found.json]).toMatchObject([
        3,
        { checked: 1, driftedEntities: 1, drifted: ['knowpost:5'], fixed: 0 },
      ]);
      const fixed = await runCli(env, ['counters', 'verify', '--fix']);
      expect([fixed.code, fixed.json]).toMatchObject([
        3,
        { command: 'counters verify --fix', drifted: ['knowpost:5'], fixed: 1 },
      ]);
      // stderr is a pipe here: progress comes as plain lines, without terminal control characters.
      expect(fixed.stderr).toMatch(/\S/);
      expect([fixed.stderr.includes('\r'), fixed.stderr.includes('\u001b')]).toEqual([false, false]);
      const clean = await runCli(env, ['counters', 'verify']);
      expect([clean.code, clean.json]).toMatchObject([0, { checked: 1, drifted: [] }]);

      const unknown = await runCli(env, [
        'counters',
        'rebuild',
        '--entity',
        'knowpost:5',
        '--entity',
        'knowpost:6',
      ]);
      expect([unknown.code, unknown.json]).toEqual([2, undefined]);
      expect(unknown.stderr).toContain('no such post: knowpost:6; nothing rebuilt');
      const rebuilt = await runCli(env, ['counters', 'rebuild', '--entity', 'knowpost:5']);
      expect([rebuilt.code, rebuilt.json]).toMatchObject([0, { rebuilt: 1 }]);

      for (const area of ['users', 'relations']) {
        const result = await runCli(env, [area, 'verify']);
        expect([area, result.code, result.json]).toMatchObject([area, 0, { drifted: [] }]);
      }
      // A follow whose follower row never appeared.
      const users = new DatabaseSync(join(dataDir, 'zhiguang.db'));
      try {
        for (const id of [1, 2]) {
          users.exec(`INSERT INTO users (id, nickname, avatar, zg_id, created_at, updated_at)
                      VALUES (${id}, 'u${id}', '', 'u${id}', 0, 0)`);
        }
        users.exec(`INSERT INTO following VALUES (1, 2, 0)`);
      } finally {
        users.close();
      }
      const drift = await runCli(env, ['relations', 'verify']);
      expect([drift.code, drift.json]).toMatchObject([3, { driftedUsers: 1, projectionPairs: 1, fixed: 0 }]);
      const healed = await runCli(env, ['relations', 'verify', '--fix']);
      expect([healed.code, healed.json]).toMatchObject([3, { driftedUsers: 1, fixed: 1 }]);
      const after = await runCli(env, ['relations', 'verify']);
      expect([after.code, after.json]).toMatchObject([0, { driftedUsers: 0 }]);
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it('exits 1 when verify could not check everything (busy), and says how many', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'zg-cli-'));
    try {
      const env = { PATH: process.env.PATH ?? '', ZG_DATA_DIR: dataDir, LOG_LEVEL: 'warn' };
      await deploy(dataDir);
      const empty = await runCli(env, ['users', 'verify']);
      expect([empty.code, empty.json]).toMatchObject([0, { checked: 0, busy: 0 }]);

      const db = new DatabaseSync(join(dataDir, 'zhiguang.db'));
      try {
        db.exec(`INSERT INTO users (id, nickname, avatar, zg_id, created_at, updated_at)
                 VALUES (1, 'u1', '', 'u1', 0, 0)`);
        db.exec(`INSERT INTO knowposts (id, author_id, status, created_at, updated_at)
                 VALUES ('5', 1, 'published', 0, 0)`);
        // A like toggled (seq 1) whose event neither the counter aggregator nor the author's likes
        // received have taken yet.
        db.exec(`INSERT INTO counter_facts VALUES ('knowpost', '5', 'like', 42)`);
        db.exec(`INSERT INTO counter_entities (etype, eid, seq, applied) VALUES ('knowpost', '5', 1, 0)`);
        db.exec(`INSERT INTO counter_snapshots VALUES ('knowpost', '5', zeroblob(20))`);
        // The author's snapshot: one public post, no likes yet.
        db.exec(`INSERT INTO user_counters (user_id, data, version)
                 VALUES (1, X'0000000000000000000000010000000000000000', 1)`);
      } finally {
        db.close();
      }

      const counters = await runCli(env, ['counters', 'verify']);
      expect([counters.code, counters.json]).toMatchObject([1, { checked: 1, busy: 1, drifted: [] }]);
      expect(counters.stderr).toContain('not every entity could be verified (busy 1');
      const users = await runCli(env, ['users', 'verify']);
      expect([users.code, users.json]).toMatchObject([
        1,
        { checked: 1, busy: 1, busyUsers: [1], driftedUsers: 0, notFixed: 0 },
      ]);
      expect(users.stderr).toContain('not every user could be verified and healed (busy 1, notFixed 0');
      // --fix cannot verify the user either, but rewrites it from the database: the next run can.
      const rewritten = await runCli(env, ['users', 'verify', '--fix']);
      expect([rewritten.code, rewritten.json]).toMatchObject([1, { busy: 1, busyRewritten: 1 }]);
      const verified = await runCli(env, ['users', 'verify']);
      expect([verified.code, verified.json]).toMatchObject([0, { checked: 1, ok: 1, busy: 0 }]);
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  });
});
