/**
 * Bring-up of the services the test suites share. Each `ensure*` finds its service answering, or starts
 * it when it is the local default and not running, and otherwise throws: a missing service is a loud
 * failure, never a skipped test. An address given in the environment (`ZG_TEST_REDIS_URL`,
 * `ZG_TEST_MYSQL_URL`, `ZG_TEST_KAFKA_BROKERS`, `ZG_TEST_S3_ENDPOINT`) names a service managed elsewhere:
 * it is checked, never started.
 */
import { spawn } from 'node:child_process';
import { mkdir, readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { createConnection } from 'mysql2/promise';

export const DEFAULT_REDIS_URL = 'redis://127.0.0.1:6379';
export const DEFAULT_MYSQL_URL = 'mysql://root@127.0.0.1:3306';

const KAFKA_SCRIPT = fileURLToPath(new URL('../../scripts/kafka-broker.sh', import.meta.url));
const S3_SCRIPT = fileURLToPath(new URL('../../scripts/s3-server.sh', import.meta.url));
const REDIS_LOG = '/var/log/redis/ci.log';
const MYSQL_START_LOG = '/var/log/mysql/test-rig-start.log';

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  error?: Error;
}

/**
 * Runs a command to completion. Resolves once the process has exited (not when every inherited pipe is
 * closed: a daemon it leaves behind may hold them), and kills it after `timeoutMs`.
 */
export function run(
  command: string,
  args: string[],
  timeoutMs: number,
  env = process.env,
): Promise<RunResult> {
  return new Promise((resolve) => {
    let stdout = '';
    let stderr = '';
    let settled = false;
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    const finish = (result: Omit<RunResult, 'stdout' | 'stderr'>): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      resolve({ ...result, stdout, stderr });
    };
    child.on('error', (error) => finish({ code: null, signal: null, error }));
    child.on('close', (code, signal) => finish({ code, signal }));
    child.on('exit', (code, signal) => {
      // Give the pipes a moment to drain, then stop waiting for them.
      setTimeout(() => {
        child.stdout.destroy();
        child.stderr.destroy();
        finish({ code, signal });
      }, 500).unref();
    });
  });
}

function describeError(error: unknown): string {
  if (error instanceof AggregateError && error.errors.length > 0)
    return error.errors.map(describeError).join('; ');
  if (error instanceof Error) return error.message || error.name;
  return String(error);
}

/** Polls `probe` (undefined = up, otherwise the reason it is not) until it succeeds or `timeoutMs` passes. */
async function waitFor(
  probe: () => Promise<string | undefined>,
  timeoutMs: number,
): Promise<string | undefined> {
  const deadline = Date.now() + timeoutMs;
  let reason = await probe();
  while (reason !== undefined && Date.now() < deadline) {
    await sleep(250);
    reason = await probe();
  }
  return reason;
}

async function tail(file: string, lines = 20): Promise<string> {
  try {
    const text = await readFile(file, 'utf8');
    return text.trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return `(no ${file})`;
  }
}

function commandOutput(result: RunResult): string {
  const text = `${result.stdout}${result.stderr}`.trim();
  return text ? `: ${text}` : '';
}

function redact(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return url;
  }
}

// ---------------------------------------------------------------------------------------------- Redis

export async function redisProblem(url: string): Promise<string | undefined> {
  const redis = new Redis(url, {
    lazyConnect: true,
    connectTimeout: 1000,
    maxRetriesPerRequest: 0,
    enableOfflineQueue: false,
    retryStrategy: () => null,
  });
  redis.on('error', () => {});
  try {
    await redis.connect();
    await redis.ping();
    return undefined;
  } catch (error) {
    return describeError(error);
  } finally {
    redis.disconnect();
  }
}

