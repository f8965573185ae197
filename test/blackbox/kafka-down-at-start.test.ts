/**
 * A process of the cluster profile started while Kafka is down (a deploy or a restart during an
 * outage): it serves, runs its periodic tasks, and starts the event log's consumers once the broker
 * is back, without being restarted.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  clusterDeployment,
  insertPosts,
  metric,
  PrivateKafka,
  signUpByPhone,
  startNode,
  type Deployment,
  type NodeProcess,
  type PhoneUser,
} from '../fault/processes.js';
import { eventually } from './harness.js';

describe('a process started while Kafka is down (cluster profile, a private broker)', () => {
  let kafka: PrivateKafka | undefined;
  let deployment: Deployment | undefined;
  let node: NodeProcess | undefined;

  beforeAll(async () => {
    // Never started before the test: down as a broker that went away is.
    kafka = await PrivateKafka.reserve();
    deployment = await clusterDeployment(kafka.brokers);
  }, 240_000);

  afterAll(async () => {
    await node?.stop();
    await kafka?.destroy();
    await deployment?.dispose();
  }, 120_000);

  const like = async (user: PhoneUser, postId: string) => {
    const res = await fetch(`${node!.baseUrl}/api/v1/action/like`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${user.token}` },
      body: JSON.stringify({ entityType: 'knowpost', entityId: postId }),
    });
    return [res.status, await res.json()] as const;
  };
  const likes = async (postId: string) => {
    const res = await fetch(`${node!.baseUrl}/api/v1/counter/knowpost/${postId}`);
    return ((await res.json()) as { counts: { like: number } }).counts.like;
  };

  it('serves and takes likes, and starts its consumers once the broker is back', async () => {
    // Before, the process ended at start ("zhiguang failed to start").
    node = await startNode(deployment!.env, 'all');
    expect(node.lines.some((l) => String(l.msg).startsWith('Kafka unreachable at start'))).toBe(true);
    // In rotation (it serves the API), and says what it cannot do yet.
    const degraded = await fetch(`${node.baseUrl}/readyz`);
    expect([degraded.status, await degraded.json()]).toMatchObject([
      200,
      { status: 'degraded', checks: { kafka: 'down', consumers: 'down', redis: 'ok' } },
    ]);

    const users = await signUpByPhone([node], 2, 30_000, 1);
    expect(users).toHaveLength(2);
    const postId = (await insertPosts(deployment!, users[0]!.id, 1))[0]!;
    expect(await like(users[0]!, postId)).toEqual([200, { changed: true, liked: true }]);
    // Not published: the repair job, running already, counts it from the facts.
    expect(
      await eventually(
        () => likes(postId),
        (n) => n === 1,
        15_000,
      ),
    ).toBe(1);

    await kafka!.up();
    await node.waitForLine((l) => l.msg === 'event-log consumers started', 60_000);
    const ready = await fetch(`${node.baseUrl}/readyz`);
    expect([ready.status, await ready.json()]).toMatchObject([200, { status: 'ok' }]);
    expect(await like(users[1]!, postId)).toEqual([200, { changed: true, liked: true }]);
    // Through the log this time: published, consumed and folded by this very process.
    const consumed = () =>
      Promise.all([
        metric(node!, 'zg_counter_events_consumed_total{outcome="applied"}'),
        metric(node!, 'zg_counter_events_consumed_total{outcome="skipped"}'),
      ]).then(([applied, skipped]) => applied + skipped);
    expect(await eventually(consumed, (n) => n > 0, 30_000)).toBeGreaterThan(0);
    expect(
      await eventually(
        () => likes(postId),
        (n) => n === 2,
        10_000,
      ),
    ).toBe(2);
  }, 240_000);
});
