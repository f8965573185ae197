/**
 * Real processes for the fault suites: the built server (`dist/main.js`) in a chosen role, the admin
 * command line (`dist/cli.js`), and a Kafka broker of the suite's own (scripts/kafka-broker.sh with a
 * private directory and port), so stopping it disturbs no other test. Unlike the black-box harness,
 * a deployment here outlives its processes: they can be killed and started again on the same
 * database, key prefix and topics.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { openMysql, openSqlite } from '../../src/platform/db/database.js';
import {
  createMysqlDatabase,
  publishedPostRow,
  services,
  uniqueBucket,
  uniqueName,
} from '../rig/resources.js';
import { deleteS3Buckets, run, type RunResult } from '../rig/services.js';

const ROOT = resolve(import.meta.dirname, '../..');
const KAFKA_SCRIPT = join(ROOT, 'scripts/kafka-broker.sh');

export type Role = 'api' | 'worker' | 'all';
export type LogLine = Record<string, unknown>;

export interface NodeProcess {
  role: Role;
  pid: number;
  /** `http://127.0.0.1:<port>`; every role serves /healthz, /readyz and /metrics. */
  baseUrl: string;
  lines: LogLine[];
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** The first log line (already written or still to come) that satisfies `match`. */
  waitForLine(match: (line: LogLine) => boolean, timeoutMs?: number): Promise<LogLine>;
  /** kill -9: no shutdown hooks, no flushing, connections cut. */
  crash(): Promise<void>;
  /** SIGTERM and a graceful shutdown; SIGKILL after 20 s. */
  stop(): Promise<void>;
}

/** Starts `node dist/main.js --role <role>` and resolves once it logged that it started. */
export async function startNode(
  env: Record<string, string>,
  role: Role,
  timeoutMs = 60_000,
): Promise<NodeProcess> {
  const child: ChildProcess = spawn(process.execPath, [join(ROOT, 'dist/main.js'), '--role', role], {
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: LogLine[] = [];
  const listeners = new Set<(line: LogLine) => void>();
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-20_000);
  });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((ok) =>
    child.once('exit', (code, signal) => ok({ code, signal })),
  );
  createInterface({ input: child.stdout! }).on('line', (text) => {
    let line: LogLine;
    try {
      line = JSON.parse(text) as LogLine;
    } catch {
      return;
    }
    lines.push(line);
    for (const listener of listeners) listener(line);
  });

  const waitForLine = (match: (line: LogLine) => boolean, ms = 10_000): Promise<LogLine> => {
    const seen = lines.find(match);
    if (seen) return Promise.resolve(seen);
    return new Promise((ok, fail) => {
      const listener = (line: LogLine): void => {
        if (!match(line)) return;
        clearTimeout(timer);
        listeners.delete(listener);
        ok(line);
      };
      const timer = setTimeout(() => {
        listeners.delete(listener);
        fail(new Error(`no matching log line from the ${role} process within ${ms} ms`));
      }, ms);
      listeners.add(listener);
    });
  };

  const started = await Promise.race([
    waitForLine((l) => l.msg === 'zhiguang started' && typeof l.address === 'string', timeoutMs).catch(
      (err: unknown) => {
        child.kill('SIGKILL');
        throw new Error(`${(err as Error).message}\n${stderr}`);
      },
    ),
    exited.then(({ code, signal }) => {
      throw new Error(`the ${role} process exited with ${code ?? signal} while starting\n${stderr}`);
    }),
  ]);

  return {
    role,
    pid: child.pid!,
    baseUrl: String(started.address),
    lines,
    exited,
    waitForLine,
    async crash() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 20_000);
        await exited;
        clearTimeout(timer);
      }
    },
  };
}

/** Test fixture: `count` published public posts of `authorId`, written straight into the deployment's database; their ids. */
export async function insertPosts(
  deployment: Deployment,
  authorId: number,
  count: number,
): Promise<string[]> {
  const first = BigInt(Date.now()) * 1_000_000n;
  const ids = Array.from({ length: count }, (_, i) => String(first + BigInt(i)));
  const db = deployment.mysqlUrl
    ? await openMysql(deployment.mysqlUrl, 1)
    : openSqlite(`${deployment.dataDir}/zhiguang.db`);
  try {
    await db.kysely
      .insertInto('knowposts')
      .values(ids.map((id) => publishedPostRow(id, authorId)))
      .execute();
  } finally {
    await db.close();
  }
  return ids;
}

