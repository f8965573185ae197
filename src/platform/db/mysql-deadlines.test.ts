import { describe, expect, it, vi } from 'vitest';
import {
  FAIL_FAST_PROBE_MS,
  FAILURES_TO_FAIL_FAST,
  MysqlDeadlineError,
  poolWithDeadlines,
  type RawMysqlConnection,
  type RawMysqlPool,
} from './mysql-deadlines.js';

type Reply = (error: unknown, result: unknown) => void;

/** A pooled connection whose statements go to `query` (by default, never answered). */
function fakeConnection(
  threadId: number,
  query: (options: { sql: string }, callback: Reply) => void = () => undefined,
  release: () => void = () => undefined,
): RawMysqlConnection {
  return {
    threadId,
    config: {},
    connect: () => undefined,
    destroy: () => undefined,
    release,
    query,
  } as unknown as RawMysqlConnection;
}

/** A pool whose connections come only when the test hands them out. */
function manualPool() {
  const asked: ((error: unknown, connection: RawMysqlConnection) => void)[] = [];
  let released = 0;
  const connection = (threadId: number): RawMysqlConnection =>
    fakeConnection(threadId, undefined, () => void released++);
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

/** Lets callbacks queued as microtasks and immediates run. */
const settled = () => new Promise<void>((resolve) => setImmediate(resolve));

describe('poolWithDeadlines while the database does not answer', () => {
  /** A pool whose connections fail to be made while `down`, and whose statements reply `reply`. */
  function flakyPool() {
    const state = {
      down: true,
      asked: 0,
      reply: null as unknown,
      statements: [] as string[],
    };
    const connection = fakeConnection(1, (options, callback) => {
      state.statements.push(options.sql);
      queueMicrotask(() => callback(state.reply, { rows: [] }));
    });
    const pool: RawMysqlPool = {
      getConnection: (callback) => {
        state.asked++;
        queueMicrotask(() =>
          state.down
            ? callback(
                Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED', fatal: true }),
                connection,
              )
            : callback(null, connection),
        );
      },
      end: (callback) => callback(null),
    };
    return { pool, state };
  }
  const statement = (connection: object) =>
    new Promise<unknown>((resolve) =>
      (connection as { query: (sql: string, params: unknown[], cb: (error: unknown) => void) => void }).query(
        'SELECT 1',
        [],
        (error) => resolve(error),
      ),
    );

  it('fails at once after failures in a row, tries it in the background once a second, and serves again once it answers', async () => {
    const clock = { now: 0 };
    const { pool: raw, state } = flakyPool();
    const pool = poolWithDeadlines(raw, { timeoutMs: 1_000, size: 4, now: () => clock.now });
    for (let i = 0; i < FAILURES_TO_FAIL_FAST; i++)
      expect(((await get(pool)).error as Error).message).toMatch(/ECONNREFUSED/);
    expect(state.asked).toBe(FAILURES_TO_FAIL_FAST);

    // Out of reach: every request fails at once; the first one starts a probe, which waits for no one.
    const fast = await Promise.all([get(pool), get(pool), get(pool)]);
    expect(fast.map((f) => f.error instanceof MysqlDeadlineError)).toEqual([true, true, true]);
    await settled();
    expect(state.asked).toBe(FAILURES_TO_FAIL_FAST + 1);
    expect(state.statements).toEqual([]);

    // A second later a request starts another probe; the database is back and answers (an SQL error
    // is an answer), and requests are served again.
    clock.now += FAIL_FAST_PROBE_MS;
    state.down = false;
    state.reply = Object.assign(new Error('Duplicate entry'), { code: 'ER_DUP_ENTRY' });
    expect((await get(pool)).error).toBeInstanceOf(MysqlDeadlineError);
    await settled();
    expect(state.statements).toEqual(['SELECT 1']);
    const after = await Promise.all([get(pool), get(pool)]);
    expect(after.map((a) => a.error)).toEqual([null, null]);
    expect(state.asked).toBe(FAILURES_TO_FAIL_FAST + 4);
  });

  it('takes the server refusing connections (too many) for an answer, not for being out of reach', async () => {
    const asked: number[] = [];
    const raw: RawMysqlPool = {
      getConnection: (callback) => {
        asked.push(asked.length);
        queueMicrotask(() =>
          callback(
            Object.assign(new Error('Too many connections'), {
              code: 'ER_CON_COUNT_ERROR',
              errno: 1040,
              fatal: true,
            }),
            undefined as unknown as RawMysqlConnection,
          ),
        );
      },
      end: (callback) => callback(null),
    };
    const pool = poolWithDeadlines(raw, { timeoutMs: 1_000, size: 4, now: () => 0 });
    for (let i = 0; i < FAILURES_TO_FAIL_FAST + 2; i++)
      expect(((await get(pool)).error as Error).message).toBe('Too many connections');
    expect(asked).toHaveLength(FAILURES_TO_FAIL_FAST + 2);
  });

  it('takes statements past the deadline for failures, and keeps serving while answers come between them', async () => {
    const clock = { now: 0 };
    const { pool: raw, state } = flakyPool();
    state.down = false;
    const pool = poolWithDeadlines(raw, { timeoutMs: 1_000, size: 4, now: () => clock.now });
    const lost = () => new MysqlDeadlineError('a MySQL statement had no answer within 1000 ms');
    // A pooled connection found closed (left over from before an outage) tells nothing either way.
    const closed = () =>
      Object.assign(new Error("Can't add new command when connection is in closed state"), { fatal: true });
    // Two lost, one answered, two lost, one closed: never three failures in a row.
    for (const reply of [lost(), lost(), null, lost(), lost(), closed()]) {
      state.reply = reply;
      const got = await get(pool);
      expect(got.error).toBeNull();
      await statement(got.connection!);
      got.connection!.release();
    }
    state.reply = lost();
    const third = await get(pool);
    await statement(third.connection!);
    third.connection!.release();
    // Out of reach: requests fail at once; the probe they start finds it lost again, and so does
    // the next one, a second later.
    const before = state.statements.length;
    expect((await get(pool)).error).toBeInstanceOf(MysqlDeadlineError);
    await settled();
    expect(state.statements.length).toBe(before + 1);
    expect((await get(pool)).error).toBeInstanceOf(MysqlDeadlineError);
    await settled();
    expect(state.statements.length).toBe(before + 1);
    clock.now += FAIL_FAST_PROBE_MS;
    expect((await get(pool)).error).toBeInstanceOf(MysqlDeadlineError);
    await settled();
    expect(state.statements.length).toBe(before + 2);
  });

  it('does not hold a probe back behind one still hanging on a connection left from before', async () => {
    const clock = { now: 0 };
    // Idle connections to a primary that vanished hang; then come fresh ones to the new primary.
    const fresh = fakeConnection(99, (_options, callback) =>
      queueMicrotask(() => callback(null, { rows: [] })),
    );
    const handed = [fakeConnection(1), fresh];
    let refused = FAILURES_TO_FAIL_FAST;
    const raw: RawMysqlPool = {
      getConnection: (callback) =>
        queueMicrotask(() =>
          refused-- > 0
            ? callback(Object.assign(new Error('connect ETIMEDOUT'), { code: 'ETIMEDOUT' }), fresh)
            : callback(null, handed.shift() ?? fresh),
        ),
      end: (callback) => callback(null),
    };
    const pool = poolWithDeadlines(raw, { timeoutMs: 60_000, size: 4, now: () => clock.now });
    for (let i = 0; i < FAILURES_TO_FAIL_FAST; i++) await get(pool);
    // The first probe draws the hanging connection; a second later the next one goes all the same.
    expect((await get(pool)).error).toBeInstanceOf(MysqlDeadlineError);
    await settled();
    clock.now += FAIL_FAST_PROBE_MS;
    expect((await get(pool)).error).toBeInstanceOf(MysqlDeadlineError);
    await settled();
    expect((await get(pool)).error).toBeNull();
  });
});
