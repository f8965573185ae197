import { randomUUID } from 'node:crypto';
import type { KeyValueStore } from './kv.js';

/** A key held by one process of the deployment until released, or until it stops renewing it. */
export interface Lease {
  /**
   * Renews the key now and tells whether this holder still has it: false once it was lost (found
   * gone or another's, or not renewed for its life), or when this renewal fails or finds it so.
   * Asked before a step that only the holder may take.
   */
  held(): Promise<boolean>;
  /** Gives the key back (when still this holder's); stops renewing it. */
  release(): Promise<void>;
}

/**
 * Takes `key` for this process unless another holds it (null then). The key lives `ttlMs` and is
 * renewed every third of that while held, so a holder that dies without releasing it (killed, or
 * its machine lost) frees it within `ttlMs`. For long admin commands that must not run twice at
 * once, not for short critical sections: a holder that cannot renew it for `ttlMs` (the store out
 * of reach, the process stopped) may lose it, and `onLost` is told once, when it finds the key gone
 * or another's, or its renewals have failed for that long.
 */
export async function takeLease(
  kv: KeyValueStore,
  key: string,
  ttlMs: number,
  onLost: () => void = () => undefined,
): Promise<Lease | null> {
  const token = randomUUID();
  if (!(await kv.setIfAbsent(key, token, ttlMs))) return null;
  let renewedAt = performance.now();
  let lost = false;
  const lose = () => {
    if (lost) return;
    lost = true;
    onLost();
  };
  let renewing: Promise<unknown> = Promise.resolve();
  const interval = Math.max(1, Math.floor(ttlMs / 3));
  /** One renewal, given up after `interval` (a store that never answers must not hold it forever). */
  const renew = async (): Promise<boolean> => {
    if (lost) return false;
    // The key lives `ttlMs` from the renewal's start at the latest: timed from there.
    const started = performance.now();
    let timeout: NodeJS.Timeout | undefined;
    try {
      const renewed = await Promise.race([
        kv.expireIfEquals(key, token, ttlMs),
        new Promise<never>((_, fail) => {
          timeout = setTimeout(() => fail(new Error('lease renewal timed out')), interval);
        }),
      ]);
      if (!renewed) {
        lose();
        return false;
      }
      renewedAt = started;
      return true;
    } catch {
      // Told by the last tick before the key may be gone, not a third of its life after.
      if (performance.now() - renewedAt >= ttlMs - interval) lose();
      return false;
    } finally {
      clearTimeout(timeout);
    }
  };
  const timer = setInterval(() => {
    renewing = renew();
  }, interval);
  timer.unref();
  return {
    held: renew,
    release: async () => {
      clearInterval(timer);
      await renewing;
      await kv.deleteIfEquals(key, token);
    },
  };
}
