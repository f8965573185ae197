import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { InvalidationBus } from './invalidation-bus.js';

export interface InvalidationBusFixture {
  /** Two processes of one deployment. */
  a: InvalidationBus;
  b: InvalidationBus;
  /** A process of another deployment (another prefix). */
  other: InvalidationBus;
  /** Cuts `b` off the bus for a moment (it reconnects by itself); absent where that cannot happen. */
  interruptB?: () => Promise<void>;
  cleanup: () => Promise<void>;
}

/** Waits until `check` holds, polling; fails after `ms`. */
async function until(check: () => boolean, ms = 2_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 5));
  }
}

const settle = () => new Promise((r) => setTimeout(r, 150));

/** The behaviour every `InvalidationBus` adapter must show. */
export function defineInvalidationBusContract(
  name: string,
  factory: () => Promise<InvalidationBusFixture>,
): void {
  describe(`InvalidationBus contract: ${name}`, () => {
    let fx: InvalidationBusFixture;

    beforeEach(async () => {
      fx = await factory();
    });
    afterEach(async () => {
      await fx.cleanup();
    });

    it('calls the publishing process’s subscribers before publish returns', async () => {
      const got: string[][] = [];
      fx.a.subscribe('post', (keys) => got.push([...keys]));
      const sent = fx.a.publish('post', ['1', '2']);
      expect(got).toEqual([['1', '2']]);
      await sent;
      await settle();
      expect(got).toEqual([['1', '2']]);
    });

    it('reaches the other processes of the deployment, keys intact, once per message', async () => {
      const atB: string[][] = [];
      fx.b.subscribe('post', (keys) => atB.push([...keys]));
      const keys = ['9007199254740993', 'знак 知光 "q" |x|', ''];
      await fx.a.publish('post', keys);
      await fx.a.publish('post', ['2']);
      await until(() => atB.length === 2);
      await settle();
      expect(atB).toEqual([keys, ['2']]);
    });

    it('keeps scopes apart and calls every subscriber of a scope', async () => {
      const posts: string[] = [];
      const users: string[] = [];
      const second: string[] = [];
      fx.b.subscribe('post', (keys) => posts.push(...keys));
      fx.b.subscribe('post', (keys) => second.push(...keys));
      fx.b.subscribe('user', (keys) => users.push(...keys));
      await fx.a.publish('user', ['u1']);
      await fx.a.publish('post', ['p1']);
      await until(() => posts.length === 1 && users.length === 1 && second.length === 1);
      expect({ posts, users, second }).toEqual({ posts: ['p1'], users: ['u1'], second: ['p1'] });
    });

    it('goes on delivering when a subscriber throws', async () => {
      const got: string[] = [];
      fx.b.subscribe('post', () => {
        throw new Error('boom');
      });
      fx.b.subscribe('post', (keys) => got.push(...keys));
      await fx.a.publish('post', ['x']);
      await until(() => got.length === 1);
      expect(got).toEqual(['x']);
    });

    it('stops delivering to a handler once unsubscribed', async () => {
      const got: string[] = [];
      const stop = fx.b.subscribe('post', (keys) => got.push(...keys));
      await fx.a.publish('post', ['before']);
      await until(() => got.length === 1);
      stop();
      await fx.a.publish('post', ['after']);
      await settle();
      expect(got).toEqual(['before']);
    });

    it('never delivers to another deployment', async () => {
      const got: string[] = [];
      const own: string[] = [];
      fx.other.subscribe('post', (keys) => got.push(...keys));
      fx.b.subscribe('post', (keys) => own.push(...keys));
      await fx.a.publish('post', ['1']);
      await until(() => own.length === 1);
      await settle();
      expect(got).toEqual([]);
    });

    it('reports a gap after a reconnect, then delivers again', async () => {
      let gaps = 0;
      fx.b.onGap(() => gaps++);
      const got: string[] = [];
      fx.b.subscribe('post', (keys) => got.push(...keys));
      await fx.a.publish('post', ['before']);
      await until(() => got.length === 1);
      expect(gaps).toBe(0);
      if (!fx.interruptB) return;
      await fx.interruptB();
      await until(() => gaps === 1, 5_000);
      await fx.a.publish('post', ['after']);
      await until(() => got.length === 2);
      expect(got).toEqual(['before', 'after']);
      expect(gaps).toBe(1);
    });

    it('delivers nothing after close and ignores publishes on a closed bus', async () => {
      const got: string[] = [];
      const atA: string[] = [];
      fx.b.subscribe('post', (keys) => got.push(...keys));
      fx.a.subscribe('post', (keys) => atA.push(...keys));
      await fx.b.close();
      await fx.a.publish('post', ['1']);
      await settle();
      expect(got).toEqual([]);
      expect(atA).toEqual(['1']);
      await expect(fx.b.publish('post', ['2'])).resolves.toBeUndefined();
      await settle();
      expect(atA).toEqual(['1']);
    });
  });
}
