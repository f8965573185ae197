import { spawn, type ChildProcess } from 'node:child_process';
import { generateKeyPairSync } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { createServer as createHttpServer } from 'node:http';
import { createServer, type AddressInfo } from 'node:net';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { SMTPServer } from 'smtp-server';
import { createMysqlDatabase, services, uniqueBucket, uniqueName } from '../rig/resources.js';
import { deleteS3Buckets } from '../rig/services.js';
import { openMysql, openSqlite } from '../../src/platform/db/database.js';

/**
 * Runs the built server (`dist/main.js`) as a child process in either profile, with throwaway
 * storage of its own, and reads what a person would: HTTP answers, log lines and delivered mail.
 */
export type ProfileName = 'embedded' | 'cluster';

export interface FixturePost {
  id: string;
  authorId: number;
  status?: 'draft' | 'published' | 'deleted';
  visible?: string;
}

export interface Delivered {
  identifier: string;
  scene: string;
  code: string;
}

export interface Server {
  profile: ProfileName;
  /** The server's environment (for the admin commands of its deployment). */
  env: Record<string, string>;
  baseUrl: string;
  /** The RS256 private key the server signs with (to forge tokens in security tests). */
  privateKeyPem: string;
  issuer: string;
  /** Waits for the next code delivered to `identifier` after `since` (ms since epoch). */
  codeFor(identifier: string, scene: string, since?: number, timeoutMs?: number): Promise<string>;
  logLines(): Record<string, unknown>[];
  /** Test fixture: writes a post row straight into the server's database, skipping the publish flow. */
  insertPost(post: FixturePost): Promise<void>;
  /** Sends SIGTERM and returns; `stop` then waits for the exit and cleans up. */
  terminate(): void;
  /** The process's exit code, once it exited (before `stop` cleans up its deployment). */
  exited: Promise<number | null>;
  stop(): Promise<void>;
}

const ROOT = resolve(import.meta.dirname, '../..');

/** A port nothing listens on right now (the caller binds it soon after). */
export function freePort(): Promise<number> {
  return new Promise((ok, fail) => {
    const probe = createServer();
    probe.once('error', fail);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => ok(port));
    });
  });
}

/** Polls `read` until `accept` holds or `ms` pass; returns the last value. */
export async function eventually<T>(
  read: () => Promise<T>,
  accept: (value: T) => boolean,
  ms = 5000,
): Promise<T> {
  const deadline = Date.now() + ms;
  let value = await read();
  while (!accept(value) && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    value = await read();
  }
  return value;
}

