/**
 * Starts the built server (`dist/main.js`) as child processes with throwaway storage for the
 * benchmarks, signs users up through the public API, writes post fixtures straight into the
 * database and removes everything it created afterwards (database, Redis keys by prefix, Kafka
 * topics and consumer groups by prefix, data directory).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { setTimeout as sleep } from 'node:timers/promises';
import { Admin } from '@platformatic/kafka';
import { Redis } from 'ioredis';
import { createConnection } from 'mysql2/promise';
import { SMTPServer } from 'smtp-server';
import { openMysql, openSqlite } from '../src/platform/db/database.js';
import { deleteS3Buckets, s3TestCredentials } from '../test/rig/services.js';

export const ROOT = resolve(import.meta.dirname, '..');

/** The server build to run: `dist/main.js` of this checkout unless BENCH_SERVER_ENTRY names another (A/B runs). */
export const SERVER_ENTRY = resolve(process.env.BENCH_SERVER_ENTRY ?? join(ROOT, 'dist/main.js'));

export const services = {
  redisUrl: process.env.ZG_REDIS_URL ?? 'redis://127.0.0.1:6379',
  mysqlRootUrl: process.env.ZG_MYSQL_ROOT_URL ?? 'mysql://root@127.0.0.1:3306',
  kafkaBrokers: (process.env.ZG_KAFKA_BROKERS ?? '127.0.0.1:19092').split(',').map((b) => b.trim()),
  s3Endpoint: process.env.ZG_S3_ENDPOINT ?? 'http://127.0.0.1:19090',
};

/** A name no other run uses, safe for databases, key prefixes and topics. */
export function uniqueName(kind: string): string {
  return `zgb_${Date.now().toString(36)}_${kind}_${randomBytes(3).toString('hex')}`;
}

/** Runs cleanups in reverse order of registration, each even when an earlier one failed. */
export class Cleanups {
  private readonly steps: { name: string; run: () => Promise<void> }[] = [];

  add(name: string, run: () => Promise<void>): void {
    this.steps.push({ name, run });
  }

  async runAll(log: (line: string) => void): Promise<void> {
    while (this.steps.length > 0) {
      const step = this.steps.pop()!;
      try {
        await step.run();
      } catch (err) {
        log(`cleanup "${step.name}" failed: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
  }
}

/** Verification codes as they are delivered: by SMTP (cluster) or in the server log (embedded). */
export class CodeInbox {
  private readonly codes = new Map<string, string>();
  private readonly waiters = new Map<string, () => void>();

  deliver(identifier: string, code: string): void {
    this.codes.set(identifier.toLowerCase(), code);
    this.waiters.get(identifier.toLowerCase())?.();
  }

  async take(identifier: string, timeoutMs = 15_000): Promise<string> {
    const key = identifier.toLowerCase();
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const code = this.codes.get(key);
      if (code) {
        this.codes.delete(key);
        return code;
      }
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no verification code delivered to ${identifier}`);
      await new Promise<void>((ok) => {
        const timer = setTimeout(ok, Math.min(left, 200));
        this.waiters.set(key, () => {
          clearTimeout(timer);
          ok();
        });
      });
      this.waiters.delete(key);
    }
  }
}

export async function startSmtp(inbox: CodeInbox, cleanups: Cleanups): Promise<string> {
  const smtp = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS'],
    logger: false,
    onData(stream, session, callback) {
      const chunks: Buffer[] = [];
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('end', () => {
        const code = /verification code is (\d{6})/.exec(Buffer.concat(chunks).toString('utf8'))?.[1];
        if (code) for (const rcpt of session.envelope.rcptTo) inbox.deliver(rcpt.address, code);
        callback();
      });
    },
  });
  await new Promise<void>((ok) => smtp.listen(0, '127.0.0.1', ok));
  cleanups.add('smtp', () => new Promise<void>((ok) => smtp.close(() => ok())));
  return `smtp://127.0.0.1:${(smtp.server.address() as { port: number }).port}`;
}

