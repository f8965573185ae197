import { describe, expect, it } from 'vitest';
import { GroupCommit } from './group-commit.js';

interface Item {
  key: string;
  value: number;
}

/** A runner that records its batches and can be held open or made to fail. */
function recorder(fail: (items: Item[]) => boolean = () => false) {
  const batches: Item[][] = [];
  let release: (() => void) | null = null;
  let hold = false;
  const run = async (items: Item[]): Promise<number[]> => {
    batches.push(items);
    if (hold) await new Promise<void>((r) => (release = r));
    if (fail(items)) throw new Error(`failed ${items.map((i) => i.value).join(',')}`);
    return items.map((i) => i.value * 10);
  };
  return {
    batches,
    run,
    holdNext: () => (hold = true),
    release: () => {
      hold = false;
      release?.();
    },
  };
}

const item = (key: string, value: number): Item => ({ key, value });

describe('GroupCommit', () => {
  it('runs a lone item at once, alone', async () => {
    const r = recorder();
    const gc = new GroupCommit(r.run, { maxBatch: 10, key: (i) => i.key });
    expect(await gc.submit(item('a', 1))).toBe(10);
    expect(r.batches).toEqual([[item('a', 1)]]);
  });

  it('groups what arrives while a batch runs into the next batch, each with its own result', async () => {
    const r = recorder();
    const gc = new GroupCommit(r.run, { maxBatch: 10, key: (i) => i.key });
    r.holdNext();
    const first = gc.submit(item('a', 1));
    const later = [gc.submit(item('b', 2)), gc.submit(item('c', 3)), gc.submit(item('d', 4))];
    expect(gc.waiting).toBe(3);
    r.release();
    expect(await first).toBe(10);
    expect(await Promise.all(later)).toEqual([20, 30, 40]);
    expect(r.batches.map((b) => b.map((i) => i.value))).toEqual([[1], [2, 3, 4]]);
  });

  it('never puts two items with one key in a batch, and keeps their order', async () => {
    const r = recorder();
    const gc = new GroupCommit(r.run, { maxBatch: 10, key: (i) => i.key });
    r.holdNext();
    const all = [
      gc.submit(item('x', 0)),
      gc.submit(item('a', 1)),
      gc.submit(item('a', 2)),
      gc.submit(item('b', 3)),
      gc.submit(item('a', 4)),
      gc.submit(item('c', 5)),
    ];
    r.release();
    await Promise.all(all);
    expect(r.batches.map((b) => b.map((i) => i.value))).toEqual([[0], [1, 3, 5], [2], [4]]);
  });

  it('reports each batch it ran with its size, failed ones too', async () => {
    const r = recorder((items) => items.some((i) => i.value === 3));
    const seen: number[] = [];
    const gc = new GroupCommit(r.run, {
      maxBatch: 10,
      key: (i) => i.key,
      onBatch: (size, seconds) => {
        expect(seconds).toBeGreaterThanOrEqual(0);
        seen.push(size);
      },
    });
    r.holdNext();
    const first = gc.submit(item('a', 1));
    const rest = [2, 3].map((v) => gc.submit(item(`k${v}`, v)));
    r.release();
    await first;
    await Promise.allSettled(rest);
    expect(seen).toEqual([1, 2, 1, 1]);
  });

  it('bounds the batch size', async () => {
    const r = recorder();
    const gc = new GroupCommit(r.run, { maxBatch: 2, key: (i) => i.key });
    r.holdNext();
    const all = [0, 1, 2, 3, 4].map((v) => gc.submit(item(`k${v}`, v)));
    r.release();
    await Promise.all(all);
    expect(r.batches.map((b) => b.length)).toEqual([1, 2, 2]);
  });

  it('runs the items of a failed batch again alone, so only the bad one fails', async () => {
    const r = recorder((items) => items.some((i) => i.value === 3));
    const gc = new GroupCommit(r.run, { maxBatch: 10, key: (i) => i.key });
    r.holdNext();
    const first = gc.submit(item('a', 1));
    const rest = [2, 3, 4].map((v) => gc.submit(item(`k${v}`, v)));
    r.release();
    await first;
    const settled = await Promise.allSettled(rest);
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect((settled[1] as PromiseRejectedResult).reason).toBeInstanceOf(Error);
    expect(r.batches.map((b) => b.map((i) => i.value))).toEqual([[1], [2, 3, 4], [2], [3], [4]]);
  });

  it('fails a whole batch at once when the database is out of reach, and retries contention alone', async () => {
    for (const [failure, alone] of [
      [Object.assign(new Error('connect ECONNREFUSED 10.0.0.5:3306'), { code: 'ECONNREFUSED' }), false],
      [Object.assign(new Error('lost', { cause: { code: 'PROTOCOL_CONNECTION_LOST' } })), false],
      [
        Object.assign(new Error('Deadlock found when trying to get lock'), { code: 'ER_LOCK_DEADLOCK' }),
        true,
      ],
      [Object.assign(new Error('database is locked'), { code: 'ERR_SQLITE_ERROR' }), true],
    ] as const) {
      const batches: number[][] = [];
      let hold!: () => void;
      const held = new Promise<void>((resolve) => (hold = resolve));
      const run = async (items: Item[]): Promise<number[]> => {
        batches.push(items.map((i) => i.value));
        if (items[0]!.value === 1) await held;
        if (items.length > 1) throw failure;
        return items.map((i) => i.value * 10);
      };
      const gc = new GroupCommit(run, { maxBatch: 10, key: (i) => i.key });
      const first = gc.submit(item('a', 1));
      const rest = [2, 3, 4].map((v) => gc.submit(item(`k${v}`, v)));
      hold();
      await first;
      const settled = await Promise.allSettled(rest);
      const label = failure.message;
      if (alone) {
        expect({ label, settled: settled.map((s) => s.status) }).toEqual({
          label,
          settled: ['fulfilled', 'fulfilled', 'fulfilled'],
        });
        expect({ label, batches }).toEqual({ label, batches: [[1], [2, 3, 4], [2], [3], [4]] });
      } else {
        expect({ label, settled: settled.map((s) => s.status) }).toEqual({
          label,
          settled: ['rejected', 'rejected', 'rejected'],
        });
        expect({ label, batches }).toEqual({ label, batches: [[1], [2, 3, 4]] });
      }
    }
  });

  it('refuses an item at once, rather than queue it, while a batch runs and refuseWhileBusy says so', async () => {
    const r = recorder();
    let outOfReach = false;
    const gc = new GroupCommit(r.run, {
      maxBatch: 10,
      key: (i) => i.key,
      refuseWhileBusy: () => (outOfReach ? new Error('out of reach') : undefined),
    });
    r.holdNext();
    const probe = gc.submit(item('a', 1));
    outOfReach = true;
    await expect(gc.submit(item('b', 2))).rejects.toThrow('out of reach');
    expect(gc.waiting).toBe(0);
    r.release();
    expect(await probe).toBe(10);
    await new Promise((resolve) => setTimeout(resolve, 0));
    // Not busy: submitted as usual (the batch tries the database).
    expect(await gc.submit(item('c', 3))).toBe(30);
    outOfReach = false;
    r.holdNext();
    const next = gc.submit(item('d', 4));
    const queued = gc.submit(item('e', 5));
    r.release();
    expect(await Promise.all([next, queued])).toEqual([40, 50]);
  });

  it('keeps going after a failure', async () => {
    const r = recorder((items) => items[0]!.value === 1);
    const gc = new GroupCommit(r.run, { maxBatch: 10, key: (i) => i.key });
    await expect(gc.submit(item('a', 1))).rejects.toThrow('failed 1');
    expect(await gc.submit(item('a', 2))).toBe(20);
  });

  it('rejects a runner that answers with the wrong number of results', async () => {
    const gc = new GroupCommit<Item, number>(async () => [], { maxBatch: 10, key: (i) => i.key });
    await expect(gc.submit(item('a', 1))).rejects.toThrow('0 results for 1 items');
  });
});