export async function startServer(
  profile: ProfileName,
  extraEnv: Record<string, string> = {},
  options: {
    /** The database URL the server is given (cluster), from the one of its database: through a proxy. */
    mysqlUrl?: (url: string) => string;
  } = {},
): Promise<Server> {
  const delivered: (Delivered & { at: number })[] = [];
  const waiters = new Set<() => void>();
  const notify = () => waiters.forEach((w) => w());
  const cleanups: (() => Promise<void>)[] = [];
  const lines: Record<string, unknown>[] = [];
  const privateKeyPem = generateKeyPairSync('rsa', { modulusLength: 2048 })
    .privateKey.export({ type: 'pkcs8', format: 'pem' })
    .toString();
  const issuer = `zg-test-${profile}`;

  const dataDir = mkdtempSync(join(tmpdir(), `zg-${profile}-`));
  let mysqlUrl: string | undefined;
  cleanups.push(async () => rmSync(dataDir, { recursive: true, force: true }));

  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '/tmp',
    ZG_PROFILE: profile,
    HOST: '127.0.0.1',
    LOG_LEVEL: 'info',
    ZG_DATA_DIR: dataDir,
    ZG_JWT_PRIVATE_KEY: privateKeyPem,
    ZG_JWT_ISSUER: issuer,
    ZG_PASSWORD_HASH_COST: '12',
    ZG_AUTH_IP_LIMIT: '100000',
    ZG_SESSION_CHECK_CACHE_MS: '0',
    // Stop at once; the drain has a test of its own.
    ZG_SHUTDOWN_DRAIN_MS: '0',
  };

  if (profile === 'cluster') {
    const database = await createMysqlDatabase();
    mysqlUrl = database.url;
    cleanups.push(database.drop);
    // The server creates its bucket at start; emptied and removed at stop.
    const bucket = uniqueBucket('bb');
    cleanups.push(async () => void (await deleteS3Buckets(services.s3Endpoint(), bucket)));
    const smtp = new SMTPServer({
      authOptional: true,
      disabledCommands: ['STARTTLS'],
      logger: false,
      onData(stream, session, callback) {
        const chunks: Buffer[] = [];
        stream.on('data', (c: Buffer) => chunks.push(c));
        stream.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          const match = /Your Zhiguang (sign-up|sign-in|password reset) verification code is (\d{6})/.exec(
            text,
          );
          const scene = { 'sign-up': 'REGISTER', 'sign-in': 'LOGIN', 'password reset': 'RESET_PASSWORD' }[
            match?.[1] ?? ''
          ];
          const code = match?.[2];
          for (const rcpt of session.envelope.rcptTo) {
            if (code && scene) delivered.push({ identifier: rcpt.address, scene, code, at: Date.now() });
          }
          notify();
          callback();
        });
      },
    });
    await new Promise<void>((ok) => smtp.listen(0, '127.0.0.1', ok));
    const smtpPort = (smtp.server.address() as { port: number }).port;
    cleanups.push(() => new Promise<void>((ok) => smtp.close(() => ok())));
    // Phone codes reach an SMS gateway's webhook, as they would in production.
    const smsToken = uniqueName('sms');
    const sms = createHttpServer((request, response) => {
      const chunks: Buffer[] = [];
      request.on('data', (c: Buffer) => chunks.push(c));
      request.on('end', () => {
        if (request.headers.authorization !== `Bearer ${smsToken}`) return void response.writeHead(401).end();
        const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Record<string, unknown>;
        if (typeof body.to === 'string' && typeof body.scene === 'string' && typeof body.code === 'string')
          delivered.push({ identifier: body.to, scene: body.scene, code: body.code, at: Date.now() });
        notify();
        response.writeHead(204).end();
      });
    });
    await new Promise<void>((ok) => sms.listen(0, '127.0.0.1', ok));
    const smsPort = (sms.address() as AddressInfo).port;
    cleanups.push(() => new Promise<void>((ok) => sms.close(() => ok())));
    Object.assign(env, {
      ZG_MYSQL_URL: options.mysqlUrl ? options.mysqlUrl(database.url) : database.url,
      ZG_REDIS_URL: services.redisUrl(),
      ZG_REDIS_PREFIX: `${uniqueName('bb')}:`,
      ZG_KAFKA_BROKERS: services.kafkaBrokers().join(','),
      ZG_KAFKA_PREFIX: `${uniqueName('bb')}.`,
      ZG_KAFKA_PARTITIONS: '2',
      ZG_SMTP_URL: `smtp://127.0.0.1:${smtpPort}`,
      ZG_SMS_WEBHOOK_URL: `http://127.0.0.1:${smsPort}/sms`,
      ZG_SMS_WEBHOOK_TOKEN: smsToken,
      ZG_S3_ENDPOINT: services.s3Endpoint(),
      ZG_S3_BUCKET: bucket,
      ZG_S3_ACCESS_KEY_ID: services.s3Credentials().accessKeyId,
      ZG_S3_SECRET_ACCESS_KEY: services.s3Credentials().secretAccessKey,
      ZG_S3_FORCE_PATH_STYLE: 'true',
    });
  }
  Object.assign(env, extraEnv);

  // Signed upload and download URLs name the server's public URL, so it must listen on a known port.
  const choosePort = extraEnv.PORT === undefined;
  const launch = async () => {
    if (choosePort) env.PORT = String(await freePort());
    if (extraEnv.ZG_PUBLIC_URL === undefined && env.PORT !== '0') {
      env.ZG_PUBLIC_URL = `http://${env.HOST}:${env.PORT}`;
    }
    lines.length = 0;
    const child: ChildProcess = spawn(process.execPath, [join(ROOT, 'dist/main.js')], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((ok) => child.once('exit', (code) => ok(code)));
    try {
      const address = await new Promise<string>((ok, fail) => {
        const timer = setTimeout(
          () => fail(new Error(`server did not start within 60 s\n${stderr}`)),
          60_000,
        );
        void exited.then((code) => {
          clearTimeout(timer);
          fail(new Error(`server exited with ${code}\n${stderr}`));
        });
        createInterface({ input: child.stdout! }).on('line', (line) => {
          let parsed: Record<string, unknown>;
          try {
            parsed = JSON.parse(line) as Record<string, unknown>;
          } catch {
            return;
          }
          lines.push(parsed);
          if (parsed.msg === 'verification code' && typeof parsed.code === 'string') {
            delivered.push({
              identifier: String(parsed.identifier),
              scene: String(parsed.scene),
              code: parsed.code,
              at: Date.now(),
            });
            notify();
          }
          if (parsed.msg === 'zhiguang started' && typeof parsed.address === 'string') {
            clearTimeout(timer);
            ok(parsed.address);
          }
        });
      });
      return { child, exited, address };
    } catch (err) {
      if (child.exitCode === null) child.kill('SIGKILL');
      await exited;
      throw err;
    }
  };

  let started: Awaited<ReturnType<typeof launch>>;
  for (let attempt = 1; ; attempt++) {
    try {
      started = await launch();
      break;
    } catch (err) {
      // Another process may take the probed port before the server binds it: probe again.
      if (choosePort && attempt < 3 && String(err).includes('EADDRINUSE')) continue;
      for (const cleanup of cleanups.reverse()) await cleanup();
      throw err;
    }
  }
  const { child, exited, address } = started;

  return {
    profile,
    env,
    baseUrl: address,
    privateKeyPem,
    issuer,
    logLines: () => lines,
    async insertPost(post) {
      const row = {
        id: post.id,
        author_id: post.authorId,
        status: post.status ?? 'published',
        visible: post.visible ?? 'public',
        created_at: Date.now(),
        updated_at: Date.now(),
      };
      const db = mysqlUrl ? await openMysql(mysqlUrl, 1) : openSqlite(join(dataDir, 'zhiguang.db'));
      try {
        await db.kysely.insertInto('knowposts').values(row).execute();
      } finally {
        await db.close();
      }
    },
    async codeFor(identifier, scene, since = 0, timeoutMs = 10_000) {
      const find = () =>
        delivered.findLast((d) => d.identifier === identifier && d.scene === scene && d.at >= since)?.code;
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const code = find();
        if (code) return code;
        if (Date.now() > deadline) throw new Error(`no ${scene} code delivered to ${identifier}`);
        await new Promise<void>((ok) => {
          const t = setTimeout(ok, 200);
          waiters.add(() => {
            clearTimeout(t);
            ok();
          });
        });
        waiters.clear();
      }
    },
    terminate() {
      if (child.exitCode === null) child.kill('SIGTERM');
    },
    exited,
    async stop() {
      if (child.exitCode === null) {
        child.kill('SIGTERM');
        const code = await Promise.race([
          exited,
          new Promise<'timeout'>((ok) => setTimeout(() => ok('timeout'), 15_000)),
        ]);
        if (code === 'timeout') child.kill('SIGKILL');
      }
      for (const cleanup of cleanups.reverse()) await cleanup();
    },
  };
}

