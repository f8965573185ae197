import { LocalSubscribers, type InvalidationBus, type InvalidationHandler } from './invalidation-bus.js';

/**
 * Connects the buses of one deployment inside one process. The embedded profile has a single process
 * and so a single bus on its own hub; tests put several buses on one hub to stand for several processes.
 */
export class LocalInvalidationHub {
  readonly members = new Set<LocalInvalidationBus>();
}

/** `InvalidationBus` for the embedded profile: messages reach the buses of its hub, synchronously. */
export class LocalInvalidationBus implements InvalidationBus {
  private readonly subscribers: LocalSubscribers;
  private closed = false;

  constructor(
    private readonly hub: LocalInvalidationHub = new LocalInvalidationHub(),
    onHandlerError?: (err: unknown) => void,
  ) {
    this.subscribers = new LocalSubscribers(onHandlerError);
    hub.members.add(this);
  }

  async publish(scope: string, keys: readonly string[]): Promise<void> {
    this.send(scope, keys);
  }

  /** Synchronous delivery to this bus first, then to the others of the hub. */
  private send(scope: string, keys: readonly string[]): void {
    if (this.closed) return;
    const copy = Object.freeze([...keys]);
    this.subscribers.deliver(scope, copy);
    for (const member of this.hub.members) if (member !== this) member.receive(scope, copy);
  }

  private receive(scope: string, keys: readonly string[]): void {
    if (!this.closed) this.subscribers.deliver(scope, keys);
  }

  subscribe(scope: string, handler: InvalidationHandler): () => void {
    return this.subscribers.add(scope, handler);
  }

  /** In process nothing is ever missed. */
  onGap(handler: () => void): () => void {
    return this.subscribers.addGap(handler);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.hub.members.delete(this);
    this.subscribers.clear();
  }
}
