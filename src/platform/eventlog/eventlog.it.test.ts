import { Admin, ConfigResourceTypes } from '@platformatic/kafka';
import { describe, expect, it } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { spawn } from 'node:child_process';
import { join, resolve } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { migrate, openSqlite } from '../db/database.js';
import { services, uniqueName } from '../../../test/rig/resources.js';
import { defineEventLogContract } from './eventlog.contract.js';
import { PublishTimeoutError, type SubscribeOptions, type Subscription } from './eventlog.js';
import { KafkaEventLog, type KafkaEventLogOptions } from './kafka-eventlog.js';
import { SqliteEventLog } from './sqlite-eventlog.js';

defineEventLogContract('sqlite', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'zg-eventlog-'));
  const db = openSqlite(join(dir, 'events.db'));
  await migrate(db);
  const log = new SqliteEventLog(db, { retryBackoffMs: { min: 50, max: 500 } });
  return {
    log,
    dropOldest: async (topic) => {
      // A group that consumed everything, and a log whose retention lets go of anything consumed.
      const end = (await log.endOffsets(topic)).get(0)!;
      await db.kysely
        .insertInto('consumer_offsets')
        .values({ group_id: 'consumed-all', topic, next_offset: Number(end) })
        .execute();
      // A clock a millisecond ahead: records published this very millisecond are old enough.
      const pruner = new SqliteEventLog(db, {
        retentionMs: 0,
        pruneIntervalMs: 0,
        now: () => Date.now() + 1,
      });
      expect(await pruner.prune()).toBeGreaterThan(0);
      await pruner.close();
    },
    unreachable: async () => {
      const gone = openSqlite(join(dir, 'gone.db'));
      await migrate(gone);
      await gone.close();
      return new SqliteEventLog(gone);
    },
    close: async () => {
      await log.close();
      await db.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
});

defineEventLogContract('kafka', async () => {
  const prefix = `${uniqueName('t')}.`;
  const log = new KafkaEventLog({
    brokers: services.kafkaBrokers(),
    prefix,
    partitions: 3,
    clientId: 'zg-contract',
    sessionTimeoutMs: 6_000,
    heartbeatIntervalMs: 500,
    retryBackoffMs: { min: 100, max: 1_000 },
  });
  const admin = new Admin({ clientId: 'zg-contract-admin', bootstrapBrokers: services.kafkaBrokers() });
  return {
    log,
    dropOldest: async (topic) => {
      const partitions = [...(await log.endOffsets(topic))]
        .filter(([, end]) => end > 0n)
        .map(([partition, offset]) => ({ partition, offset }));
      await admin.deleteRecords({ topics: [{ name: `${prefix}${topic}`, partitions }] });
    },
    unreachable: async () =>
      new KafkaEventLog({
        brokers: ['127.0.0.1:1'],
        prefix,
        clientId: 'zg-contract-dead',
        connectTimeoutMs: 500,
        requestTimeoutMs: 1_000,
        retries: 2,
        retryDelayMs: 100,
        publishTimeoutMs: 5_000,
      }),
    cleanup: async (topics, groups) => {
      await log.deleteGroups(groups).catch(() => undefined);
      await log.deleteTopics(topics);
    },
    close: async () => {
      await admin.close();
      await log.close();
    },
  };
});