export async function ensureRedis(): Promise<string> {
  const override = process.env.ZG_TEST_REDIS_URL;
  const url = override ?? DEFAULT_REDIS_URL;
  const first = await redisProblem(url);
  if (first === undefined) return url;
  if (override !== undefined) {
    throw new Error(`Redis at ZG_TEST_REDIS_URL=${redact(url)} does not answer PING: ${first}`);
  }

  await mkdir('/var/lib/redis', { recursive: true });
  await mkdir('/var/log/redis', { recursive: true });
  // prettier-ignore
  const started = await run('redis-server', [
    '--daemonize', 'yes', '--bind', '127.0.0.1', '-::1', '--port', '6379', '--save', '', '--appendonly', 'no',
    '--dir', '/var/lib/redis', '--logfile', REDIS_LOG,
  ], 15_000);
  const reason = await waitFor(() => redisProblem(url), 10_000);
  if (reason === undefined) return url;
  throw new Error(
    `Redis is not running at ${url} and could not be started (${reason}).\n` +
      `redis-server exited with ${started.code ?? started.signal ?? started.error?.message}` +
      `${commandOutput(started)}\n--- ${REDIS_LOG} ---\n${await tail(REDIS_LOG)}`,
  );
}

// -------------------------------------------------------------------------------------------- MariaDB

export async function mysqlProblem(url: string): Promise<string | undefined> {
  try {
    const conn = await createConnection({ uri: url, connectTimeout: 1000 });
    try {
      await conn.query('SELECT 1');
      return undefined;
    } finally {
      await conn.end();
    }
  } catch (error) {
    return describeError(error);
  }
}

export async function ensureMysql(): Promise<string> {
  const override = process.env.ZG_TEST_MYSQL_URL;
  const url = override ?? DEFAULT_MYSQL_URL;
  const first = await mysqlProblem(url);
  if (first === undefined) return url;
  if (override !== undefined) {
    throw new Error(`MariaDB at ZG_TEST_MYSQL_URL=${redact(url)} does not answer: ${first}`);
  }

  // The server needs its socket directory; a fresh container may not have it yet.
  await run('install', ['-d', '-o', 'mysql', '-g', 'mysql', '/run/mysqld'], 5_000);
  await mkdir('/var/log/mysql', { recursive: true });
  // prettier-ignore
  const started = await run('start-stop-daemon', [
    '--start', '--oknodo', '--background', '--output', MYSQL_START_LOG, '--exec', '/usr/sbin/mariadbd',
  ], 15_000);
  const reason = await waitFor(() => mysqlProblem(url), 30_000);
  if (reason === undefined) return url;
  throw new Error(
    `MariaDB is not running at ${url} and could not be started within 30 s (${reason}).\n` +
      `start-stop-daemon exited with ${started.code ?? started.signal ?? started.error?.message}` +
      `${commandOutput(started)}\n--- ${MYSQL_START_LOG} ---\n${await tail(MYSQL_START_LOG)}`,
  );
}

// ---------------------------------------------------------------------------------------------- Kafka

export async function kafkaProblem(brokers: string[]): Promise<string | undefined> {
  const { Admin } = await import('@platformatic/kafka'); // loaded only when needed: it is slow to import
  const admin = new Admin({ clientId: 'zg-test-rig', bootstrapBrokers: brokers, timeout: 3000, retries: 0 });
  try {
    await admin.listTopics();
    return undefined;
  } catch (error) {
    return describeError(error);
  } finally {
    await admin.close().catch(() => {});
  }
}

/** Returns the bootstrap address list as a comma-separated string. */
export async function ensureKafka(): Promise<string> {
  const override = process.env.ZG_TEST_KAFKA_BROKERS;
  if (override !== undefined) {
    const reason = await kafkaProblem(override.split(','));
    if (reason === undefined) return override;
    throw new Error(`Kafka at ZG_TEST_KAFKA_BROKERS=${override} does not answer: ${reason}`);
  }
  // Idempotent: returns at once when the broker already runs; the first run ever downloads the jars.
  const result = await run('bash', [KAFKA_SCRIPT, 'start'], 300_000);
  const output = `${result.stdout}${result.stderr}`.trim();
  const bootstrap = result.stdout
    .trim()
    .split('\n')
    .map((line) => line.trim())
    .findLast((line) => /^[^\s:]+:\d+$/.test(line));
  if (result.code !== 0 || bootstrap === undefined) {
    throw new Error(
      `The Kafka test broker could not be started (bash ${KAFKA_SCRIPT} start exited with ` +
        `${result.code ?? result.signal ?? result.error?.message}):\n${output}`,
    );
  }
  if (!/already running/.test(result.stdout)) console.log(output);
  return bootstrap;
}

