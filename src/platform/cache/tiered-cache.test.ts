import { describe, expect, it } from 'vitest';
import type { CacheFill, CacheRead, CacheSlot, SharedCache } from './shared-cache.js';
import { TieredCache, type TieredCacheOptions } from './tiered-cache.js';

/** An in-memory shared tier with the port's semantics, counting calls. */
class MemoryShared implements SharedCache {
  gens = new Map<string, number>();
  values = new Map<string, { gen: number; value: string }>();
  calls = { get: 0, fill: 0, invalidate: 0 };
  failing = false;

  async get(slots: readonly CacheSlot[]): Promise<CacheRead[]> {
    this.calls.get++;
    if (this.failing) throw new Error('shared tier down');
    return slots.map((s) => {
      const gen = this.gens.get(s.guard) ?? 0;
      const hit = this.values.get(`${s.guard}/${s.key}`);
      return { gen: String(gen), value: hit && hit.gen === gen ? hit.value : null };
    });
  }

  async fill(entries: readonly CacheFill[]): Promise<void> {
    this.calls.fill++;
    for (const e of entries) {
      const gen = this.gens.get(e.guard) ?? 0;
      if (String(gen) === e.gen) this.values.set(`${e.guard}/${e.key}`, { gen, value: e.value });
    }
  }

  async invalidate(guards: readonly string[]): Promise<void> {
    this.calls.invalidate++;
    for (const g of guards) this.gens.set(g, (this.gens.get(g) ?? 0) + 1);
  }
}

function deferred<T>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((ok) => (resolve = ok));
  return { promise, resolve };
}

interface Post {
  id: string;
  public: boolean;
  title: string;
}

function cacheOf(shared: SharedCache, extra: Partial<TieredCacheOptions<Post>> = {}) {
  const errors: unknown[] = [];
  const sut = new TieredCache<Post>({
    local: { maxEntries: 100, ttlMs: 60_000 },
    shared,
    sharedTtlMs: 60_000,
    encode: (p) => JSON.stringify(p),
    decode: (t) => {
      const v = JSON.parse(t) as Post | { bogus: true };
      return 'id' in v ? v : null;
    },
    cacheable: (p) => p.public,
    onSharedError: (err) => errors.push(err),
    ...extra,
  });
  return { sut, errors };
}

/** A database of posts that counts loads and the keys asked for. */
function table(rows: Record<string, Post>) {
  const asked: string[][] = [];
  const load = async (keys: readonly string[]) => {
    asked.push([...keys]);
    return new Map(keys.flatMap((k) => (rows[k] ? [[k, { ...rows[k] }] as const] : [])));
  };
  return { rows, asked, load };
}

