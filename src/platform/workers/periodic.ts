/**
 * Runs `task` every `intervalMs` (measured from the end of the previous run, so runs never overlap)
 * until stopped. `stop` waits for the run in flight. A failing run is reported and the loop goes on.
 */
export class PeriodicTask {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = true;

  constructor(
    private readonly name: string,
    private readonly intervalMs: number,
    private readonly task: () => Promise<unknown>,
    private readonly onError: (name: string, err: unknown) => void,
  ) {}

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.schedule();
  }

  /** Runs the task now (and waits for it), outside the schedule. */
  async runNow(): Promise<void> {
    await this.running;
    await this.runOnce();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    await this.running;
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.running = this.runOnce().finally(() => {
        this.running = undefined;
        this.schedule();
      });
    }, this.intervalMs);
    this.timer.unref();
  }

  private async runOnce(): Promise<void> {
    try {
      await this.task();
    } catch (err) {
      this.onError(this.name, err);
    }
  }
}