/** A small JSON client for one server. */
export class Client {
  constructor(private readonly baseUrl: string) {}

  async call(
    method: string,
    path: string,
    options: {
      body?: unknown;
      raw?: string | Buffer | FormData;
      token?: string | undefined;
      headers?: Record<string, string>;
    } = {},
  ): Promise<{ status: number; body: any; headers: Headers }> {
    const headers: Record<string, string> = { ...options.headers };
    if (options.token) headers.authorization = `Bearer ${options.token}`;
    let body: string | Buffer | FormData | undefined;
    if (options.raw !== undefined) body = options.raw;
    else if (options.body !== undefined) {
      body = JSON.stringify(options.body);
      headers['content-type'] ??= 'application/json';
    }
    const init: RequestInit = { method, headers };
    if (body !== undefined) init.body = body as NonNullable<RequestInit['body']>;
    const response = await fetch(`${this.baseUrl}${path}`, init);
    const text = await response.text();
    let parsed: unknown = text;
    try {
      parsed = text ? JSON.parse(text) : null;
    } catch {
      // not JSON; keep the text
    }
    return { status: response.status, body: parsed, headers: response.headers };
  }
}

let counter = 0;
/** An identifier no other test uses. */
export function newEmail(): string {
  return `u${Date.now().toString(36)}${(counter++).toString(36)}${Math.random().toString(36).slice(2, 6)}@example.test`;
}

export function newPhone(): string {
  return `1${String(Math.floor(Math.random() * 1e10)).padStart(10, '0')}`;
}

export interface SignedUp {
  identifier: string;
  password: string;
  userId: number;
  accessToken: string;
  refreshToken: string;
}

/** Registers a fresh user through the public API, the way a person would. */
export async function signUp(server: Server, client: Client, password = 'secret123'): Promise<SignedUp> {
  const identifier = newEmail();
  const since = Date.now();
  const sent = await client.call('POST', '/api/v1/auth/send-code', {
    body: { scene: 'REGISTER', identifierType: 'EMAIL', identifier },
  });
  if (sent.status !== 200) throw new Error(`send-code failed: ${sent.status} ${JSON.stringify(sent.body)}`);
  const code = await server.codeFor(identifier, 'REGISTER', since);
  const reg = await client.call('POST', '/api/v1/auth/register', {
    body: { identifierType: 'EMAIL', identifier, code, password, agreeTerms: true },
  });
  if (reg.status !== 200) throw new Error(`register failed: ${reg.status} ${JSON.stringify(reg.body)}`);
  return {
    identifier,
    password,
    userId: reg.body.user.id,
    accessToken: reg.body.token.accessToken,
    refreshToken: reg.body.token.refreshToken,
  };
}
