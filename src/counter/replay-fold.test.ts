import { readdirSync, readlinkSync } from 'node:fs';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { eventFor, type EntityRef } from './model.js';
import { ReplayFold } from './replay-fold.js';

/** The files this process holds open. */
function openFiles(): string[] {
  return readdirSync('/proc/self/fd').map((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      return '';
    }
  });
}

describe(ReplayFold.name, () => {
  const post = (n: number): EntityRef => ({ etype: 'knowpost', eid: String(n) });
  let sut: ReplayFold;

  beforeEach(() => {
    sut = ReplayFold.open();
  });

  afterEach(() => {
    sut.close();
  });

  it('keeps the event with the highest seq of each (entity, metric, user), whatever the order', () => {
    const ref = post(7);
    sut.add([eventFor(ref, 'like', 1, -1, 4, 40), eventFor(ref, 'like', 2, 1, 2, 20)]);
    sut.add([
      eventFor(ref, 'like', 1, 1, 1, 10),
      eventFor(ref, 'fav', 1, 1, 3, 30),
      eventFor(post(8), 'like', 1, 1, 9, 90),
    ]);

    expect(sut.factCount()).toBe(4);
    expect([sut.loggedSeq(ref), sut.loggedSeq(post(8)), sut.loggedSeq(post(9))]).toEqual([4, 9, 0]);
    const chunks = [...sut.chunks(100)];
    expect(chunks).toHaveLength(1);
    expect(chunks[0]!.facts).toEqual([
      eventFor(ref, 'fav', 1, 1, 3, 30),
      eventFor(ref, 'like', 1, -1, 4, 40),
      eventFor(ref, 'like', 2, 1, 2, 20),
      eventFor(post(8), 'like', 1, 1, 9, 90),
    ]);
    expect(chunks[0]!.complete).toEqual([ref, post(8)]);
    expect(chunks[0]!.spanning).toEqual([]);
  });

  it('chunks whole entities where they fit, and spreads only one larger than a chunk over several', () => {
    // Entities 1 to 4 with 3 facts each, then 5 with 9, then 6 with 2; chunks of 4.
    const facts = (ref: EntityRef, n: number, from = 1) =>
      Array.from({ length: n }, (_, i) => eventFor(ref, 'like', 100 + i, 1, from + i, 0));
    sut.add([...facts(post(1), 3), ...facts(post(2), 3), ...facts(post(3), 3), ...facts(post(4), 3)]);
    sut.add([...facts(post(5), 9), ...facts(post(6), 2)]);

    const chunks = [...sut.chunks(4)].map((c) => ({
      facts: c.facts.map((e) => e.entityId),
      complete: c.complete.map((r) => r.eid),
      spanning: c.spanning.map((r) => r.eid),
    }));
    expect(chunks).toEqual([
      { facts: ['1', '1', '1'], complete: ['1'], spanning: [] },
      { facts: ['2', '2', '2'], complete: ['2'], spanning: [] },
      { facts: ['3', '3', '3'], complete: ['3'], spanning: [] },
      { facts: ['4', '4', '4'], complete: ['4'], spanning: [] },
      { facts: ['5', '5', '5', '5'], complete: [], spanning: [] },
      { facts: ['5', '5', '5', '5'], complete: [], spanning: [] },
      { facts: ['5', '6', '6'], complete: ['6'], spanning: ['5'] },
    ]);
  });

  it('reads the facts lazily, a chunk at a time, and may be closed half-way', () => {
    sut.add(Array.from({ length: 50 }, (_, i) => eventFor(post(i + 1), 'like', 1, 1, 1, 0)));
    const chunks = sut.chunks(10);
    expect(chunks.next().value?.facts).toHaveLength(10);
    sut.close();
    sut.close();
  });

  it('spills past its cache to a temporary file no name holds, freed on close', () => {
    const spilled = () => openFiles().filter((f) => /etilqs_\w+ \(deleted\)$/.test(f)).length;
    const before = spilled();
    const small = ReplayFold.open(64);
    try {
      for (let b = 0; b < 10; b++)
        small.add(Array.from({ length: 2_000 }, (_, i) => eventFor(post(b * 2_000 + i), 'like', 7, 1, 1, 0)));
      expect(small.factCount()).toBe(20_000);
      // Unlinked once made: a replay killed outright leaves nothing behind.
      expect(spilled()).toBe(before + 1);
      small.close();
      expect(spilled()).toBe(before);
    } finally {
      small.close();
    }
  });
});