describe(TieredCache.name, () => {
  it('loads a miss once, then answers from this process and from the shared tier', async () => {
    const shared = new MemoryShared();
    const db = table({ a: { id: 'a', public: true, title: 'A' }, b: { id: 'b', public: true, title: 'B' } });
    const one = cacheOf(shared).sut;
    const other = cacheOf(shared).sut;

    const first = await one.getMany(['a', 'b', 'zz', 'a'], db.load);
    expect([...first.keys()]).toEqual(['a', 'b']);
    expect(db.asked).toEqual([['a', 'b', 'zz']]);
    expect(shared.calls).toEqual({ get: 1, fill: 1, invalidate: 0 });

    expect((await one.get('a', db.load))?.title).toBe('A');
    expect(shared.calls.get).toBe(1);

    expect((await other.getMany(['a', 'b'], db.load)).size).toBe(2);
    expect(db.asked).toHaveLength(1);
    expect(shared.calls.get).toBe(2);
  });

  it('shares one load among concurrent callers', async () => {
    const gate = deferred<void>();
    const db = table({ a: { id: 'a', public: true, title: 'A' } });
    const { sut } = cacheOf(new MemoryShared());
    const slow = async (keys: readonly string[]) => {
      await gate.promise;
      return db.load(keys);
    };
    const all = Promise.all([sut.get('a', slow), sut.get('a', slow), sut.getMany(['a'], slow)]);
    gate.resolve();
    const [x, y, z] = await all;
    expect([x?.title, y?.title, z.get('a')?.title]).toEqual(['A', 'A', 'A']);
    expect(db.asked).toEqual([['a']]);
  });

  it('never stores a value that is not cacheable, in either tier', async () => {
    const shared = new MemoryShared();
    const db = table({ p: { id: 'p', public: false, title: 'private' } });
    const { sut } = cacheOf(shared);
    expect((await sut.get('p', db.load))?.title).toBe('private');
    expect((await sut.get('p', db.load))?.title).toBe('private');
    expect(db.asked).toHaveLength(2);
    expect(shared.values.size).toBe(0);
    expect(shared.calls.fill).toBe(0);
  });

  it('does not cache, nor hand to later callers, a load that overlapped an invalidation', async () => {
    const shared = new MemoryShared();
    const db = table({ a: { id: 'a', public: true, title: 'before' } });
    const { sut } = cacheOf(shared);
    const gate = deferred<void>();
    const slow = async (keys: readonly string[]) => {
      const snapshot = await db.load(keys);
      await gate.promise;
      return snapshot;
    };
    const early = sut.get('a', slow);
    await new Promise((r) => setTimeout(r, 0));
    // The change commits and is announced while the early read is in flight.
    db.rows.a = { id: 'a', public: false, title: 'after' };
    sut.invalidateLocal(['a']);
    await sut.invalidateShared(['a']);
    const late = sut.get('a', db.load);
    gate.resolve();
    expect((await early)?.title).toBe('before');
    expect((await late)?.title).toBe('after');
    expect(shared.values.size).toBe(0);
    expect((await sut.get('a', db.load))?.title).toBe('after');
    expect(db.asked).toHaveLength(3);
  });

  it('keeps another process from reading or refilling an invalidated shared value', async () => {
    const shared = new MemoryShared();
    const db = table({ a: { id: 'a', public: true, title: 'v1' } });
    const writer = cacheOf(shared).sut;
    const reader = cacheOf(shared, { local: { maxEntries: 0, ttlMs: 0 } }).sut;
    expect((await reader.get('a', db.load))?.title).toBe('v1');
    db.rows.a = { id: 'a', public: true, title: 'v2' };
    writer.invalidateLocal(['a']);
    await writer.invalidateShared(['a']);
    expect((await reader.get('a', db.load))?.title).toBe('v2');
  });

  it('drops a whole family of keys under one guard', async () => {
    const shared = new MemoryShared();
    const rows = {
      'feed:1': { id: 'feed:1', public: true, title: 'p1' },
      'feed:2': { id: 'feed:2', public: true, title: 'p2' },
    };
    const db = table(rows);
    const { sut } = cacheOf(shared, { guardOf: (k) => (k.startsWith('feed:') ? 'feed' : k) });
    await sut.getMany(['feed:1', 'feed:2'], db.load);
    await sut.getMany(['feed:1', 'feed:2'], db.load);
    expect(db.asked).toHaveLength(1);
    sut.invalidateLocal(['feed']);
    await sut.invalidateShared(['feed']);
    await sut.getMany(['feed:1', 'feed:2'], db.load);
    expect(db.asked).toHaveLength(2);
  });

  it('reads past a failing shared tier and reports it', async () => {
    const shared = new MemoryShared();
    shared.failing = true;
    const db = table({ a: { id: 'a', public: true, title: 'A' } });
    const { sut, errors } = cacheOf(shared);
    expect((await sut.get('a', db.load))?.title).toBe('A');
    expect(errors).toHaveLength(1);
  });

  it('treats a shared value it cannot decode as a miss', async () => {
    const shared = new MemoryShared();
    shared.values.set('a/a', { gen: 0, value: JSON.stringify({ bogus: true }) });
    const db = table({ a: { id: 'a', public: true, title: 'A' } });
    const { sut } = cacheOf(shared);
    expect((await sut.get('a', db.load))?.title).toBe('A');
    expect(db.asked).toEqual([['a']]);
  });

  it('clearLocal forgets what this process holds and reads the shared tier again', async () => {
    const shared = new MemoryShared();
    const db = table({ a: { id: 'a', public: true, title: 'A' } });
    const { sut } = cacheOf(shared);
    await sut.get('a', db.load);
    await sut.get('a', db.load);
    expect(shared.calls.get).toBe(1);
    sut.clearLocal();
    expect((await sut.get('a', db.load))?.title).toBe('A');
    expect(shared.calls.get).toBe(2);
    expect(db.asked).toHaveLength(1);
  });

  it('answers from the database while its own shared invalidation is on its way, keeping it here only', async () => {
    const shared = new MemoryShared();
    const db = table({ a: { id: 'a', public: true, title: 'old' } });
    const writer = cacheOf(shared).sut;
    expect((await writer.get('a', db.load))?.title).toBe('old'); // in both tiers now
    // The change commits; the writer drops its copy and sends the shared invalidation, which is slow.
    db.rows.a!.title = 'new';
    const slow = deferred<void>();
    const invalidate = shared.invalidate.bind(shared);
    shared.invalidate = async (guards) => {
      await slow.promise;
      return invalidate(guards);
    };
    writer.invalidateLocal(['a']);
    const sent = writer.invalidateShared(['a']);
    // Read meanwhile in the same process: not the shared tier's old copy.
    expect((await writer.get('a', db.load))?.title).toBe('new');
    expect([db.asked.length, shared.calls.get, shared.calls.fill]).toEqual([2, 1, 1]);
    slow.resolve();
    await sent;
    // Kept in this process; the shared tier was neither read nor filled for it.
    expect((await writer.get('a', db.load))?.title).toBe('new');
    expect([db.asked.length, shared.calls.get, shared.calls.fill]).toEqual([2, 1, 1]);
    // Another process reads the shared tier, misses (moved) and fills it.
    const reader = cacheOf(shared).sut;
    expect((await reader.get('a', db.load))?.title).toBe('new');
    expect([db.asked.length, shared.calls.fill]).toEqual([3, 2]);
  });

  it('reads past the shared tier while a failed invalidation may have left an old value there', async () => {
    const shared = new MemoryShared();
    const db = table({ a: { id: 'a', public: true, title: 'old' } });
    const writer = cacheOf(shared, { sharedTtlMs: 200 }).sut;
    expect((await writer.get('a', db.load))?.title).toBe('old'); // in both tiers now
    db.rows.a!.title = 'new';
    shared.invalidate = async () => {
      throw new Error('shared tier down');
    };
    writer.invalidateLocal(['a']);
    await expect(writer.invalidateShared(['a'])).rejects.toThrow('shared tier down');
    // The shared tier still holds the old copy: this process answers from the database.
    expect((await writer.get('a', db.load))?.title).toBe('new');
    expect([db.asked.length, shared.calls.get]).toEqual([2, 1]);
    // Once that copy has expired there, the shared tier is read again.
    await new Promise((resolve) => setTimeout(resolve, 250));
    writer.clearLocal();
    await writer.get('a', db.load);
    expect(shared.calls.get).toBe(2);
  });

  it('reads the shared tier again once an invalidation started after the failure is done', async () => {
    const shared = new MemoryShared();
    const db = table({ a: { id: 'a', public: true, title: 'old' } });
    const writer = cacheOf(shared, { sharedTtlMs: 60_000 }).sut;
    await writer.get('a', db.load);
    db.rows.a!.title = 'new';
    const invalidate = shared.invalidate.bind(shared);
    // One started before the failure and done after it tells nothing: it may have run before the change.
    const early = deferred<void>();
    shared.invalidate = async (guards) => {
      await early.promise;
      return invalidate(guards);
    };
    const before = writer.invalidateShared(['a']);
    shared.invalidate = async () => {
      throw new Error('shared tier down');
    };
    writer.invalidateLocal(['a']);
    await expect(writer.invalidateShared(['a'])).rejects.toThrow('shared tier down');
    early.resolve();
    await before;
    writer.clearLocal();
    await writer.get('a', db.load);
    expect(shared.calls.get).toBe(1);
    // The retry (the consumer's) goes through: the old copy is unreadable there, and the tier is read again.
    shared.invalidate = invalidate;
    await writer.invalidateShared(['a']);
    writer.clearLocal();
    expect((await writer.get('a', db.load))?.title).toBe('new');
    expect(shared.calls.get).toBe(2);
  });
});
