export interface PeriodicOptions {
  /**
   * Measure the interval from the start of the previous run instead of its end, so a run's own
   * duration does not stretch the period (a run longer than the interval is followed at once by the
   * next). Runs still never overlap.
   */
  fixedRate?: boolean;
  /** Monotonic clock in ms (tests). */
  now?: () => number;
}

/**
 * Runs `task` every `intervalMs` until stopped: by default measured from the end of the previous run,
 * with `fixedRate` from its start; runs never overlap either way. `stop` aborts the signal the task
 * is given and waits for the run in flight. A failing run is reported and the loop goes on.
 */
export class PeriodicTask {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = true;
  /** Raised by `start`, so a run that ends after a stop and a new start does not schedule twice. */
  private epoch = 0;
  private readonly fixedRate: boolean;
  private readonly now: () => number;
  /** Aborted by `stop`: a long run (a backlog worked through) ends at its next step. */
  private stopping = new AbortController();

  constructor(
    private readonly name: string,
    private readonly intervalMs: number,
    private readonly task: (signal: AbortSignal) => Promise<unknown>,
    private readonly onError: (name: string, err: unknown) => void,
    options: PeriodicOptions = {},
  ) {
    this.fixedRate = options.fixedRate ?? false;
    this.now = options.now ?? (() => performance.now());
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.epoch++;
    if (this.stopping.signal.aborted) this.stopping = new AbortController();
    this.schedule(this.intervalMs);
  }

  /** Runs the task now (and waits for it), outside the schedule; after the run in flight, if any. */
  runNow(): Promise<void> {
    return this.run();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.stopping.abort();
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    await this.running;
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    const epoch = this.epoch;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      const started = this.now();
      void this.run().then(() => {
        if (epoch !== this.epoch) return;
        const took = Math.max(0, this.now() - started);
        this.schedule(this.fixedRate ? Math.max(0, this.intervalMs - took) : this.intervalMs);
      });
    }, delayMs);
    this.timer.unref();
  }

  /** One run, queued behind the run in flight so that runs never overlap. */
  private run(): Promise<void> {
    const previous = this.running;
    const run = (async () => {
      await previous;
      await this.runOnce();
    })();
    const tracked = run.finally(() => {
      if (this.running === tracked) this.running = undefined;
    });
    this.running = tracked;
    return tracked;
  }

  private async runOnce(): Promise<void> {
    try {
      await this.task(this.stopping.signal);
    } catch (err) {
      try {
        this.onError(this.name, err);
      } catch {
        // A failing reporter must not end the schedule.
      }
    }
  }
}
