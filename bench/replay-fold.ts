/**
 * The fold of `counters replay`: a synthetic, skewed counter-events log folded by `ReplayFold` (on
 * disk) and, as the baseline measured in the same run, by a fold kept in the heap (one event per
 * (entity, metric, user) in maps, as the replay did before). Each runs in a child process of its own,
 * which reports its wall time, peak RSS and peak heap, and then reads its facts back in chunks.
 *
 *   npx tsx bench/replay-fold.ts [events]          (2,000,000 by default)
 *   NODE_OPTIONS=--max-old-space-size=256 npx tsx bench/replay-fold.ts
 *
 * Events: 100,000 posts, a few of them with most of the events (one ~10%), users drawn from 5
 * million, 80% likes, 85% of toggles on: nearly every event is a distinct fact.
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { eventFor, type CounterEvent, type EntityRef } from '../src/counter/model.js';
import { ReplayFold } from '../src/counter/replay-fold.js';

const ENTITIES = 100_000;
const USERS = 5_000_000;
const BATCH = 5_000;
const CHUNK = 5_000;

/** mulberry32: the same log in every child. */
function rng(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function* batches(events: number): Generator<CounterEvent[]> {
  const random = rng(42);
  const seqs = new Uint32Array(ENTITIES + 1);
  for (let start = 0; start < events; start += BATCH) {
    const batch: CounterEvent[] = [];
    for (let i = start; i < Math.min(events, start + BATCH); i++) {
      const n = Math.floor(ENTITIES * random() ** 3) + 1;
      const ref: EntityRef = { etype: 'knowpost', eid: String(1_000_000 + n) };
      const metric = random() < 0.8 ? 'like' : 'fav';
      const user = Math.floor(random() * USERS);
      // Parsed from JSON, as the replay gets them.
      const event = eventFor(ref, metric, user, random() < 0.85 ? 1 : -1, ++seqs[n]!, 1_700_000_000_000 + i);
      batch.push(JSON.parse(JSON.stringify(event)) as CounterEvent);
    }
    yield batch;
  }
}

function heapFold(events: number): number {
  const finals = new Map<string, Record<'like' | 'fav', Map<number, CounterEvent>>>();
  for (const batch of batches(events)) {
    for (const e of batch) {
      const key = `${e.entityType}:${e.entityId}`;
      let entity = finals.get(key);
      if (!entity) finals.set(key, (entity = { like: new Map(), fav: new Map() }));
      const byUser = entity[e.metric];
      const known = byUser.get(e.userId);
      if (!known || known.seq < e.seq) byUser.set(e.userId, e);
    }
  }
  let facts = 0;
  let chunk: CounterEvent[] = [];
  for (const byMetric of finals.values()) {
    for (const metric of ['like', 'fav'] as const) {
      for (const e of byMetric[metric].values()) {
        chunk.push(e);
        facts++;
        if (chunk.length >= CHUNK) chunk = [];
      }
    }
  }
  return facts;
}

function diskFold(events: number): number {
  const fold = ReplayFold.open();
  try {
    for (const batch of batches(events)) fold.add(batch);
    let facts = 0;
    for (const chunk of fold.chunks(CHUNK)) facts += chunk.facts.length;
    return facts;
  } finally {
    fold.close();
  }
}

const [mode, arg] = process.argv.slice(2);
if (mode === 'heap' || mode === 'disk') {
  const events = Number(arg);
  let peakHeap = 0;
  const sampler = setInterval(() => (peakHeap = Math.max(peakHeap, process.memoryUsage().heapUsed)), 50);
  const started = performance.now();
  let result: Record<string, unknown>;
  try {
    const facts = mode === 'heap' ? heapFold(events) : diskFold(events);
    peakHeap = Math.max(peakHeap, process.memoryUsage().heapUsed);
    result = { facts, seconds: (performance.now() - started) / 1000 };
  } catch (err) {
    result = { failed: String(err) };
  }
  clearInterval(sampler);
  const rss = process.resourceUsage().maxRSS * 1024;
  console.log(
    JSON.stringify({ mode, ...result, peakRssMiB: rss / 2 ** 20, peakHeapMiB: peakHeap / 2 ** 20 }),
  );
} else {
  const events = Number(mode ?? 2_000_000);
  const self = fileURLToPath(import.meta.url);
  const rows = (['heap', 'disk'] as const).map((which) => {
    const child = spawnSync(process.execPath, [...process.execArgv, self, which, String(events)], {
      encoding: 'utf8',
      env: process.env,
    });
    const line = child.stdout.trim().split('\n').at(-1);
    return line?.startsWith('{')
      ? (JSON.parse(line) as Record<string, number | string>)
      : {
          mode: which,
          failed: /heap out of memory/i.test(child.stderr)
            ? 'JavaScript heap out of memory'
            : `exit ${child.status ?? child.signal}: ${child.stderr.trim().split('\n').at(-1)}`,
        };
  });
  console.log(
    `replay fold, ${events.toLocaleString('en')} events (${process.env.NODE_OPTIONS ?? 'default heap'})`,
  );
  for (const r of rows) {
    if ('failed' in r) console.log(`  ${r.mode}: failed (${r.failed})`);
    else
      console.log(
        `  ${r.mode}: ${Number(r.facts).toLocaleString('en')} facts, ${Number(r.seconds).toFixed(1)} s, ` +
          `peak RSS ${Number(r.peakRssMiB).toFixed(0)} MiB, peak heap ${Number(r.peakHeapMiB).toFixed(0)} MiB`,
      );
  }
  const [heap, disk] = rows;
  if (heap && disk && !('failed' in heap) && !('failed' in disk))
    console.log(
      `  disk/heap: time ${(Number(disk.seconds) / Number(heap.seconds)).toFixed(2)}×, ` +
        `peak RSS ${(Number(disk.peakRssMiB) / Number(heap.peakRssMiB)).toFixed(2)}×`,
    );
}
