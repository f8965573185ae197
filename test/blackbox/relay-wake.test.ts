/**
 * A commit with outbox rows in an API process (a follow, a publish) wakes the outbox relay of a
 * worker process at once, through the invalidation bus, instead of at the relay's next poll: with
 * the poll set to a minute, every change still leaves the outbox, and shows in the counters, within
 * seconds.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openMysql, type Db } from '../../src/platform/db/database.js';
import { services } from '../rig/resources.js';
import {
  clusterDeployment,
  metric,
  runCli,
  signUpByPhone,
  startNode,
  type Deployment,
  type NodeProcess,
  type PhoneUser,
} from '../fault/processes.js';
import { Client, type SignedUp } from './harness.js';
import { writePost } from './posts.js';

const POLL_MS = 60_000;
/** Far below the poll: only a wake gets a row out this soon. */
const WITHIN_MS = 5_000;

describe('outbox relay woken across processes (cluster profile: an API and a worker process)', () => {
  let deployment: Deployment | undefined;
  let api: NodeProcess | undefined;
  let worker: NodeProcess | undefined;
  let db: Db | undefined;
  let users: PhoneUser[] = [];

  beforeAll(async () => {
    deployment = await clusterDeployment(services.kafkaBrokers().join(','), {
      ZG_OUTBOX_POLL_MS: String(POLL_MS),
    });
    // The first process creates the schema and the topics.
    api = await startNode(deployment.env, 'api');
    worker = await startNode(deployment.env, 'worker');
    db = await openMysql(deployment.mysqlUrl!, 1);
    users = await signUpByPhone([api], 3, 30_000, 3);
    expect(users).toHaveLength(3);
    // The worker's relay has run its first round and now waits out its poll.
    await sleep(500);
  }, 120_000);

  afterAll(async () => {
    await Promise.allSettled([api?.stop(), worker?.stop()]);
    await db?.close();
    await deployment?.dispose();
  });

  const outboxRows = async (): Promise<number> =>
    Number(
      (
        await db!.kysely
          .selectFrom('outbox')
          .select((eb) => eb.fn.countAll<number | string>().as('n'))
          .executeTakeFirstOrThrow()
      ).n,
    );

  /** A user signed up by phone, as the post helpers take one (they need the token only). */
  const signedUp = (user: PhoneUser): SignedUp => ({
    identifier: '',
    password: '',
    userId: user.id,
    accessToken: user.token,
    refreshToken: '',
  });

  /** Milliseconds until `check` holds, failing after `ms`. */
  const within = async (ms: number, check: () => Promise<boolean>): Promise<number> => {
    const started = Date.now();
    while (!(await check())) {
      if (Date.now() - started > ms) throw new Error(`not within ${ms} ms`);
      await sleep(25);
    }
    return Date.now() - started;
  };

  const counter = async (client: Client, of: PhoneUser, as: PhoneUser): Promise<Record<string, number>> => {
    const res = await client.call('GET', `/api/v1/relation/counter?userId=${of.id}`, { token: as.token });
    expect(res.status).toBe(200);
    return res.body as Record<string, number>;
  };

  it('serves the OpenAPI document from the API process only, and warns of open metrics only where it serves them', async () => {
    const status = async (node: NodeProcess, path: string) => (await fetch(`${node.baseUrl}${path}`)).status;
    for (const path of ['/healthz', '/readyz', '/metrics']) {
      expect({ path, status: await status(worker!, path) }).toEqual({ path, status: 200 });
    }
    for (const path of ['/openapi.json', '/docs/', '/api/v1/knowposts/feed']) {
      expect({ path, status: await status(worker!, path) }).toEqual({ path, status: 404 });
      expect({ path, status: await status(api!, path) }).toEqual({ path, status: 200 });
    }
    // Serving processes warn that /metrics is open and codes are logged; an admin command serves
    // nothing and does not.
    const warnings = [
      'GET /metrics answers anyone who reaches this port; set ZG_METRICS_TOKEN',
      'verification codes are written to the log: whoever reads it can sign in as those users',
    ];
    const verify = await runCli(deployment!.env, ['counters', 'verify']);
    expect(verify.code).toBe(0);
    for (const warning of warnings) {
      expect(worker!.lines.some((line) => line.msg === warning)).toBe(true);
      expect(verify.stdout).not.toContain(warning);
    }
  });

  it('publishes every follow and unfollow of the API process within seconds, though the relay polls once a minute', async () => {
    const client = new Client(api!.baseUrl);
    const [a, b, c] = users as [PhoneUser, PhoneUser, PhoneUser];
    const followers = async (): Promise<number> => (await counter(client, b, a)).followers!;
    const steps: [PhoneUser, 'follow' | 'unfollow', number][] = [
      [a, 'follow', 1],
      [c, 'follow', 2],
      [a, 'unfollow', 1],
    ];
    for (const [who, action, expected] of steps) {
      const res = await client.call('POST', `/api/v1/relation/${action}?toUserId=${b.id}`, {
        token: who.token,
      });
      expect(res.status).toBe(200);
      expect(res.body).toBe(true);
      await within(WITHIN_MS, async () => (await outboxRows()) === 0);
      await within(WITHIN_MS, async () => (await followers()) === expected);
    }
  });

  it("publishes a post's publish, pictures edit and delete within seconds, though the relay polls once a minute", async () => {
    const client = new Client(api!.baseUrl);
    const author = users[0]!;
    const posts = async (): Promise<number> => (await counter(client, author, author)).posts!;
    const before = await posts();
    const { id } = await writePost(client, signedUp(author));
    await within(WITHIN_MS, async () => (await outboxRows()) === 0);
    await within(WITHIN_MS, async () => (await posts()) === before + 1);
    // A pictures edit of the published post writes a `changed` event, which the worker's
    // post-cache consumer takes (it drops the post from the caches once more).
    const dropped = () => metric(worker!, 'zg_post_cache_invalidations_total');
    await within(WITHIN_MS, async () => (await dropped()) > 0); // the publish's own, first
    const droppedBefore = await dropped();
    const edit = await client.call('PATCH', `/api/v1/knowposts/${id}`, {
      token: author.token,
      body: { imgUrls: [] },
    });
    expect(edit.status).toBe(204);
    await within(WITHIN_MS, async () => (await dropped()) > droppedBefore);
    const res = await client.call('DELETE', `/api/v1/knowposts/${id}`, { token: author.token });
    expect(res.status).toBe(204);
    await within(WITHIN_MS, async () => (await outboxRows()) === 0);
    await within(WITHIN_MS, async () => (await posts()) === before);
  });

  it('keeps an API process that cannot reach Kafka in rotation, and its likes still count', async () => {
    // Started while Kafka is unreachable (a port nothing listens on): it serves, degraded.
    const cut = await startNode({ ...deployment!.env, ZG_KAFKA_BROKERS: '127.0.0.1:1' }, 'api');
    try {
      const ready = await fetch(`${cut.baseUrl}/readyz`);
      expect(ready.status).toBe(200);
      expect(await ready.json()).toMatchObject({
        status: 'degraded',
        checks: { kafka: 'down', redis: 'ok' },
      });
      const { id } = await writePost(new Client(api!.baseUrl), signedUp(users[1]!));
      const client = new Client(cut.baseUrl);
      const liked = await client.call('POST', '/api/v1/action/like', {
        token: users[2]!.token,
        body: { entityType: 'knowpost', entityId: id },
      });
      expect(liked.status).toBe(200);
      expect(liked.body).toEqual({ changed: true, liked: true });
      // Its event waits in the counter store; the worker's repair counts it.
      await within(30_000, async () => {
        const res = await client.call('GET', `/api/v1/counter/knowpost/${id}?metrics=like`);
        return (res.body as { counts: { like: number } }).counts.like === 1;
      });
    } finally {
      await cut.stop();
    }
  }, 60_000);
});
