import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type {
  Batch,
  DeliveredRecord,
  EventLog,
  EventRecord,
  SubscribeOptions,
  Subscription,
} from './eventlog.js';

export interface EventLogHarness {
  log: EventLog;
  /** A second adapter whose backend is down or unreachable; `publish` on it must reject quickly. */
  unreachable(): Promise<EventLog>;
  /** Removes the oldest records of `topic`, as retention would. */
  dropOldest(topic: string): Promise<void>;
  /** Removes what the suite created in a shared backend. */
  cleanup?(topics: string[], groups: string[]): Promise<void>;
  close(): Promise<void>;
}

export interface EventLogContractOptions {
  /** Upper bound for waiting on deliveries. */
  deliveryTimeoutMs?: number;
}

/** The semantics documented on `EventLog`, proved against one adapter. */
export function defineEventLogContract(
  name: string,
  factory: () => Promise<EventLogHarness>,
  options: EventLogContractOptions = {},
): void {
  const deliveryTimeoutMs = options.deliveryTimeoutMs ?? 15_000;

  describe(`EventLog contract: ${name}`, () => {
    let h: EventLogHarness;
    const topics: string[] = [];
    const groups: string[] = [];
    const open: Subscription[] = [];
    let seq = 0;

    const newTopic = async (): Promise<string> => {
      const t = `topic${++seq}`;
      topics.push(t);
      await h.log.ensureTopics([t]);
      return t;
    };
    const newGroup = (): string => {
      const g = `group${++seq}`;
      groups.push(g);
      return g;
    };
    const subscribe = async (opts: SubscribeOptions): Promise<Subscription> => {
      const sub = await h.log.subscribe(opts);
      open.push(sub);
      return sub;
    };
    const collector = (): Collector => new Collector(deliveryTimeoutMs);

    beforeAll(async () => {
      h = await factory();
    });

    afterAll(async () => {
      if (!h) return;
      await Promise.allSettled(open.map((s) => s.close()));
      try {
        await h.cleanup?.(topics, groups);
      } finally {
        await h.close();
      }
    });

    it('ensureTopics is idempotent and the log answers ping', async () => {
      const t = await newTopic();
      await h.log.ensureTopics([t, t]);
      await h.log.ensureTopics([t]);
      expect(await h.log.ping()).toBe(true);
    });

    it('delivers every record, in publish order per key, in batches of at most maxBatch', async () => {
      const a = await newTopic();
      const b = await newTopic();
      const early = records('k', 5, 8);
      const late = records('k', 5, 8, 8);
      await h.log.publish(a, early.slice(0, 20));
      await h.log.publish(a, early.slice(20));
      await h.log.publish(b, [{ key: 'only', value: 'b0' }]);
      const got = collector();
      const sub = await subscribe({
        group: newGroup(),
        topics: [a, b],
        maxBatch: 7,
        maxWaitMs: 50,
        handler: got.handler,
      });
      await h.log.publish(a, late);
      await h.log.publish(b, [{ key: 'only', value: 'b1' }]);

      await got.until(() => got.records.length >= 82);
      await sub.close();
      expect(got.records).toHaveLength(82);
      for (const batch of got.batches) {
        expect(batch.records.length).toBeGreaterThan(0);
        expect(batch.records.length).toBeLessThanOrEqual(7);
        for (const r of batch.records) expect(r.topic).toBe(batch.topic);
      }
      const fromA = got.records.filter((r) => r.topic === a);
      expect(perKey(fromA)).toEqual(perKey([...early, ...late]));
      expect(got.records.filter((r) => r.topic === b).map((r) => r.value)).toEqual(['b0', 'b1']);
      for (const r of got.records) {
        expect(typeof r.offset).toBe('bigint');
        expect(Number.isInteger(r.partition)).toBe(true);
        expect(r.timestamp).toBeGreaterThan(0);
      }
    });

    it('redelivers a batch whose handler threw, skipping and losing nothing', async () => {
      const t = await newTopic();
      const sent = records('r', 4, 10);
      await h.log.publish(t, sent);
      const errors: unknown[] = [];
      let failed: DeliveredRecord[] | undefined;
      const got = collector();
      await subscribe({
        group: newGroup(),
        topics: [t],
        maxBatch: 6,
        maxWaitMs: 50,
        onError: (err) => errors.push(err),
        handler: async (batch) => {
          if (!failed) {
            failed = batch.records;
            throw new Error('handler failed once');
          }
          await got.handler(batch);
        },
      });
      await got.until(() => distinct(got.records).length >= sent.length);
      expect(failed).toBeDefined();
      const later = new Set(got.records.map(id));
      for (const r of failed!) expect(later.has(id(r))).toBe(true);
      expect(perKey(distinct(got.records))).toEqual(perKey(sent));
      expect(errors.some((e) => e instanceof Error && e.message === 'handler failed once')).toBe(true);
    });

    it('redelivers to the next member of the group what a closed subscription had not committed', async () => {
      const t = await newTopic();
      const g = newGroup();
      const sent = records('c', 3, 4);
      await h.log.publish(t, sent);
      const gate = deferred();
      const first: DeliveredRecord[] = [];
      let closed = false;
      const sub = await subscribe({
        group: g,
        topics: [t],
        maxBatch: 50,
        maxWaitMs: 300,
        onError: () => undefined,
        handler: async (batch) => {
          first.push(...batch.records);
          await gate.promise;
        },
      });
      await waitUntil(() => first.length > 0, deliveryTimeoutMs);
      const closing = sub.close().then(() => (closed = true));
      await delay(100);
      // close waits for the handler in flight
      expect(closed).toBe(false);
      gate.reject(new Error('stopped before commit'));
      await closing;

      const got = collector();
      await subscribe({ group: g, topics: [t], handler: got.handler });
      await got.until(() => distinct(got.records).length >= sent.length);
      const again = new Set(got.records.map(id));
      for (const r of first) expect(again.has(id(r))).toBe(true);
      expect(perKey(distinct(got.records))).toEqual(perKey(sent));
    });

    it('commits the batch in flight when closed, so the next member continues after it', async () => {
      const t = await newTopic();
      const g = newGroup();
      const sent = records('d', 3, 5);
      await h.log.publish(t, sent);
      const gate = deferred();
      const first: DeliveredRecord[] = [];
      const sub = await subscribe({
        group: g,
        topics: [t],
        maxBatch: 4,
        maxWaitMs: 50,
        handler: async (batch) => {
          if (first.length > 0) throw new Error('only one batch expected before close');
          first.push(...batch.records);
          await gate.promise;
        },
      });
      await waitUntil(() => first.length > 0, deliveryTimeoutMs);
      const closing = sub.close();
      gate.resolve();
      await closing;

      const got = collector();
      await subscribe({ group: g, topics: [t], handler: got.handler });
      await got.until(() => got.records.length + first.length >= sent.length);
      await delay(300);
      const handled = new Set(first.map(id));
      expect(got.records.filter((r) => handled.has(id(r)))).toEqual([]);
      expect(got.records.length + first.length).toBe(sent.length);
    });

    it('with commitIntervalMs, commits on close every batch it handled, so the next member continues after them', async () => {
      const t = await newTopic();
      const g = newGroup();
      const sent = records('i', 3, 8);
      await h.log.publish(t, sent);
      const first: DeliveredRecord[] = [];
      let batches = 0;
      const sub = await subscribe({
        group: g,
        topics: [t],
        maxBatch: 4,
        maxWaitMs: 20,
        // Far longer than the test: only close commits what came after the first batch.
        commitIntervalMs: 600_000,
        handler: async (batch) => {
          batches++;
          first.push(...batch.records);
        },
      });
      await waitUntil(() => first.length >= sent.length, deliveryTimeoutMs);
      expect(batches).toBeGreaterThan(1);
      await sub.close();

      const got = collector();
      await subscribe({ group: g, topics: [t], handler: got.handler });
      await delay(1_000);
      expect(got.records).toEqual([]);
    });

    it('shares a group between members and hands work over when one leaves', async () => {
      const t = await newTopic();
      const g = newGroup();
      const first = records('m', 9, 4);
      const second = records('m', 9, 3, 4);
      const shared = collector();
      const one = await subscribe({ group: g, topics: [t], maxBatch: 5, handler: shared.handler });
      const two = await subscribe({ group: g, topics: [t], maxBatch: 5, handler: shared.handler });
      await h.log.publish(t, first);
      await shared.until(() => distinct(shared.records).length >= first.length);
      await one.close();
      await h.log.publish(t, second);
      await shared.until(() => distinct(shared.records).length >= first.length + second.length);
      await two.close();
      expect(perKey(distinct(shared.records))).toEqual(perKey([...first, ...second]));
    });

    it('gives every group all records', async () => {
      const t = await newTopic();
      const sent = records('g', 4, 5);
      await h.log.publish(t, sent);
      const one = collector();
      const two = collector();
      await Promise.all([
        subscribe({ group: newGroup(), topics: [t], handler: one.handler }),
        subscribe({ group: newGroup(), topics: [t], handler: two.handler }),
      ]);
      await Promise.all([
        one.until(() => one.records.length >= 20),
        two.until(() => two.records.length >= 20),
      ]);
      expect(perKey(one.records)).toEqual(perKey(sent));
      expect(perKey(two.records)).toEqual(perKey(sent));
    });

    it('starts a new group at the earliest record, or after the latest with fromLatest', async () => {
      const t = await newTopic();
      const old = records('o', 2, 3);
      await h.log.publish(t, old);
      const fromStart = collector();
      const fromNow = collector();
      await subscribe({ group: newGroup(), topics: [t], handler: fromStart.handler });
      await subscribe({ group: newGroup(), topics: [t], fromLatest: true, handler: fromNow.handler });
      const fresh = records('o', 2, 3, 3);
      await h.log.publish(t, fresh);
      await fromStart.until(() => fromStart.records.length >= 12);
      await fromNow.until(() => fromNow.records.length >= 6);
      await delay(300);
      expect(perKey(fromStart.records)).toEqual(perKey([...old, ...fresh]));
      expect(perKey(fromNow.records)).toEqual(perKey(fresh));
    });

    it('reads exactly up to captured end offsets, without touching any group', async () => {
      const t = await newTopic();
      expect(await collectRange(h.log, t, await h.log.endOffsets(t))).toEqual([]);
      const before = records('e', 6, 7);
      await h.log.publish(t, before.slice(0, 15));
      await h.log.publish(t, before.slice(15));
      const end = await h.log.endOffsets(t);
      const after = records('e', 6, 3, 7);
      const publishing = h.log.publish(t, after);

      const batches: Batch[] = [];
      const read = await collectRange(h.log, t, end, 5, batches);
      await publishing;
      expect(read).toHaveLength(before.length);
      expect(perKey(read)).toEqual(perKey(before));
      for (const b of batches) expect(b.records.length).toBeLessThanOrEqual(5);
      // again, with the rest published: same answer
      expect(perKey(await collectRange(h.log, t, end))).toEqual(perKey(before));
      // and from the end captured then to the end now: exactly the rest
      const tail: DeliveredRecord[] = [];
      await h.log.readRange(t, await h.log.endOffsets(t), async (b) => void tail.push(...b.records), 4, end);
      expect(perKey(tail)).toEqual(perKey(after));

      const got = collector();
      await subscribe({ group: newGroup(), topics: [t], handler: got.handler });
      await got.until(() => got.records.length >= before.length + after.length);
      expect(perKey(got.records)).toEqual(perKey([...before, ...after]));
    });

    it('tells where a group goes on reading: after what it committed, in end-offset terms', async () => {
      const t = await newTopic();
      const g = newGroup();
      expect([...(await h.log.committedOffsets(g, t))]).toEqual([]);
      const sent = records('c', 4, 3);
      await h.log.publish(t, sent);
      const got = collector();
      const sub = await subscribe({ group: g, topics: [t], handler: got.handler });
      await got.until(() => got.records.length >= sent.length);
      await sub.close();
      const end = await h.log.endOffsets(t);
      const committed = await h.log.committedOffsets(g, t);
      for (const [partition, offset] of end) if (offset > 0n) expect(committed.get(partition)).toBe(offset);
      // Published after: not consumed, so neither committed nor read up to the committed offsets.
      await h.log.publish(t, records('c2', 2, 2));
      expect([...(await h.log.committedOffsets(g, t))]).toEqual([...committed]);
      expect(perKey(await collectRange(h.log, t, committed))).toEqual(perKey(sent));
      expect([...(await h.log.committedOffsets(newGroup(), t))]).toEqual([]);
    });

    it('counts the members of a group, and none once they closed', async () => {
      const t = await newTopic();
      const g = newGroup();
      expect(await h.log.groupMembers(g)).toBe(0);
      const first = await subscribe({ group: g, topics: [t], handler: async () => undefined });
      const second = await subscribe({ group: g, topics: [t], handler: async () => undefined });
      const deadline = Date.now() + 20_000;
      while ((await h.log.groupMembers(g)) < 2 && Date.now() < deadline) await delay(100);
      expect(await h.log.groupMembers(g)).toBe(2);
      await first.close();
      await second.close();
      while ((await h.log.groupMembers(g)) > 0 && Date.now() < deadline) await delay(100);
      expect(await h.log.groupMembers(g)).toBe(0);
    });

    it('tells whether a topic still holds every record published to it', async () => {
      const t = await newTopic();
      expect(await h.log.holdsEveryRecord(t)).toBe(true);
      await h.log.publish(t, records('r', 3, 2));
      expect(await h.log.holdsEveryRecord(t)).toBe(true);
      await h.dropOldest(t);
      expect(await h.log.holdsEveryRecord(t)).toBe(false);
    });

    it('rejects publish promptly when the log cannot be reached', async () => {
      const dead = await h.unreachable();
      try {
        const started = Date.now();
        await expect(dead.publish('nowhere', [{ key: 'k', value: 'v' }])).rejects.toBeDefined();
        expect(Date.now() - started).toBeLessThan(10_000);
        expect(await dead.ping()).toBe(false);
      } finally {
        await dead.close().catch(() => undefined);
      }
    });
  });
}

