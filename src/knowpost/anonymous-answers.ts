import { LruCache } from '../platform/cache/lru.js';
import { SingleFlight } from '../platform/cache/single-flight.js';
import type { PostInteractions } from './feed.service.js';

export interface AnonymousAnswersOptions {
  /** How long a written answer lives; also the most its counts may lag. */
  ttlMs: number;
  maxEntries: number;
  /**
   * Most bytes of answers kept: an expired answer stays in memory until it is read again or pushed
   * out, so entries alone would let many distinct keys (pages and sizes) hold a lot.
   */
  maxBytes: number;
  /** Counts read when an answer is written: not through a cache, so they are no older than the answer. */
  counts: PostInteractions['counts'];
  now?: () => number;
}

/**
 * Answers for callers who sent no token (JSON bytes, or what they were written from), which are the
 * same for all of them: kept for a fraction of a second, one writer per key at a time. Any local
 * invalidation of the post cache (a post changed anywhere, or the bus lost messages) bumps
 * `generation()` and so makes every kept answer invalid at once, and an answer written across such
 * an invalidation is not kept, nor joined by callers who came after it. Nothing that depends on the
 * caller may go in.
 */
export class AnonymousAnswers<V = Buffer> {
  private readonly kept: LruCache<{ value: V; generation: number }>;
  private readonly writes = new SingleFlight<V>();

  /** `size` tells how many bytes an answer holds (see `maxBytes`). */
  constructor(
    private readonly generation: () => number,
    options: Pick<AnonymousAnswersOptions, 'ttlMs' | 'maxEntries' | 'maxBytes' | 'now'>,
    size: (value: V) => number,
  ) {
    this.kept = new LruCache({
      ttlMs: options.ttlMs,
      maxEntries: options.maxEntries,
      maxWeight: options.maxBytes,
      weigh: (kept) => size(kept.value),
      ...(options.now ? { now: options.now } : {}),
    });
  }

  /** The kept answer for `key`, if there is a valid one now. */
  peek(key: string): V | undefined {
    const kept = this.kept.get(key);
    return kept && kept.generation === this.generation() ? kept.value : undefined;
  }

  /** The kept answer for `key`, or the one `write` produces (shared with concurrent callers). */
  async get(key: string, write: () => Promise<V>): Promise<V> {
    const generation = this.generation();
    const kept = this.kept.get(key);
    if (kept && kept.generation === generation) return kept.value;
    const written = await this.writes.do(`${key}:${generation}`, async () => {
      const value = await write();
      if (generation === this.generation()) this.kept.set(key, { value, generation });
      return value;
    });
    if (written === undefined) throw new Error('answer write produced nothing');
    return written;
  }
}
