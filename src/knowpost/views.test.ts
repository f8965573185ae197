import { Registry } from 'prom-client';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { PublishTimeoutError, type EventRecord } from '../platform/eventlog/eventlog.js';
import {
  extendRun,
  parseViewRecord,
  VIEW_TOPIC,
  ViewMetrics,
  ViewRecorder,
  VIEWS_PER_RECORD,
} from './views.js';

/** An event log that keeps what it was given and can be made to fail. */
class FakeLog {
  batches: { topic: string; records: EventRecord[] }[] = [];
  failing = false;

  async publish(topic: string, records: EventRecord[]): Promise<void> {
    if (this.failing) throw new Error('log down');
    this.batches.push({ topic, records });
  }

  /** Views per post over every batch so far. */
  totals(): Record<string, number> {
    const sums: Record<string, number> = {};
    for (const b of this.batches)
      for (const r of b.records) {
        const events = parseViewRecord(r.value)!;
        expect(r.key).toBe(`knowpost:${events[0]!.eid}`);
        for (const e of events) sums[e.eid] = (sums[e.eid] ?? 0) + e.n;
      }
    return sums;
  }
}

async function metric(registry: Registry, name: string): Promise<number> {
  const m = await registry.getSingleMetric(name)?.get();
  return m?.values[0]?.value ?? Number.NaN;
}