class Collector {
  readonly records: DeliveredRecord[] = [];
  readonly batches: Batch[] = [];

  constructor(private readonly timeoutMs: number) {}

  readonly handler = async (batch: Batch): Promise<void> => {
    this.batches.push(batch);
    this.records.push(...batch.records);
  };

  until(condition: () => boolean): Promise<void> {
    return waitUntil(condition, this.timeoutMs, () => `${this.records.length} records so far`);
  }
}

async function collectRange(
  log: EventLog,
  topic: string,
  end: Map<number, bigint>,
  maxBatch?: number,
  batches: Batch[] = [],
): Promise<DeliveredRecord[]> {
  const out: DeliveredRecord[] = [];
  await log.readRange(
    topic,
    end,
    async (batch) => {
      batches.push(batch);
      out.push(...batch.records);
    },
    maxBatch,
  );
  return out;
}

/** `perKey` records for `keys` keys, interleaved the way concurrent writers would produce them. */
function records(prefix: string, keys: number, each: number, from = 0): EventRecord[] {
  const out: EventRecord[] = [];
  for (let i = from; i < from + each; i++) {
    for (let k = 0; k < keys; k++) out.push({ key: `${prefix}${k}`, value: `${prefix}${k}:${i}` });
  }
  return out;
}

function perKey(list: EventRecord[]): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const r of list) (out[r.key] ??= []).push(r.value);
  return out;
}

function id(r: DeliveredRecord): string {
  return `${r.topic}/${r.partition}/${r.offset}`;
}

/** First delivery of each record, in delivery order. */
function distinct(list: DeliveredRecord[]): DeliveredRecord[] {
  const seen = new Set<string>();
  return list.filter((r) => {
    const k = id(r);
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
}

async function waitUntil(
  condition: () => boolean,
  timeoutMs: number,
  describe?: () => string,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline)
      throw new Error(`condition not met within ${timeoutMs} ms${describe ? `: ${describe()}` : ''}`);
    await delay(20);
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function deferred(): { promise: Promise<void>; resolve: () => void; reject: (err: Error) => void } {
  let resolve!: () => void;
  let reject!: (err: Error) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  // The handler awaits it; an unobserved rejection would otherwise be reported before it does.
  promise.catch(() => undefined);
  return { promise, resolve, reject };
}