/** The sum of a Prometheus metric's samples (lines starting with `name`) that a process exports. */
export async function metric(process: NodeProcess, name: string): Promise<number> {
  const text = await (await fetch(`${process.baseUrl}/metrics`)).text();
  return text
    .split('\n')
    .filter((l) => l.startsWith(name))
    .reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
}

/** Runs `node dist/cli.js <args>` to completion; `json` is its summary line, when it printed one. */
export async function runCli(
  env: Record<string, string>,
  args: string[],
  timeoutMs = 120_000,
): Promise<RunResult & { json: Record<string, unknown> | undefined }> {
  const result = await run(process.execPath, [join(ROOT, 'dist/cli.js'), ...args], timeoutMs, env);
  const last = result.stdout.trim().split('\n').at(-1);
  let json: Record<string, unknown> | undefined;
  try {
    json = last ? (JSON.parse(last) as Record<string, unknown>) : undefined;
  } catch {
    json = undefined;
  }
  return { ...result, json };
}

/** Two consecutive free ports on 127.0.0.1 (the broker's client and controller listeners). */
async function freePortPair(): Promise<number> {
  const free = (port: number): Promise<boolean> =>
    new Promise((ok) => {
      const server = createServer();
      server.once('error', () => ok(false));
      server.listen(port, '127.0.0.1', () => server.close(() => ok(true)));
    });
  for (let attempt = 0; attempt < 50; attempt++) {
    const port = 29_100 + 2 * Math.floor(Math.random() * 400);
    if ((await free(port)) && (await free(port + 1))) return port;
  }
  throw new Error('no two consecutive free ports between 29100 and 29900');
}

/** A single-node Kafka broker of the suite's own; the shared test broker is never touched. */
export class PrivateKafka {
  private constructor(
    readonly dir: string,
    readonly port: number,
  ) {}

  static async start(): Promise<PrivateKafka> {
    const kafka = await PrivateKafka.reserve();
    await kafka.up();
    return kafka;
  }

  /** A broker not started yet: its address refuses connections until `up()`. */
  static async reserve(): Promise<PrivateKafka> {
    return new PrivateKafka(mkdtempSync(join(tmpdir(), 'zg-fault-kafka-')), await freePortPair());
  }

  get brokers(): string {
    return `127.0.0.1:${this.port}`;
  }

  private script(command: string, timeoutMs: number, stopTimeoutS = 3): Promise<RunResult> {
    return run('bash', [KAFKA_SCRIPT, command], timeoutMs, {
      ...process.env,
      ZG_KAFKA_DIR: this.dir,
      ZG_KAFKA_PORT: String(this.port),
      // An outage is a crash, not a maintenance stop: SIGKILL after 3 s (no class-data dump either).
      ZG_KAFKA_STOP_TIMEOUT: String(stopTimeoutS),
      ZG_KAFKA_HEAP: '384m',
    });
  }

  /** Starts (or restarts on the same data) and waits until it serves metadata. */
  async up(): Promise<void> {
    let result = await this.script('start', 180_000);
    if (result.code !== 0) {
      // A broker whose first start failed half-way (e.g. formatting) gets one clean retry.
      await this.script('reset', 60_000);
      result = await this.script('start', 180_000);
    }
    if (result.code !== 0)
      throw new Error(`the private Kafka broker did not start:\n${result.stdout}${result.stderr}`);
  }

  async down(): Promise<void> {
    const result = await this.script('stop', 60_000);
    if (result.code !== 0)
      throw new Error(`the private Kafka broker did not stop:\n${result.stdout}${result.stderr}`);
  }

  async destroy(): Promise<void> {
    // Its data goes with it: nothing to stop gracefully for.
    await this.script('reset', 60_000, 0);
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export interface Deployment {
  env: Record<string, string>;
  redisPrefix: string;
  /** Cluster only. */
  mysqlUrl?: string;
  dataDir: string;
  dispose(): Promise<void>;
}

function baseEnv(dataDir: string): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '/tmp',
    HOST: '127.0.0.1',
    PORT: '0',
    LOG_LEVEL: 'info',
    ZG_DATA_DIR: dataDir,
    ZG_JWT_PRIVATE_KEY: generateKeyPairSync('rsa', { modulusLength: 2048 })
      .privateKey.export({ type: 'pkcs8', format: 'pem' })
      .toString(),
    ZG_JWT_ISSUER: 'zg-fault',
    ZG_PASSWORD_HASH_COST: '10',
    ZG_AUTH_IP_LIMIT: '1000000000',
    ZG_COUNTER_TOGGLE_LIMIT: '1000000000',
    ZG_SHUTDOWN_DRAIN_MS: '0',
    ZG_ACCESS_TOKEN_TTL: '3600',
  };
}

