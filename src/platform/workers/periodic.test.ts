import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { PeriodicTask } from './periodic.js';

/** A task that takes `durationMs` of (fake) time and records when each run started and how many overlapped. */
function recorder(durationMs: number | (() => number)) {
  const starts: number[] = [];
  let active = 0;
  let maxActive = 0;
  const task = async (): Promise<void> => {
    starts.push(Date.now());
    active++;
    maxActive = Math.max(maxActive, active);
    const ms = typeof durationMs === 'number' ? durationMs : durationMs();
    await new Promise((resolve) => setTimeout(resolve, ms));
    active--;
  };
  return {
    task,
    starts,
    get maxActive() {
      return maxActive;
    },
  };
}

describe(PeriodicTask.name, () => {
  let t0 = 0;
  beforeEach(() => {
    vi.useFakeTimers();
    t0 = Date.now();
  });
  afterEach(() => {
    vi.useRealTimers();
  });

  const clock = (): (() => number) => () => Date.now();
  const relative = (starts: number[]) => starts.map((s) => s - t0);
  /** Stops while fake time goes on, so a run in flight can finish. */
  const stopAll = async (sut: PeriodicTask) => {
    const stopping = sut.stop();
    await vi.advanceTimersByTimeAsync(5_000);
    await stopping;
  };

  it('measures the interval from the end of the previous run by default', async () => {
    const r = recorder(300);
    const sut = new PeriodicTask('t', 1000, r.task, () => undefined, { now: clock() });
    sut.start();
    await vi.advanceTimersByTimeAsync(3_700);
    await stopAll(sut);
    expect(relative(r.starts)).toEqual([1000, 2300, 3600]);
  });

  it('with fixedRate starts each run one interval after the previous one started', async () => {
    const r = recorder(300);
    const sut = new PeriodicTask('t', 1000, r.task, () => undefined, { fixedRate: true, now: clock() });
    sut.start();
    await vi.advanceTimersByTimeAsync(4_100);
    await stopAll(sut);
    expect(relative(r.starts)).toEqual([1000, 2000, 3000, 4000]);
  });

  it('with fixedRate starts a run at once after one that overran the interval, never overlapping', async () => {
    const durations = [1500, 200, 200];
    const r = recorder(() => durations.shift() ?? 200);
    const sut = new PeriodicTask('t', 1000, r.task, () => undefined, { fixedRate: true, now: clock() });
    sut.start();
    await vi.advanceTimersByTimeAsync(4_100);
    await stopAll(sut);
    // "at once" is the next timer tick (a 0 ms timer fires after 1 ms)
    const starts = relative(r.starts);
    expect(starts).toHaveLength(3);
    expect(starts[0]).toBe(1000);
    expect(starts[1]).toBeGreaterThanOrEqual(2500);
    expect(starts[1]).toBeLessThanOrEqual(2501);
    expect(starts[2]! - starts[1]!).toBe(1000);
    expect(r.maxActive).toBe(1);
  });

  it('keeps going after a failing run and reports it', async () => {
    const errors: string[] = [];
    let calls = 0;
    const sut = new PeriodicTask(
      'failing',
      100,
      async () => {
        calls++;
        if (calls === 1) throw new Error('boom');
      },
      (name, err) => errors.push(`${name}: ${(err as Error).message}`),
      { fixedRate: true, now: clock() },
    );
    sut.start();
    await vi.advanceTimersByTimeAsync(350);
    await stopAll(sut);
    expect(errors).toEqual(['failing: boom']);
    expect(calls).toBe(3);
  });

  it('stop waits for the run in flight and nothing runs afterwards', async () => {
    const r = recorder(500);
    const sut = new PeriodicTask('t', 1000, r.task, () => undefined, { fixedRate: true, now: clock() });
    sut.start();
    await vi.advanceTimersByTimeAsync(1_100);
    let stopped = false;
    const stopping = sut.stop().then(() => (stopped = true));
    await vi.advanceTimersByTimeAsync(100);
    expect(stopped).toBe(false);
    await vi.advanceTimersByTimeAsync(300);
    await stopping;
    expect(stopped).toBe(true);
    await vi.advanceTimersByTimeAsync(5_000);
    expect(relative(r.starts)).toEqual([1000]);
  });

  it('tells the run in flight to end when stopped, and a start after it runs with a fresh signal', async () => {
    const seen: AbortSignal[] = [];
    let steps = 0;
    // A long run in steps of 100 ms that ends at the first step after its signal is aborted.
    const task = async (signal: AbortSignal): Promise<void> => {
      seen.push(signal);
      for (let i = 0; i < 100 && !signal.aborted; i++) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        steps++;
      }
    };
    const sut = new PeriodicTask('t', 1000, task, () => undefined, { now: clock() });
    sut.start();
    await vi.advanceTimersByTimeAsync(1_350);
    let stopped = false;
    const stopping = sut.stop().then(() => (stopped = true));
    await vi.advanceTimersByTimeAsync(100);
    await stopping;
    expect(stopped).toBe(true);
    expect(steps).toBe(4);
    expect(seen[0]!.aborted).toBe(true);
    sut.start();
    await vi.advanceTimersByTimeAsync(1_050);
    expect(seen[1]!.aborted).toBe(false);
    await stopAll(sut);
  });

  it('runNow waits for a scheduled run in flight instead of overlapping it', async () => {
    const r = recorder(400);
    const sut = new PeriodicTask('t', 1000, r.task, () => undefined, { fixedRate: true, now: clock() });
    sut.start();
    await vi.advanceTimersByTimeAsync(1_100);
    const now = sut.runNow();
    await vi.advanceTimersByTimeAsync(700);
    await now;
    await stopAll(sut);
    expect(relative(r.starts)).toEqual([1000, 1400]);
    expect(r.maxActive).toBe(1);
  });
});
