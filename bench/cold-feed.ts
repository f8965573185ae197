/**
 * Latency of a signed-in feed page at light traffic. One request every COLD_GAP_MS (longer than
 * the 200 ms an anonymous page is kept, so the server writes the page again: "cold"), each followed
 * at once by the same request, which finds the kept page ("kept"). One `--role all` server of a
 * throwaway cluster deployment, 200 posts, 30 of them liked by the viewer.
 *
 *   npx tsx bench/cold-feed.ts
 *   COLD_SAMPLES=150 COLD_GAP_MS=230 BENCH_SERVER_ENTRY=/path/to/other/dist/main.js npx tsx bench/cold-feed.ts
 *
 * Prints the median and p90 of each kind and of each cold sample's excess over the kept one right
 * after it. Needs what `npm run bench` needs; cleans up everything it
 * created.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { percentile } from './load.js';
import {
  Cleanups,
  createClusterStack,
  insertPosts,
  newPostIds,
  SERVER_ENTRY,
  signUpUsers,
  spawnServer,
} from './servers.js';

const samples = Number(process.env.COLD_SAMPLES ?? 150);
const gapMs = Number(process.env.COLD_GAP_MS ?? 230);
const cleanups = new Cleanups();
try {
  const stack = await createClusterStack(cleanups);
  const server = await spawnServer(stack.env, 'all', stack.inbox, cleanups);
  const [viewer] = await signUpUsers(server.baseUrl, stack.inbox, 1);
  const posts = newPostIds(200);
  await insertPosts(stack, posts, viewer!.userId);
  const auth = { authorization: `Bearer ${viewer!.accessToken}` };
  for (const id of posts.slice(-30)) {
    const res = await fetch(`${server.baseUrl}/api/v1/action/like`, {
      method: 'POST',
      headers: { ...auth, 'content-type': 'application/json' },
      body: JSON.stringify({ entityType: 'knowpost', entityId: id }),
    });
    if (res.status !== 200) throw new Error(`like: ${res.status} ${await res.text()}`);
  }
  const page = async (): Promise<number> => {
    const started = performance.now();
    const res = await fetch(`${server.baseUrl}/api/v1/knowposts/feed?page=1&size=20`, { headers: auth });
    await res.text();
    if (res.status !== 200) throw new Error(`feed: ${res.status}`);
    return performance.now() - started;
  };
  for (let i = 0; i < 20; i++) await page();
  const cold: number[] = [];
  const kept: number[] = [];
  for (let i = 0; i < samples; i++) {
    await sleep(gapMs);
    cold.push(await page());
    kept.push(await page());
  }
  const line = (name: string, ms: number[]) => {
    const sorted = [...ms].sort((a, b) => a - b);
    return `${name} median ${percentile(sorted, 50).toFixed(2)} ms, p90 ${percentile(sorted, 90).toFixed(2)} ms`;
  };
  console.log(
    `signed-in feed page of 20, ${samples} samples, ${gapMs} ms apart` +
      (process.env.BENCH_SERVER_ENTRY ? `; server build ${SERVER_ENTRY}` : ''),
  );
  console.log(line('cold', cold));
  console.log(line('kept', kept));
  // Paired, so what the rest of the machine does at the time weighs on both alike.
  console.log(
    line(
      'cold minus kept',
      cold.map((ms, i) => ms - kept[i]!),
    ),
  );
} finally {
  await cleanups.runAll((line) => console.error(line));
}