/** Starts the local Kafka broker unless ZG_KAFKA_BROKERS names one managed elsewhere (idempotent). */
export async function ensureKafka(): Promise<void> {
  if (process.env.ZG_KAFKA_BROKERS) return;
  await new Promise<void>((ok, fail) => {
    const child = spawn('bash', [join(ROOT, 'scripts/kafka-broker.sh'), 'start'], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('exit', (code) =>
      code === 0 ? ok() : fail(new Error(`kafka-broker.sh start exited with ${code}\n${stderr}`)),
    );
  });
}

/** Everything a cluster deployment needs, created for this run only; `env` is what each server process gets. */
export interface ClusterStack {
  env: Record<string, string>;
  mysqlUrl: string;
  redisPrefix: string;
  kafkaPrefix: string;
  inbox: CodeInbox;
}

export async function createClusterStack(
  cleanups: Cleanups,
  extraEnv: Record<string, string> = {},
): Promise<ClusterStack> {
  await ensureKafka();
  const dbName = uniqueName('db');
  const root = await createConnection({ uri: services.mysqlRootUrl });
  try {
    await root.query(`CREATE DATABASE \`${dbName}\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin`);
  } finally {
    await root.end();
  }
  cleanups.add(`database ${dbName}`, async () => {
    const c = await createConnection({ uri: services.mysqlRootUrl });
    try {
      await c.query(`DROP DATABASE IF EXISTS \`${dbName}\``);
    } finally {
      await c.end();
    }
  });
  const mysql = new URL(services.mysqlRootUrl);
  mysql.pathname = `/${dbName}`;
  const redisPrefix = `${uniqueName('r')}:`;
  const kafkaPrefix = `${uniqueName('k')}.`;
  cleanups.add(`redis keys ${redisPrefix}*`, () => deleteRedisKeys(redisPrefix).then(() => undefined));
  cleanups.add(`kafka ${kafkaPrefix}*`, () => deleteKafkaResources(kafkaPrefix).then(() => undefined));
  const inbox = new CodeInbox();
  const smtpUrl = await startSmtp(inbox, cleanups);
  const dataDir = mkdtempSync(join(tmpdir(), 'zgb-cluster-'));
  cleanups.add('data dir', async () => rmSync(dataDir, { recursive: true, force: true }));
  // The servers create the bucket at start (S3 names allow no `_`).
  const bucket = uniqueName('s3').replace(/_/g, '-');
  cleanups.add(`bucket ${bucket}`, async () => void (await deleteS3Buckets(services.s3Endpoint, bucket)));
  const env: Record<string, string> = {
    ...baseEnv('cluster', dataDir),
    ZG_MYSQL_URL: mysql.toString(),
    ZG_REDIS_URL: services.redisUrl,
    ZG_REDIS_PREFIX: redisPrefix,
    ZG_KAFKA_BROKERS: services.kafkaBrokers.join(','),
    ZG_KAFKA_PREFIX: kafkaPrefix,
    ZG_SMTP_URL: smtpUrl,
    // bench/relations.ts signs users up by phone, their codes read from the log.
    ZG_SMS_LOG_CODES: 'true',
    ZG_S3_ENDPOINT: services.s3Endpoint,
    ZG_S3_BUCKET: bucket,
    ZG_S3_ACCESS_KEY_ID: s3TestCredentials().accessKeyId,
    ZG_S3_SECRET_ACCESS_KEY: s3TestCredentials().secretAccessKey,
    ZG_S3_FORCE_PATH_STYLE: 'true',
    ...extraEnv,
  };
  return { env, mysqlUrl: mysql.toString(), redisPrefix, kafkaPrefix, inbox };
}

export interface EmbeddedStack {
  env: Record<string, string>;
  dbPath: string;
  inbox: CodeInbox;
}

export function createEmbeddedStack(
  cleanups: Cleanups,
  extraEnv: Record<string, string> = {},
): EmbeddedStack {
  const dataDir = mkdtempSync(join(tmpdir(), 'zgb-embedded-'));
  cleanups.add('data dir', async () => rmSync(dataDir, { recursive: true, force: true }));
  return {
    env: { ...baseEnv('embedded', dataDir), ...extraEnv },
    dbPath: join(dataDir, 'zhiguang.db'),
    inbox: new CodeInbox(),
  };
}

/**
 * Production defaults except: a throwaway key and data directory, a cheap password hash (sign-up is
 * set-up work, not measured) and a high per-address limit (every benchmark user signs up from 127.0.0.1).
 */
function baseEnv(profile: 'embedded' | 'cluster', dataDir: string): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '/tmp',
    ZG_PROFILE: profile,
    HOST: '127.0.0.1',
    PORT: '0',
    LOG_LEVEL: 'info',
    ZG_DATA_DIR: dataDir,
    ZG_JWT_PRIVATE_KEY: generateKeyPairSync('rsa', { modulusLength: 2048 })
      .privateKey.export({ type: 'pkcs8', format: 'pem' })
      .toString(),
    ZG_JWT_ISSUER: `zg-bench-${profile}`,
    ZG_PASSWORD_HASH_COST: '12',
    ZG_AUTH_IP_LIMIT: '1000000',
    // 20 users make thousands of likes a second between them.
    ZG_COUNTER_TOGGLE_LIMIT: '1000000000',
    ZG_SHUTDOWN_DRAIN_MS: '0',
  };
}