// ------------------------------------------------------------------------------------------------- S3

/**
 * Up means the endpoint answers an S3 request at all: ListBuckets without credentials is 200 on
 * S3Mock and 403 on stores that check them, both an S3 server at work.
 */
export async function s3Problem(endpoint: string): Promise<string | undefined> {
  try {
    const res = await fetch(`${endpoint.replace(/\/+$/, '')}/`, { signal: AbortSignal.timeout(3000) });
    const body = await res.text();
    if (res.status >= 500) return `HTTP ${res.status}`;
    if (!/<ListAllMyBucketsResult|<Error>/.test(body)) return `HTTP ${res.status}, not an S3 answer`;
    return undefined;
  } catch (error) {
    return describeError(error);
  }
}

/** Returns the endpoint URL (http://host:port) of an S3-compatible server. */
export async function ensureS3(): Promise<string> {
  const override = process.env.ZG_TEST_S3_ENDPOINT;
  if (override !== undefined) {
    const reason = await s3Problem(override);
    if (reason === undefined) return override;
    throw new Error(`The S3 server at ZG_TEST_S3_ENDPOINT=${override} does not answer: ${reason}`);
  }
  // Idempotent: returns at once when the server already runs; the first run ever downloads the jar.
  const result = await run('bash', [S3_SCRIPT, 'start'], 300_000);
  const output = `${result.stdout}${result.stderr}`.trim();
  const endpoint = result.stdout
    .trim()
    .split('\n')
    .map((line) => line.trim())
    .findLast((line) => /^https?:\/\/[^\s/]+$/.test(line));
  if (result.code !== 0 || endpoint === undefined) {
    throw new Error(
      `The S3 test server could not be started (bash ${S3_SCRIPT} start exited with ` +
        `${result.code ?? result.signal ?? result.error?.message}):\n${output}`,
    );
  }
  if (!/already running/.test(result.stdout)) console.log(output);
  return endpoint;
}

/**
 * S3Mock takes any credentials; a store given as ZG_TEST_S3_ENDPOINT that checks them gets
 * ZG_TEST_S3_ACCESS_KEY_ID and ZG_TEST_S3_SECRET_ACCESS_KEY.
 */
export function s3TestCredentials(): { accessKeyId: string; secretAccessKey: string } {
  return {
    accessKeyId: process.env.ZG_TEST_S3_ACCESS_KEY_ID ?? 'zg-test',
    secretAccessKey: process.env.ZG_TEST_S3_SECRET_ACCESS_KEY ?? 'zg-test-secret',
  };
}

/** Empties and deletes every bucket whose name starts with `prefix`; returns how many went. */
export async function deleteS3Buckets(endpoint: string, prefix: string): Promise<number> {
  const { S3Client, ListBucketsCommand, ListObjectsV2Command, DeleteObjectsCommand, DeleteBucketCommand } =
    await import('@aws-sdk/client-s3'); // loaded only when needed: it is slow to import
  const client = new S3Client({
    endpoint,
    region: 'us-east-1',
    forcePathStyle: true,
    credentials: s3TestCredentials(),
    requestChecksumCalculation: 'WHEN_REQUIRED',
  });
  try {
    const buckets = ((await client.send(new ListBucketsCommand({}))).Buckets ?? [])
      .map((bucket) => bucket.Name ?? '')
      .filter((name) => name.startsWith(prefix));
    for (const bucket of buckets) {
      let token: string | undefined;
      do {
        const page = await client.send(
          new ListObjectsV2Command({ Bucket: bucket, ...(token ? { ContinuationToken: token } : {}) }),
        );
        const keys = (page.Contents ?? []).flatMap((o) => (o.Key ? [{ Key: o.Key }] : []));
        if (keys.length > 0)
          await client.send(new DeleteObjectsCommand({ Bucket: bucket, Delete: { Objects: keys } }));
        token = page.IsTruncated ? page.NextContinuationToken : undefined;
      } while (token);
      await client.send(new DeleteBucketCommand({ Bucket: bucket }));
    }
    return buckets.length;
  } finally {
    client.destroy();
  }
}
