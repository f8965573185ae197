import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { migrate, openMysql, openSqlite, type Db } from '../db/database.js';
import { createMysqlDatabase } from '../../../test/rig/resources.js';
import type { Batch, EventLog, EventRecord } from '../eventlog/eventlog.js';
import { SqliteEventLog } from '../eventlog/sqlite-eventlog.js';
import { MysqlOutboxStore } from './mysql-outbox-store.js';
import { OutboxWriter, type OutboxMessage, type OutboxStore } from './outbox.js';
import { OutboxRelay } from './relay.js';
import { SqliteOutboxStore } from './sqlite-outbox-store.js';

interface Backend {
  db: Db;
  /** A store as a separate relay process would have it (its own connections where the dialect has any). */
  newStore(): Promise<OutboxStore>;
  close(): Promise<void>;
}

const backends: [string, () => Promise<Backend>][] = [
  [
    'sqlite',
    async () => {
      const dir = mkdtempSync(join(tmpdir(), 'zg-outbox-'));
      const db = openSqlite(join(dir, 'outbox.db'));
      await migrate(db);
      return {
        db,
        newStore: async () => new SqliteOutboxStore(db),
        close: async () => {
          await db.close();
          rmSync(dir, { recursive: true, force: true });
        },
      };
    },
  ],
  [
    'mariadb',
    async () => {
      const database = await createMysqlDatabase();
      const db = await openMysql(database.url);
      const extra: Db[] = [];
      try {
        await migrate(db);
      } catch (err) {
        await db.close();
        await database.drop();
        throw err;
      }
      return {
        db,
        newStore: async () => {
          const own = await openMysql(database.url, 4);
          extra.push(own);
          return new MysqlOutboxStore(own);
        },
        close: async () => {
          await Promise.allSettled([db.close(), ...extra.map((d) => d.close())]);
          await database.drop();
        },
      };
    },
  ],
];

/** Records what the relays published; `down` plays an unreachable log. */
class Recorder {
  readonly published: { topic: string; key: string; value: string; by: string }[] = [];
  down = false;
  failures = 0;

  constructor(private readonly publishDelayMs = 0) {}

  /** An event log that only publishes, attributing what it publishes to `by`. */
  log(by = 'default'): EventLog {
    const unused = (): never => {
      throw new Error('not used by the relay');
    };
    return {
      ensureTopics: async () => undefined,
      publish: async (topic: string, records: EventRecord[]) => {
        if (this.publishDelayMs > 0) await delay(this.publishDelayMs);
        if (this.down) {
          this.failures++;
          throw new Error('event log unreachable');
        }
        for (const r of records) this.published.push({ topic, key: r.key, value: r.value, by });
      },
      subscribe: unused,
      endOffsets: unused,
      committedOffsets: unused,
      groupMembers: unused,
      holdsEveryRecord: unused,
      readRange: unused,
      ping: async () => !this.down,
      close: async () => undefined,
    };
  }
}

const writer = new OutboxWriter();

function messages(
  prefix: string,
  count: number,
  keys: number,
  topics = ['likes', 'follows'],
): OutboxMessage[] {
  return Array.from({ length: count }, (_, i) => ({
    topic: topics[i % topics.length]!,
    key: `${prefix}k${i % keys}`,
    payload: `${prefix}${i}`,
  }));
}

async function appendCommitted(db: Db, list: OutboxMessage[], perTransaction = 25): Promise<void> {
  for (let i = 0; i < list.length; i += perTransaction) {
    await db.kysely.transaction().execute((trx) => writer.append(trx, list.slice(i, i + perTransaction)));
  }
}

async function outboxCount(db: Db): Promise<number> {
  const row = await db.kysely
    .selectFrom('outbox')
    .select((eb) => eb.fn.countAll<number | string>().as('n'))
    .executeTakeFirstOrThrow();
  return Number(row.n);
}

/** Payloads in the order they were published, per topic and key. */
function perKey(list: { topic: string; key: string; value: string }[]): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const r of list) (out[`${r.topic}/${r.key}`] ??= []).push(r.value);
  return out;
}

function expected(list: OutboxMessage[]): Record<string, string[]> {
  return perKey(list.map((m) => ({ topic: m.topic, key: m.key, value: m.payload })));
}

