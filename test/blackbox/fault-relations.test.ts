/**
 * Fault suite for follow relations against real processes (cluster profile): three API processes and
 * one worker process of the built server (the worker runs the outbox relay and the relation-proj
 * consumer; `--role` has no finer split, so killing the worker kills both) on a Kafka broker of this
 * file's own.
 *
 * Scale: 300 users signed up through the API; 10,000 follow/unfollow calls among them, spread over
 * the API processes, never two at a time for one pair, so each pair's state is known from the answers.
 * Followed users are skewed (a fifth of the new pairs go to 10 "big" users) so that lists span several
 * pages and the big users pass the big-account threshold (their first followers page is then kept in
 * each API process). Readers page through lists and read counters all along, so list caches, first pages
 * and counter snapshots exist and are changed in place rather than built afresh at the end.
 *
 * Faults: the worker is killed with SIGKILL four times under load (and started again); the broker is
 * stopped in the middle for 20 s and then restarted (its restart adds to the outage), with follows
 * going on, and the same worker (not restarted) must publish and project everything it could not
 * meanwhile before the next kill. The periodic reconcilers are switched off
 * (their interval is a day), so what is checked is what the pipeline itself did, not what a
 * reconciler healed.
 *
 * Once quiet, for every user: `following` equals the answers the API gave, `follower` mirrors it
 * (`created_at` included), every cached list (read from Redis as the relation code stores it) equals
 * its table, every counter snapshot in the store and every counter read through the API equals the
 * tables, both lists read through the API with cursor paging (each page from another process) equal
 * the tables, and every API process serves each big account the right first page; `relations verify`
 * reports no drift.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openMysql, type Db } from '../../src/platform/db/database.js';
import { KafkaEventLog } from '../../src/platform/eventlog/kafka-eventlog.js';
import { RedisListCache } from '../../src/relation/list-cache/redis-list-cache.js';
import { RELATION_TOPIC } from '../../src/relation/model.js';
import { RedisUserCounterStore } from '../../src/user-counter/store/redis-user-counter-store.js';
import { services } from '../rig/resources.js';
import {
  clusterDeployment,
  metric,
  PrivateKafka,
  prng,
  runCli,
  signUpByPhone,
  startNode,
  type Deployment,
  type NodeProcess,
  type PhoneUser,
} from '../fault/processes.js';
import { Client } from './harness.js';

const USERS = 300;
const OPS = 10_000;
const API_PROCESSES = 3;
const BIG_USERS = 10;
const BIG_ACCOUNT_FOLLOWERS = 60;
const OUTAGE_MS = 20_000;
const LIST_CACHE_MAX = 5_000;

const RELATION_ENV = {
  ZG_RELATION_CHANGE_LIMIT: '1000000',
  ZG_RELATION_BIG_ACCOUNT_FOLLOWERS: String(BIG_ACCOUNT_FOLLOWERS),
  // Long enough that a first page missing an invalidation would still be served at the end.
  ZG_RELATION_FIRST_PAGE_CACHE_MS: '600000',
  ZG_RELATION_LIST_CACHE_MAX: String(LIST_CACHE_MAX),
  ZG_RELATION_RECONCILE_MS: '86400000',
  ZG_COUNTER_RECONCILE_MS: '86400000',
  ZG_SESSION_CHECK_CACHE_MS: '10000',
};

/** A set of pair keys that can hand out a random member in O(1). */
class PickableSet {
  private readonly items: string[] = [];
  private readonly index = new Map<string, number>();

  get size(): number {
    return this.items.length;
  }

  has(key: string): boolean {
    return this.index.has(key);
  }

  add(key: string): void {
    if (this.index.has(key)) return;
    this.index.set(key, this.items.length);
    this.items.push(key);
  }

  delete(key: string): void {
    const i = this.index.get(key);
    if (i === undefined) return;
    const last = this.items.pop()!;
    this.index.delete(key);
    if (last !== key) {
      this.items[i] = last;
      this.index.set(last, i);
    }
  }

  pick(rand: () => number): string | undefined {
    return this.items.length === 0 ? undefined : this.items[Math.floor(rand() * this.items.length)];
  }

  values(): readonly string[] {
    return this.items;
  }
}

/**
 * Follow and unfollow calls through the API processes in turn. Never two calls for one pair at a
 * time, so the model (who follows whom, from the answers) is exact, and each answer is checked
 * against it: `true` exactly when the call changes the state.
 */
