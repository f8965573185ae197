/**
 * Proves the shared test services work as the rig promises, and shows how to use them; the Kafka part
 * is a small worked example of @platformatic/kafka (Admin, Producer, Consumer).
 */
import {
  Admin,
  Consumer,
  ListOffsetTimestamps,
  MessagesStreamModes,
  ProduceAcks,
  Producer,
  stringDeserializers,
  stringSerializers,
  type Message,
} from '@platformatic/kafka';
import { Redis } from 'ioredis';
import type { RowDataPacket } from 'mysql2';
import { createConnection } from 'mysql2/promise';
import { describe, expect, it } from 'vitest';
import { createMysqlDatabase, services, uniqueName } from '../../test/rig/resources.js';

/** Rejects after `ms` unless `work` settles first (and then runs `onTimeout` to unblock it). */
async function within<T>(ms: number, what: string, work: Promise<T>, onTimeout?: () => unknown): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      void onTimeout?.();
      reject(new Error(`${what} did not finish within ${ms} ms`));
    }, ms);
  });
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

describe('test rig', () => {
  it('hands over a run id that is safe in names', () => {
    expect(services.runId()).toMatch(/^[0-9a-f]{1,8}$/);
    expect(uniqueName('thing')).toMatch(new RegExp(`^zgt_${services.runId()}_thing_[0-9a-f]{6}$`));
  });

  it('Redis answers PING', async () => {
    const redis = new Redis(services.redisUrl(), { lazyConnect: true, maxRetriesPerRequest: 1 });
    try {
      await redis.connect();
      expect(await redis.ping()).toBe('PONG');
      const key = uniqueName('key');
      await redis.set(key, 'v', 'EX', 60);
      expect(await redis.get(key)).toBe('v');
      await redis.unlink(key);
    } finally {
      redis.disconnect();
    }
  });

  it('createMysqlDatabase gives a database of our own, gone after drop()', async () => {
    const db = await createMysqlDatabase();
    expect(db.name.startsWith(`zgt_${services.runId()}_db_`)).toBe(true);
    const conn = await createConnection({ uri: db.url });
    try {
      await conn.query('CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(20) NOT NULL)');
      await conn.query('INSERT INTO t VALUES (1, ?), (2, ?)', ['一', 'two']);
      const [rows] = await conn.query<RowDataPacket[]>('SELECT id, name FROM t ORDER BY id');
      expect(rows.map((r) => ({ ...r }))).toEqual([
        { id: 1, name: '一' },
        { id: 2, name: 'two' },
      ]);
    } finally {
      await conn.end();
    }
    await db.drop();

    const root = await createConnection({ uri: services.mysqlRootUrl() });
    try {
      const [left] = await root.query<RowDataPacket[]>('SHOW DATABASES LIKE ?', [db.name]);
      expect(left).toHaveLength(0);
    } finally {
      await root.end();
    }
  });

  it('Kafka: create a topic, produce, consume back with manual commits, list offsets, delete', async () => {
    const bootstrapBrokers = services.kafkaBrokers();
    const topic = uniqueName('topic');
    const groupId = uniqueName('group');

    // Admin: topics are never auto-created by the test broker, so create them explicitly.
    const admin = new Admin({ clientId: 'rig-admin', bootstrapBrokers });
    const producer = new Producer({
      clientId: 'rig-producer',
      bootstrapBrokers,
      serializers: stringSerializers, // key, value and headers as strings instead of Buffers
    });
    const consumer = new Consumer({
      clientId: 'rig-consumer',
      groupId,
      bootstrapBrokers,
      deserializers: stringDeserializers,
      sessionTimeout: 10_000,
      heartbeatInterval: 500,
      maxWaitTime: 200, // a fetch returns after 200 ms when there is nothing to read
    });

    try {
      const created = await admin.createTopics({ topics: [topic], partitions: 2, replicas: 1 });
      expect(created.map((t) => [t.name, t.partitions])).toEqual([[topic, 2]]);
      // A broker learns of a new topic from the controller a moment after the create returns.
      await expect.poll(() => admin.listTopics(), { timeout: 5_000, interval: 100 }).toContain(topic);

      // Producer: records with the same key land on the same partition, in order.
      const sent = await producer.send({
        messages: [
          { topic, key: 'a', value: 'a-1', headers: { origin: 'rig' } },
          { topic, key: 'b', value: 'b-1' },
          { topic, key: 'a', value: 'a-2' },
        ],
        acks: ProduceAcks.ALL,
      });
      expect(sent.offsets?.every((o) => o.topic === topic)).toBe(true);

      // Admin.listOffsets: the end offset (one past the last record) of each partition; -1n = LATEST.
      // The answer is not ordered by partition: index it by `partitionIndex`.
      const listed = await admin.listOffsets({
        topics: [
          {
            name: topic,
            partitions: [0, 1].map((partitionIndex) => ({
              partitionIndex,
              timestamp: ListOffsetTimestamps.LATEST,
            })),
          },
        ],
      });
      const endOffsets: bigint[] = [];
      for (const p of listed[0]!.partitions) endOffsets[p.partitionIndex] = p.offset;
      expect(endOffsets.reduce((a, b) => a + b, 0n)).toBe(3n);

      // Consumer: join the group, read from the beginning, commit each record after handling it.
      const stream = await consumer.consume({
        topics: [topic],
        mode: MessagesStreamModes.EARLIEST,
        autocommit: false,
      });
      const received: Message<string, string, string, string>[] = [];
      await within(
        20_000,
        'consuming 3 records',
        (async () => {
          for await (const message of stream) {
            received.push(message);
            await message.commit();
            if (received.length === 3) break; // leaving the loop destroys the stream
          }
        })(),
        () => stream.close(),
      );

      const byKey = (key: string): string[] => received.filter((m) => m.key === key).map((m) => m.value);
      expect(byKey('a')).toEqual(['a-1', 'a-2']);
      expect(byKey('b')).toEqual(['b-1']);
      const first = received.find((m) => m.value === 'a-1')!;
      expect(first.headers.get('origin')).toBe('rig');
      expect(first.topic).toBe(topic);
      expect(typeof first.offset).toBe('bigint');

      // The commits are the group's position: the committed offset of a partition is its end offset
      // (the array is indexed by partition; -1n where nothing was committed, i.e. an empty partition).
      const committed = await consumer.listCommittedOffsets({ topics: [{ topic, partitions: [0, 1] }] });
      expect(committed.get(topic)).toEqual(endOffsets.map((end) => (end === 0n ? -1n : end)));

      await admin.deleteTopics({ topics: [topic] });
      expect(await admin.listTopics()).not.toContain(topic);
    } finally {
      await consumer.close(true);
      await producer.close();
      await admin.close();
    }
  });
});