describe('KafkaEventLog publish timeout', () => {
  it('rejects with the send still going on, whose outcome settles later', async () => {
    const log = new KafkaEventLog({
      brokers: ['127.0.0.1:1'],
      prefix: `${uniqueName('t')}.`,
      clientId: 'zg-publish-timeout',
      connectTimeoutMs: 300,
      requestTimeoutMs: 500,
      retries: 2,
      retryDelayMs: 100,
      publishTimeoutMs: 50,
    });
    try {
      const err = await log.publish('t', [{ key: 'k', value: 'v' }]).then(
        () => null,
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(PublishTimeoutError);
      // Not written after all: the send's own failure comes later.
      await expect((err as PublishTimeoutError).outcome).rejects.toThrow();
    } finally {
      await log.close();
    }
  });
});

/** How far `group` committed, summed over its partitions. */
async function committedSum(admin: Admin, group: string): Promise<bigint> {
  const [offsets] = await admin.listConsumerGroupOffsets({ groups: [group] });
  let sum = 0n;
  for (const topic of offsets?.topics ?? [])
    for (const p of topic.partitions) if (p.committedOffset > 0n) sum += p.committedOffset;
  return sum;
}

/** Two logs of one topic prefix of their own, as two members of a group would use. */
function twoMembers(
  clientId: string,
  partitions: number,
  options: Partial<ConstructorParameters<typeof KafkaEventLog>[0]> = {},
) {
  const prefix = `${uniqueName('t')}.`;
  const settings = {
    brokers: services.kafkaBrokers(),
    prefix,
    partitions,
    sessionTimeoutMs: 6_000,
    heartbeatIntervalMs: 300,
    ...options,
  };
  return {
    prefix,
    first: new KafkaEventLog({ ...settings, clientId: `${clientId}-a` }),
    second: new KafkaEventLog({ ...settings, clientId: `${clientId}-b` }),
  };
}

/** A Kafka log of its own topic prefix, and how far its group `g` committed (summed over partitions). */
function kafkaLogWithCommits(
  clientId: string,
  options: Partial<ConstructorParameters<typeof KafkaEventLog>[0]> = {},
) {
  const prefix = `${uniqueName('t')}.`;
  const log = new KafkaEventLog({
    brokers: services.kafkaBrokers(),
    prefix,
    partitions: 2,
    clientId,
    sessionTimeoutMs: 6_000,
    heartbeatIntervalMs: 500,
    ...options,
  });
  const admin = new Admin({ clientId: `${clientId}-admin`, bootstrapBrokers: services.kafkaBrokers() });
  const committed = () => committedSum(admin, `${prefix}g`);
  const dispose = async () => {
    await admin.close();
    await log.deleteGroups(['g']).catch(() => undefined);
    await log.deleteTopics(['t']);
    await log.close();
  };
  return { log, committed, dispose };
}

/**
 * Counts the group joins of the log's consumers, and has their first `times` commits answer
 * `refusal()` (none by default).
 */
function watchConsumers(
  log: KafkaEventLog,
  times = 0,
  refusal: () => Promise<never> = () => Promise.reject(new Error('commit refused')),
) {
  const seen = { joins: 0, refused: 0 };
  const create = log.createConsumer.bind(log);
  log.createConsumer = (...args) => {
    const consumer = create(...args);
    consumer.on('consumer:group:join', () => void seen.joins++);
    const commit = consumer.commit.bind(consumer);
    consumer.commit = (options: Parameters<typeof commit>[0]) => {
      if (seen.refused >= times) return commit(options);
      seen.refused++;
      return refusal();
    };
    return consumer;
  };
  return seen;
}

/** Subscribes group `g` to `t` in batches of 5, keeping what the handler is handed in `handled`. */
function subscribeInto(log: KafkaEventLog, handled: string[], options: Partial<SubscribeOptions> = {}) {
  return log.subscribe({
    group: 'g',
    topics: ['t'],
    maxBatch: 5,
    maxWaitMs: 10,
    handler: async (batch) => {
      handled.push(...batch.records.map((r) => r.value));
    },
    ...options,
  });
}

describe('KafkaEventLog commitIntervalMs', () => {
  it('commits what a quiet subscription handled within the interval, without waiting for close', async () => {
    const { log, committed, dispose } = kafkaLogWithCommits('zg-commit-interval');
    try {
      await log.ensureTopics(['t']);
      const handled: string[] = [];
      const sub = await subscribeInto(log, handled, { commitIntervalMs: 1_500 });
      const records = Array.from({ length: 40 }, (_, i) => ({ key: `k${i % 4}`, value: String(i) }));
      await log.publish('t', records);
      const deadline = Date.now() + 15_000;
      while (handled.length < records.length && Date.now() < deadline) await delay(20);
      expect(handled).toHaveLength(records.length);
      // Handled, and (but for the first batch) not committed yet: the commits are gathered.
      expect(await committed()).toBeLessThan(BigInt(records.length));
      // Nothing more arrives; the gathered commit goes out once the interval has passed.
      while ((await committed()) < BigInt(records.length) && Date.now() < deadline) await delay(100);
      expect(await committed()).toBe(BigInt(records.length));
      await sub.close();
    } finally {
      await dispose();
    }
  });
});

describe('KafkaEventLog commit failures', () => {
  /** Publishes 30 records and waits until the group committed past them; what the handler was handed. */
  async function consumeAll(
    log: KafkaEventLog,
    committed: () => Promise<bigint>,
    errors: unknown[],
    whenSubscribed: () => void = () => undefined,
  ): Promise<string[]> {
    await log.ensureTopics(['t']);
    const handled: string[] = [];
    const sub = await subscribeInto(log, handled, { onError: (err) => errors.push(err) });
    whenSubscribed();
    const records = Array.from({ length: 30 }, (_, i) => ({ key: `k${i % 4}`, value: String(i) }));
    await log.publish('t', records);
    const deadline = Date.now() + 20_000;
    while ((await committed()) < BigInt(records.length) && Date.now() < deadline) await delay(100);
    expect(await committed()).toBe(BigInt(records.length));
    await sub.close();
    return handled.toSorted((a, b) => Number(a) - Number(b));
  }

  const ALL = Array.from({ length: 30 }, (_, i) => String(i));

  it('commits again after a failed commit, without handing the records again or joining again', async () => {
    const { log, committed, dispose } = kafkaLogWithCommits('zg-commit-failures', {
      retryBackoffMs: { min: 50, max: 100 },
    });
    // The group's coordinator moving: the first three commits are refused.
    const seen = watchConsumers(log, 3, () => Promise.reject(new Error('coordinator moving')));
    try {
      const errors: unknown[] = [];
      let joined = 0;
      const handled = await consumeAll(log, committed, errors, () => (joined = seen.joins));
      expect(joined).toBeGreaterThan(0);
      expect(seen.refused).toBe(3);
      expect(errors.filter((e) => (e as Error).message === 'coordinator moving')).toHaveLength(3);
      // Every record handed once: none again from the last commit, and no JoinGroup more.
      expect(handled).toEqual(ALL);
      expect(seen.joins).toBe(joined);
    } finally {
      await dispose();
    }
  });

  it('makes the consumer anew after a commit without an answer in time, which could land late', async () => {
    const { log, committed, dispose } = kafkaLogWithCommits('zg-commit-timeout', {
      requestTimeoutMs: 500,
      retryBackoffMs: { min: 50, max: 100 },
    });
    const seen = watchConsumers(log, 1, () => new Promise<never>(() => undefined));
    try {
      const errors: unknown[] = [];
      let joined = 0;
      const handled = await consumeAll(log, committed, errors, () => (joined = seen.joins));
      expect(errors.some((e) => (e as Error).message === 'commit timed out')).toBe(true);
      // A new member: what the first one handled after its last commit comes again.
      expect(seen.joins).toBeGreaterThan(joined);
      expect(new Set(handled)).toEqual(new Set(ALL));
    } finally {
      await dispose();
    }
  });
});

describe('KafkaEventLog handler failures', () => {
  it('hands a failed batch again on the same stream, without joining the group again', async () => {
    const { log, dispose } = kafkaLogWithCommits('zg-handler-failures', {
      retryBackoffMs: { min: 50, max: 100 },
    });
    const seen = watchConsumers(log);
    try {
      await log.ensureTopics(['t']);
      const errors: unknown[] = [];
      const handled: string[] = [];
      let failures = 0;
      const sub = await log.subscribe({
        group: 'g',
        topics: ['t'],
        maxBatch: 50,
        maxWaitMs: 10,
        onError: (err) => errors.push(err),
        handler: async (batch) => {
          // A store out of reach for a while: every batch fails until the fifth try.
          if (failures < 5) {
            failures++;
            throw new Error('redis down');
          }
          handled.push(...batch.records.map((r) => r.value));
        },
      });
      const joined = seen.joins;
      expect(joined).toBeGreaterThan(0);
      const records = Array.from({ length: 20 }, (_, i) => ({ key: `k${i % 4}`, value: String(i) }));
      await log.publish('t', records);
      const deadline = Date.now() + 15_000;
      while (new Set(handled).size < records.length && Date.now() < deadline) await delay(20);
      expect(new Set(handled).size).toBe(records.length);
      expect(errors.filter((e) => (e as Error).message === 'redis down')).toHaveLength(5);
      // Five failures, and not one JoinGroup more (each would rebalance the whole group).
      expect(seen.joins).toBe(joined);
      await sub.close();
    } finally {
      await dispose();
    }
  });
});

describe('KafkaEventLog handler failures and rebalances', () => {
  it('hands a failed batch again only for the partitions the member still holds', async () => {
    const { first, second } = twoMembers('zg-retry', 4, { retryBackoffMs: { min: 100, max: 100 } });
    try {
      await first.ensureTopics(['t']);
      const byFirst: string[] = [];
      const bySecond: string[] = [];
      let failing = true;
      let tries = 0;
      const a = await first.subscribe({
        group: 'g',
        topics: ['t'],
        maxBatch: 100,
        maxWaitMs: 10,
        handler: async (batch) => {
          tries++;
          // Redis is down for this member until the group has been rebalanced.
          if (failing) throw new Error('redis down');
          byFirst.push(...batch.records.map((r) => `${r.partition}:${r.value}`));
        },
      });
      const records = Array.from({ length: 40 }, (_, i) => ({ key: `k${i}`, value: String(i) }));
      await first.publish('t', records);
      const deadline = Date.now() + 30_000;
      while (tries < 2 && Date.now() < deadline) await delay(20);
      expect(tries).toBeGreaterThanOrEqual(2);
      // A second member joins: the group splits the partitions while the first retries its batch.
      const b = await second.subscribe({
        group: 'g',
        topics: ['t'],
        maxBatch: 100,
        maxWaitMs: 10,
        handler: async (batch) => {
          bySecond.push(...batch.records.map((r) => `${r.partition}:${r.value}`));
        },
      });
      while (bySecond.length === 0 && Date.now() < deadline) await delay(20);
      expect(bySecond.length).toBeGreaterThan(0);
      failing = false;
      while (new Set([...byFirst, ...bySecond]).size < records.length && Date.now() < deadline)
        await delay(20);
      expect(new Set([...byFirst, ...bySecond]).size).toBe(records.length);
      // No partition was handled by both: the first let go of those handed to the second.
      const partitions = (handled: string[]) => new Set(handled.map((h) => h.split(':')[0]));
      const shared = [...partitions(byFirst)].filter((p) => partitions(bySecond).has(p));
      expect(shared).toEqual([]);
      await Promise.all([a.close(), b.close()]);
    } finally {
      await first.deleteGroups(['g']).catch(() => undefined);
      await first.deleteTopics(['t']);
      await Promise.all([first.close(), second.close()]);
    }
  });
});

describe('KafkaEventLog records fetched before a rebalance', () => {
  it('neither hands again nor commits behind what another member handled while it held the partition', async () => {
    const { prefix, first, second } = twoMembers('zg-moved', 2);
    const admin = new Admin({ clientId: 'zg-moved-admin', bootstrapBrokers: services.kafkaBrokers() });
    const committed = () => committedSum(admin, `${prefix}g`);
    try {
      await first.ensureTopics(['t']);
      const records = Array.from({ length: 40 }, (_, i) => ({ key: `k${i}`, value: String(i) }));
      await first.publish('t', records);
      const handled: string[] = [];
      let release!: () => void;
      const gate = new Promise<void>((resolve) => (release = resolve));
      const joinsOfFirst = watchConsumers(first);
      let firstBatch = true;
      let held: string[] = [];
      // The first member's handler holds its first batch while the stream keeps the rest it fetched.
      const a = await first.subscribe({
        group: 'g',
        topics: ['t'],
        maxBatch: 5,
        maxWaitMs: 10,
        handler: async (batch) => {
          if (firstBatch) {
            firstBatch = false;
            held = batch.records.map((r) => r.value);
            await gate;
            return;
          }
          handled.push(...batch.records.map((r) => r.value));
        },
      });
      const deadline = Date.now() + 40_000;
      while (firstBatch && Date.now() < deadline) await delay(20);
      expect(firstBatch).toBe(false);
      // A second member takes one partition, handles and commits all of it, and leaves.
      const bySecond: string[] = [];
      const b = await subscribeInto(second, bySecond, { maxBatch: 100 });
      while (
        (bySecond.length === 0 || (await committed()) < BigInt(bySecond.length)) &&
        Date.now() < deadline
      )
        await delay(50);
      expect(bySecond.length).toBeGreaterThan(0);
      const joined = joinsOfFirst.joins;
      await b.close();
      // The first member holds both partitions again, with records of both fetched before.
      while (joinsOfFirst.joins === joined && Date.now() < deadline) await delay(20);
      expect(joinsOfFirst.joins).toBeGreaterThan(joined);
      release();
      while ((await committed()) < BigInt(records.length) && Date.now() < deadline) await delay(50);
      await delay(1_000);
      expect(await committed()).toBe(BigInt(records.length));
      // Each record handed once, by one member or the other; those the first held through the
      // rebalance may have been the second's too (a handler can't be taken back).
      expect(held).toHaveLength(5);
      expect(
        [...held, ...handled, ...bySecond.filter((v) => !held.includes(v))].toSorted(
          (x, y) => Number(x) - Number(y),
        ),
      ).toEqual(records.map((r) => r.value));
      await a.close();
      expect(await committed()).toBe(BigInt(records.length));
    } finally {
      await admin.close();
      await first.deleteGroups(['g']).catch(() => undefined);
      await first.deleteTopics(['t']);
      await Promise.all([first.close(), second.close()]);
    }
  });
});

/** A subscription in a process of its own (test/rig/kafka-member.ts), which a test may kill. */
function memberProcess(prefix: string, memberName: string) {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', 'test/rig/kafka-member.ts', services.kafkaBrokers().join(','), prefix, memberName],
    { cwd: resolve(import.meta.dirname, '../../..'), stdio: ['ignore', 'pipe', 'pipe'] },
  );
  let out = '';
  let err = '';
  child.stdout.setEncoding('utf8').on('data', (chunk: string) => (out += chunk));
  child.stderr.setEncoding('utf8').on('data', (chunk: string) => (err += chunk));
  const exited = new Promise<void>((ok) => child.once('exit', () => ok()));
  return {
    /** Resolves once the member printed `line`; rejects after `timeoutMs`. */
    async printed(line: string, timeoutMs: number): Promise<void> {
      const deadline = Date.now() + timeoutMs;
      while (!out.split('\n').includes(line)) {
        if (Date.now() > deadline)
          throw new Error(`member did not print "${line}" in ${timeoutMs} ms\n${out}\n${err}`);
        await sleep(20);
      }
    },
    async kill(): Promise<void> {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}

describe('KafkaEventLog member names', () => {
  /** A log on the shared broker with a server's session settings (a dead member lasts 10 s). */
  const serverLikeLog = (prefix: string, options: Omit<KafkaEventLogOptions, 'brokers' | 'prefix'>) =>
    new KafkaEventLog({ brokers: services.kafkaBrokers(), prefix, partitions: 3, ...options });

  it('has a process started again under its name take its partitions over at once', async () => {
    const prefix = `${uniqueName('t')}.`;
    const log = serverLikeLog(prefix, { clientId: 'zg-named' });
    const members: ReturnType<typeof memberProcess>[] = [];
    try {
      await log.ensureTopics(['t']);
      // Keys that land on every partition.
      const publish = (tag: string) =>
        log.publish(
          't',
          Array.from({ length: 12 }, (_, i) => ({ key: `k${i}`, value: `${tag}${i}` })),
        );
      const first = memberProcess(prefix, 'host-n7-worker');
      members.push(first);
      await first.printed('subscribed', 30_000);
      await publish('a');
      for (let i = 0; i < 12; i++) await first.printed(`handled a${i}`, 10_000);
      // Killed: it neither leaves its group nor heartbeats, and its member lives on for its session (10 s).
      await first.kill();
      const started = Date.now();
      const second = memberProcess(prefix, 'host-n7-worker');
      members.push(second);
      await second.printed('subscribed', 30_000);
      await publish('b');
      for (let i = 0; i < 12; i++) await second.printed(`handled b${i}`, 10_000);
      // A process start, a join and the records: well within the dead member's 10 s session.
      expect(Date.now() - started).toBeLessThan(7_000);
    } finally {
      await Promise.all(members.map((m) => m.kill()));
      await log.deleteGroups(['g']).catch(() => undefined);
      await log.deleteTopics(['t']);
      await log.close();
    }
  }, 60_000);

  it('keeps the name through rebalances, however many', async () => {
    const prefix = `${uniqueName('t')}.`;
    const named = serverLikeLog(prefix, { clientId: 'zg-named', memberName: 'host-n7-worker' });
    const other = serverLikeLog(prefix, { clientId: 'zg-other' });
    const handled: string[] = [];
    const errors: string[] = [];
    let sub: Subscription | undefined;
    try {
      await named.ensureTopics(['t']);
      sub = await subscribeInto(named, handled, { onError: (err) => errors.push(String(err)) });
      const joins = watchConsumers(named);
      // Another member comes and goes six times: every one a rebalance the named member joins in.
      for (let i = 0; i < 6; i++) {
        const passing = await subscribeInto(other, []);
        await sleep(300);
        await passing.close();
      }
      await sleep(1_000);
      expect(errors).toEqual([]);
      // No new consumer was made: the same one joined in every rebalance.
      expect(joins.joins).toBe(0);
    } finally {
      await sub?.close();
      await named.deleteGroups(['g']).catch(() => undefined);
      await named.deleteTopics(['t']);
      await Promise.all([named.close(), other.close()]);
    }
  }, 90_000);

  it('gives the name up when another running process takes the member in turn', async () => {
    const prefix = `${uniqueName('t')}.`;
    // Two processes of one name, played by two logs of one process.
    // A name given up is told to the log's reporter, not to the subscription's onError.
    const givenUp: string[][] = [[], []];
    const logs = [0, 1].map((i) =>
      serverLikeLog(prefix, {
        clientId: 'zg-twin',
        memberName: 'host-n7-worker',
        onNameGivenUp: (err) => givenUp[i]!.push(String(err)),
      }),
    );
    const handled: string[] = [];
    const errors: string[][] = [[], []];
    const subscriptions: Subscription[] = [];
    try {
      await logs[0]!.ensureTopics(['t']);
      await Promise.all(
        logs.map(async (log, i) =>
          subscriptions.push(
            await subscribeInto(log, handled, { onError: (err) => errors[i]!.push(String(err)) }),
          ),
        ),
      );
      // Each takes the member from the other about once a second, until one (as a rule) gives the
      // name up; the other is then no longer taken over.
      const takeover = /was taken over 6 times in 15 s, as when another running process has the same name/;
      const told = () => [...givenUp, ...errors].map((list) => list.filter((e) => takeover.test(e)).length);
      const deadline = Date.now() + 30_000;
      while (told().every((n) => n === 0) && Date.now() < deadline) await sleep(50);
      // Told once by each that gave it up, to its reporter only.
      await sleep(2_000);
      const [toFirst, toSecond, ...toOnError] = told();
      expect(toFirst! + toSecond!).toBeGreaterThan(0);
      expect([toFirst, toSecond, ...toOnError]).toEqual([
        expect.toBeOneOf([0, 1]),
        expect.toBeOneOf([0, 1]),
        0,
        0,
      ]);
      // Then the two share the partitions as any two members do.
      await logs[0]!.publish(
        't',
        Array.from({ length: 12 }, (_, i) => ({ key: `k${i}`, value: `v${i}` })),
      );
      const handledBy = Date.now() + 20_000;
      while (new Set(handled).size < 12 && Date.now() < handledBy) await sleep(50);
      expect([...new Set(handled)].sort()).toEqual(Array.from({ length: 12 }, (_, i) => `v${i}`).sort());
    } finally {
      await Promise.all(subscriptions.map((sub) => sub.close()));
      await logs[0]!.deleteGroups(['g']).catch(() => undefined);
      await logs[0]!.deleteTopics(['t']);
      for (const log of logs) await log.close();
    }
  }, 90_000);
});

describe('KafkaEventLog ensureTopics', () => {
  it('keeps every record of the topics named to keep forever, also of a topic created before', async () => {
    const prefix = `${uniqueName('t')}.`;
    const log = new KafkaEventLog({ brokers: services.kafkaBrokers(), prefix, clientId: 'zg-retention' });
    const admin = new Admin({ clientId: 'zg-retention-admin', bootstrapBrokers: services.kafkaBrokers() });
    const retention = async (topic: string): Promise<string | null | undefined> => {
      const [described] = await admin.describeConfigs({
        resources: [
          {
            resourceType: ConfigResourceTypes.TOPIC,
            resourceName: `${prefix}${topic}`,
            configurationKeys: ['retention.ms'],
          },
        ],
      });
      return described?.configs.find((c) => c.name === 'retention.ms')?.value;
    };
    try {
      await log.ensureTopics(['kept', 'plain']);
      const plain = await retention('plain');
      expect(plain).not.toBe('-1');
      await log.ensureTopics(['kept', 'plain'], { keepForever: ['kept'] });
      // The broker applies a config change through its metadata log: it shows a moment later.
      const deadline = Date.now() + 10_000;
      while ((await retention('kept')) !== '-1' && Date.now() < deadline) await delay(100);
      expect(await retention('kept')).toBe('-1');
      expect(await retention('plain')).toBe(plain);
    } finally {
      await admin.close();
      await log.deleteTopics(['kept', 'plain']);
      await log.close();
    }
  });
});

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
