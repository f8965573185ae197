import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { migrate, openSqlite, type Db } from '../../platform/db/database.js';
import { COUNTER_TOPIC, type CounterEvent, type EntityRef } from '../model.js';
import { encodeSnapshot } from '../snapshot.js';
import { defineCounterStoreContract } from './counter-store.contract.js';
import { SqliteCounterStore } from './sqlite-counter-store.js';

async function openTempSqlite(): Promise<{ db: Db; path: string; dispose: () => Promise<void> }> {
  const dir = mkdtempSync(join(tmpdir(), 'zg-cs-'));
  const path = join(dir, 'counters.db');
  const db = openSqlite(path);
  await migrate(db);
  return {
    db,
    path,
    dispose: async () => {
      await db.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

defineCounterStoreContract('sqlite', async () => {
  const { db, dispose } = await openTempSqlite();
  return { sut: new SqliteCounterStore(db), cleanup: dispose };
});

const post = (eid: string): EntityRef => ({ etype: 'knowpost', eid });
const NOW = Date.parse('2030-01-01T00:00:00Z');

describe('SqliteCounterStore (embedded specifics)', () => {
  let db: Db;
  let path: string;
  let dispose: () => Promise<void>;
  let store: SqliteCounterStore;

  beforeEach(async () => {
    ({ db, path, dispose } = await openTempSqlite());
    store = new SqliteCounterStore(db);
  });
  afterEach(async () => {
    await dispose();
  });

  const exec = (statement: string): void => db.raw!.exec(statement);
  const all = <T>(statement: string, ...params: (string | number)[]): T[] =>
    db.raw!.prepare(statement).all(...params) as T[];
  const loggedEvents = (topic = COUNTER_TOPIC): CounterEvent[] =>
    all<{ value: string }>(`SELECT value FROM event_log WHERE topic = ? ORDER BY "offset"`, topic).map(
      (r) => JSON.parse(r.value) as CounterEvent,
    );
  const count = (table: string): number => all<{ n: number }>(`SELECT count(*) AS n FROM ${table}`)[0]!.n;

  /** What the aggregator and the flusher do, in one step: every logged event applied, then flushed. */
  const drain = async (): Promise<void> => {
    await store.applyEvents(loggedEvents());
    while ((await store.flush(100)) > 0);
  };

  it('appends each change to the event log in the toggle transaction, keyed by entity', async () => {
    const result = await store.toggle(post('101'), 'like', 7, true, NOW);
    expect(result).toMatchObject({ changed: true, state: true, published: true });
    const rows = all<{ topic: string; key: string; value: string; ts: number }>(
      'SELECT topic, key, value, ts FROM event_log',
    );
    expect(rows).toEqual([
      { topic: COUNTER_TOPIC, key: 'knowpost:101', value: JSON.stringify(result.event), ts: NOW },
    ]);
    expect(result.event).toMatchObject({ eventId: 'knowpost:101:1', seq: 1, delta: 1, userId: 7, idx: 1 });

    expect(await store.toggle(post('101'), 'like', 7, true, NOW)).toEqual({
      changed: false,
      state: true,
      event: null,
      published: false,
    });
    expect(await store.toggle(post('101'), 'fav', 7, false, NOW)).toMatchObject({
      changed: false,
      event: null,
    });
    expect(count('event_log')).toBe(1);
  });

  it('writes to the configured topic', async () => {
    const custom = new SqliteCounterStore(db, { topic: 'counter-events-test' });
    await custom.toggle(post('5'), 'fav', 1, true, NOW);
    expect(loggedEvents()).toEqual([]);
    expect(loggedEvents('counter-events-test')).toHaveLength(1);
  });

  it('numbers an entity’s changes consecutively across metrics and users, also under concurrency', async () => {
    const toggles = [];
    for (let user = 1; user <= 150; user++) {
      toggles.push(store.toggle(post('9'), user % 2 ? 'like' : 'fav', user, true, NOW));
      toggles.push(store.toggle(post('10'), 'like', user, true, NOW));
    }
    for (let user = 1; user <= 50; user++)
      toggles.push(store.toggle(post('9'), 'like', user * 2 - 1, false, NOW));
    await Promise.all(toggles);
    const seqsOf = (eid: string): number[] =>
      loggedEvents()
        .filter((e) => e.entityId === eid)
        .map((e) => e.seq);
    expect(seqsOf('9')).toEqual(Array.from({ length: 200 }, (_, i) => i + 1));
    expect(seqsOf('10')).toEqual(Array.from({ length: 150 }, (_, i) => i + 1));
    expect(await store.inspect(post('9'))).toMatchObject({ seq: 200, facts: { like: 25, fav: 75 } });
  });

  it('leaves neither fact nor event nor seq behind when a toggle fails half-way, and spares its neighbours', async () => {
    await store.toggle(post('1'), 'like', 1, true, NOW);
    // The fact insert succeeds; the event insert in the same transaction then fails.
    exec(`CREATE TRIGGER fail_event BEFORE INSERT ON event_log WHEN NEW.value LIKE '%"userId":666,%'
          BEGIN SELECT RAISE(ABORT, 'injected event log failure'); END`);
    const outcomes = await Promise.allSettled([
      store.toggle(post('1'), 'like', 2, true, NOW),
      store.toggle(post('1'), 'like', 666, true, NOW),
      store.toggle(post('1'), 'fav', 3, true, NOW),
    ]);
    expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'rejected', 'fulfilled']);
    expect(String((outcomes[1] as PromiseRejectedResult).reason)).toMatch(/injected event log failure/);
    expect(all('SELECT user_id FROM counter_facts WHERE user_id = 666')).toEqual([]);
    expect(loggedEvents().map((e) => [e.userId, e.seq])).toEqual([
      [1, 1],
      [2, 2],
      [3, 3],
    ]);
    expect((await store.inspect(post('1'))).seq).toBe(3);

    exec('DROP TRIGGER fail_event');
    const retried = await store.toggle(post('1'), 'like', 666, true, NOW);
    expect(retried.event?.seq).toBe(4);
    await drain();
    expect(await store.readSnapshots([post('1')])).toEqual([[0, 3, 1, 0, 0]]);
  });

  it('rolls back a toggle that fails half-way alone in its commit, leaving nothing behind', async () => {
    exec(`CREATE TRIGGER fail_event BEFORE INSERT ON event_log WHEN NEW.value LIKE '%"userId":666,%'
          BEGIN SELECT RAISE(ABORT, 'injected event log failure'); END`);
    await expect(store.toggle(post('5'), 'like', 666, true, NOW)).rejects.toThrow(
      /injected event log failure/,
    );
    expect(count('counter_facts')).toBe(0);
    expect(count('event_log')).toBe(0);
    expect(await store.inspect(post('5'))).toMatchObject({ seq: 0, facts: { like: 0, fav: 0 } });
    expect(db.raw!.isTransaction).toBe(false);
    exec('DROP TRIGGER fail_event');
    expect((await store.toggle(post('5'), 'like', 666, true, NOW)).event?.seq).toBe(1);
    expect(loggedEvents().map((e) => [e.userId, e.seq])).toEqual([[666, 1]]);
  });

  it('fails every toggle of a group whose commit fails, and keeps none of them', async () => {
    exec(`CREATE TRIGGER fail_commit BEFORE INSERT ON event_log WHEN NEW.value LIKE '%"userId":13,%'
          BEGIN SELECT RAISE(ROLLBACK, 'injected rollback'); END`);
    const outcomes = await Promise.allSettled([
      store.toggle(post('2'), 'like', 12, true, NOW),
      store.toggle(post('2'), 'like', 13, true, NOW),
      store.toggle(post('2'), 'like', 14, true, NOW),
    ]);
    // RAISE(ROLLBACK) ends the whole transaction, not just the statement: nothing of the group survives.
    expect(outcomes.every((o) => o.status === 'rejected')).toBe(true);
    expect(count('counter_facts')).toBe(0);
    expect(count('event_log')).toBe(0);
    exec('DROP TRIGGER fail_commit');
    expect((await store.toggle(post('2'), 'like', 12, true, NOW)).event?.seq).toBe(1);
  });

  it('keeps every resolved toggle after the database is reopened', async () => {
    const users = Array.from({ length: 300 }, (_, i) => i + 1);
    const results = await Promise.all(users.map((u) => store.toggle(post('77'), 'like', u, true, NOW)));
    expect(results.every((r) => r.changed)).toBe(true);
    const other = openSqlite(path);
    try {
      const reopened = new SqliteCounterStore(other);
      expect(await reopened.factCounts(post('77'))).toEqual({ like: 300, fav: 0 });
      const row = await other.kysely
        .selectFrom('event_log')
        .select((eb) => eb.fn.countAll<number>().as('n'))
        .executeTakeFirstOrThrow();
      expect(Number(row.n)).toBe(300);
    } finally {
      await other.close();
    }
  });

  it('applies a redelivered batch once, whatever the split of the redelivery', async () => {
    for (let user = 1; user <= 6; user++) await store.toggle(post('3'), 'like', user, true, NOW);
    await store.toggle(post('3'), 'like', 2, false, NOW);
    await store.toggle(post('4'), 'fav', 1, true, NOW);
    const events = loggedEvents();

    expect(await store.applyEvents(events)).toEqual({ applied: 8, skipped: 0 });
    expect(await store.applyEvents(events)).toEqual({ applied: 0, skipped: 8 });
    expect(await store.applyEvents([...events, ...events])).toEqual({ applied: 0, skipped: 16 });
    expect(all('SELECT eid, idx, delta FROM counter_pending ORDER BY eid, idx')).toEqual([
      { eid: '3', idx: 1, delta: 5 },
      { eid: '4', idx: 2, delta: 1 },
    ]);
    while ((await store.flush(10)) > 0);
    // A redelivery that straddles the mark falls back to the facts, which agree.
    const straddling = events.filter((e) => e.entityId === '3' && e.seq >= 5);
    await store.toggle(post('3'), 'like', 9, true, NOW);
    const next = loggedEvents().at(-1)!;
    expect(await store.applyEvents([...straddling, next])).toEqual({ applied: 1, skipped: 3 });
    expect(await store.applyEvents([next])).toEqual({ applied: 0, skipped: 1 });
    while ((await store.flush(10)) > 0);
    expect(await store.readSnapshots([post('3'), post('4')])).toEqual([
      [0, 6, 0, 0, 0],
      [0, 0, 1, 0, 0],
    ]);
    expect(await store.inspect(post('3'))).toEqual({
      seq: 8,
      applied: 8,
      pending: false,
      snapshot: [0, 6, 0, 0, 0],
      facts: { like: 6, fav: 0 },
      sealed: true,
    });
  });

  it('folds a batch of thousands of events into a few rows', async () => {
    const events: CounterEvent[] = [];
    for (let e = 0; e < 50; e++) {
      for (let seq = 1; seq <= 100; seq++) {
        events.push({
          eventId: `knowpost:${e}:${seq}`,
          entityType: 'knowpost',
          entityId: String(e),
          metric: seq % 3 ? 'like' : 'fav',
          idx: seq % 3 ? 1 : 2,
          userId: seq,
          delta: 1,
          ts: NOW,
          seq,
        });
      }
    }
    expect(await store.applyEvents(events)).toEqual({ applied: 5_000, skipped: 0 });
    expect(count('counter_pending')).toBe(100);
    expect(count('counter_entities')).toBe(50);
  });

  it('loses nothing and doubles nothing when a flush dies half-way', async () => {
    for (let e = 1; e <= 5; e++) {
      for (let user = 1; user <= e; user++) await store.toggle(post(String(e)), 'like', user, true, NOW);
    }
    await drain();
    for (let e = 1; e <= 5; e++) await store.toggle(post(String(e)), 'fav', 100, true, NOW);
    await store.applyEvents(loggedEvents().filter((e) => e.metric === 'fav'));
    const pendingBefore = all('SELECT * FROM counter_pending ORDER BY etype, eid, idx');
    const snapshotsBefore = all('SELECT * FROM counter_snapshots ORDER BY etype, eid');
    expect(pendingBefore).toHaveLength(5);

    // Dies after the first entities' snapshots were written, while clearing the third one's deltas.
    exec(`CREATE TRIGGER die_mid_flush BEFORE DELETE ON counter_pending WHEN OLD.eid = '3'
          BEGIN SELECT RAISE(ABORT, 'injected crash'); END`);
    await expect(store.flush(100)).rejects.toThrow(/injected crash/);
    expect(all('SELECT * FROM counter_pending ORDER BY etype, eid, idx')).toEqual(pendingBefore);
    expect(all('SELECT * FROM counter_snapshots ORDER BY etype, eid')).toEqual(snapshotsBefore);
    expect(await store.isQuiet()).toBe(false);

    exec('DROP TRIGGER die_mid_flush');
    expect(await store.flush(100)).toBe(5);
    expect(await store.flush(100)).toBe(0);
    expect(await store.isQuiet()).toBe(true);
    expect(await store.readSnapshots([1, 2, 3, 4, 5].map((e) => post(String(e))))).toEqual(
      [1, 2, 3, 4, 5].map((e) => [0, e, 1, 0, 0]),
    );
  });

  it('applies nothing of a batch whose transaction fails, so the redelivery counts once', async () => {
    for (let user = 1; user <= 3; user++) await store.toggle(post('8'), 'like', user, true, NOW);
    exec(`CREATE TRIGGER die_mid_apply BEFORE UPDATE OF applied ON counter_entities
          BEGIN SELECT RAISE(ABORT, 'injected crash'); END`);
    await expect(store.applyEvents(loggedEvents())).rejects.toThrow(/injected crash/);
    expect(count('counter_pending')).toBe(0);
    exec('DROP TRIGGER die_mid_apply');
    await drain();
    expect(await store.readSnapshots([post('8')])).toEqual([[0, 3, 0, 0, 0]]);
  });

  it('rebuilds an entity from its facts when its snapshot is malformed at flush time', async () => {
    for (let user = 1; user <= 4; user++) await store.toggle(post('6'), 'like', user, true, NOW);
    await drain();
    await store.writeRawSnapshot(post('6'), Buffer.from('garbage'));
    await store.toggle(post('6'), 'fav', 1, true, NOW);
    await store.applyEvents(loggedEvents().slice(-1));
    expect(await store.flush(10)).toBe(1);
    expect(await store.readSnapshots([post('6')])).toEqual([[0, 4, 1, 0, 0]]);
    expect(await store.inspect(post('6'))).toMatchObject({ seq: 5, applied: 5, pending: false });
  });

  it('keeps the other fields on rebuild and never folds below zero', async () => {
    await store.toggle(post('12'), 'like', 1, true, NOW);
    await store.writeRawSnapshot(post('12'), encodeSnapshot([40, 0, 0, 3, 2]));
    expect(await store.rebuild(post('12'))).toEqual([40, 1, 0, 3, 2]);
    exec(`INSERT INTO counter_pending (etype, eid, idx, delta) VALUES ('knowpost', '12', 2, -5)`);
    expect(await store.flush(10)).toBe(1);
    expect(await store.readSnapshots([post('12')])).toEqual([[40, 1, 0, 3, 2]]);
  });

  it('pages through entities that changed or have a snapshot, and resets all but the event log', async () => {
    for (let e = 100; e < 125; e++) await store.toggle(post(String(e)), 'like', 1, true, NOW);
    await store.toggle(post('100'), 'like', 1, false, NOW);
    await store.toggle(post('200'), 'like', 1, true, NOW);
    await store.toggle(post('200'), 'like', 1, false, NOW);
    await store.writeRawSnapshot(post('300'), encodeSnapshot([0, 0, 0, 0, 0]));
    const seen: string[] = [];
    let cursor: string | null = '';
    while (cursor !== null) {
      const page: { refs: EntityRef[]; cursor: string | null } = await store.scanEntities(cursor, 7);
      expect(page.refs.length).toBeLessThanOrEqual(7);
      seen.push(...page.refs.map((r) => r.eid));
      cursor = page.cursor;
    }
    // Entities that changed count even when no fact is left, like every entity with a snapshot.
    expect(seen).toEqual([...Array.from({ length: 25 }, (_, i) => String(100 + i)), '200', '300']);
    expect(await store.sampleEntities(10)).toEqual([post('300')]);

    await store.reset();
    for (const table of ['counter_facts', 'counter_entities', 'counter_pending', 'counter_snapshots']) {
      expect(count(table)).toBe(0);
    }
    expect(count('event_log')).toBe(28);
    expect(await store.scanEntities('', 10)).toEqual({ refs: [], cursor: null });
  });

  it('replays facts from events so new changes continue above them', async () => {
    for (let user = 1; user <= 3; user++) await store.toggle(post('50'), 'like', user, true, NOW);
    await store.toggle(post('50'), 'like', 2, false, NOW);
    await store.toggle(post('50'), 'fav', 2, true, NOW);
    const events = loggedEvents();
    await store.reset();
    await store.replayFacts(events);
    expect(await store.factCounts(post('50'))).toEqual({ like: 2, fav: 1 });
    expect(await store.flags(2, [post('50'), post('51')])).toEqual([
      { like: false, fav: true },
      { like: false, fav: false },
    ]);
    expect((await store.inspect(post('50'))).seq).toBe(5);
    expect((await store.toggle(post('50'), 'like', 4, true, NOW)).event?.seq).toBe(6);
    expect(await store.rebuild(post('50'))).toEqual([0, 3, 1, 0, 0]);
    expect(await store.staleUnpublished(NOW + 1e9, 0, 10)).toEqual([]);
  });

  it('refuses toggles while unsealed, also after a reopen, until sealed again', async () => {
    await store.toggle(post('60'), 'like', 1, true, NOW);
    expect(await store.unsealedGroups()).toBe(0);
    // A replay unseals the store before its reset and seals it once the facts are back.
    expect(await store.restoring()).toBe(false);
    expect(await store.unseal()).toEqual([0]);
    expect(await store.unsealedGroups()).toBe(1);
    expect(await store.restoring()).toBe(true);
    await expect(store.toggle(post('60'), 'like', 2, true, NOW)).rejects.toThrow(/being restored/);
    expect((await store.inspect(post('60'))).sealed).toBe(false);
    // One stopped half-way (killed after its reset) leaves the next process refusing them too.
    await store.reset();
    let told = 0;
    const reopened = new SqliteCounterStore(db, { onUnsealed: () => told++ });
    const refused = [1, 2, 3].map((user) => reopened.toggle(post('60'), 'like', user, true, NOW));
    for (const toggle of refused) await expect(toggle).rejects.toThrow(/being restored/);
    expect(told).toBeGreaterThan(0);
    expect(await reopened.factCounts(post('60'))).toEqual({ like: 0, fav: 0 });
    expect(count('event_log')).toBe(1);
    // Unsealed already: a replay stopping before its reset leaves it so.
    expect(await reopened.unseal()).toEqual([]);
    await reopened.seal([]);
    await expect(reopened.toggle(post('60'), 'like', 2, true, NOW)).rejects.toThrow(/being restored/);
    await reopened.seal();
    expect(await reopened.unsealedGroups()).toBe(0);
    expect((await reopened.toggle(post('60'), 'like', 2, true, NOW)).changed).toBe(true);
    expect((await reopened.inspect(post('60'))).sealed).toBe(true);
  });

  it('refuses a database it cannot use', () => {
    expect(() => new SqliteCounterStore({ ...db, dialect: 'mysql' })).toThrow(/sqlite/);
  });
});
