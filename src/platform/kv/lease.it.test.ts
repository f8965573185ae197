import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { openTempSqlite } from '../../../test/rig/resources.js';
import { createSqliteKv } from './create.js';
import type { KeyValueStore } from './kv.js';
import { takeLease } from './lease.js';

describe(takeLease.name, () => {
  let kv: KeyValueStore;
  let dispose: () => Promise<void>;
  beforeEach(async () => {
    const opened = await openTempSqlite();
    dispose = opened.dispose;
    kv = createSqliteKv(opened.db);
  });
  afterEach(async () => dispose());

  it('lets one holder at a time take a key, renewed for as long as it is held', async () => {
    const first = await takeLease(kv, 'job', 600);
    expect(first).not.toBeNull();
    expect(await takeLease(kv, 'job', 600)).toBeNull();
    // Held past its time to live: renewed meanwhile.
    await sleep(1_000);
    expect(await takeLease(kv, 'job', 600)).toBeNull();
    await first!.release();
    const second = await takeLease(kv, 'job', 600);
    expect(second).not.toBeNull();
    await second!.release();
  });

  it('tells its holder whether it still holds it, before a step only the holder may take', async () => {
    const lease = await takeLease(kv, 'job', 60_000);
    expect(await lease!.held()).toBe(true);
    // Wiped from under it (a store that lost its data), then taken by another.
    await kv.delete('job');
    expect(await lease!.held()).toBe(false);
    const next = await takeLease(kv, 'job', 60_000);
    expect(await lease!.held()).toBe(false);
    expect(await next!.held()).toBe(true);
    await lease!.release();
    expect(await next!.held()).toBe(true);
    await next!.release();
  });

  it('is free again once a holder that stopped renewing it has let its time pass', async () => {
    let told = 0;
    const gone = await takeLease(kv, 'job', 100, () => told++);
    expect(gone).not.toBeNull();
    // As a killed holder: nothing renews it, nothing releases it.
    await kv.set('job', 'someone else', 100);
    await sleep(200);
    const next = await takeLease(kv, 'job', 100);
    expect(next).not.toBeNull();
    // The first holder found its key another's, and was told once.
    expect(told).toBe(1);
    // The first holder's release leaves the key of the one that holds it now.
    await gone!.release();
    expect(await takeLease(kv, 'job', 100)).toBeNull();
    await next!.release();
  });

  it('tells a holder whose renewals fail for its whole time to live that it may have lost it', async () => {
    let told = 0;
    let down = false;
    const flaky: KeyValueStore = Object.assign(Object.create(kv) as KeyValueStore, {
      get: (key: string) => (down ? Promise.reject(new Error('unreachable')) : kv.get(key)),
      expireIfEquals: (key: string, value: string, ttlMs: number) =>
        down ? Promise.reject(new Error('unreachable')) : kv.expireIfEquals(key, value, ttlMs),
    });
    const lease = await takeLease(flaky, 'job', 600, () => told++);
    await sleep(700);
    expect(told).toBe(0);
    down = true;
    await sleep(800);
    expect(told).toBe(1);
    down = false;
    await lease!.release();
  });

  it('neither renews nor frees a key another holder took between a look at it and the act', async () => {
    // Another process takes the key the moment before this holder acts on it (its lease ran out
    // meanwhile): after the holder's read when it reads first, or right before its one-step act.
    let racing = false;
    const takeOver = async (key: string) => {
      if (!racing) return;
      racing = false;
      await kv.set(key, 'another holder', 60_000);
    };
    const racy: KeyValueStore = Object.assign(Object.create(kv) as KeyValueStore, {
      get: async (key: string) => {
        const value = await kv.get(key);
        await takeOver(key);
        return value;
      },
      expireIfEquals: async (key: string, value: string, ttlMs: number) => {
        await takeOver(key);
        return kv.expireIfEquals(key, value, ttlMs);
      },
      deleteIfEquals: async (key: string, value: string) => {
        await takeOver(key);
        return kv.deleteIfEquals(key, value);
      },
    });
    let told = 0;
    const renewed = await takeLease(racy, 'job', 600, () => told++);
    racing = true;
    // The first renewal (after 200 ms) finds the key another's and leaves its lifetime alone.
    await sleep(400);
    expect(racing).toBe(false);
    expect(told).toBe(1);
    expect(await kv.get('job')).toBe('another holder');
    expect(await kv.ttl('job')).toBeGreaterThan(50_000);
    await renewed!.release();

    // Taken over right before the release: the release leaves it to its new holder.
    const released = await takeLease(racy, 'other job', 60_000);
    racing = true;
    await released!.release();
    expect(racing).toBe(false);
    expect(await kv.get('other job')).toBe('another holder');
  });
});
