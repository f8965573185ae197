import { randomUUID } from 'node:crypto';
import type { KeyValueStore } from './kv.js';

/** A key held by one process of the deployment until released, or until it stops renewing it. */
export interface Lease {
  /** Gives the key back (when still this holder's); stops renewing it. */
  release(): Promise<void>;
}

/**
 * Takes `key` for this process unless another holds it (null then). The key lives `ttlMs` and is
 * renewed every third of that while held, so a holder that dies without releasing it (killed, or
 * its machine lost) frees it within `ttlMs`. For long admin commands that must not run twice at
 * once, not for short critical sections: a holder paused past `ttlMs` (a stopped process) loses it.
 */
export async function takeLease(kv: KeyValueStore, key: string, ttlMs: number): Promise<Lease | null> {
  const token = randomUUID();
  if (!(await kv.setIfAbsent(key, token, ttlMs))) return null;
  let renewing: Promise<unknown> = Promise.resolve();
  const timer = setInterval(
    () => {
      renewing = (async () => {
        if ((await kv.get(key)) === token) await kv.expire(key, ttlMs);
      })().catch(() => undefined);
    },
    Math.max(1, Math.floor(ttlMs / 3)),
  );
  timer.unref();
  return {
    release: async () => {
      clearInterval(timer);
      await renewing;
      if ((await kv.get(key)) === token) await kv.delete(key);
    },
  };
}