/**
 * Database, key prefix and topic prefix for one cluster deployment whose processes come and go.
 * Sign-ups use phone numbers, whose codes the server logs, so no mail server is involved (the SMTP
 * address is required by the configuration but never dialled).
 */
export async function clusterDeployment(
  kafkaBrokers: string,
  extra: Record<string, string> = {},
): Promise<Deployment> {
  const database = await createMysqlDatabase();
  const dataDir = mkdtempSync(join(tmpdir(), 'zg-fault-cluster-'));
  const redisPrefix = `${uniqueName('ft')}:`;
  // The servers create the bucket at start; dispose empties and removes it.
  const bucket = uniqueBucket('ft');
  return {
    env: {
      ...baseEnv(dataDir),
      ZG_PROFILE: 'cluster',
      ZG_MYSQL_URL: database.url,
      ZG_REDIS_URL: services.redisUrl(),
      ZG_REDIS_PREFIX: redisPrefix,
      ZG_KAFKA_BROKERS: kafkaBrokers,
      ZG_KAFKA_PREFIX: `${uniqueName('ft')}.`,
      ZG_KAFKA_PARTITIONS: '3',
      ZG_SMTP_URL: 'smtp://127.0.0.1:9',
      // Accounts sign up by phone, their codes read from the log.
      ZG_SMS_LOG_CODES: 'true',
      ZG_S3_ENDPOINT: services.s3Endpoint(),
      ZG_S3_BUCKET: bucket,
      ZG_S3_ACCESS_KEY_ID: services.s3Credentials().accessKeyId,
      ZG_S3_SECRET_ACCESS_KEY: services.s3Credentials().secretAccessKey,
      ZG_S3_FORCE_PATH_STYLE: 'true',
      ...extra,
    },
    redisPrefix,
    mysqlUrl: database.url,
    dataDir,
    async dispose() {
      await database.drop();
      await deleteS3Buckets(services.s3Endpoint(), bucket);
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

export function embeddedDeployment(extra: Record<string, string> = {}): Deployment {
  const dataDir = mkdtempSync(join(tmpdir(), 'zg-fault-embedded-'));
  return {
    env: { ...baseEnv(dataDir), ZG_PROFILE: 'embedded', ...extra },
    redisPrefix: '',
    dataDir,
    async dispose() {
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

export interface PhoneUser {
  id: number;
  /** Access token (the deployment's ZG_ACCESS_TOKEN_TTL of an hour outlasts any suite). */
  token: string;
}

/**
 * Real sign-ups spread over `apis` (send a code to a phone number, read it from the log of the
 * process that sent it, register without a password) until `max` users or `budgetMs` runs out.
 */
export async function signUpByPhone(
  apis: readonly NodeProcess[],
  max: number,
  budgetMs: number,
  concurrency = 24,
): Promise<PhoneUser[]> {
  const post = async (api: NodeProcess, path: string, body: unknown) => {
    const res = await fetch(`${api.baseUrl}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    if (res.status !== 200) throw new Error(`POST ${path}: ${res.status} ${text}`);
    return JSON.parse(text) as Record<string, any>;
  };
  const users: PhoneUser[] = [];
  const deadline = Date.now() + budgetMs;
  const base = 10_000_000 + Math.floor(Math.random() * 80_000_000);
  let next = 0;
  const one = async (): Promise<void> => {
    while (next < max && Date.now() < deadline) {
      const n = next++;
      const api = apis[n % apis.length]!;
      const identifier = `1${String(base * 100 + n).padStart(10, '0')}`;
      await post(api, '/api/v1/auth/send-code', { scene: 'REGISTER', identifierType: 'PHONE', identifier });
      const line = await api.waitForLine(
        (l) => l.msg === 'verification code' && l.identifier === identifier && l.scene === 'REGISTER',
      );
      const reg = await post(api, '/api/v1/auth/register', {
        identifierType: 'PHONE',
        identifier,
        code: line.code,
        agreeTerms: true,
      });
      users.push({ id: Number(reg.user.id), token: String(reg.token.accessToken) });
    }
  };
  await Promise.all(Array.from({ length: concurrency }, one));
  return users;
}

/** A small seeded generator (mulberry32), so a fault run can be replayed with the same choices. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