describe(ViewRecorder.name, () => {
  afterEach(() => vi.useRealTimers());

  const setup = (
    options: { maxItems?: number; flushMs?: number; maxPosts?: number; settleWaitMs?: number } = {},
  ) => {
    const log = new FakeLog();
    const registry = new Registry();
    const errors: unknown[] = [];
    const sut = new ViewRecorder(log, new ViewMetrics(registry), {
      maxItems: options.maxItems ?? 100,
      flushMs: options.flushMs ?? 200,
      ...(options.maxPosts !== undefined ? { maxPosts: options.maxPosts } : {}),
      ...(options.settleWaitMs !== undefined ? { settleWaitMs: options.settleWaitMs } : {}),
      onError: (err) => errors.push(err),
      now: () => 42,
    });
    return { log, registry, errors, sut };
  };

  it('publishes the summed views of each post, flushMs after the first view', async () => {
    vi.useFakeTimers();
    const { log, sut, registry } = setup();
    for (const id of ['1', '2', '1', '1']) sut.record(id);
    expect(await metric(registry, 'zg_views_buffered')).toBe(4);
    await vi.advanceTimersByTimeAsync(199);
    expect(log.batches).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(log.batches).toHaveLength(1);
    expect(log.batches[0]!.topic).toBe(VIEW_TOPIC);
    expect(log.batches[0]!.records.map((r) => [r.key, parseViewRecord(r.value)])).toEqual([
      [
        'knowpost:1',
        [
          { etype: 'knowpost', eid: '1', n: 3, ts: 42 },
          { etype: 'knowpost', eid: '2', n: 1, ts: 42 },
        ],
      ],
    ]);
    expect(await metric(registry, 'zg_views_buffered')).toBe(0);
    expect(await metric(registry, 'zg_views_published_total')).toBe(4);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(log.batches).toHaveLength(1);
  });

  it(`packs the views of at most ${VIEWS_PER_RECORD} posts into one record, sent on its own`, async () => {
    const { log, sut } = setup({ maxItems: 10_000, flushMs: 60_000 });
    const posts = 2 * VIEWS_PER_RECORD + 3;
    for (let i = 1; i <= posts; i++) for (let v = 0; v < 1 + (i % 3); v++) sut.record(String(i));
    await sut.flush();
    expect(log.batches.map((b) => b.records.length)).toEqual([1, 1, 1]);
    expect(log.batches.map((b) => parseViewRecord(b.records[0]!.value)!.length)).toEqual([
      VIEWS_PER_RECORD,
      VIEWS_PER_RECORD,
      3,
    ]);
    const totals = log.totals();
    expect(Object.keys(totals)).toHaveLength(posts);
    for (let i = 1; i <= posts; i++) expect(totals[String(i)]).toBe(1 + (i % 3));
  });

  it('publishes as soon as maxItems views are buffered', async () => {
    vi.useFakeTimers();
    const { log, sut } = setup({ maxItems: 3, flushMs: 10_000 });
    sut.record('1');
    sut.record('2');
    expect(log.batches).toHaveLength(0);
    sut.record('2');
    await vi.advanceTimersByTimeAsync(0);
    expect(log.totals()).toEqual({ '1': 1, '2': 2 });
  });

  it('keeps views whose publish failed and publishes them with later ones', async () => {
    vi.useFakeTimers();
    const { log, sut, errors, registry } = setup();
    log.failing = true;
    sut.record('1');
    sut.record('1');
    await vi.advanceTimersByTimeAsync(200);
    expect(errors).toHaveLength(1);
    expect(await metric(registry, 'zg_views_publish_failed_total')).toBe(2);
    expect(await metric(registry, 'zg_views_buffered')).toBe(2);
    log.failing = false;
    sut.record('1');
    await vi.advanceTimersByTimeAsync(200);
    expect(log.totals()).toEqual({ '1': 3 });
    expect(await metric(registry, 'zg_views_buffered')).toBe(0);
  });

  it('bounds the posts kept during an outage and counts what it drops', async () => {
    const { log, sut, registry } = setup({ maxPosts: 2, flushMs: 60_000 });
    log.failing = true;
    for (const id of ['1', '2', '3', '1']) sut.record(id);
    expect(await metric(registry, 'zg_views_dropped_total')).toBe(1);
    log.failing = false;
    await sut.flush();
    expect(log.totals()).toEqual({ '1': 2, '2': 1 });
  });

  it('publishes what is left on close and drops views recorded afterwards', async () => {
    const { log, sut, registry } = setup({ flushMs: 60_000 });
    sut.record('7');
    sut.record('7');
    await sut.close();
    expect(log.totals()).toEqual({ '7': 2 });
    sut.record('7');
    await sut.flush();
    expect(log.totals()).toEqual({ '7': 2 });
    expect(await metric(registry, 'zg_views_dropped_total')).toBe(1);
  });

  it('closes within its budget when the log does not answer', async () => {
    const { log, sut, errors } = setup({ flushMs: 60_000 });
    log.publish = () => new Promise<void>(() => {});
    sut.record('7');
    const started = performance.now();
    await sut.close(50);
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(errors).toHaveLength(1);
  });

  it('tries again on close when its last publish failed, and reports what it could not publish', async () => {
    const { log, sut, errors, registry } = setup({ flushMs: 60_000 });
    const publish = log.publish.bind(log);
    let calls = 0;
    log.publish = async (topic, records) => {
      if (++calls === 1) throw new Error('leader moved');
      await publish(topic, records);
    };
    sut.record('7');
    sut.record('8');
    await sut.close(2_000);
    expect(log.totals()).toEqual({ '7': 1, '8': 1 });
    expect(await metric(registry, 'zg_views_buffered')).toBe(0);

    const down = setup({ flushMs: 60_000 });
    down.log.failing = true;
    down.sut.record('7');
    await down.sut.close(250);
    expect(await metric(down.registry, 'zg_views_buffered')).toBe(0);
    expect(await metric(down.registry, 'zg_views_dropped_total')).toBe(1);
    expect(down.errors.map(String)).toContain('Error: 1 views dropped: not published before closing');
    expect(errors).toHaveLength(1);
  });

  it('waits for a publish that timed out instead of publishing its views again', async () => {
    const { log, sut, registry } = setup({ flushMs: 60_000 });
    const publish = log.publish.bind(log);
    let land!: () => Promise<void>;
    log.publish = (topic, records) => {
      log.publish = publish;
      const outcome = new Promise<void>(
        (resolve) => (land = async () => resolve(await publish(topic, records))),
      );
      return Promise.reject(new PublishTimeoutError('publish timed out', outcome));
    };
    sut.record('1');
    const flushed = sut.flush();
    await new Promise((r) => setTimeout(r, 10));
    sut.record('1');
    await land();
    await flushed;
    await sut.flush();
    expect(log.totals()).toEqual({ '1': 2 });
    expect(await metric(registry, 'zg_views_published_total')).toBe(2);
  });

  it('keeps the views of a timed-out publish that then failed, and drops those of one that never settles', async () => {
    const failed = setup({ flushMs: 60_000 });
    const failedPublish = failed.log.publish.bind(failed.log);
    failed.log.publish = () => {
      failed.log.publish = failedPublish;
      return Promise.reject(new PublishTimeoutError('timed out', Promise.reject(new Error('refused'))));
    };
    failed.sut.record('1');
    await failed.sut.flush();
    await failed.sut.flush();
    expect(failed.log.totals()).toEqual({ '1': 1 });

    const hung = setup({ flushMs: 60_000, settleWaitMs: 20 });
    const hungPublish = hung.log.publish.bind(hung.log);
    hung.log.publish = () => {
      hung.log.publish = hungPublish;
      return Promise.reject(new PublishTimeoutError('timed out', new Promise<void>(() => {})));
    };
    hung.sut.record('1');
    await hung.sut.flush();
    await hung.sut.flush();
    expect(hung.log.totals()).toEqual({});
    expect(await metric(hung.registry, 'zg_views_dropped_total')).toBe(1);
    expect(await metric(hung.registry, 'zg_views_buffered')).toBe(0);
  });

  it('keeps only the records that were refused when a flush spans several', async () => {
    const { log, sut } = setup({ maxItems: 10_000, flushMs: 60_000 });
    const publish = log.publish.bind(log);
    // Writes record by record, like a send spread over partitions; the second record is refused once.
    let records = 0;
    log.publish = async (topic, batch) => {
      for (const record of batch) {
        if (++records === 2) throw new Error('partition offline');
        await publish(topic, [record]);
      }
    };
    const posts = VIEWS_PER_RECORD + 1;
    for (let i = 1; i <= posts; i++) sut.record(String(i));
    await sut.flush();
    await sut.flush();
    const totals = log.totals();
    expect(Object.keys(totals)).toHaveLength(posts);
    expect(Object.values(totals).every((n) => n === 1)).toBe(true);
  });

  it('runs one publish at a time, however often it is asked to', async () => {
    const { log, sut } = setup({ maxItems: 1, flushMs: 60_000 });
    let inFlight = 0;
    let most = 0;
    const publish = log.publish.bind(log);
    log.publish = async (topic, records) => {
      most = Math.max(most, ++inFlight);
      await new Promise((r) => setTimeout(r, 5));
      await publish(topic, records);
      inFlight--;
    };
    for (let i = 0; i < 50; i++) sut.record(String(1 + (i % 5)));
    await sut.flush();
    expect(most).toBe(1);
    expect(log.batches.length).toBeLessThanOrEqual(3);
    expect(log.totals()).toEqual({ '1': 10, '2': 10, '3': 10, '4': 10, '5': 10 });
  });
});

