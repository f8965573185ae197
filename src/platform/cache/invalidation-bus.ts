/**
 * Tells every process of a deployment that cached data changed, so each drops what it holds in
 * memory (cluster: Redis pub/sub; embedded: in process). It also carries news that needs no keys,
 * such as the outbox having new rows (see `platform/outbox/wake.ts`).
 *
 * Semantics every adapter guarantees (proved by `invalidation-bus.contract.ts`):
 * - A message is a scope (what kind of data, e.g. `knowpost`) and a list of keys (which items).
 *   Subscribers of a scope get exactly the keys published, in one call per message.
 * - `publish` calls this process's subscribers synchronously, before it returns, so the publishing
 *   process never serves what it just invalidated; other processes get the message soon after (within
 *   milliseconds while connected).
 * - Delivery to other processes is at most once: a process that is disconnected from the bus when a
 *   message is sent misses it. When it is connected again its `onGap` handlers are called, so caches
 *   fed by the bus can drop everything; they must still expire on their own (short TTLs), which bounds
 *   how long a missed message can matter while the connection is down.
 * - Buses of different deployments (other key prefixes) never see each other's messages.
 * - After `close` the bus delivers nothing more and `publish` does nothing.
 */
export type InvalidationHandler = (keys: readonly string[]) => void;

export interface InvalidationBus {
  publish(scope: string, keys: readonly string[]): Promise<void>;
  /** Returns a function that ends the subscription. A handler that throws does not stop the others. */
  subscribe(scope: string, handler: InvalidationHandler): () => void;
  /** Called after this process may have missed messages (it reconnected); returns an unsubscribe. */
  onGap(handler: () => void): () => void;
  close(): Promise<void>;
}

/** Subscribers of one process, by scope; both adapters deliver through it. */
export class LocalSubscribers {
  private readonly handlers = new Map<string, Set<InvalidationHandler>>();
  private readonly gapHandlers = new Set<() => void>();

  constructor(private readonly onHandlerError: (err: unknown) => void = () => {}) {}

  add(scope: string, handler: InvalidationHandler): () => void {
    let set = this.handlers.get(scope);
    if (!set) this.handlers.set(scope, (set = new Set()));
    // Wrapped so that the same function subscribed twice is called twice and unsubscribed once.
    const entry: InvalidationHandler = (keys) => handler(keys);
    set.add(entry);
    return () => {
      set.delete(entry);
      if (set.size === 0 && this.handlers.get(scope) === set) this.handlers.delete(scope);
    };
  }

  deliver(scope: string, keys: readonly string[]): void {
    const set = this.handlers.get(scope);
    if (!set) return;
    for (const handler of [...set]) {
      try {
        handler(keys);
      } catch (err) {
        this.onHandlerError(err);
      }
    }
  }

  /** Calls every gap handler (see `InvalidationBus.onGap`). */
  gap(): void {
    for (const handler of [...this.gapHandlers]) {
      try {
        handler();
      } catch (err) {
        this.onHandlerError(err);
      }
    }
  }

  addGap(handler: () => void): () => void {
    const entry = () => handler();
    this.gapHandlers.add(entry);
    return () => this.gapHandlers.delete(entry);
  }

  clear(): void {
    this.handlers.clear();
    this.gapHandlers.clear();
  }
}
