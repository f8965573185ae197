import { afterEach, describe, expect, it, vi } from 'vitest';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { migrate, openSqlite, type Db } from '../db/database.js';
import type { DeliveredRecord, EventLog } from './eventlog.js';
import { SqliteEventLog, type SqliteEventLogOptions } from './sqlite-eventlog.js';
import { turnCounter } from '../../../test/rig/fakes.js';

const RETENTION_MS = 1_000;

describe(`${SqliteEventLog.name} retention`, () => {
  const cleanups: (() => Promise<void>)[] = [];
  let clock = 1_000_000;

  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });

  const newDb = async (): Promise<{ db: Db; path: string }> => {
    const dir = mkdtempSync(join(tmpdir(), 'zg-eventlog-retention-'));
    const path = join(dir, 'events.db');
    const db = openSqlite(path);
    await migrate(db);
    cleanups.push(async () => {
      await db.close();
      rmSync(dir, { recursive: true, force: true });
    });
    return { db, path };
  };

  const newLog = (db: Db, options: SqliteEventLogOptions = {}): SqliteEventLog => {
    const log = new SqliteEventLog(db, {
      idlePollMs: 5,
      retryBackoffMs: { min: 20, max: 50 },
      retentionMs: RETENTION_MS,
      pruneIntervalMs: 0,
      now: () => clock,
      ...options,
    });
    // Closed before its database (cleanups run in reverse).
    cleanups.push(() => log.close());
    return log;
  };

  const publish = (log: EventLog, topic: string, ...values: string[]): Promise<void> =>
    log.publish(
      topic,
      values.map((value) => ({ key: 'k', value })),
    );

  /** Lets `group` handle and commit exactly the first `count` records it is given, then leave. */
  const consume = async (log: EventLog, group: string, topic: string, count: number): Promise<void> => {
    const handled: string[] = [];
    const sub = await log.subscribe({
      group,
      topics: [topic],
      maxBatch: count,
      handler: async (batch) => {
        if (handled.length >= count) throw new Error('enough');
        handled.push(...batch.records.map((r) => r.value));
      },
    });
    const deadline = Date.now() + 5_000;
    while (handled.length < count && Date.now() < deadline) await delay(5);
    await sub.close();
    expect(handled).toHaveLength(count);
  };

  const readAll = async (log: EventLog, topic: string): Promise<DeliveredRecord[]> => {
    const records: DeliveredRecord[] = [];
    await log.readRange(topic, await log.endOffsets(topic), async (batch) => {
      records.push(...batch.records);
    });
    return records;
  };

  const values = (records: DeliveredRecord[]): string[] => records.map((r) => r.value);

  it('deletes the records every group consumed once they are older than the retention age', async () => {
    const { db } = await newDb();
    const sut = newLog(db);
    await sut.ensureTopics(['views']);
    await publish(sut, 'views', 'a', 'b', 'c');
    await consume(sut, 'g', 'views', 2);
    await publish(sut, 'views', 'd');
    const before = await readAll(sut, 'views');
    const end = await sut.endOffsets('views');

    clock += RETENTION_MS + 1;
    expect(await sut.prune()).toBe(2);

    const after = await readAll(sut, 'views');
    expect(values(after)).toEqual(['c', 'd']);
    // Offsets stay: the retained records keep theirs, the end is where it was.
    expect(after).toEqual(before.slice(2));
    expect(await sut.endOffsets('views')).toEqual(end);
    // The group goes on where it stopped, and a new record takes the next offset.
    await publish(sut, 'views', 'e');
    const [e] = (await readAll(sut, 'views')).slice(-1);
    expect(e?.offset).toBe(end.get(0));
    expect(await sut.endOffsets('views')).toEqual(new Map([[0, end.get(0)! + 1n]]));
    const seen: string[] = [];
    const sub = await sut.subscribe({
      group: 'g',
      topics: ['views'],
      handler: async (batch) => {
        seen.push(...values(batch.records));
      },
    });
    const deadline = Date.now() + 5_000;
    while (seen.length < 3 && Date.now() < deadline) await delay(5);
    await sub.close();
    expect(seen).toEqual(['c', 'd', 'e']);
  });

  it('keeps the newest record of a topic, so its end offset stays when everything was consumed', async () => {
    const { db } = await newDb();
    const sut = newLog(db);
    await publish(sut, 'views', 'a', 'b', 'c');
    await consume(sut, 'g', 'views', 3);
    const end = await sut.endOffsets('views');

    clock += RETENTION_MS + 1;
    expect(await sut.prune()).toBe(2);

    expect(values(await readAll(sut, 'views'))).toEqual(['c']);
    expect(await sut.endOffsets('views')).toEqual(end);
  });

  it('keeps records younger than the retention age, and all that follow them', async () => {
    const { db } = await newDb();
    const sut = newLog(db);
    await publish(sut, 'views', 'a', 'b');
    clock += RETENTION_MS / 2;
    await publish(sut, 'views', 'c', 'd', 'e');
    await consume(sut, 'g', 'views', 5);

    clock += RETENTION_MS / 2 - 1;
    expect(await sut.prune()).toBe(0);
    expect(values(await readAll(sut, 'views'))).toEqual(['a', 'b', 'c', 'd', 'e']);

    clock += 2;
    expect(await sut.prune()).toBe(2);
    expect(values(await readAll(sut, 'views'))).toEqual(['c', 'd', 'e']);
  });

  it('keeps what a lagging group has not consumed, and deletes it once the group caught up', async () => {
    const { db } = await newDb();
    const sut = newLog(db);
    await publish(sut, 'posts', 'a', 'b', 'c', 'd', 'e');
    await consume(sut, 'fast', 'posts', 5);
    await consume(sut, 'slow', 'posts', 2);

    clock += RETENTION_MS + 1;
    expect(await sut.prune()).toBe(2);
    expect(values(await readAll(sut, 'posts'))).toEqual(['c', 'd', 'e']);

    await consume(sut, 'slow', 'posts', 3);
    expect(await sut.prune()).toBe(2);
    expect(values(await readAll(sut, 'posts'))).toEqual(['e']);
  });

  it('keeps every record of a topic no group committed on', async () => {
    const { db } = await newDb();
    const sut = newLog(db);
    await publish(sut, 'relations', 'a', 'b');
    await publish(sut, 'views', 'x', 'y');
    await consume(sut, 'g', 'views', 2);

    clock += RETENTION_MS + 1;
    expect(await sut.prune()).toBe(1);

    expect(values(await readAll(sut, 'relations'))).toEqual(['a', 'b']);
    expect(values(await readAll(sut, 'views'))).toEqual(['y']);
  });

  it('keeps a keep-forever topic whole, also after a restart that no longer names it so', async () => {
    const { db, path } = await newDb();
    const first = newLog(db);
    await first.ensureTopics(['counters', 'views'], { keepForever: ['counters'] });
    await publish(first, 'counters', '1', '2', '3');
    await publish(first, 'views', 'a', 'b', 'c');
    await consume(first, 'g', 'counters', 3);
    await consume(first, 'g', 'views', 3);
    clock += RETENTION_MS + 1;
    expect(await first.prune()).toBe(2);
    expect(values(await readAll(first, 'counters'))).toEqual(['1', '2', '3']);
    expect(values(await readAll(first, 'views'))).toEqual(['c']);
    await first.close();

    // Another process, as after a restart, on the same file.
    const reopened = openSqlite(path);
    cleanups.push(() => reopened.close());
    const sut = newLog(reopened);
    await sut.ensureTopics(['counters', 'views']);
    await publish(sut, 'counters', '4');
    await consume(sut, 'g', 'counters', 1);
    clock += RETENTION_MS + 1;
    expect(await sut.prune()).toBe(0);
    expect(values(await readAll(sut, 'counters'))).toEqual(['1', '2', '3', '4']);
    await expect(
      sut.subscribe({ group: '__keep_forever', topics: ['counters'], handler: async () => undefined }),
    ).rejects.toThrow(/reserved/);
  });

  it('deletes in chunks of pruneChunk records until all that may go is gone', async () => {
    const { db } = await newDb();
    const sut = newLog(db, { pruneChunk: 2 });
    const deleteFrom = db.kysely.deleteFrom.bind(db.kysely);
    const spy = vi
      .spyOn(db.kysely, 'deleteFrom')
      .mockImplementation(((table: 'event_log') => deleteFrom(table)) as typeof deleteFrom);
    await publish(sut, 'views', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h');
    await consume(sut, 'g', 'views', 8);

    clock += RETENTION_MS + 1;
    spy.mockClear();
    expect(await sut.prune()).toBe(7);

    // Seven records two at a time: four statements, the last one short.
    expect(spy).toHaveBeenCalledTimes(4);
    expect(values(await readAll(sut, 'views'))).toEqual(['h']);
  });

  it('gives the event loop a turn between chunks, so requests are served while a backlog goes', async () => {
    const { db } = await newDb();
    const sut = newLog(db, { pruneChunk: 2 });
    await publish(sut, 'views', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h');
    await consume(sut, 'g', 'views', 8);
    clock += RETENTION_MS + 1;
    const loop = turnCounter();
    expect(await sut.prune()).toBe(7);
    loop.stop();
    expect(loop.turns).toBeGreaterThanOrEqual(3);
  });

  it('gives the event loop a turn between the full batches of a backlog, so a server answers meanwhile', async () => {
    const { db } = await newDb();
    const sut = newLog(db);
    await publish(sut, 'views', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h');
    const loop = turnCounter();
    const seen: number[] = [];
    const sub = await sut.subscribe({
      group: 'g',
      topics: ['views'],
      maxBatch: 2,
      handler: async () => void seen.push(loop.turns),
    });
    const deadline = Date.now() + 5_000;
    while (seen.length < 4 && Date.now() < deadline) await delay(5);
    loop.stop();
    await sub.close();
    expect(seen).toHaveLength(4);
    for (let i = 1; i < seen.length; i++) expect(seen[i]).toBeGreaterThan(seen[i - 1]!);
  });

  it('gives the event loop a turn between the chunks of a range read (a replay renews its lease, takes signals)', async () => {
    const { db } = await newDb();
    const sut = newLog(db);
    await publish(sut, 'counter-events', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h');
    const loop = turnCounter();
    const read: string[] = [];
    await sut.readRange(
      'counter-events',
      await sut.endOffsets('counter-events'),
      async (batch) => {
        read.push(...batch.records.map((r) => r.value));
      },
      2,
    );
    loop.stop();
    expect(read).toEqual(['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h']);
    expect(loop.turns).toBeGreaterThanOrEqual(3);
  });

  it('prunes by itself every pruneIntervalMs once ensureTopics was called, until closed', async () => {
    const { db } = await newDb();
    const sut = newLog(db, { pruneIntervalMs: 20 });
    const prune = vi.spyOn(sut, 'prune');
    await publish(sut, 'views', 'a', 'b', 'c');
    await consume(sut, 'g', 'views', 3);
    clock += RETENTION_MS + 1;
    await delay(80);
    expect(prune).not.toHaveBeenCalled();

    await sut.ensureTopics(['views']);
    const deadline = Date.now() + 5_000;
    while ((await readAll(sut, 'views')).length > 1 && Date.now() < deadline) await delay(10);
    expect(values(await readAll(sut, 'views'))).toEqual(['c']);

    await sut.close();
    const calls = prune.mock.calls.length;
    await delay(80);
    expect(prune.mock.calls.length).toBe(calls);
  });

  it('tells of a periodic prune that failed, and tries again at the next interval', async () => {
    const { db } = await newDb();
    const failures: unknown[] = [];
    const sut = newLog(db, { pruneIntervalMs: 20, onPruneError: (err) => failures.push(err) });
    const prune = vi.spyOn(sut, 'prune').mockRejectedValue(new Error('database is locked'));
    await sut.ensureTopics(['views']);
    const deadline = Date.now() + 5_000;
    while (failures.length < 2 && Date.now() < deadline) await delay(10);
    expect(failures.slice(0, 2)).toEqual([new Error('database is locked'), new Error('database is locked')]);
    expect(prune.mock.calls.length).toBeGreaterThanOrEqual(2);
  });

  it('tells whether every subscription of this process has handled every record of its topics', async () => {
    const { db } = await newDb();
    const log = newLog(db);
    expect(await log.caughtUp()).toBe(true);
    await publish(log, 'a', '1');
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const seen: string[] = [];
    const sub = await log.subscribe({
      group: 'g',
      topics: ['a', 'b'],
      handler: async (batch) => {
        await gate;
        seen.push(...batch.records.map((r) => r.value));
      },
    });
    cleanups.push(() => sub.close());
    // A record handed over and not yet handled, and one of another topic not yet read.
    await publish(log, 'b', '2');
    expect(await log.caughtUp()).toBe(false);
    release();
    await vi.waitFor(() => expect(seen.sort()).toEqual(['1', '2']));
    await vi.waitFor(async () => expect(await log.caughtUp()).toBe(true));
    // Records of topics nobody here reads do not count.
    await publish(log, 'c', '3');
    expect(await log.caughtUp()).toBe(true);
  });
});

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
