import { setImmediate as nextTurn } from 'node:timers/promises';
import { chmodSync, existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { hostname } from 'node:os';
import type { Logger } from 'pino';
import { ConfigError, type Config } from './config/config.js';
import { isDeployed, migrate, openMysql, openSqlite, type Db } from './db/database.js';
import type { KeyValueStore } from './kv/kv.js';
import { createRedisKv, createSqliteKv } from './kv/create.js';
import type { RateLimiter } from './ratelimit/ratelimit.js';
import { createRedisRateLimiter, createSqliteRateLimiter } from './ratelimit/create.js';
import type { EventLog } from './eventlog/eventlog.js';
import { SqliteEventLog } from './eventlog/sqlite-eventlog.js';
import type { OutboxStore } from './outbox/outbox.js';
import { SqliteOutboxStore } from './outbox/sqlite-outbox-store.js';
import type { ObjectStorage } from './storage/object-storage.js';
import { LocalObjectStorage, loadOrCreateSigningKey } from './storage/local-object-storage.js';
import type { CounterStore } from '../counter/store/counter-store.js';
import { SqliteCounterStore } from '../counter/store/sqlite-counter-store.js';
import type { Redis, RedisOptions } from 'ioredis';
import type { UserCounterStore } from '../user-counter/store/user-counter-store.js';
import { SqliteUserCounterStore } from '../user-counter/store/sqlite-user-counter-store.js';
import type { CodeSender } from '../auth/code-sender/code-sender.js';
import { RoutingCodeSender } from '../auth/code-sender/code-sender.js';
import { LogCodeSender } from '../auth/code-sender/log-code-sender.js';
import { WebhookCodeSender } from '../auth/code-sender/webhook-code-sender.js';
import { SmtpCodeSender } from '../auth/code-sender/smtp-code-sender.js';
import { loadOrCreatePem } from '../auth/keys.js';
import type { ListCache } from '../relation/list-cache/list-cache.js';
import { MemoryListCache } from '../relation/list-cache/memory-list-cache.js';
import type { InvalidationBus } from './cache/invalidation-bus.js';
import type { SharedCache } from './cache/shared-cache.js';
import {
  createLocalInvalidationBus,
  createNoSharedCache,
  createRedisInvalidationBus,
  createRedisSharedCache,
} from './cache/create.js';

/**
 * Every port the features use, built for one profile. This module is the only place that reads
 * `config.profile`; features receive the ports and never learn which adapters they got.
 */
export interface Platform {
  db: Db;
  kv: KeyValueStore;
  limiter: RateLimiter;
  events: EventLog;
  outboxStore: OutboxStore;
  storage: ObjectStorage;
  counterStore: CounterStore;
  /** After a replay brought the counter facts back and sealed them: marks the store as the deployment's (see `markCountersRestored`). */
  markCountersRestored(): Promise<void>;
  userCounterStore: UserCounterStore;
  /** Cached following/followers lists (cluster: Redis sorted sets; embedded: in process). */
  relationLists: ListCache;
  codeSender: CodeSender;
  /** The deployment-wide cache tier (cluster: Redis; embedded: none, the in-process tier suffices). */
  sharedCache: SharedCache;
  /** Cache invalidations reaching every process (cluster: Redis pub/sub; embedded: in process). */
  invalidation: InvalidationBus;
  signingKeyPem: string;
  readiness: Record<string, () => Promise<boolean>>;
  /**
   * Embedded only (one process writes and consumes everything): whether every consumer of this
   * process has handled every record written so far (`SqliteEventLog.caughtUp`). A graceful stop
   * waits for it so that nothing is left on its way (see `App.close`).
   */
  eventsCaughtUp?: () => Promise<boolean>;
  /** Closes every connection, in reverse order of opening. */
  close(): Promise<void>;
}

export interface PlatformOptions {
  /** Whether the process serves HTTP (a server, not an admin command): start-up warnings of what it serves. */
  serves?: boolean;
  /**
   * Cluster: whether the deployment's mark and seals are set where a first start (or a release
   * before seals) leaves them missing (see `checkRedisAtStart`); by default only servers set them.
   */
  markRedis?: boolean;
  /** Cluster: the replay, which brings lost data back, does not report it lost. */
  replaying?: boolean;
  /**
   * An admin command: the deployment must exist (a database a server has migrated). A data
   * directory or database named by mistake is refused rather than created empty, where a verify
   * would check nothing and report it clean.
   */
  existing?: boolean;
}

export async function createPlatform(
  config: Config,
  log: Logger,
  options: PlatformOptions = {},
): Promise<Platform> {
  const existing = options.existing ?? false;
  if (existing) checkEmbeddedDeployment(config);
  return config.profile === 'embedded'
    ? createEmbedded(config, log, existing, options.serves ?? false)
    : createCluster(
        config,
        log,
        options.serves ?? false,
        options.markRedis ?? options.serves ?? false,
        options.replaying ?? false,
        existing,
      );
}

/**
 * Embedded: refuses a data directory without the database a server made there (an admin command
 * pointed at the wrong directory), before anything is written to it. Cluster: nothing to check yet.
 */
export function checkEmbeddedDeployment(config: Config): void {
  if (config.profile === 'embedded' && !existsSync(join(config.dataDir, 'zhiguang.db')))
    throw noDeployment(`ZG_DATA_DIR: no embedded deployment in ${config.dataDir} (no zhiguang.db)`);
}

function noDeployment(problem: string): ConfigError {
  return new ConfigError([`${problem}; point the command at the deployment a server runs on`]);
}

/** Refuses a database no server ever migrated (see `PlatformOptions.existing`). */
async function checkDeployed(db: Db, where: string): Promise<void> {
  if (!(await isDeployed(db))) throw noDeployment(`${where}: no tables of a deployment in this database`);
}

function localStorage(config: Config): ObjectStorage {
  const signingKey =
    config.storageSigningKey ?? loadOrCreateSigningKey(join(config.dataDir, 'keys', 'storage-signing.key'));
  return new LocalObjectStorage(join(config.dataDir, 'objects'), `${config.publicUrl}/files`, { signingKey });
}

async function s3Storage(config: Config, log: Logger) {
  const { S3ObjectStorage } = await import('./storage/s3-object-storage.js');
  const storage = new S3ObjectStorage({
    ...(config.s3.endpoint !== undefined ? { endpoint: config.s3.endpoint } : {}),
    region: config.s3.region,
    bucket: required(config.s3.bucket, 'ZG_S3_BUCKET'),
    accessKeyId: required(config.s3.accessKeyId, 'ZG_S3_ACCESS_KEY_ID'),
    secretAccessKey: required(config.s3.secretAccessKey, 'ZG_S3_SECRET_ACCESS_KEY'),
    forcePathStyle: config.s3.forcePathStyle,
    ...(config.s3.publicUrl !== undefined ? { publicUrl: config.s3.publicUrl } : {}),
  });
  // A provisioned bucket only answers HEAD here; a development store gets its bucket created. An
  // unreachable store must not keep the API down (only uploads need it): their requests fail instead.
  await storage.ensureBucket().catch((err: unknown) => {
    log.warn({ err, bucket: config.s3.bucket }, 'object storage bucket not reachable at start');
  });
  return storage;
}

function warnOpenMetrics(config: Config, log: Logger): void {
  if (config.metricsToken === undefined)
    log.warn('GET /metrics answers anyone who reaches this port; set ZG_METRICS_TOKEN');
}

/** `warn`: say at start-up which codes go to the log (a cluster process that serves requests). */
async function codeSenders(config: Config, log: Logger, warn: boolean): Promise<RoutingCodeSender> {
  const { smtp, sms } = config;
  const logged = [...(smtp.url ? [] : ['e-mail']), ...(!sms.webhookUrl && sms.log ? ['phone'] : [])];
  if (warn && logged.length > 0) {
    log.warn(
      { codes: logged },
      'verification codes are written to the log: whoever reads it can sign in as those users',
    );
  }
  return new RoutingCodeSender({
    EMAIL: smtp.url ? await SmtpCodeSender.create(smtp.url, smtp.from) : new LogCodeSender(log),
    PHONE: sms.webhookUrl
      ? new WebhookCodeSender({ url: sms.webhookUrl, token: sms.webhookToken })
      : sms.log
        ? new LogCodeSender(log)
        : null,
  });
}

/**
 * Keeps the embedded profile's data from other local users: the database holds password hashes,
 * sessions and codes, `objects/` posts that are not public, `keys/` the signing keys. A data
 * directory this creates is 0700; in one that exists, the database files are made 0600 and
 * `objects/` and `keys/` 0700 (SQLite gives its -wal and -shm files the database's mode). Resolves
 * to what it could not change (not this process's to change: shared through a group, say).
 */
export function keepDataPrivate(dataDir: string): string[] {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const left: string[] = [];
  const tighten = (path: string, mode: number) => {
    try {
      chmodSync(path, mode);
    } catch {
      left.push(path);
    }
  };
  for (const dir of ['objects', 'keys']) {
    mkdirSync(join(dataDir, dir), { recursive: true, mode: 0o700 });
    tighten(join(dataDir, dir), 0o700);
  }
  const database = join(dataDir, 'zhiguang.db');
  writeFileSync(database, '', { flag: 'a', mode: 0o600 });
  for (const file of [database, `${database}-wal`, `${database}-shm`]) {
    if (existsSync(file)) tighten(file, 0o600);
  }
  return left;
}

async function createEmbedded(
  config: Config,
  log: Logger,
  existing: boolean,
  serves: boolean,
): Promise<Platform> {
  const open = keepDataPrivate(config.dataDir);
  if (open.length > 0)
    log.warn(
      { paths: open },
      'could not make these data files private to this user; check their owner and mode',
    );
  const db = openSqlite(join(config.dataDir, 'zhiguang.db'));
  const closers: (() => Promise<void>)[] = [() => db.close()];
  try {
    if (existing) await checkDeployed(db, 'ZG_DATA_DIR');
    await migrate(db);
    const events = new SqliteEventLog(db, {
      onPruneError: (err) =>
        log.warn({ err }, 'the event log could not delete its old records; it tries again in 5 minutes'),
    });
    closers.unshift(() => events.close());
    const codeSender = await codeSenders(config, log, false);
    closers.unshift(async () => codeSender.close());
    const invalidation = createLocalInvalidationBus();
    closers.unshift(() => invalidation.close());
    const tellUnsealed = oncePerMinute(() =>
      log.error(
        'likes and favourites are refused: the counter store is unsealed, by a counters replay under way (--force, beside this server) ' +
          'or one that stopped before it was done; they are refused until a replay completes: this server runs one by itself where ZG_COUNTER_AUTO_REPLAY is true (the default), otherwise stop it and run `zhiguang counters replay --yes`',
      ),
    );
    const counterStore = new SqliteCounterStore(db, { onUnsealed: tellUnsealed });
    // Said at start too: nothing else shows it until the first like is refused.
    if (serves && (await counterStore.unsealedGroups()) > 0) tellUnsealed();
    if (serves) warnOpenMetrics(config, log);
    return {
      db,
      kv: createSqliteKv(db),
      limiter: createSqliteRateLimiter(db),
      events,
      outboxStore: new SqliteOutboxStore(db),
      storage: localStorage(config),
      counterStore,
      markCountersRestored: async () => undefined,
      userCounterStore: new SqliteUserCounterStore(db),
      relationLists: new MemoryListCache({
        ttlMs: config.relations.listCacheTtlMs,
        maxEntries: config.relations.listCacheMaxEntries,
        maxLists: 20_000,
        // About 50 MB of entries at most, however long the lists.
        maxTotalEntries: 1_000_000,
      }),
      codeSender,
      sharedCache: createNoSharedCache(),
      invalidation,
      signingKeyPem:
        config.jwt.privateKeyPem ?? loadOrCreatePem(join(config.dataDir, 'keys', 'jwt-private.pem')),
      readiness: {
        database: () =>
          db.kysely
            .selectFrom('users')
            .select('id')
            .limit(1)
            .execute()
            .then(() => true),
      },
      eventsCaughtUp: () => events.caughtUp(),
      close: () => closeAll(closers),
    };
  } catch (err) {
    await closeAll(closers);
    throw err;
  }
}

/**
 * The cluster profile's Redis client settings: auto-pipelined but for `SEND_AT_ONCE`. A command
 * fails after `commandTimeoutMs` (0: no limit), time spent queued for a lost connection included,
 * so while Redis cannot be reached a request answers 503 within about that time instead of waiting
 * through the client's reconnection attempts (a toggle whose answer is lost so is still published:
 * its event waits in Redis with the unpublished ones). The timer costs about 2 µs of CPU a command.
 */
export async function clusterRedisOptions(
  commandTimeoutMs = 2_000,
): Promise<
  Pick<
    RedisOptions,
    | 'maxRetriesPerRequest'
    | 'enableAutoPipelining'
    | 'autoPipeliningIgnoredCommands'
    | 'commandTimeout'
    | 'connectTimeout'
    | 'autoResendUnfulfilledCommands'
  >
> {
  const { SEND_AT_ONCE } = await import('../counter/store/redis-counter-store.js');
  return {
    maxRetriesPerRequest: 2,
    // A connection attempt to a host that does not answer fails within the same time, so fail-fast
    // (which waits for a failed attempt) is not held up by the client's default of 10 s.
    ...(commandTimeoutMs > 0 ? { commandTimeout: commandTimeoutMs, connectTimeout: commandTimeoutMs } : {}),
    enableAutoPipelining: true,
    // PING too: the connection's probe (see `watchRedisConnection`) must not wait behind a pipeline
    // a stopped Redis holds until its commands time out.
    autoPipeliningIgnoredCommands: [...SEND_AT_ONCE, 'ping'],
    // A command sent on a connection that was lost before its answer came is not sent again on the
    // next one: it may have timed out and been answered 503 ("changing nothing") already, and a like
    // sent again after its unlike was refused would stand against the user's wish; one that ran and
    // lost only its answer would run twice. Callers retry what is safe to. The client then drops it
    // without an answer, so only its timeout ends it: without one (0) it is sent again.
    autoResendUnfulfilledCommands: commandTimeoutMs === 0,
  };
}

/**
 * Fails fast while Redis cannot be reached: once a connection that was ready has failed an attempt
 * to reconnect, commands are refused at once (answered as an outage, 503) rather than queued until
 * it is back or they time out, so a request that runs several commands one after another does not
 * wait out each one's timeout; from its next `ready` they are sent again. A connection closed and
 * reopened at the first attempt (an idle timeout, a killed client, a proxy's reset) queues its
 * commands meanwhile, and before the first `ready` they wait, as start-up needs. Also logs the loss
 * once (the client reports every failed attempt) and the return; without a listener the client
 * prints each attempt to stderr.
 *
 * A Redis that stops answering without resetting anything (a hung or stopped server, a network that
 * drops packets) fails no connection: each command would wait out its timeout, and a request
 * running several would take several timeouts. So, with a command timeout, the connection is
 * probed every `probeMs` with a PING; one that times out has the connection ended and made anew,
 * and commands refused at once until the new one is ready.
 */
export function watchRedisConnection(redis: Redis, log: Logger, name: string, probeMs = 1_000): void {
  let ready = false;
  let down = false;
  const lost = (err: Error): void => {
    if (down) return;
    down = true;
    log.warn(
      { err, connection: name },
      'Redis connection lost; requests that need it answer 503 until it is back',
    );
  };
  redis.on('ready', () => {
    ready = true;
    redis.options.enableOfflineQueue = true;
    if (!down) return;
    down = false;
    log.info({ connection: name }, 'Redis connection back');
  });
  redis.on('error', (err: Error) => {
    // An error of the ready connection itself (a reset) comes before its close: not yet a loss.
    if (redis.status === 'ready') return;
    if (ready) redis.options.enableOfflineQueue = false;
    lost(err);
  });
  if (!redis.options.commandTimeout || probeMs <= 0) return;
  // A method of the client not in its types: commands on their way fail with it rather than at
  // their timeouts when the probe ends a connection.
  const flushQueue = (redis as unknown as { flushQueue?: (error: Error) => void }).flushQueue?.bind(redis);
  if (!flushQueue)
    log.warn(
      { connection: name },
      'this ioredis has no flushQueue: commands on their way end at their timeouts',
    );
  let probing = false;
  const probe = setInterval(() => {
    if (probing || redis.status !== 'ready') return;
    probing = true;
    const stream = redis.stream;
    const read = stream.bytesRead;
    redis
      .ping()
      .catch(async (err: unknown) => {
        if (!(err instanceof Error) || !/timed out/i.test(err.message)) return;
        // Bytes the loop has not read yet (it was busy past the timeout) are read first.
        await nextTurn();
        // Not the connection it was sent on any more, or one still answering (only slowly, or
        // other commands first): neither is a Redis that stopped answering.
        if (redis.status !== 'ready' || redis.stream !== stream || stream.bytesRead !== read) return;
        redis.options.enableOfflineQueue = false;
        const gone = new Error('Connection is closed. Redis did not answer a PING in time', { cause: err });
        lost(gone);
        // Commands on their way fail now rather than at their timeouts, and so free the pipeline
        // the client holds the next ones behind.
        flushQueue?.(gone);
        // Destroyed rather than ended: a server that does not answer may never close its side.
        stream.destroy();
      })
      .finally(() => (probing = false));
  }, probeMs);
  probe.unref();
  redis.once('end', () => clearInterval(probe));
}

const REDIS_DATA_LOST =
  'Redis holds no data of this deployment: likes and favourites are refused (503) until their facts are ' +
  'back, and users must sign in again; worker processes rebuild the facts and counts from counter-events ' +
  'by themselves where ZG_COUNTER_AUTO_REPLAY is true (the default), otherwise run `zhiguang counters replay --yes`';

/**
 * Tells when Redis comes back from a lost connection without its data (restarted without
 * persistence, or failed over to an empty replica): the mark `checkCounterGroups` left is gone. The
 * facts behind likes and favourites and the sessions went with it; nothing here can bring them back,
 * so the process says so at error level, with what to run, once per loss. The mark stays missing
 * (as do the groups' seals, so toggles are refused) until the replay sets it: a process started
 * meanwhile finds it missing too, and says so (see `checkRedisAtStart`).
 */
export function watchRedisDataLoss(redis: Redis, prefix: string, log: Logger): void {
  const key = `${prefix}meta:counter-groups`;
  let lost = false;
  redis.on('close', () => void (lost = true));
  redis.on('ready', () => {
    if (!lost) return;
    lost = false;
    redis
      .exists(key)
      .then((found) => {
        if (found === 0) log.error({ prefix }, REDIS_DATA_LOST);
      })
      .catch((err: unknown) => {
        // Checked again at the next reconnection.
        lost = true;
        log.warn({ err }, 'could not check Redis for lost data after a reconnection');
      });
  });
}

/**
 * Whether Redis lost counter changes the database knows of: the likes-received marks record, per
 * post, the highest change seq applied, which the store's seq of the post (it numbers every change)
 * is never below while it keeps its data. Checked on the posts with the most changes.
 */
async function countsBehindDatabase(db: Db, store: Pick<CounterStore, 'inspect'>): Promise<boolean> {
  const marks = await db.kysely
    .selectFrom('likes_received_marks')
    .select(['post_id', 'applied_seq'])
    .orderBy('applied_seq', 'desc')
    .limit(200)
    .execute();
  const seqs = await Promise.all(
    marks.map(async (m) => (await store.inspect({ etype: 'knowpost', eid: String(m.post_id) })).seq),
  );
  return marks.some((m, i) => seqs[i]! < Number(m.applied_seq));
}

/** Whether the deployment has users, that is, had data in Redis. */
async function hasUsers(db: Db): Promise<boolean> {
  return (await db.kysely.selectFrom('users').select('id').limit(1).executeTakeFirst()) !== undefined;
}

/** Set once every counter group of the deployment was sealed (see `RedisCounterStore.seal`). */
const sealedKey = (prefix: string) => `${prefix}meta:counter-sealed`;

/**
 * Records that Redis holds the deployment's counter facts: the groups' mark (`checkCounterGroups`),
 * every group's seal, then the deployment's. At a deployment's first start (a replay seals the
 * groups itself, and then only marks: `markCountersRestored`).
 */
export async function sealCounters(
  redis: Redis,
  prefix: string,
  groups: number,
  store: Pick<CounterStore, 'seal'>,
): Promise<void> {
  await checkCounterGroups(redis, prefix, groups, true);
  await store.seal();
  await redis.set(sealedKey(prefix), '1');
}

/**
 * After a replay brought the facts back and sealed the groups it refilled: the groups' mark and the
 * deployment's seal. Not the groups' seals again, which would seal a group emptied since.
 */
export async function markCountersRestored(redis: Redis, prefix: string, groups: number): Promise<void> {
  await checkCounterGroups(redis, prefix, groups, true);
  await redis.set(sealedKey(prefix), '1');
}

/**
 * Counter keys are spread over `ZG_COUNTER_GROUPS` hash-tag groups, so the same entity lives under
 * another key with another value, where its counts read as zeros. The first process of a deployment
 * records the value under `{prefix}meta:counter-groups`; a process started with another refuses to.
 * The mark also tells that Redis holds the deployment's data. Resolves to `created` when this call
 * set it, `missing` when there was none and `create` is false, `found` otherwise.
 */
export async function checkCounterGroups(
  redis: Redis,
  prefix: string,
  groups: number,
  create = true,
): Promise<'created' | 'found' | 'missing'> {
  const key = `${prefix}meta:counter-groups`;
  if (!create && (await redis.exists(key)) === 0) return 'missing';
  const created = create && (await redis.set(key, String(groups), 'NX')) === 'OK';
  const recorded = Number(await redis.get(key));
  if (recorded !== groups) {
    throw new Error(
      `ZG_COUNTER_GROUPS is ${groups}, but the counters under the Redis prefix "${prefix}" are laid out in ` +
        `${recorded} groups: set it back to ${recorded} (the value is fixed for the life of a deployment)`,
    );
  }
  return created ? 'created' : 'found';
}

/**
 * Checks the counter groups' mark at start (`checkCounterGroups`). Found: Redis holds the
 * deployment's data; a deployment whose groups were never sealed (made by a release before seals)
 * is sealed now, unless Redis is behind the database (a loss the mark does not show). Missing while the database has users: Redis lost its data; said at error level
 * (unless `replaying`: the replay is what brings it back), and nothing is set, so every process
 * finds it missing until the replay. Missing in a deployment without users: its first start, which
 * sets the mark and seals the groups. Only a process that `markRedis` writes.
 */
export async function checkRedisAtStart(
  redis: Redis,
  db: Db,
  prefix: string,
  groups: number,
  store: Pick<CounterStore, 'seal' | 'inspect'>,
  options: { markRedis: boolean; replaying?: boolean },
  log: Logger,
): Promise<void> {
  const mark = await checkCounterGroups(redis, prefix, groups, false);
  if (mark !== 'missing') {
    if (!options.markRedis || (await redis.exists(sealedKey(prefix))) === 1) return;
    // Marked, never sealed: made by a release before seals, or a process of one set the mark again
    // after a loss (or Redis came back from an old backup). Sealed unless Redis is behind the
    // database on the posts with the most changes.
    if (!(await countsBehindDatabase(db, store))) await sealCounters(redis, prefix, groups, store);
    else if (!options.replaying) log.error({ prefix }, REDIS_DATA_LOST);
    return;
  }
  if (await hasUsers(db)) {
    if (!options.replaying) log.error({ prefix }, REDIS_DATA_LOST);
    return;
  }
  if (options.markRedis) await sealCounters(redis, prefix, groups, store);
}

/**
 * Says when Redis may evict keys once its memory is full (a `maxmemory` and a `maxmemory-policy`
 * other than `noeviction`, Redis' default, which refuses writes instead: 503 here). At error level
 * for `allkeys-*`: the facts behind likes and favourites, the session versions that keep reset
 * passwords' sessions ended and the counter buckets have no expiry, and evicting them loses them
 * silently. As a warning for `volatile-*`, which evicts keys before they expire: sessions (users
 * signed out), rotation marks (a replayed refresh token only refused), a code's tries (more
 * guesses). A Redis that does not allow `CONFIG GET` (some managed services) is not checked.
 * Resolves to the policy that evicts, or null.
 */
export async function checkRedisEviction(
  redis: Pick<Redis, 'config'>,
  log: Pick<Logger, 'error' | 'warn'>,
): Promise<string | null> {
  let policy: string | null;
  let maxmemory: number;
  try {
    const setting = async (name: string): Promise<string | null> => {
      const answer = (await redis.config('GET', name)) as unknown;
      return Array.isArray(answer) && typeof answer[1] === 'string' ? answer[1] : null;
    };
    policy = await setting('maxmemory-policy');
    maxmemory = Number(await setting('maxmemory'));
  } catch {
    return null;
  }
  // Without a memory limit nothing is evicted, whatever the policy.
  if (policy === null || policy === 'noeviction' || !(maxmemory > 0)) return null;
  const advice = 'set maxmemory-policy to noeviction (writes are refused instead when memory is full)';
  if (policy.startsWith('allkeys-'))
    log.error(
      { maxmemoryPolicy: policy, maxmemory },
      `Redis evicts any key when its memory is full (maxmemory-policy ${policy}): likes, favourites and ` +
        `ended sessions can be lost without a trace; ${advice}`,
    );
  else
    log.warn(
      { maxmemoryPolicy: policy, maxmemory },
      `Redis evicts keys with an expiry when its memory is full (maxmemory-policy ${policy}): sessions, ` +
        `refresh-token rotation marks and verification-code tries can be lost early; ${advice}`,
    );
  return policy;
}

/**
 * The invalidation bus's subscriber, a `duplicate` of the command client, without its limits or its
 * fail-fast state: the client re-sends SUBSCRIBE itself after a reconnection, and a failure of that
 * (a timeout, too many retries; no caller to catch it) would end the process or leave the
 * connection subscribed to nothing.
 */
export const SUBSCRIBER_OPTIONS = {
  enableAutoPipelining: false,
  enableOfflineQueue: true,
  commandTimeout: undefined,
  maxRetriesPerRequest: null,
  // A SUBSCRIBE lost with its connection before its answer is sent again (harmless twice): the
  // client records a channel only once answered, so it would not subscribe it again by itself.
  autoResendUnfulfilledCommands: true,
} as const satisfies RedisOptions;

async function createCluster(
  config: Config,
  log: Logger,
  serves: boolean,
  markRedis: boolean,
  replaying: boolean,
  existing: boolean,
): Promise<Platform> {
  const closers: (() => Promise<void>)[] = [];
  try {
    const mysqlUrl = required(config.mysqlUrl, 'ZG_MYSQL_URL');
    const db = await openMysql(mysqlUrl, 10, config.mysqlTimeoutMs);
    closers.unshift(() => db.close());
    if (existing) await checkDeployed(db, 'ZG_MYSQL_URL');
    // A migration may rightly take longer than a request's statements are given.
    const migrating = await openMysql(mysqlUrl, 1);
    try {
      await migrate(migrating);
    } finally {
      await migrating.close();
    }

    const { Redis } = await import('ioredis');
    const redis = new Redis(
      required(config.redisUrl, 'ZG_REDIS_URL'),
      await clusterRedisOptions(config.redisCommandTimeoutMs),
    );
    watchRedisConnection(redis, log, 'commands');
    closers.unshift(async () => void (await redis.quit().catch(() => redis.disconnect())));
    const { RedisCounterStore } = await import('../counter/store/redis-counter-store.js');
    const tellUnsealed = oncePerMinute((group: number) =>
      log.error(
        { prefix: config.redisPrefix, group },
        'a like or favourite was refused: counter group holds no facts (Redis lost them, or a replay is under way); ' +
          'they are refused until a replay brings them back (worker processes run one by themselves where ' +
          'ZG_COUNTER_AUTO_REPLAY is true, the default; otherwise `zhiguang counters replay --yes`)',
      ),
    );
    const counterStore = new RedisCounterStore(redis, {
      prefix: config.redisPrefix,
      groups: config.counters.groups,
      requireSeal: true,
      onUnsealed: tellUnsealed,
    });
    // Asked first, so that an outage is said as plainly as the database's: which service, and where.
    await redis.ping().catch((err: unknown) => {
      throw new Error(`Redis could not be reached at ${hostOf(config.redisUrl)}: ${(err as Error).message}`, {
        cause: err,
      });
    });
    await checkRedisAtStart(
      redis,
      db,
      config.redisPrefix,
      config.counters.groups,
      counterStore,
      { markRedis, replaying },
      log,
    );
    watchRedisDataLoss(redis, config.redisPrefix, log);
    await checkRedisEviction(redis, log);
    // A subscribed connection can run no other command, so the bus gets one of its own (and closes it).
    const invalidation = await createRedisInvalidationBus({
      publisher: redis,
      subscriber: redis.duplicate(SUBSCRIBER_OPTIONS),
      prefix: config.redisPrefix,
      onError: (err) =>
        log.warn({ err }, 'cache invalidation bus trouble; caches expire on their own meanwhile'),
    });
    closers.unshift(() => invalidation.close());

    const { KafkaEventLog } = await import('./eventlog/kafka-eventlog.js');
    const events = new KafkaEventLog({
      brokers: config.kafkaBrokers,
      prefix: config.kafkaPrefix,
      partitions: config.kafkaPartitions,
      clientId: 'zhiguang',
      // Retry a lost broker at least every second: events published once it is back are no longer
      // covered by the repair job, so counting must resume within seconds (not the default 10 s).
      retryBackoffMs: { min: 200, max: 1_000 },
      // A server started again (by its supervisor, on the same host, with the same ZG_NODE_ID and
      // role) takes its consumers' partitions over at once; admin commands stay members of their own.
      ...(serves ? { memberName: `${hostname()}-n${config.nodeId}-${config.role}` } : {}),
      onNameGivenUp: (err) =>
        log.error(
          { err },
          "another running process has this one's name (host name, ZG_NODE_ID and role): a consumer goes on as a member of its own, and a restart of this process no longer takes its partitions over at once; give every process its own ZG_NODE_ID",
        ),
    });
    closers.unshift(() => events.close());
    const { MysqlOutboxStore } = await import('./outbox/mysql-outbox-store.js');
    const storage = await s3Storage(config, log);
    closers.unshift(async () => storage.close());
    const { RedisUserCounterStore } = await import('../user-counter/store/redis-user-counter-store.js');
    const { RedisListCache } = await import('../relation/list-cache/redis-list-cache.js');

    const codeSender = await codeSenders(config, log, serves);
    closers.unshift(async () => codeSender.close());
    if (serves) warnOpenMetrics(config, log);
    return {
      db,
      kv: createRedisKv(redis, config.redisPrefix),
      limiter: createRedisRateLimiter(redis, config.redisPrefix),
      events,
      outboxStore: new MysqlOutboxStore(db),
      storage,
      counterStore,
      markCountersRestored: () => markCountersRestored(redis, config.redisPrefix, config.counters.groups),
      userCounterStore: new RedisUserCounterStore(redis, {
        prefix: config.redisPrefix,
        groups: config.counters.groups,
      }),
      relationLists: new RedisListCache(redis, {
        prefix: config.redisPrefix,
        ttlMs: config.relations.listCacheTtlMs,
        maxEntries: config.relations.listCacheMaxEntries,
      }),
      codeSender,
      sharedCache: createRedisSharedCache(redis, config.redisPrefix),
      invalidation,
      signingKeyPem: required(config.jwt.privateKeyPem, 'ZG_JWT_PRIVATE_KEY'),
      readiness: {
        database: () =>
          db.kysely
            .selectFrom('users')
            .select('id')
            .limit(1)
            .execute()
            .then(() => true),
        redis: () => redis.ping().then((r) => r === 'PONG'),
        kafka: () => events.ping(),
      },
      close: () => closeAll(closers),
    };
  } catch (err) {
    await closeAll(closers);
    throw err;
  }
}

function required<T>(value: T | undefined, name: string): T {
  if (value === undefined) throw new Error(`${name} is required on the cluster profile`);
  return value;
}

async function closeAll(closers: (() => Promise<void>)[]): Promise<void> {
  for (const close of closers) {
    try {
      await close();
    } catch {
      // Closing is best effort: one stuck connection must not keep the others open.
    }
  }
}

/** `tell`, at most once a minute (the first call at once): for a state every request would report. */
function oncePerMinute<A extends unknown[]>(tell: (...args: A) => void): (...args: A) => void {
  let toldAt = Number.NEGATIVE_INFINITY;
  return (...args) => {
    if (Date.now() - toldAt < 60_000) return;
    toldAt = Date.now();
    tell(...args);
  };
}

/** Where a service's URL points, without its credentials (for messages). */
function hostOf(url: string | undefined): string {
  return url !== undefined && URL.canParse(url) ? new URL(url).host : 'its URL';
}