describe(parseViewRecord.name, () => {
  it('reads packed records and the one-post form, and refuses anything else whole', () => {
    expect(parseViewRecord('{"etype":"knowpost","views":[["12",3],["7",1]],"ts":1}')).toEqual([
      { etype: 'knowpost', eid: '12', n: 3, ts: 1 },
      { etype: 'knowpost', eid: '7', n: 1, ts: 1 },
    ]);
    expect(parseViewRecord('{"etype":"knowpost","eid":"12","n":3,"ts":1}')).toEqual([
      { etype: 'knowpost', eid: '12', n: 3, ts: 1 },
    ]);
    for (const bad of [
      'nope',
      'null',
      '[]',
      '{"etype":"user","eid":"12","n":1}',
      '{"etype":"knowpost","eid":"012","n":1}',
      '{"etype":"knowpost","eid":"12","n":0}',
      '{"etype":"knowpost","eid":"12","n":1.5}',
      '{"etype":"knowpost","eid":12,"n":1}',
      '{"etype":"knowpost","views":[]}',
      '{"etype":"knowpost","views":{"12":1}}',
      '{"etype":"user","views":[["12",1]]}',
      '{"etype":"knowpost","views":[["12",1],["13",-1]]}',
      '{"etype":"knowpost","views":[["12",1],["x",1]]}',
      '{"etype":"knowpost","views":[["12",1,2]]}',
      '{"etype":"knowpost","views":[["12",1],"13"]}',
    ])
      expect(parseViewRecord(bad), bad).toBeNull();
  });
});

describe(extendRun.name, () => {
  it('extends a run by the next offset, keeps it for one inside, and starts anew otherwise', () => {
    const run = { range: [3n, 7n] as const, ts: 50 };
    expect(extendRun(undefined, 7n, 1)).toEqual({ range: [7n, 7n], ts: 1 });
    expect(extendRun(run, 8n, 60)).toEqual({ range: [3n, 8n], ts: 60 });
    expect(extendRun(run, 8n, 40)).toEqual({ range: [3n, 8n], ts: 50 });
    expect(extendRun(run, 3n, 50)).toEqual(run);
    expect(extendRun(run, 5n, 10)).toEqual(run);
    expect(extendRun(run, 9n, 50)).toEqual({ range: [9n, 9n], ts: 50 });
    expect(extendRun(run, 2n, 50)).toEqual({ range: [2n, 2n], ts: 50 });
    // Inside, but later than all of it: the topic was made again.
    expect(extendRun(run, 5n, 51)).toEqual({ range: [5n, 5n], ts: 51 });
  });
});