class FollowLoad {
  /** Pairs `a:b` (indexes into users) where a follows b, by the answers. */
  readonly model = new PickableSet();
  private readonly inFlight = new Set<string>();
  private readonly rand: () => number;
  done = 0;
  changes = 0;
  readonly failures: string[] = [];

  constructor(
    private readonly clients: readonly Client[],
    private readonly users: readonly PhoneUser[],
    seed: number,
  ) {
    this.rand = prng(seed);
  }

  private pickUser(bigShare: number): number {
    return this.rand() < bigShare
      ? Math.floor(this.rand() * BIG_USERS)
      : Math.floor(this.rand() * this.users.length);
  }

  /** The next call: undo an existing follow, repeat one (a no-op), or a random pair, mostly follows. */
  private next(): { a: number; b: number; follow: boolean } {
    for (;;) {
      const r = this.rand();
      let a: number;
      let b: number;
      let follow: boolean;
      const existing = r < 0.2 ? this.model.pick(this.rand) : undefined;
      if (existing) {
        [a, b] = existing.split(':').map(Number) as [number, number];
        follow = r >= 0.15;
      } else {
        a = this.pickUser(0);
        b = this.pickUser(0.2);
        follow = this.rand() < 0.85;
      }
      if (a !== b && !this.inFlight.has(`${a}:${b}`)) return { a, b, follow };
    }
  }