export interface ServerProcess {
  baseUrl: string;
  pid: number;
  /** Log lines at warn or above, for the report. */
  warnings(): string[];
  stop(): Promise<void>;
}

/**
 * `node <SERVER_ENTRY> --role <role>` with `env`. Verification codes found in the log go to `inbox`.
 * With `cpuProfDir`, the process writes a V8 CPU profile there when it exits.
 */
export async function spawnServer(
  env: Record<string, string>,
  role: 'all' | 'api' | 'worker',
  inbox: CodeInbox,
  cleanups: Cleanups,
  cpuProfDir?: string,
): Promise<ServerProcess> {
  const args: string[] = [];
  if (cpuProfDir) {
    mkdirSync(cpuProfDir, { recursive: true });
    args.push('--cpu-prof', `--cpu-prof-dir=${cpuProfDir}`);
  }
  args.push(SERVER_ENTRY, '--role', role);
  const child: ChildProcess = spawn(process.execPath, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise<number | null>((ok) => child.once('exit', (code) => ok(code)));
  let stderr = '';
  child.stderr?.on('data', (d: Buffer) => {
    stderr += d.toString();
    if (stderr.length > 20_000) stderr = stderr.slice(-20_000);
  });
  const warnings: string[] = [];
  const stop = async (): Promise<void> => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const result = await Promise.race([exited, sleep(20_000).then(() => 'timeout' as const)]);
      if (result === 'timeout') child.kill('SIGKILL');
    }
  };
  cleanups.add(`server ${role} (pid ${child.pid})`, stop);
  const baseUrl = await new Promise<string>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`server did not start within 60 s\n${stderr}`)), 60_000);
    void exited.then((code) => fail(new Error(`server exited with ${code}\n${stderr}`)));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      let parsed: Record<string, unknown>;
      try {
        parsed = JSON.parse(line) as Record<string, unknown>;
      } catch {
        return;
      }
      if (typeof parsed.level === 'number' && parsed.level >= 40 && warnings.length < 50)
        warnings.push(line.slice(0, 500));
      if (parsed.msg === 'verification code' && typeof parsed.code === 'string')
        inbox.deliver(String(parsed.identifier), parsed.code);
      if (parsed.msg === 'zhiguang started' && typeof parsed.address === 'string') {
        clearTimeout(timer);
        ok(parsed.address);
      }
    });
  });
  return { baseUrl, pid: child.pid ?? -1, warnings: () => warnings, stop };
}

export interface BenchUser {
  userId: number;
  accessToken: string;
}

async function postJson(url: string, body: unknown): Promise<{ status: number; body: unknown }> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as unknown) : null };
}