describe.each(backends)('outbox on %s', (dialect, open) => {
  let b: Backend;

  beforeAll(async () => {
    b = await open();
  });

  afterAll(async () => {
    await b?.close();
  });

  it('never publishes rows of a rolled-back transaction', async () => {
    const kept: OutboxMessage = { topic: 'likes', key: 'rb', payload: 'committed' };
    await expect(
      b.db.kysely.transaction().execute(async (trx) => {
        await writer.append(trx, { topic: 'likes', key: 'rb', payload: 'rolled back' });
        throw new Error('business rule failed');
      }),
    ).rejects.toThrow('business rule failed');
    await b.db.kysely.transaction().execute((trx) => writer.append(trx, kept));
    await writer.append(b.db.kysely, []);

    const log = new Recorder();
    const relay = new OutboxRelay({ store: await b.newStore(), events: log.log() });
    expect(await relay.runOnce()).toBe(1);
    expect(await relay.runOnce()).toBe(0);
    expect(log.published).toEqual([{ topic: 'likes', key: 'rb', value: 'committed', by: 'default' }]);
    expect(await outboxCount(b.db)).toBe(0);
  });

  it('publishes every committed row once, in id order per key, and empties the outbox', async () => {
    const list = messages('a', 230, 9);
    await appendCommitted(b.db, list);
    const log = new Recorder();
    const published: number[] = [];
    const relay = new OutboxRelay({
      store: await b.newStore(),
      events: log.log(),
      batchSize: 40,
      pollIntervalMs: 20,
      onPublished: (n) => published.push(n),
    });
    relay.start();
    await waitUntil(() => log.published.length >= list.length, 15_000);
    await relay.stop();
    expect(log.published).toHaveLength(list.length);
    expect(perKey(log.published)).toEqual(expected(list));
    expect(published.reduce((s, n) => s + n, 0)).toBe(list.length);
    expect(relay.stats.published).toBe(list.length);
    expect(await outboxCount(b.db)).toBe(0);
  });

  it('keeps the rows while publishing fails and publishes them after recovery', async () => {
    const list = messages('f', 30, 4);
    const log = new Recorder();
    log.down = true;
    const errors: unknown[] = [];
    const relay = new OutboxRelay({
      store: await b.newStore(),
      events: log.log(),
      batchSize: 8,
      pollIntervalMs: 20,
      retryBackoffMs: { min: 20, max: 100 },
      onError: (err) => errors.push(err),
    });
    await appendCommitted(b.db, list, 10);
    relay.start();
    await waitUntil(() => log.failures >= 3, 10_000);
    expect(await outboxCount(b.db)).toBe(list.length);
    expect(errors.length).toBeGreaterThanOrEqual(3);
    expect(relay.stats.failedRounds).toBeGreaterThanOrEqual(3);

    log.down = false;
    await waitUntil(() => log.published.length >= list.length, 10_000);
    await relay.stop();
    expect(log.published).toHaveLength(list.length);
    expect(perKey(log.published)).toEqual(expected(list));
    expect(await outboxCount(b.db)).toBe(0);
  });

  it('stop waits for the round in flight, which then deletes what it published', async () => {
    const list = messages('s', 5, 5);
    await appendCommitted(b.db, list);
    const log = new Recorder(300);
    const relay = new OutboxRelay({
      store: await b.newStore(),
      events: log.log(),
      batchSize: 100,
      pollIntervalMs: 20,
    });
    relay.start();
    await delay(100);
    await relay.stop();
    expect(log.published).toHaveLength(list.length);
    expect(await outboxCount(b.db)).toBe(0);
  });

  it.runIf(dialect === 'sqlite')('relays into the embedded event log', async () => {
    const events = new SqliteEventLog(b.db);
    const list = messages('e', 60, 6);
    await appendCommitted(b.db, list);
    const relay = new OutboxRelay({ store: await b.newStore(), events, batchSize: 25, pollIntervalMs: 20 });
    relay.start();
    await waitUntil(async () => (await outboxCount(b.db)) === 0, 10_000);
    await relay.stop();
    const read: { topic: string; key: string; value: string }[] = [];
    for (const topic of ['likes', 'follows']) {
      await events.readRange(topic, await events.endOffsets(topic), async (batch: Batch) => {
        read.push(...batch.records);
      });
    }
    expect(perKey(read)).toEqual(expected(list));
    await events.close();
  });

  it.runIf(dialect === 'mariadb')(
    'lets concurrent relays share the work without publishing a row twice or out of key order',
    async () => {
      const list = messages('c', 400, 12);
      await appendCommitted(b.db, list, 50);
      const log = new Recorder(5);
      const relays = await Promise.all(
        ['one', 'two', 'three'].map(
          async (name) =>
            new OutboxRelay({
              store: await b.newStore(),
              events: log.log(name),
              batchSize: 10,
              pollIntervalMs: 10,
            }),
        ),
      );
      for (const r of relays) r.start();
      await waitUntil(() => log.published.length >= list.length, 20_000);
      await Promise.all(relays.map((r) => r.stop()));

      expect(log.published).toHaveLength(list.length);
      expect(new Set(log.published.map((p) => p.value)).size).toBe(list.length);
      expect(perKey(log.published)).toEqual(expected(list));
      const workers = new Set(log.published.map((p) => p.by));
      expect(workers.size).toBeGreaterThan(1);
      expect(await outboxCount(b.db)).toBe(0);
    },
  );

  it.runIf(dialect === 'mariadb')(
    'goes on at once after a full claim part of which waits behind another relay',
    async () => {
      const held: OutboxMessage = { topic: 'follows', key: 'p-held', payload: 'p-first' };
      const behind: OutboxMessage = { ...held, payload: 'p-second' };
      const free = messages('p', 29, 29, ['follows']);
      await appendCommitted(b.db, [held, behind, ...free]);

      // Another relay holds the first row of a key until released.
      let release!: () => void;
      const gate = new Promise<void>((resolve) => (release = resolve));
      let holding = false;
      const other = (await b.newStore()).claim(1, async (rows) => {
        holding = true;
        await gate;
        return rows.map((r) => r.id);
      });
      await waitUntil(() => holding, 5_000);

      const log = new Recorder();
      const relay = new OutboxRelay({
        store: await b.newStore(),
        events: log.log(),
        batchSize: 10,
        pollIntervalMs: 60_000,
      });
      relay.start();
      try {
        // Each claim of 10 holds back the key's second row and hands the other 9: a full claim,
        // so no poll interval is waited until only the held-back row is left.
        await waitUntil(() => log.published.length >= free.length, 5_000);
        expect(log.published.map((p) => p.value)).toEqual(free.map((m) => m.payload));
      } finally {
        release();
        await other;
        await relay.stop();
      }
      expect(await outboxCount(b.db)).toBe(1);
      await b.newStore().then((s) => s.claim(10, async (rows) => rows.map((r) => r.id)));
    },
  );
});

async function waitUntil(condition: () => boolean | Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await delay(20);
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