  /** Issues up to `ops` calls, `concurrency` at a time, at most `perSecond` on average when given. */
  async run(
    ops: number,
    concurrency: number,
    stop: () => boolean = () => false,
    perSecond: number | (() => number) = Infinity,
  ): Promise<number> {
    const rate = typeof perSecond === 'number' ? () => perSecond : perSecond;
    let issued = 0;
    const started = Date.now();
    const worker = async (): Promise<void> => {
      while (issued < ops && !stop()) {
        if (issued >= ((Date.now() - started) / 1000) * rate()) {
          await sleep(5);
          continue;
        }
        const { a, b, follow } = this.next();
        const key = `${a}:${b}`;
        const n = issued++;
        this.inFlight.add(key);
        const want = follow !== this.model.has(key);
        try {
          const res = await this.clients[n % this.clients.length]!.call(
            'POST',
            `/api/v1/relation/${follow ? 'follow' : 'unfollow'}?toUserId=${this.users[b]!.id}`,
            { token: this.users[a]!.token },
          );
          if (res.status !== 200 || res.body !== want) {
            this.failures.push(
              `${follow ? 'follow' : 'unfollow'} ${key}: ${res.status} ${JSON.stringify(res.body)}, want ${want}`,
            );
          } else if (want) {
            this.changes++;
            if (follow) this.model.add(key);
            else this.model.delete(key);
          }
        } catch (err) {
          this.failures.push(`${follow ? 'follow' : 'unfollow'} ${key}: ${(err as Error).message}`);
        } finally {
          this.inFlight.delete(key);
          this.done++;
        }
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
    return issued;
  }
}

/** Readers that keep list caches, first pages and counter snapshots in use while the load runs. */
function startReaders(
  clients: readonly Client[],
  users: readonly PhoneUser[],
  count: number,
): { stop: () => Promise<{ reads: number; failures: string[] }> } {
  const rand = prng(99);
  let running = true;
  let reads = 0;
  const failures: string[] = [];
  const loop = async (r: number): Promise<void> => {
    let n = r;
    while (running) {
      const owner = users[rand() < 0.3 ? Math.floor(rand() * BIG_USERS) : Math.floor(rand() * users.length)]!;
      const client = clients[n++ % clients.length]!;
      const token = users[r]!.token;
      const kind = rand() < 0.5 ? 'following' : 'followers';
      for (const path of [
        `/api/v1/relation/${kind}?userId=${owner.id}&limit=20`,
        `/api/v1/relation/counter?userId=${owner.id}`,
      ]) {
        const res = await client.call('GET', path, { token }).catch((err: Error) => ({
          status: 0,
          body: err.message,
        }));
        reads++;
        if (res.status !== 200 && failures.length < 20)
          failures.push(`${path}: ${res.status} ${JSON.stringify(res.body)}`);
      }
      await sleep(10);
    }
  };
  const loops = Array.from({ length: count }, (_, r) => loop(r));
  return {
    async stop() {
      running = false;
      await Promise.all(loops);
      return { reads, failures };
    },
  };
}

interface Row {
  from: number;
  to: number;
  createdAt: number;
}

/** Newest first, ties by user id descending: the order of the lists. */
const listOrder = (a: { userId: number; createdAt: number }, b: { userId: number; createdAt: number }) =>
  b.createdAt - a.createdAt || b.userId - a.userId;

describe('follow relations under faults (cluster profile: 3 API processes, a worker, a private Kafka broker)', () => {
  let kafka: PrivateKafka | undefined;
  let deployment: Deployment | undefined;
  let apis: NodeProcess[] = [];
  let worker: NodeProcess | undefined;
  let clients: Client[] = [];
  let users: PhoneUser[] = [];
  let load: FollowLoad;
  let db: Db | undefined;
  let readers: ReturnType<typeof startReaders> | undefined;
  let workerKills = 0;
  const consumedBeforeKills: number[] = [];
  /** Per kill, the calls answered between the kill and the new worker's start: the load went on. */
  const callsWhileDown: number[] = [];
  const timings: Record<string, number> = {};
  const found: Record<string, number> = {};

  const env = (): Record<string, string> => deployment!.env;
  const crashWorker = async (): Promise<void> => {
    // Each kill hits a worker whose consumer has been projecting (a fresh one needs a moment to
    // join its group and catch up on what piled up while no worker ran).
    const deadline = Date.now() + 60_000;
    for (;;) {
      const consumed = await metric(worker!, 'zg_relation_events_consumed_total');
      if (consumed > 0) {
        consumedBeforeKills.push(consumed);
        break;
      }
      if (Date.now() > deadline) throw new Error('the worker projected nothing within 60 s of starting');
      await sleep(100);
    }
    const before = load.done;
    await worker!.crash();
    workerKills++;
    worker = await startNode(env(), 'worker', 90_000);
    callsWhileDown.push(load.done - before);
  };
  const killWorkerAt = async (at: readonly number[], ready: () => boolean = () => true): Promise<void> => {
    for (const n of at) {
      while (load.done < n || !ready()) await sleep(20);
      await crashWorker();
    }
  };
  const countRows = async (table: 'outbox' | 'relation_unapplied', createdBefore?: number) => {
    let q = db!.kysely.selectFrom(table).select((eb) => eb.fn.countAll<number | string>().as('n'));
    if (table === 'outbox') q = q.where('topic', 'like', `%${RELATION_TOPIC}`);
    if (createdBefore !== undefined) q = q.where('created_at', '<=', createdBefore);
    return Number((await q.executeTakeFirstOrThrow()).n);
  };
  /** Resolves when no relation change waits for the relay or the consumer (`ms` at most). */
  const quiet = async (ms: number, createdBefore?: number): Promise<number> => {
    const started = Date.now();
    for (;;) {
      const left =
        (await countRows('outbox', createdBefore)) + (await countRows('relation_unapplied', createdBefore));
      if (left === 0) return Date.now() - started;
      if (Date.now() - started > ms)
        throw new Error(`${left} relation changes still in flight after ${ms} ms`);
      await sleep(200);
    }
  };

  beforeAll(async () => {
    const t0 = Date.now();
    kafka = await PrivateKafka.start();
    timings.kafkaStartMs = Date.now() - t0;
    deployment = await clusterDeployment(kafka.brokers, RELATION_ENV);
    // The first process creates the schema and the topics; the others start beside each other.
    const first = await startNode(env(), 'api');
    apis = [first];
    const [started, ...others] = await Promise.all([
      startNode(env(), 'worker'),
      ...Array.from({ length: API_PROCESSES - 1 }, () => startNode(env(), 'api')),
    ]);
    worker = started;
    apis = [first, ...others];
    clients = apis.map((a) => new Client(a.baseUrl));
    db = await openMysql(deployment.mysqlUrl!, 2);
    timings.startMs = Date.now() - t0;
  }, 240_000);

  afterAll(async () => {
    await readers?.stop();
    await Promise.allSettled([...apis.map((a) => a.stop()), worker?.stop()]);
    await db?.close();
    await kafka?.destroy();
    await deployment?.dispose();
    console.log(
      `fault-relations: ${JSON.stringify({ users: users.length, calls: load?.done, changes: load?.changes, following: load?.model.size, workerKills, consumedBeforeKills, callsWhileDown, ...timings, ...found })}`,
    );
  }, 120_000);

  it('signs up 300 users through the API', async () => {
    const t0 = Date.now();
    users = await signUpByPhone(apis, USERS, 60_000);
    timings.signUpMs = Date.now() - t0;
    expect(users.length).toBe(USERS);
    load = new FollowLoad(clients, users, 20_251_202);
  }, 90_000);

  it('takes 10,000 follows and unfollows while the worker is killed four times and Kafka is down for 20 s', async () => {
    // Readers go on until the pipeline is quiet (they are stopped by the next test).
    readers = startReaders(clients, users, 4);
    // Phase 1: two kills, the load going on until the second worker is back.
    let t0 = Date.now();
    let phase1Killed = false;
    await Promise.all([
      load.run(4_500, 24, () => phase1Killed, 100),
      killWorkerAt([500, 1_200]).then(() => (phase1Killed = true)),
    ]);
    timings.phase1Ms = Date.now() - t0;

    // Phase 2: the broker goes away for 20 s; follows go on (they need only the database).
    const doneBefore = load.done;
    await kafka!.down();
    const downAt = Date.now();
    let backAt = 0;
    const paced = load.run(OPS - load.done - 2_000, 8, () => backAt > 0 && Date.now() - backAt > 1_000, 100);
    await sleep(Math.max(0, downAt + OUTAGE_MS - Date.now()));
    found.outboxAtOutageEnd = await countRows('outbox');
    await kafka!.up();
    backAt = Date.now();
    await paced;
    timings.kafkaUnavailableMs = backAt - downAt;
    timings.callsDuringOutage = load.done - doneBefore;

    // Phase 3: the rest, while the worker that lived through the outage catches up on its own
    // (relay and consumer, no restart: the first kill waits for that), then two more kills.
    t0 = Date.now();
    let recoverySettled = false;
    const recovery = quiet(60_000, backAt)
      .then(() => {
        timings.caughtUpAfterKafkaBackMs = Date.now() - backAt;
      })
      .finally(() => (recoverySettled = true));
    const remaining = OPS - load.done;
    const start = load.done;
    let phase3Killed = false;
    await Promise.all([
      // Paced to last about 30 s, so that both kills and restarts (about 1.5 s each) fall within
      // it, and unpaced once the second worker is back.
      load.run(
        remaining,
        24,
        () => false,
        () => (phase3Killed ? Infinity : Math.max(50, remaining / 30)),
      ),
      killWorkerAt(
        [start + Math.floor(remaining / 3), start + Math.floor((2 * remaining) / 3)],
        () => recoverySettled,
      ).then(() => (phase3Killed = true)),
      recovery,
    ]);
    timings.phase3Ms = Date.now() - t0;
    expect(load.failures.slice(0, 10)).toEqual([]);
    expect(load.done).toBe(OPS);
    expect(workerKills).toBe(4);
    expect(callsWhileDown.filter((n) => n > 0)).toHaveLength(4);
    // The outage was real for the relay: changes piled up in the outbox while the broker was away.
    expect(found.outboxAtOutageEnd).toBeGreaterThan(500);
  }, 240_000);

  it('once quiet, the projection, every cached list, every counter and every list read agree with the answers', async () => {
    timings.quietMs = await quiet(60_000);
    // Readers kept going through the last projections (a first page loaded just before the last
    // change must not outlive its invalidation); now they stop, so the checks see a still state.
    await sleep(1_000);
    const read = await readers!.stop();
    readers = undefined;
    found.reads = read.reads;
    expect(read.failures).toEqual([]);
    const t0 = Date.now();
    let problems: string[];
    let attempts = 0;
    // What the consumer does after its last unapplied mark is deleted (list caches, first pages)
    // may land a moment later: look again for a few seconds before calling a difference a failure.
    do {
      if (attempts++ > 0) await sleep(1_000);
      problems = await checkAll();
    } while (problems.length > 0 && Date.now() - t0 < 15_000);
    timings.checkMs = Date.now() - t0;
    found.checkAttempts = attempts;
    expect(problems.slice(0, 20)).toEqual([]);

    // Every change reached the log at least once (more after a relay died between publish and delete).
    const log = new KafkaEventLog({ brokers: [kafka!.brokers], prefix: env().ZG_KAFKA_PREFIX! });
    try {
      const ends = await log.endOffsets(RELATION_TOPIC);
      found.eventsInLog = [...ends.values()].reduce((sum, n) => sum + Number(n), 0);
    } finally {
      await log.close();
    }
    expect(found.eventsInLog).toBeGreaterThanOrEqual(load.changes);
    // The checks covered something: caches and snapshots existed, big accounts and long lists too.
    expect(found.cachedLists).toBeGreaterThan(100);
    expect(found.storedSnapshots).toBeGreaterThan(200);
    expect(found.bigAccounts).toBeGreaterThanOrEqual(3);
    expect(found.multiPageLists).toBeGreaterThan(50);
  }, 120_000);

  it('relations verify finds no drift', async () => {
    const t0 = Date.now();
    const verify = await runCli(env(), ['relations', 'verify']);
    timings.verifyMs = Date.now() - t0;
    expect([verify.code, verify.stderr.includes('zhiguang:') ? verify.stderr : '']).toEqual([0, '']);
    expect(verify.json).toMatchObject({
      command: 'relations verify',
      checked: USERS,
      driftedUsers: 0,
      drifted: [],
      projectionPairs: 0,
      counterUsers: 0,
      cacheLists: 0,
      inFlight: 0,
    });
  }, 120_000);

  /** Every comparison of the final state; returns what differs (empty when all agree). */
  async function checkAll(): Promise<string[]> {
    const problems: string[] = [];
    const report = (p: string) => problems.length < 200 && problems.push(p);
    const idx = new Map(users.map((u, i) => [u.id, i]));
    const ids = users.map((u) => u.id);

    // The truth equals the answers, and the projection mirrors the truth.
    const following: Row[] = (
      await db!.kysely.selectFrom('following').select(['from_user_id', 'to_user_id', 'created_at']).execute()
    ).map((r) => ({
      from: Number(r.from_user_id),
      to: Number(r.to_user_id),
      createdAt: Number(r.created_at),
    }));
    const follower: Row[] = (
      await db!.kysely.selectFrom('follower').select(['from_user_id', 'to_user_id', 'created_at']).execute()
    ).map((r) => ({
      from: Number(r.from_user_id),
      to: Number(r.to_user_id),
      createdAt: Number(r.created_at),
    }));
    const truth = new Set(following.map((r) => `${idx.get(r.from)}:${idx.get(r.to)}`));
    const model = new Set(load.model.values());
    for (const k of model)
      if (!truth.has(k)) report(`following lacks ${k}, which the API answered as followed`);
    for (const k of truth)
      if (!model.has(k)) report(`following holds ${k}, which the API answered as not followed`);
    const mirror = new Map(follower.map((r) => [`${r.from}:${r.to}`, r.createdAt]));
    for (const r of following) {
      const have = mirror.get(`${r.from}:${r.to}`);
      if (have !== r.createdAt)
        report(`follower ${r.from}->${r.to}: ${have ?? 'missing'}, want ${r.createdAt}`);
      mirror.delete(`${r.from}:${r.to}`);
    }
    for (const k of mirror.keys()) report(`follower holds ${k}, which following does not`);

    // Lists and counts by the tables.
    const lists = { following: new Map<number, Entry[]>(), followers: new Map<number, Entry[]>() };
    for (const id of ids) {
      lists.following.set(id, []);
      lists.followers.set(id, []);
    }
    for (const r of following) {
      lists.following.get(r.from)?.push({ userId: r.to, createdAt: r.createdAt });
      lists.followers.get(r.to)?.push({ userId: r.from, createdAt: r.createdAt });
    }
    for (const m of Object.values(lists)) for (const l of m.values()) l.sort(listOrder);

    // Cached lists, read the way the relation code stores them.
    const redis = new Redis(services.redisUrl(), { maxRetriesPerRequest: 2 });
    try {
      const cache = new RedisListCache(redis, {
        prefix: deployment!.redisPrefix,
        ttlMs: 3_600_000,
        maxEntries: LIST_CACHE_MAX,
      });
      let cached = 0;
      for (const id of ids) {
        for (const kind of ['following', 'followers'] as const) {
          const entries = await cache.all({ owner: id, kind });
          if (entries === null) continue;
          cached++;
          const want = lists[kind].get(id)!;
          if (!sameEntries(entries, want)) report(`cached ${kind} of ${id}: ${describeDiff(entries, want)}`);
        }
      }
      found.cachedLists = cached;

      // Counter snapshots as stored (a snapshot that exists is never rebuilt by a read).
      const store = new RedisUserCounterStore(redis, { prefix: deployment!.redisPrefix });
      const snapshots = await store.read(ids);
      found.storedSnapshots = snapshots.filter((s) => s !== null).length;
      snapshots.forEach((s, i) => {
        const id = ids[i]!;
        const want = {
          followings: lists.following.get(id)!.length,
          followers: lists.followers.get(id)!.length,
        };
        if (s && (s.followings !== want.followings || s.followers !== want.followers))
          report(
            `stored counts of ${id}: ${s.followings}/${s.followers}, want ${want.followings}/${want.followers}`,
          );
      });
    } finally {
      redis.disconnect();
    }

    // Through the API: counters, both lists with cursor paging, and big accounts' first pages from
    // every API process.
    const token = users[0]!.token;
    let call = 0;
    const get = async (path: string, client?: Client) => {
      const res = await (client ?? clients[call++ % clients.length]!).call('GET', path, { token });
      if (res.status !== 200) throw new Error(`GET ${path}: ${res.status} ${JSON.stringify(res.body)}`);
      return res;
    };
    let multiPage = 0;
    let big = 0;
    for (const id of ids) {
      const c = (await get(`/api/v1/relation/counter?userId=${id}`)).body;
      const want = {
        followings: lists.following.get(id)!.length,
        followers: lists.followers.get(id)!.length,
      };
      if (c.followings !== want.followings || c.followers !== want.followers)
        report(`counter of ${id}: ${c.followings}/${c.followers}, want ${want.followings}/${want.followers}`);
      for (const kind of ['following', 'followers'] as const) {
        const want = lists[kind].get(id)!.map((e) => e.userId);
        const got: number[] = [];
        let cursor: string | null = null;
        let pages = 0;
        do {
          const res = await get(
            `/api/v1/relation/${kind}?userId=${id}&limit=13${cursor ? `&cursor=${cursor}` : ''}`,
          );
          for (const p of res.body as Record<string, unknown>[]) {
            got.push(Number(p.id));
            if ('phone' in p || 'email' in p)
              report(`${kind} of ${id} exposes phone or email of ${String(p.id)}`);
          }
          cursor = res.headers.get('x-next-cursor');
          pages++;
        } while (cursor && pages <= want.length + 1);
        if (pages > 1) multiPage++;
        if (got.join(',') !== want.join(','))
          report(
            `${kind} of ${id} through the API: ${got.length} users, want ${want.length} (${firstDiff(got, want)})`,
          );
      }
      const followers = lists.followers.get(id)!;
      if (followers.length >= BIG_ACCOUNT_FOLLOWERS) {
        big++;
        const want = followers.slice(0, 100).map((e) => e.userId);
        for (const [p, client] of clients.entries()) {
          const res = await get(`/api/v1/relation/followers?userId=${id}&limit=100`, client);
          const got = (res.body as { id: number }[]).map((x) => x.id);
          if (got.join(',') !== want.join(','))
            report(
              `first followers page of big account ${id} from API process ${p}: ${firstDiff(got, want)}`,
            );
        }
      }
    }
    found.multiPageLists = multiPage;
    found.bigAccounts = big;
    return problems;
  }
});

interface Entry {
  userId: number;
  createdAt: number;
}

function sameEntries(a: readonly Entry[], b: readonly Entry[]): boolean {
  return (
    a.length === b.length && a.every((e, i) => e.userId === b[i]!.userId && e.createdAt === b[i]!.createdAt)
  );
}

function describeDiff(got: readonly Entry[], want: readonly Entry[]): string {
  const key = (e: Entry) => `${e.userId}@${e.createdAt}`;
  const g = new Set(got.map(key));
  const w = new Set(want.map(key));
  const extra = [...g].filter((k) => !w.has(k));
  const missing = [...w].filter((k) => !g.has(k));
  return `${got.length} entries, want ${want.length}; extra [${extra.slice(0, 5).join(' ')}], missing [${missing.slice(0, 5).join(' ')}]${extra.length + missing.length === 0 ? ' (order differs)' : ''}`;
}

function firstDiff(got: readonly number[], want: readonly number[]): string {
  const i = got.findIndex((v, k) => v !== want[k]);
  const at = i === -1 ? Math.min(got.length, want.length) : i;
  return `first difference at ${at}: ${got[at] ?? 'end'} vs ${want[at] ?? 'end'}`;
}