describe('GroupCommit waits', () => {
  const outage = () => Object.assign(new Error('connect ETIMEDOUT'), { code: 'ETIMEDOUT' });

  it('fails the items waiting for later batches too when the database is out of reach, items of one key included', async () => {
    const batches: number[][] = [];
    let hold!: () => void;
    const held = new Promise<void>((resolve) => (hold = resolve));
    const run = async (items: Item[]): Promise<number[]> => {
      batches.push(items.map((i) => i.value));
      await held;
      throw outage();
    };
    const gc = new GroupCommit(run, { maxBatch: 10, key: (i) => i.key });
    // One pair changed six times: six batches one after the other, each its own timeout.
    const all = [1, 2, 3, 4, 5, 6].map((v) => gc.submit(item('pair', v)));
    const other = gc.submit(item('other', 7));
    hold();
    const settled = await Promise.allSettled([...all, other]);
    expect(settled.map((s) => s.status)).toEqual(Array(7).fill('rejected'));
    // Only the first batch ran: the rest failed with it.
    expect(batches).toEqual([[1]]);
    expect(gc.waiting).toBe(0);
  });

  it('does not run again alone an item of a failed batch that waited past maxWaitMs by its turn', async () => {
    const ran: number[][] = [];
    const expired = new Error('waited too long');
    const run = async (items: Item[]): Promise<number[]> => {
      ran.push(items.map((i) => i.value));
      // The batch fails (one bad item) after a long lock wait; alone, the first also waits long.
      await new Promise((resolve) => setTimeout(resolve, 60));
      if (items.length > 1) throw new Error('one of them is bad');
      return items.map((i) => i.value);
    };
    const gc = new GroupCommit(run, {
      maxBatch: 10,
      key: (i) => i.key,
      maxWaitMs: 150,
      expired: () => expired,
    });
    const first = gc.submit(item('a', 1));
    const batch = [2, 3, 4].map((v) => gc.submit(item(`k${v}`, v)));
    expect(await first).toBe(1);
    const settled = await Promise.allSettled(batch);
    // 2 ran alone in time; by the time 3 and 4 had their turns they had waited too long.
    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'rejected']);
    expect((settled[1] as PromiseRejectedResult).reason).toBe(expired);
    expect(ran).toEqual([[1], [2, 3, 4], [2]]);
  });

  it('fails an item that waited longer than maxWaitMs for its batch without running it', async () => {
    const r = recorder();
    const expired = new Error('waited too long');
    const gc = new GroupCommit(r.run, {
      maxBatch: 10,
      key: (i) => i.key,
      maxWaitMs: 30,
      expired: () => expired,
    });
    r.holdNext();
    const first = gc.submit(item('a', 1));
    const late = gc.submit(item('a', 2));
    await new Promise((resolve) => setTimeout(resolve, 60));
    const fresh = gc.submit(item('b', 3));
    r.release();
    expect(await first).toBe(10);
    await expect(late).rejects.toBe(expired);
    expect(await fresh).toBe(30);
    expect(r.batches.map((b) => b.map((i) => i.value))).toEqual([[1], [3]]);
  });
});
