import type { InvalidationBus } from '../cache/invalidation-bus.js';

/** Bus scope of "the outbox has new rows": no keys, only the news. */
export const OUTBOX_WAKE_SCOPE = 'outbox';

/**
 * Tells the outbox relays of other processes that a transaction committed outbox rows, so a relay
 * in a worker process starts its next round at once instead of at its next poll. Used by processes
 * that commit but run no relay (the `api` role).
 *
 * Commits arriving together are told as one message: at most one every `minIntervalMs`, the first
 * at once and the last never dropped (a commit after a message went out is followed by another, so
 * a relay that ran its round just before that commit is woken again). The bus delivers at most once;
 * a message lost on the way costs a relay one poll interval, never a row.
 */
export class OutboxWakeSender {
  private lastSentAt = Number.NEGATIVE_INFINITY;
  private timer: NodeJS.Timeout | undefined;
  private sending = false;
  private pending = false;
  private closed = false;

  constructor(
    private readonly bus: Pick<InvalidationBus, 'publish'>,
    private readonly onError: (err: unknown) => void,
    private readonly minIntervalMs = 10,
    private readonly now: () => number = Date.now,
  ) {}

  /** After a commit that wrote outbox rows. */
  committed(): void {
    if (this.closed) return;
    this.pending = true;
    this.schedule();
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private schedule(): void {
    if (this.sending || this.timer || !this.pending || this.closed) return;
    const wait = this.lastSentAt + this.minIntervalMs - this.now();
    if (wait > 0) {
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.schedule();
      }, wait);
      this.timer.unref();
      return;
    }
    this.pending = false;
    this.sending = true;
    this.lastSentAt = this.now();
    this.bus
      .publish(OUTBOX_WAKE_SCOPE, [])
      .catch((err: unknown) => this.onError(err))
      .finally(() => {
        this.sending = false;
        this.schedule();
      });
  }
}

/**
 * Wakes `relay` whenever any process announces outbox rows, and after this process's bus
 * reconnected (announcements may have been missed meanwhile). Returns the unsubscribe.
 */
export function wakeOnAnnouncements(
  bus: Pick<InvalidationBus, 'subscribe' | 'onGap'>,
  relay: { notify(): void },
): () => void {
  const stopWakes = bus.subscribe(OUTBOX_WAKE_SCOPE, () => relay.notify());
  const stopGaps = bus.onGap(() => relay.notify());
  return () => {
    stopWakes();
    stopGaps();
  };
}
