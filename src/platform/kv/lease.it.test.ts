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
    // Another process takes the key the moment after this holder has read it (its lease ran out
    // meanwhile): renewing or deleting after a separate read would act on the other's key.
    let racing = false;
    const racy: KeyValueStore = Object.assign(Object.create(kv) as KeyValueStore, {
      get: async (key: string) => {
        const value = await kv.get(key);
        if (racing) await kv.set(key, 'another holder', 60_000);
        return value;
      },
    });
    let told = 0;
    const lease = await takeLease(racy, 'job', 300, () => told++);
    racing = true;
    await sleep(150);
    expect(await kv.get('job')).not.toBe('another holder');
    await kv.set('job', 'another holder', 60_000);
    await sleep(150);
    // The renewal found the key another's and left its lifetime alone.
    expect(told).toBe(1);
    expect(await kv.ttl('job')).toBeGreaterThan(50_000);
    await lease!.release();
    expect(await kv.get('job')).toBe('another holder');
  });
});
