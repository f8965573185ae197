import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { LocalSubscribers, type InvalidationBus, type InvalidationHandler } from './invalidation-bus.js';

interface Message {
  /** The publishing bus, which has already delivered the message to its own subscribers. */
  o: string;
  s: string;
  k: string[];
}

function parse(text: string): Message | null {
  try {
    const m = JSON.parse(text) as Partial<Message>;
    if (
      typeof m.o === 'string' &&
      typeof m.s === 'string' &&
      Array.isArray(m.k) &&
      m.k.every((k) => typeof k === 'string')
    )
      return { o: m.o, s: m.s, k: m.k };
  } catch {
    // fall through
  }
  return null;
}

/**
 * `InvalidationBus` over Redis pub/sub on one channel per deployment (`{prefix}invalidate`). Publishes
 * go through the shared command connection; receiving needs a connection of its own in subscriber
 * mode, which this bus owns and closes. ioredis resubscribes after a reconnect; messages sent while
 * disconnected are lost (at most once, as the port allows), so every reconnect is reported as a gap.
 */
export class RedisInvalidationBus implements InvalidationBus {
  private readonly id = randomUUID();
  private readonly subscribers: LocalSubscribers;
  private readonly channel: string;
  private closed = false;

  private constructor(
    private readonly publisher: Redis,
    private readonly subscriber: Redis,
    prefix: string,
    private readonly onError: (err: unknown) => void,
  ) {
    this.channel = `${prefix}invalidate`;
    this.subscribers = new LocalSubscribers(onError);
  }

  /**
   * Resolves once `subscriber` (a dedicated connection, owned by the bus from now on) listens, so
   * every message published after that reaches this process.
   */
  static async start(options: {
    publisher: Redis;
    subscriber: Redis;
    prefix: string;
    onError?: (err: unknown) => void;
  }): Promise<RedisInvalidationBus> {
    const bus = new RedisInvalidationBus(
      options.publisher,
      options.subscriber,
      options.prefix,
      options.onError ?? (() => {}),
    );
    options.subscriber.on('message', (channel: string, text: string) => bus.receive(channel, text));
    options.subscriber.on('error', (err: unknown) => bus.onError(err));
    try {
      await options.subscriber.subscribe(bus.channel);
    } catch (err) {
      options.subscriber.disconnect();
      throw err;
    }
    // Registered after the first subscription, so only reconnects count. ioredis sends the
    // resubscription before it reports the connection ready; a PING answered after it tells that
    // this process listens again, and only then may caches refill from a state that is complete.
    options.subscriber.on('ready', () => {
      if (bus.closed) return;
      const gap = () => {
        if (!bus.closed) bus.subscribers.gap();
      };
      options.subscriber.ping().then(gap, gap);
    });
    return bus;
  }

  private receive(channel: string, text: string): void {
    if (this.closed || channel !== this.channel) return;
    const message = parse(text);
    if (!message) {
      this.onError(new Error('ignoring a malformed invalidation message'));
      return;
    }
    if (message.o === this.id) return;
    this.subscribers.deliver(message.s, Object.freeze(message.k));
  }

  async publish(scope: string, keys: readonly string[]): Promise<void> {
    if (this.closed) return;
    const copy = Object.freeze([...keys]);
    this.subscribers.deliver(scope, copy);
    const message: Message = { o: this.id, s: scope, k: [...copy] };
    await this.publisher.publish(this.channel, JSON.stringify(message));
  }

  subscribe(scope: string, handler: InvalidationHandler): () => void {
    return this.subscribers.add(scope, handler);
  }

  onGap(handler: () => void): () => void {
    return this.subscribers.addGap(handler);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.subscribers.clear();
    await this.subscriber.quit().catch(() => this.subscriber.disconnect());
  }
}
