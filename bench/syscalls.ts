/**
 * Diagnostic: system calls of the server's main thread per answered request, by endpoint, counted
 * with `strace -c` (Linux, strace installed). strace slows the server down a lot, so this measures
 * how many writes and reads a request costs, not how fast it is.
 *
 *   npx tsx bench/syscalls.ts [cluster|embedded]     (BENCH_SERVER_ENTRY picks another build)
 *
 * Every socket write is a system call, and on a small machine with loopback networking a write costs
 * about as much as the rest of a small request: a request that adds writes beyond the one for its
 * HTTP answer pays for each of them.
 */
import { spawn } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import autocannon from 'autocannon';
import { batchCountsMix, healthz, likeMix, singleCountsMix } from './load.js';
import {
  Cleanups,
  createClusterStack,
  createEmbeddedStack,
  insertPosts,
  newPostIds,
  SERVER_ENTRY,
  signUpUsers,
  spawnServer,
} from './servers.js';

const profile = process.argv[2] === 'embedded' ? 'embedded' : 'cluster';
const SYSCALLS = ['write', 'writev', 'read', 'epoll_pwait', 'epoll_wait', 'pwrite64', 'fdatasync'];

/** `strace -c` summary lines: `% time  seconds  usecs/call  calls  [errors]  syscall`. */
function callsOf(summary: string): Map<string, number> {
  const calls = new Map<string, number>();
  for (const line of summary.split('\n')) {
    const cells = line.trim().split(/\s+/);
    const name = cells[cells.length - 1];
    if (cells.length >= 5 && name && /^\d+$/.test(cells[3] ?? '')) calls.set(name, Number(cells[3]));
  }
  return calls;
}

async function main(): Promise<void> {
  const cleanups = new Cleanups();
  try {
    const stack = profile === 'cluster' ? await createClusterStack(cleanups) : createEmbeddedStack(cleanups);
    const server = await spawnServer(stack.env, 'all', stack.inbox, cleanups);
    const users = await signUpUsers(server.baseUrl, stack.inbox, 20);
    const posts = newPostIds(2000);
    await insertPosts(stack, posts, users[0]!.userId);
    const phases: [string, autocannon.Request[], number][] = [
      ['GET /healthz', healthz, 20_000],
      ['POST /api/v1/action/like|unlike', likeMix(users, posts), 10_000],
    ];
    if (profile === 'cluster') {
      phases.push(
        ['GET /api/v1/counter/knowpost/{id}', singleCountsMix(posts), 10_000],
        ['GET /api/v1/counter/knowpost?ids=(20)', batchCountsMix(posts), 5_000],
      );
    }
    console.log(
      `${profile} profile, server ${SERVER_ENTRY}, role all, 50 connections; system calls of the main thread per 2xx answer:`,
    );
    console.log(['request'.padEnd(40), ...SYSCALLS.map((s) => s.padStart(12))].join(''));
    for (const [name, requests, amount] of phases) {
      await autocannon({ url: server.baseUrl, connections: 50, amount: 3_000, requests });
      const out = join(tmpdir(), `zgb-strace-${process.pid}.txt`);
      const strace = spawn('strace', ['-c', '-o', out, '-p', String(server.pid)], { stdio: 'ignore' });
      const exited = new Promise<void>((ok) => strace.once('exit', () => ok()));
      await sleep(1000);
      const result = await autocannon({ url: server.baseUrl, connections: 50, amount, requests });
      strace.kill('SIGINT');
      await exited;
      const calls = callsOf(readFileSync(out, 'utf8'));
      rmSync(out, { force: true });
      const ok = result['2xx'];
      console.log(
        [name.padEnd(40), ...SYSCALLS.map((s) => ((calls.get(s) ?? 0) / ok).toFixed(2).padStart(12))].join(
          '',
        ),
      );
    }
  } finally {
    await cleanups.runAll((line) => console.error(line));
  }
}

await main();
