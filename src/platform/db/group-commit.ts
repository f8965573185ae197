import { isContention, isDependencyOutage } from '../errors/outage.js';

/**
 * Group commit: writes submitted while a transaction is running wait and then commit together in
 * the next one, so under load many requests share one transaction's round trips and one log flush,
 * and an idle system still commits each write at once, alone.
 *
 * One batch runs at a time: a second one running beside it was measured to make batches smaller
 * and the whole slower (more statements for the same work). Items with the same key never share a
 * batch and run in submission order: a later one waits for a later batch, so a batch can treat its
 * items as independent.
 *
 * When a batch of several items fails, each of them is run again alone, so one bad item cannot fail
 * the writes it happened to be grouped with; an item that fails alone rejects its own promise. But
 * when the database is out of reach (not merely contended), every item of the batch fails at once,
 * and so does every item waiting for a later batch: alone, each would wait out its own timeout while
 * later writes queue behind it (items of one key, which never share a batch, one timeout after the
 * other). With `maxWaitMs`, an item that waited longer than that for its batch (or, run again
 * alone, for its turn) fails without running.
 */
export interface GroupCommitOptions<I> {
  /** Most items in one batch. */
  maxBatch: number;
  /** Items with equal keys are applied one batch after the other, in submission order. */
  key: (item: I) => string;
  /** Told after each batch ran (committed or not): its size and how long it took. */
  onBatch?: (size: number, seconds: number) => void;
  /**
   * Longest an item waits for its batch to start: one that waited longer is rejected with
   * `expired()`, not run (its caller would rather hear so than wait on). 0 or absent: no limit.
   */
  maxWaitMs?: number;
  expired?: () => unknown;
  /**
   * Asked when an item is submitted while a batch runs: an error to reject it with at once rather
   * than queue it behind that batch (the database is out of reach and the batch may hang on it).
   */
  refuseWhileBusy?: () => Error | undefined;
}

interface Waiting<I, O> {
  item: I;
  key: string;
  /** When it was submitted (performance.now()). */
  since: number;
  resolve: (value: O) => void;
  reject: (reason: unknown) => void;
}

export class GroupCommit<I, O> {
  private queue: Waiting<I, O>[] = [];
  private running = false;
  private readonly maxBatch: number;

  /** `run` commits a batch and returns one result per item, in the batch's order. */
  constructor(
    private readonly run: (items: I[]) => Promise<O[]>,
    private readonly options: GroupCommitOptions<I>,
  ) {
    this.maxBatch = Math.max(1, options.maxBatch);
  }

  /** Resolves with the item's result once its batch committed. */
  submit(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      const refusal = this.running ? this.options.refuseWhileBusy?.() : undefined;
      if (refusal !== undefined) return reject(refusal);
      this.queue.push({ item, key: this.options.key(item), since: performance.now(), resolve, reject });
      if (!this.running) void this.drain();
    });
  }

  /** Items waiting for a batch (not counting the one running). */
  get waiting(): number {
    return this.queue.length;
  }

  private async drain(): Promise<void> {
    this.running = true;
    try {
      while (this.queue.length > 0) await this.runBatch(this.takeBatch());
    } finally {
      this.running = false;
    }
  }

  /**
   * The oldest items with distinct keys, up to the bound; the rest keep their order. Items that
   * waited past `maxWaitMs` are rejected instead.
   */
  private takeBatch(): Waiting<I, O>[] {
    const batch: Waiting<I, O>[] = [];
    const rest: Waiting<I, O>[] = [];
    const keys = new Set<string>();
    for (const w of this.queue) {
      if (this.expired(w)) {
        this.rejectExpired(w);
      } else if (batch.length < this.maxBatch && !keys.has(w.key)) {
        keys.add(w.key);
        batch.push(w);
      } else rest.push(w);
    }
    this.queue = rest;
    return batch;
  }

  private async runBatch(batch: Waiting<I, O>[]): Promise<void> {
    const started = performance.now();
    try {
      const results = await this.runObserved(batch, started);
      if (results.length !== batch.length) {
        throw new Error(`group commit: ${results.length} results for ${batch.length} items`);
      }
      batch.forEach((w, i) => w.resolve(results[i]!));
    } catch (err) {
      if (isDependencyOutage(err) && !isContention(err)) {
        // Those waiting would each find the database out of reach too, one timeout at a time.
        const waiting = this.queue;
        this.queue = [];
        for (const w of [...batch, ...waiting]) w.reject(err);
        return;
      }
      if (batch.length === 1) {
        batch[0]!.reject(err);
        return;
      }
      // Alone, one after the other: one that has waited too long by its turn is not run.
      for (const w of batch) {
        if (this.expired(w)) this.rejectExpired(w);
        else await this.runBatch([w]);
      }
    }
  }

  private expired(w: Waiting<I, O>): boolean {
    const maxWaitMs = this.options.maxWaitMs ?? 0;
    return maxWaitMs > 0 && performance.now() - w.since > maxWaitMs;
  }

  private rejectExpired(w: Waiting<I, O>): void {
    w.reject(
      this.options.expired?.() ?? new Error(`group commit: waited more than ${this.options.maxWaitMs} ms`),
    );
  }

  private async runObserved(batch: Waiting<I, O>[], started: number): Promise<O[]> {
    try {
      return await this.run(batch.map((w) => w.item));
    } finally {
      this.options.onBatch?.(batch.length, (performance.now() - started) / 1000);
    }
  }
}