/** Registers `count` users through the public API (send-code, read the delivered code, register). */
export async function signUpUsers(
  baseUrl: string,
  inbox: CodeInbox,
  count: number,
  parallel = 4,
): Promise<BenchUser[]> {
  const users: BenchUser[] = [];
  let next = 0;
  const one = async (): Promise<BenchUser> => {
    const identifier = `bench${Date.now().toString(36)}${(next++).toString(36)}${randomBytes(2).toString('hex')}@example.test`;
    const sent = await postJson(`${baseUrl}/api/v1/auth/send-code`, {
      scene: 'REGISTER',
      identifierType: 'EMAIL',
      identifier,
    });
    if (sent.status !== 200) throw new Error(`send-code failed: ${sent.status} ${JSON.stringify(sent.body)}`);
    const code = await inbox.take(identifier);
    const reg = await postJson(`${baseUrl}/api/v1/auth/register`, {
      identifierType: 'EMAIL',
      identifier,
      code,
      password: 'bench-secret-1',
      agreeTerms: true,
    });
    const body = reg.body as { user?: { id?: number }; token?: { accessToken?: string } } | null;
    if (
      reg.status !== 200 ||
      typeof body?.user?.id !== 'number' ||
      typeof body.token?.accessToken !== 'string'
    ) {
      throw new Error(`register failed: ${reg.status} ${JSON.stringify(reg.body)}`);
    }
    return { userId: body.user.id, accessToken: body.token.accessToken };
  };
  let started = 0;
  await Promise.all(
    Array.from({ length: Math.min(parallel, count) }, async () => {
      while (started < count) {
        started++;
        users.push(await one());
      }
    }),
  );
  return users;
}

let lastPostId = BigInt(Date.now()) * 1_000_000n;
/** Decimal ids shaped like snowflakes (19 digits), unique within the process. */
export function newPostIds(count: number): string[] {
  return Array.from({ length: count }, () => String(++lastPostId));
}

/** Writes published public posts straight into the server's database (posts have no routes yet). */
export async function insertPosts(
  target: { mysqlUrl: string } | { dbPath: string },
  ids: readonly string[],
  authorId: number,
): Promise<void> {
  const db = 'mysqlUrl' in target ? await openMysql(target.mysqlUrl, 1) : openSqlite(target.dbPath);
  try {
    const now = Date.now();
    for (let i = 0; i < ids.length; i += 500) {
      const rows = ids.slice(i, i + 500).map((id, j) => ({
        id,
        author_id: authorId,
        status: 'published',
        visible: 'public',
        created_at: now,
        updated_at: now,
        // What a published post carries, so feed and detail answers have their real size.
        title: `Benchmark post ${id}`,
        description: 'A post written by the benchmark',
        tags_json: '["bench","zhiguang"]',
        img_urls_json: JSON.stringify([`posts/${id}/images/20250101/0000abcd.jpg`]),
        content_key: `posts/${id}/content.md`,
        publish_time: now + i + j,
      }));
      await db.kysely.insertInto('knowposts').values(rows).execute();
    }
  } finally {
    await db.close();
  }
}

/** The CPU time Redis has used since it started (user + system, seconds), from `INFO cpu`. */
export async function redisCpuSeconds(redis: Redis): Promise<number> {
  const info = await redis.info('cpu');
  const value = (name: string): number => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(info)?.[1] ?? 0);
  return value('used_cpu_user') + value('used_cpu_sys');
}

export async function deleteRedisKeys(prefix: string): Promise<number> {
  const redis = new Redis(services.redisUrl, { maxRetriesPerRequest: 1 });
  try {
    let deleted = 0;
    let cursor = '0';
    const pattern = `${prefix.replace(/[*?[\]\\]/g, '\\$&')}*`;
    do {
      const [next, keys] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1_000);
      if (keys.length > 0) deleted += await redis.unlink(...keys);
      cursor = next;
    } while (cursor !== '0');
    return deleted;
  } finally {
    redis.disconnect();
  }
}

/** Deletes the topics, then the consumer groups, whose names start with `prefix`. */
export async function deleteKafkaResources(prefix: string): Promise<{ topics: number; groups: number }> {
  const admin = new Admin({
    clientId: 'zg-bench-cleanup',
    bootstrapBrokers: services.kafkaBrokers,
    timeout: 10_000,
  });
  try {
    const topics = (await admin.listTopics()).filter((name) => name.startsWith(prefix));
    if (topics.length > 0) await admin.deleteTopics({ topics });
    let groups = 0;
    const ids = [...(await admin.listGroups()).keys()].filter((id) => id.startsWith(prefix));
    for (const id of ids) {
      // A group whose member has not timed out yet cannot be deleted; its offsets expire with retention.
      groups += await admin.deleteGroups({ groups: [id] }).then(
        () => 1,
        () => 0,
      );
    }
    return { topics: topics.length, groups };
  } finally {
    await admin.close();
  }
}
