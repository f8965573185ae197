import { describe, expect, it, vi } from 'vitest';
import {
  MysqlDeadlineError,
  poolWithDeadlines,
  type RawMysqlConnection,
  type RawMysqlPool,
} from './mysql-deadlines.js';

/** A pool whose connections come only when the test hands them out. */
function manualPool() {
  const asked: ((error: unknown, connection: RawMysqlConnection) => void)[] = [];
  let released = 0;
  const connection = (threadId: number): RawMysqlConnection =>
    ({
      threadId,
      config: {},
      connect: () => undefined,
      destroy: () => undefined,
      release: () => void released++,
      query: () => undefined,
    }) as unknown as RawMysqlConnection;
  const pool: RawMysqlPool = {
    getConnection: (callback) => void asked.push(callback),
    end: (callback) => callback(null),
  };
  return {
    pool,
    asked,
    released: () => released,
    /** Hands the oldest request waiting on the pool a connection. */
    give: (threadId: number) => asked.shift()!(null, connection(threadId)),
  };
}

const get = (pool: ReturnType<typeof poolWithDeadlines>) =>
  new Promise<{ error: unknown; connection?: { release(): void; threadId: number } }>((resolve) =>
    pool.getConnection((error, connection) => resolve({ error, connection })),
  );

describe(poolWithDeadlines.name, () => {
  it('hands the pool no more requests than its size, and drops those that gave up', async () => {
    vi.useFakeTimers();
    try {
      const raw = manualPool();
      const pool = poolWithDeadlines(raw.pool, { timeoutMs: 1_000, size: 2 });
      const first = get(pool);
      const second = get(pool);
      const late = Array.from({ length: 50 }, () => get(pool));
      // Only two reach the pool; the rest wait in the wrapper.
      expect(raw.asked).toHaveLength(2);
      raw.give(1);
      const held = await first;
      expect(held.connection?.threadId).toBe(1);

      await vi.advanceTimersByTimeAsync(1_000);
      // The second and every later request gave up; none of the later ones ever reached the pool.
      for (const outcome of [await second, ...(await Promise.all(late))])
        expect(outcome.error).toBeInstanceOf(MysqlDeadlineError);
      expect(raw.asked).toHaveLength(1);

      // The connection that comes for the second after it gave up goes straight back.
      raw.give(2);
      expect(raw.released()).toBe(1);

      // A new request goes to the pool at once, not behind the 50 that gave up.
      const next = get(pool);
      expect(raw.asked).toHaveLength(1);
      raw.give(3);
      expect((await next).connection?.threadId).toBe(3);

      // A release frees a place for a request waiting in the wrapper; a second release of the
      // same lending changes nothing.
      const third = get(pool);
      const fourth = get(pool);
      expect(raw.asked).toHaveLength(0);
      held.connection!.release();
      held.connection!.release();
      expect(raw.released()).toBe(2);
      expect(raw.asked).toHaveLength(1);
      raw.give(4);
      expect((await third).connection?.threadId).toBe(4);
      expect(raw.asked).toHaveLength(0);
      void fourth;
    } finally {
      vi.useRealTimers();
    }
  });

  it('passes a failure to make a connection on, freeing its place', async () => {
    const raw = manualPool();
    const pool = poolWithDeadlines(raw.pool, { timeoutMs: 1_000, size: 1 });
    const first = get(pool);
    const second = get(pool);
    raw.asked.shift()!(new Error('ECONNREFUSED'), undefined as unknown as RawMysqlConnection);
    expect(((await first).error as Error).message).toBe('ECONNREFUSED');
    expect(raw.asked).toHaveLength(1);
    raw.give(5);
    expect((await second).connection?.threadId).toBe(5);
  });
});
