import { createPrivateKey, createPublicKey } from 'node:crypto';
import { isIP } from 'node:net';
import { readFileSync } from 'node:fs';
import { MAX_WORKER_ID } from '../ids/snowflake.js';

/**
 * The one place configuration is read. Every variable is declared once below with a description,
 * parsed and validated together; `loadConfig` throws a `ConfigError` listing every problem at once
 * rather than falling back to defaults that would let a cluster quietly come up embedded.
 * Secrets may be given as `<VAR>_FILE`, a path whose contents are the value.
 */

export type Profile = 'embedded' | 'cluster';
export type Role = 'api' | 'worker' | 'all';

export interface Config {
  profile: Profile;
  role: Role;
  host: string;
  port: number;
  /** Base URL clients use to reach this server; used for URLs the server signs for itself. */
  publicUrl: string;
  logLevel: string;
  dataDir: string;
  mysqlUrl: string | undefined;
  mysqlTimeoutMs: number;
  redisUrl: string | undefined;
  /** Prefix for every Redis key this deployment writes (several deployments may share a Redis). */
  redisPrefix: string;
  /** Longest a Redis command may take, a wait for the connection included; 0: no limit. */
  redisCommandTimeoutMs: number;
  kafkaBrokers: string[];
  /** Prefix for every Kafka topic and consumer group this deployment uses. */
  kafkaPrefix: string;
  kafkaPartitions: number;
  jwt: {
    privateKeyPem: string | undefined;
    /** Keys whose tokens are accepted as well (PEM, public or private). */
    acceptedKeyPems: string[];
    keyId: string | undefined;
    issuer: string;
    accessTtlSeconds: number;
    refreshTtlSeconds: number;
    /** A rotated refresh token presented again within this time is refused without ending its session. */
    refreshReuseGraceMs: number;
  };
  /** How long a process may trust its cached view of a session before asking the store again. */
  sessionCheckCacheMs: number;
  /** scrypt cost parameter (log2 N) for new password hashes. */
  passwordHashCost: number;
  /** `log`: without a mail server, e-mail codes go to the log (always true when `url` is unset). */
  smtp: { url: string | undefined; from: string; log: boolean };
  /** Phone codes: POSTed to `webhookUrl` when set; else logged when `log`, else refused. */
  sms: { webhookUrl: string | undefined; webhookToken: string | undefined; log: boolean };
  /** Guessing limits per 15 minutes: password sign-ins per identifier; code sends, and separately sign-ins, per client address. */
  authLimits: { passwordPerIdentifier: number; perIp: number; windowMs: number };
  /** How long a sign-in attempt (with its client address and user agent) stays in the login audit. */
  loginAuditRetentionMs: number;
  counters: {
    /** Redis hash-tag groups the counter keys are spread over (cluster). */
    groups: number;
    flushIntervalMs: number;
    /** An event not acknowledged by the event log for this long has its entity rebuilt from facts. */
    repairAfterMs: number;
    reconcileIntervalMs: number;
    /** Likes, unlikes, favourites and unfavourites one user may make per minute, in each API process. */
    togglesPerMinute: number;
    /** Workers replay counter-events by themselves when the counter store's facts are not whole. */
    autoReplay: boolean;
  };
  /** The model that writes post descriptions; without a key, descriptions are extractive summaries. */
  ai: {
    apiKey: string | undefined;
    baseURL: string;
    model: string;
    timeoutMs: number;
    maxRetries: number;
    perUserPerMinute: number;
    perUserPerDay: number;
  };
  /** How long a process trusts what it learned of a post's visibility. */
  entityCacheMs: number;
  /** How much longer a cached entity answers while its loads fail. */
  entityStaleIfErrorMs: number;
  /** Secret for file URLs the app signs itself (local object storage). */
  storageSigningKey: string | undefined;
  /** Object storage of the cluster profile (any S3-compatible store); bucket and keys required there. */
  s3: {
    endpoint: string | undefined;
    region: string;
    bucket: string | undefined;
    accessKeyId: string | undefined;
    secretAccessKey: string | undefined;
    forcePathStyle: boolean;
    publicUrl: string | undefined;
  };
  /** Worker id of this process in snowflake ids; unique per process of a deployment. */
  nodeId: number;
  posts: {
    contentMaxBytes: number;
    imageMaxBytes: number;
    presignExpiresSeconds: number;
    /** How old an unused upload or image copy of a live post must be before it is removed. */
    uploadRetentionMs: number;
  };
  /** Caches of the read side (detail, feeds) and the validity of the download URLs they hold. */
  postReads: {
    localCacheMs: number;
    localCacheEntries: number;
    sharedCacheMs: number;
    urlTtlSeconds: number;
    countsCacheMs: number;
  };
  /** The in-process buffer of views: published at `flushItems` views or `flushMs` after the first. */
  views: { flushItems: number; flushMs: number };
  /** Bearer token `/metrics` asks for; unset, it is open. */
  metricsToken: string | undefined;
  bodyLimitBytes: number;
  /** Fastify's `trustProxy`: which proxies may name the client's address in X-Forwarded-For. */
  trustProxy: boolean | number | string;
  /** Web origins browsers may call the API from: any (`true`) or exactly these. */
  corsOrigins: true | string[];
  avatarMaxBytes: number;
  shutdownTimeoutMs: number;
  /** How long a stopping process answers while its readiness says "draining", before it stops listening. */
  shutdownDrainMs: number;
  relations: {
    /** Follows plus unfollows one user may make per minute. */
    changesPerMinute: number;
    /** Users with at least this many followers keep their first followers page in every process. */
    bigAccountFollowers: number;
    firstPageCacheMs: number;
    listCacheTtlMs: number;
    /** Longest following/followers list kept in the list cache; longer ones page in the database. */
    listCacheMaxEntries: number;
    /** How long an idle outbox relay waits before it looks for rows nobody told it about. */
    outboxPollMs: number;
    reconcileIntervalMs: number;
  };
}

export class ConfigError extends Error {
  constructor(readonly problems: string[]) {
    super(`Invalid configuration:\n  - ${problems.join('\n  - ')}`);
    this.name = 'ConfigError';
  }
}

interface VarSpec {
  description: string;
  default?: string;
  secret?: boolean;
}

/** Every variable the service reads, with its one-line description (also the source for `.env.example`). */
export const CONFIG_VARS = {
  ZG_PROFILE: {
    description:
      'embedded (SQLite, local files, one process) or cluster (MySQL, Redis, Kafka); left unset beside cluster settings (ZG_MYSQL_URL, ZG_REDIS_URL, ZG_KAFKA_BROKERS, ZG_S3_ENDPOINT, ZG_S3_BUCKET, ZG_S3_ACCESS_KEY_ID, ZG_S3_SECRET_ACCESS_KEY) it refuses to start',
    default: 'embedded',
  },
  ZG_ROLE: {
    description: 'api, worker or all (the embedded profile runs all only); the --role flag wins over this',
    default: 'all',
  },
  HOST: { description: 'interface the HTTP server binds to', default: '0.0.0.0' },
  PORT: { description: 'HTTP port', default: '8080' },
  ZG_PUBLIC_URL: { description: 'base URL clients reach this server at (default http://localhost:PORT)' },
  LOG_LEVEL: {
    description: 'pino log level: fatal, error, warn, info, debug, trace or silent',
    default: 'info',
  },
  ZG_DATA_DIR: {
    description:
      'embedded: directory for the SQLite file, keys and uploaded files (one server per directory: a second one, or one started during a counters replay, refuses to start)',
    default: './data',
  },
  ZG_MYSQL_URL: { description: 'cluster: mysql://user:password@host:port/database', secret: true },
  ZG_MYSQL_TIMEOUT_MS: {
    description:
      'cluster: how long a wait for a MySQL connection of the pool, and each statement, may take before the request answers 503 (the connection of that statement is closed; a lock is waited for at most half as long, in whole seconds, at least 1); also the connect timeout; 0 sets no limit; migrations have none',
    default: '10000',
  },
  ZG_REDIS_URL: { description: 'cluster: redis://[:password@]host:port[/db]', secret: true },
  ZG_REDIS_PREFIX: {
    description: 'prefix of every Redis key; without "{" or "}" (the keys carry hash tags of their own)',
    default: 'zg:',
  },
  ZG_REDIS_COMMAND_TIMEOUT_MS: {
    description:
      'cluster: how long a Redis command may take, waiting for a connection included, before its request answers 503; a connection whose PING (one a second) takes longer is made anew, requests answering 503 at once meanwhile; 0 sets no limit and sends no PING (a timer per command costs about 2 µs of CPU)',
    default: '2000',
  },
  ZG_KAFKA_BROKERS: { description: 'cluster: comma-separated host:port list of Kafka bootstrap brokers' },
  ZG_KAFKA_PREFIX: { description: 'prefix of every Kafka topic and consumer group', default: 'zg.' },
  ZG_KAFKA_PARTITIONS: { description: 'partitions for topics the service creates', default: '6' },
  ZG_JWT_PRIVATE_KEY: {
    description:
      'RS256 private key: unencrypted RSA of 2048 bits or more, PKCS#8 or PKCS#1 PEM; embedded generates one under ZG_DATA_DIR if unset',
    secret: true,
  },
  ZG_JWT_ACCEPTED_KEYS: {
    description:
      'further RSA keys (PEM, public or private, one after another) whose tokens are accepted, never signed with, and published in the JWKS: the next key before a rotation, the previous one after it',
    secret: true,
  },
  ZG_JWT_KID: { description: 'key id published in the JWKS (default: the key thumbprint)' },
  ZG_JWT_ISSUER: {
    description: 'iss claim of issued tokens; tokens from other issuers are rejected',
    default: 'zhiguang',
  },
  ZG_ACCESS_TOKEN_TTL: { description: 'access token lifetime in seconds, 60 to 86400', default: '900' },
  ZG_REFRESH_TOKEN_TTL: {
    description: 'refresh token lifetime in seconds, 300 to 7776000 (90 days)',
    default: '604800',
  },
  ZG_REFRESH_REUSE_GRACE_MS: {
    description:
      'a refresh token presented again within this time of its rotation gets the same answer again when it comes from the same client (address and user agent: a lost answer, two tabs refreshing at once) and is refused without ending its session otherwise; later, reuse ends the session; 0 to 60000',
    default: '10000',
  },
  ZG_SESSION_CHECK_CACHE_MS: {
    description: 'how long a process trusts its cached session state (revocation delay across processes)',
    default: '1000',
  },
  ZG_PASSWORD_HASH_COST: {
    description:
      'scrypt cost as log2(N), 10 to 20; raise it freely (hashes are redone at sign-in), but lowering it lets accounts not signed in since answer a wrong password slower than unknown ones',
    default: '15',
  },
  ZG_SMTP_URL: {
    description:
      'smtp://user:pass@host:port (STARTTLS required, except to localhost or with ?tls=optional) or smtps://… for verification mail; required on cluster unless ZG_MAIL_LOG_CODES=true; on embedded, e-mail codes are logged when unset',
    secret: true,
  },
  ZG_SMTP_FROM: {
    description: 'From address of verification mail',
    default: 'Zhiguang <no-reply@zhiguang.local>',
  },
  ZG_MAIL_LOG_CODES: {
    description:
      'without ZG_SMTP_URL, write e-mail codes to the log (true); default true on embedded, false on cluster, where ZG_SMTP_URL is then required: anyone who reads the log could sign in as any e-mail user',
  },
  ZG_SMS_WEBHOOK_URL: {
    description:
      'http(s) URL phone verification codes are POSTed to as JSON (an SMS gateway or a relay to one); a 2xx answer means sent, 400 or 422 that the gateway refused that message, anything else that the gateway is failing',
  },
  ZG_SMS_WEBHOOK_TOKEN: {
    description: 'sent as "Authorization: Bearer <token>" with every POST to ZG_SMS_WEBHOOK_URL',
    secret: true,
  },
  ZG_SMS_LOG_CODES: {
    description:
      'without ZG_SMS_WEBHOOK_URL, write phone codes to the log (true) or refuse to send them (false, 503 UNAVAILABLE); default true on embedded, false on cluster: anyone who reads the log could sign in as any phone user',
  },
  ZG_AUTH_LOGIN_LIMIT: {
    description:
      'password sign-in attempts per identifier (phone number or e-mail address, registered or not) and client per 15 minutes, and ten times as many per identifier from all clients together, a client the identifier signed in from in the last 30 days excepted; a successful sign-in starts the count of that client again',
    default: '10',
  },
  ZG_AUTH_IP_LIMIT: {
    description:
      'code sends per client (an IPv4 address, an IPv6 /64) per 15 minutes, and as many code checks and as many password sign-ins (each counted apart); the /64s of one IPv6 /48 get sixteen times as many code sends, code checks and password sign-ins together (each counted apart)',
    default: '60',
  },
  ZG_LOGIN_AUDIT_DAYS: {
    description:
      'days the login audit keeps each sign-up, sign-in, refresh and reset attempt with its client address and user agent; older rows are deleted by the workers every ten minutes',
    default: '90',
  },
  ZG_TRUST_PROXY: {
    description:
      'proxies whose X-Forwarded-For names the client (rate limits, audit): false, true (any: the leftmost entry, which a client writes itself unless every proxy replaces the header; prefer a hop count or the addresses of the proxies), a hop count from 0 to 16 (0 = false), or a comma-separated list of addresses, CIDRs or loopback/linklocal/uniquelocal',
    default: 'false',
  },
  ZG_CORS_ORIGINS: {
    description:
      'web origins whose pages may call the API from a browser: * (any; the API takes no cookies, only bearer tokens) or a comma-separated list such as https://zhiguang.example.com',
    default: '*',
  },
  ZG_COUNTER_GROUPS: {
    description:
      'cluster: hash-tag groups for counter keys (snapshot buckets); fixed for the life of a deployment (the first process records it in Redis; one started with another value refuses to start)',
    default: '4096',
  },
  ZG_COUNTER_FLUSH_MS: {
    description: 'how often workers fold pending counter deltas into snapshots',
    default: '1000',
  },
  ZG_COUNTER_REPAIR_AFTER_MS: {
    description:
      'an unacknowledged counter event older than this is published again by the repair job (while the log refuses it, its entity is rebuilt from facts and it is tried again after as long as it has waited, at most a minute); likes received wait three times this (at least 10 s) for a missing event of a post before rebuilding its author',
    default: '3000',
  },
  ZG_COUNTER_RECONCILE_MS: {
    description: "how often workers' reconcilers sample post counters and user counters and heal drift",
    default: '30000',
  },
  ZG_COUNTER_AUTO_REPLAY: {
    description:
      'true: worker processes (and an embedded server) that find the counter store refusing likes and favourites because its facts are not whole (Redis came back without its data, a replay stopped half-way) replay counter-events themselves, as `zhiguang counters replay --yes` does; false: they stay refused until someone runs it',
    default: 'true',
  },
  ZG_COUNTER_TOGGLE_LIMIT: {
    description:
      'likes, unlikes, favourites and unfavourites one user may make per minute, counted by each API process apart (behind N processes a user gets up to N times as many)',
    default: '300',
  },
  ZG_ENTITY_CACHE_MS: {
    description:
      'how long a process caches whether a post exists and who may see it (at most 60000: it bounds how long a missed change is believed)',
    default: '5000',
  },
  ZG_ENTITY_STALE_IF_ERROR_MS: {
    description:
      'while the database is out of reach, how much longer a process still answers from what it read lately: whether a post exists and who may see it (past ZG_ENTITY_CACHE_MS, and only with no change of the post heard of since), so likes and counts of posts read recently go on, and the public fields of the authors of posts (past ZG_POST_CACHE_MS), so posts in the shared cache are still shown; 0 = answer 503 at once',
    default: '300000',
  },
  ZG_AI_API_KEY: {
    description:
      'API key of the OpenAI-compatible model that writes post descriptions; unset = offline extractive summaries only',
    secret: true,
  },
  ZG_AI_BASE_URL: {
    description: 'base URL of the OpenAI-compatible API (/chat/completions is appended)',
    default: 'https://api.deepseek.com',
  },
  ZG_AI_MODEL: {
    description:
      'chat model used for post descriptions (not a reasoning model: its reasoning would use up the 160 tokens an answer may take)',
    default: 'deepseek-chat',
  },
  ZG_AI_TIMEOUT_MS: {
    description:
      'longest a description suggestion waits for the model, retries included, before the extractive summary is used',
    default: '10000',
  },
  ZG_AI_MAX_RETRIES: {
    description:
      'further attempts after a connection error, 408, 409, 429 or 5xx, within the timeout; a provider asking for a longer wait (Retry-After) is not called until it is over, 10 minutes at most',
    default: '1',
  },
  ZG_AI_RATE_LIMIT: { description: 'description suggestions per user per minute', default: '20' },
  ZG_AI_DAILY_LIMIT: {
    description: 'description suggestions per user per day (bounds what one account costs in model calls)',
    default: '200',
  },
  ZG_STORAGE_SIGNING_KEY: {
    description:
      'embedded: secret (32+ characters) for the file URLs the app signs itself (local file storage); generated under ZG_DATA_DIR when unset; not used on cluster',
    secret: true,
  },
  ZG_S3_ENDPOINT: {
    description: 'cluster: base URL of an S3-compatible store (MinIO, …); AWS S3 itself when unset',
  },
  ZG_S3_REGION: { description: 'cluster: region of the bucket', default: 'us-east-1' },
  ZG_S3_BUCKET: { description: 'cluster: bucket for uploaded files (required on the cluster profile)' },
  ZG_S3_ACCESS_KEY_ID: { description: 'cluster: access key id of the bucket (required)', secret: true },
  ZG_S3_SECRET_ACCESS_KEY: {
    description: 'cluster: secret access key of the bucket (required)',
    secret: true,
  },
  ZG_S3_FORCE_PATH_STYLE: {
    description:
      'cluster: true for {endpoint}/{bucket}/{key} URLs (most self-hosted stores), false for virtual hosts',
    default: 'false',
  },
  ZG_S3_PUBLIC_URL: {
    description: 'cluster: base URL public objects are read from (a CDN); the bucket URL when unset',
  },
  ZG_NODE_ID: {
    description: `worker id of this process in generated ids, 0 to ${MAX_WORKER_ID}, and with the host name and role its name in Kafka consumer groups (a worker started again under its name takes its partitions over at once); distinct for every process of a deployment`,
    default: '0',
  },
  ZG_POST_CONTENT_MAX_BYTES: {
    description: 'largest post body upload accepted; description/suggest takes JSON bodies up to twice this',
    default: '5242880',
  },
  ZG_POST_IMAGE_MAX_BYTES: { description: 'largest post image upload accepted', default: '10485760' },
  ZG_PRESIGN_EXPIRES_SECONDS: { description: 'how long a presigned upload URL stays valid', default: '600' },
  ZG_UPLOAD_RETENTION_HOURS: {
    description:
      'hours after which a post upload never confirmed or used in a patch, or an image copy a post no longer shows, is removed from storage (an upload larger than its limit goes a minute after its URL expires); also how long after its URL expired an upload is still looked for',
    default: '24',
  },
  ZG_POST_CACHE_MS: {
    description:
      'how long each process keeps posts, feed pages and authors in memory (changes are announced at once; this bounds profile edits and missed announcements)',
    default: '1000',
  },
  ZG_POST_CACHE_ENTRIES: {
    description: 'posts each process keeps in memory at most (and about 128 MiB of them)',
    default: '10000',
  },
  ZG_POST_SHARED_CACHE_MS: {
    description:
      'how long posts and feed pages stay in the Redis cache tier (cluster; embedded has no such tier, yet the value counts in the ZG_POST_URL_TTL_SECONDS check on both profiles)',
    default: '60000',
  },
  ZG_POST_URL_TTL_SECONDS: {
    description:
      'validity of the presigned download URLs of post bodies and images in detail and feed answers; at least 2 × (ZG_POST_CACHE_MS + ZG_POST_SHARED_CACHE_MS) / 1000',
    default: '3600',
  },
  ZG_POST_COUNTS_CACHE_MS: {
    description:
      'how long each process reuses the like/favourite counts it read for feeds and details, and a written anonymous feed page or detail, 0 to 1000 (adds to how late a like shows there; 0 = read every time)',
    default: '200',
  },
  ZG_VIEW_FLUSH_ITEMS: { description: 'views a process buffers before publishing them', default: '1000' },
  ZG_VIEW_FLUSH_MS: {
    description: 'longest a view waits in the buffer before it is published',
    default: '200',
  },
  ZG_BODY_LIMIT_BYTES: {
    description: 'largest JSON body accepted (description/suggest takes at least room for a post body)',
    default: '1048576',
  },
  ZG_METRICS_TOKEN: {
    description:
      'when set, GET /metrics answers only requests with "Authorization: Bearer <token>" (401 otherwise); unset, anyone who reaches the port may read it',
    secret: true,
  },
  ZG_AVATAR_MAX_BYTES: { description: 'largest avatar upload accepted', default: '5242880' },
  ZG_SHUTDOWN_DRAIN_MS: {
    description:
      'on SIGTERM, how long a process keeps serving while /readyz answers 503 "draining", so load balancers stop sending it requests before it stops listening; default 5000 on cluster, 0 on embedded and for role worker (it serves no API)',
  },
  ZG_SHUTDOWN_TIMEOUT_MS: {
    description:
      'how long a graceful shutdown may take, after the drain, before the process exits anyway; requests still in flight after half of it have their connections closed',
    default: '10000',
  },
  ZG_RELATION_CHANGE_LIMIT: {
    description: 'follows plus unfollows one user may make per minute',
    default: '60',
  },
  ZG_RELATION_BIG_ACCOUNT_FOLLOWERS: {
    description: 'users with at least this many followers keep their first followers page in every process',
    default: '10000',
  },
  ZG_RELATION_FIRST_PAGE_CACHE_MS: {
    description:
      "how long a process keeps a big account's first followers page (changes are announced at once)",
    default: '5000',
  },
  ZG_RELATION_LIST_CACHE_TTL_MS: {
    description: 'how long a cached following or followers list lives after it was built',
    default: '3600000',
  },
  ZG_RELATION_LIST_CACHE_MAX: {
    description:
      'longest following or followers list kept in the list cache, 0 to 50000; longer ones page in the database',
    default: '5000',
  },
  ZG_RELATION_RECONCILE_MS: {
    description:
      "how often workers compare sampled users' relation counters, projection and list caches with the tables",
    default: '60000',
  },
  ZG_OUTBOX_POLL_MS: {
    description:
      'how often an idle outbox relay looks for new rows on its own (commits in any process also wake it at once)',
    default: '100',
  },
} satisfies Record<string, VarSpec>;

type VarName = keyof typeof CONFIG_VARS;

const PROXY_PRESETS = ['loopback', 'linklocal', 'uniquelocal'];

/** `false`, `true`, a hop count, or addresses, CIDRs and presets; anything else is a problem, not a guess. */
function parseTrustProxy(value: string, problems: string[]): boolean | number | string {
  const trimmed = value.trim();
  if (trimmed === 'false' || trimmed === '' || trimmed === '0') return false;
  if (trimmed === 'true') return true;
  if (/^\d+$/.test(trimmed)) {
    const hops = Number(trimmed);
    if (hops <= 16) return hops;
    problems.push(`ZG_TRUST_PROXY: a hop count must be from 0 to 16 (got ${trimmed})`);
    return false;
  }
  const entries = trimmed.split(',').map((e) => e.trim());
  for (const entry of entries) {
    const [address, bits, ...rest] = entry.split('/');
    const family = isIP(address ?? '');
    const validBits =
      bits === undefined || (/^\d{1,3}$/.test(bits) && Number(bits) <= (family === 6 ? 128 : 32));
    if (!PROXY_PRESETS.includes(entry) && (family === 0 || !validBits || rest.length > 0)) {
      problems.push(`ZG_TRUST_PROXY: "${entry}" is not an address, a CIDR or a preset`);
      return false;
    }
  }
  return entries.join(',');
}

/** `*`, or origins (scheme, host and port only, as browsers send them); anything else is a problem. */
function parseCorsOrigins(value: string, problems: string[]): true | string[] {
  const trimmed = value.trim();
  if (trimmed === '*') return true;
  const origins: string[] = [];
  for (const entry of trimmed.split(',').map((e) => e.trim())) {
    let origin: string | undefined;
    try {
      const parsed = new URL(entry);
      if ((parsed.protocol === 'http:' || parsed.protocol === 'https:') && parsed.origin === entry) {
        origin = parsed.origin;
      }
    } catch {
      // reported below
    }
    if (origin === undefined) {
      problems.push(
        `ZG_CORS_ORIGINS: "${entry}" is not an origin such as https://example.com (or * for any)`,
      );
      return true;
    }
    origins.push(origin);
  }
  return origins;
}

/**
 * Why a PEM cannot sign RS256 tokens (`private`), or have them checked against it (a public key, or
 * a private one's public half); undefined when it can.
 */
function rsaKeyProblem(pem: string, use: 'private' | 'public'): string | undefined {
  let key;
  try {
    key = use === 'private' ? createPrivateKey(pem) : createPublicKey(pem);
  } catch {
    return use === 'private'
      ? 'expected a PEM-encoded private key (PKCS#8 or PKCS#1, not encrypted)'
      : 'expected a PEM-encoded public or private key';
  }
  if (key.asymmetricKeyType !== 'rsa')
    return `expected an RSA key (got ${key.asymmetricKeyType ?? 'another kind'})`;
  const bits = key.asymmetricKeyDetails?.modulusLength ?? 0;
  if (bits < 2048) return `an RSA key of at least 2048 bits is needed for RS256 (got ${bits})`;
  return undefined;
}

const PEM_BLOCK = /-----BEGIN ([A-Z0-9 ]+)-----[\s\S]*?-----END \1-----/g;

/** The PEM blocks of `text` (keys given together in one setting, one after another). */
function pemBlocks(text: string): string[] {
  return [...text.matchAll(PEM_BLOCK)].map((m) => m[0]);
}

/** What `text` holds besides its PEM blocks, trimmed. */
function outsidePemBlocks(text: string): string {
  return text.replace(PEM_BLOCK, '').trim();
}

/**
 * The `ZG_`-prefixed variables of `env` this module does not read (with or without `_FILE`):
 * misspelt settings, which would otherwise leave their defaults in force without a word.
 */
export function unknownSettings(env: NodeJS.ProcessEnv): string[] {
  const known = new Set<string>(Object.keys(CONFIG_VARS));
  return Object.keys(env)
    .filter(
      (name) => name.startsWith('ZG_') && !known.has(name.replace(/_FILE$/, '')) && !TOOLING_VARS.test(name),
    )
    .sort();
}

/** Settings only the cluster profile reads: given without a profile, they were meant for one. */
const CLUSTER_SETTINGS: readonly VarName[] = [
  'ZG_MYSQL_URL',
  'ZG_REDIS_URL',
  'ZG_KAFKA_BROKERS',
  'ZG_S3_ENDPOINT',
  'ZG_S3_BUCKET',
  'ZG_S3_ACCESS_KEY_ID',
  'ZG_S3_SECRET_ACCESS_KEY',
];

/** Variables of the test rig and of scripts/ (the local Kafka broker and S3 server), not settings. */
const TOOLING_VARS =
  /^ZG_(TEST_\w+|S3MOCK_\w+|CACHE_DIR|MYSQL_ROOT_URL|KAFKA_(CONTROLLER_PORT|DIR|HEAP|JAVA_OPTS|PORT|START_TIMEOUT|STOP_TIMEOUT|VERSION))$/;

export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: { role?: string } = {}): Config {
  const problems: string[] = [];

  const raw = (name: VarName): string | undefined => {
    const fileVar = env[`${name}_FILE`];
    if (fileVar) {
      try {
        const value = readFileSync(fileVar, 'utf8').trim();
        // An empty secret file is a mistake, not a secret (an empty metrics token would open
        // /metrics to `Authorization: Bearer `).
        if (value === '') problems.push(`${name}_FILE: ${fileVar} is empty`);
        return value === '' ? undefined : value;
      } catch (err) {
        problems.push(`${name}_FILE: cannot read ${fileVar} (${(err as Error).message})`);
        return undefined;
      }
    }
    const value = env[name];
    if (value !== undefined && value.trim() !== '') return value.trim();
    const spec: VarSpec = CONFIG_VARS[name];
    return spec.default;
  };
  const oneOf = <T extends string>(name: VarName, allowed: readonly T[], value = raw(name)): T => {
    if (value !== undefined && (allowed as readonly string[]).includes(value)) return value as T;
    problems.push(`${name}: must be one of ${allowed.join(', ')} (got ${JSON.stringify(value)})`);
    return allowed[0] as T;
  };
  const redisPrefix = (): string => {
    const value = raw('ZG_REDIS_PREFIX') ?? 'zg:';
    if (/[{}]/.test(value)) {
      problems.push(`ZG_REDIS_PREFIX: must not contain "{" or "}" (got ${JSON.stringify(value)})`);
    }
    return value;
  };
  const int = (name: VarName, min: number, max: number): number => {
    const value = raw(name);
    // Decimal digits only: Number() would also take 0x1F90, 5e6, 1.0 or an empty string.
    const n = value !== undefined && /^-?\d{1,16}$/.test(value.trim()) ? Number(value) : Number.NaN;
    if (!Number.isInteger(n) || n < min || n > max) {
      problems.push(`${name}: must be an integer from ${min} to ${max} (got ${JSON.stringify(value)})`);
      return min;
    }
    return n;
  };
  const url = (name: VarName, protocols: string[], value = raw(name)): string | undefined => {
    if (value === undefined) return undefined;
    try {
      const parsed = new URL(value);
      if (!protocols.includes(parsed.protocol)) {
        problems.push(`${name}: protocol must be ${protocols.join(' or ')}`);
      }
    } catch {
      problems.push(`${name}: not a valid URL`);
    }
    return value;
  };

  const profile = oneOf<Profile>('ZG_PROFILE', ['embedded', 'cluster']);
  const role = oneOf<Role>('ZG_ROLE', ['api', 'worker', 'all'], overrides.role ?? raw('ZG_ROLE'));
  const port = int('PORT', 0, 65535);
  const host = raw('HOST') ?? '0.0.0.0';
  const publicUrl = url('ZG_PUBLIC_URL', ['http:', 'https:']) ?? `http://localhost:${port}`;
  if (URL.canParse(publicUrl)) {
    // Paths are appended to it, and links made from it are stored with users.
    const parsed = new URL(publicUrl);
    if (parsed.search || parsed.hash || parsed.username || parsed.password) {
      problems.push('ZG_PUBLIC_URL: a base URL without a query, a fragment or credentials');
    }
  }
  const logLevel = oneOf('LOG_LEVEL', ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']);
  const mysqlUrl = url('ZG_MYSQL_URL', ['mysql:', 'mariadb:']);
  const redisUrl = url('ZG_REDIS_URL', ['redis:', 'rediss:']);
  const kafkaBrokers = (raw('ZG_KAFKA_BROKERS') ?? '')
    .split(',')
    .map((b) => b.trim())
    .filter(Boolean);
  for (const broker of kafkaBrokers) {
    if (!/^[^:\s]+:\d{1,5}$/.test(broker)) problems.push(`ZG_KAFKA_BROKERS: "${broker}" is not host:port`);
  }
  if (profile === 'cluster') {
    if (!mysqlUrl) problems.push('ZG_MYSQL_URL: required on the cluster profile');
    if (!redisUrl) problems.push('ZG_REDIS_URL: required on the cluster profile');
    if (kafkaBrokers.length === 0) problems.push('ZG_KAFKA_BROKERS: required on the cluster profile');
  } else {
    if (role !== 'all') {
      // The event log, the outbox's wake-ups and the caches' invalidations live inside the process.
      problems.push('ZG_ROLE: the embedded profile runs every role in one process (all)');
    }
    // A cluster's settings with the profile left out (dropped from a manifest, say) would start a
    // server on a local SQLite file that takes sign-ups and loses them with its container.
    const given = (name: VarName) => Boolean(env[name]?.trim() || env[`${name}_FILE`]);
    const clusterOnly = CLUSTER_SETTINGS.filter(given);
    if (!given('ZG_PROFILE') && clusterOnly.length > 0) {
      problems.push(
        `ZG_PROFILE: not set, so embedded, which does not use ${clusterOnly.join(', ')}: ` +
          'set ZG_PROFILE=cluster, or ZG_PROFILE=embedded to ignore them',
      );
    }
  }
  const storageSigningKey = raw('ZG_STORAGE_SIGNING_KEY');
  if (storageSigningKey !== undefined && Buffer.byteLength(storageSigningKey) < 32) {
    problems.push('ZG_STORAGE_SIGNING_KEY: must be at least 32 characters');
  }
  const s3Bucket = raw('ZG_S3_BUCKET');
  const s3AccessKeyId = raw('ZG_S3_ACCESS_KEY_ID');
  const s3SecretAccessKey = raw('ZG_S3_SECRET_ACCESS_KEY');
  if (s3Bucket !== undefined && !/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/.test(s3Bucket)) {
    problems.push('ZG_S3_BUCKET: not a valid bucket name');
  }
  if (profile === 'cluster') {
    if (!s3Bucket) problems.push('ZG_S3_BUCKET: required on the cluster profile (uploaded files)');
    if (!s3AccessKeyId) problems.push('ZG_S3_ACCESS_KEY_ID: required on the cluster profile');
    if (!s3SecretAccessKey) problems.push('ZG_S3_SECRET_ACCESS_KEY: required on the cluster profile');
  }
  const smtpUrl = url('ZG_SMTP_URL', ['smtp:', 'smtps:']);
  if (smtpUrl !== undefined && URL.canParse(smtpUrl)) {
    const { search } = new URL(smtpUrl);
    if (search !== '' && search !== '?tls=optional')
      problems.push('ZG_SMTP_URL: the only query it takes is ?tls=optional');
  }
  const mailLog =
    oneOf(
      'ZG_MAIL_LOG_CODES',
      ['false', 'true'],
      raw('ZG_MAIL_LOG_CODES') ?? String(profile === 'embedded'),
    ) === 'true';
  if (!smtpUrl && !mailLog) {
    problems.push(
      profile === 'cluster'
        ? 'ZG_SMTP_URL: required on the cluster profile (verification mail), unless ZG_MAIL_LOG_CODES=true writes the codes to the log'
        : 'ZG_SMTP_URL: required when ZG_MAIL_LOG_CODES=false (e-mail codes must go somewhere)',
    );
  }
  const privateKeyPem = raw('ZG_JWT_PRIVATE_KEY')?.replace(/\\n/g, '\n');
  if (profile === 'cluster' && !privateKeyPem) {
    problems.push(
      'ZG_JWT_PRIVATE_KEY: required on the cluster profile (every API process must sign with the same key)',
    );
  }
  if (privateKeyPem) {
    const problem = rsaKeyProblem(privateKeyPem, 'private');
    if (problem) problems.push(`ZG_JWT_PRIVATE_KEY: ${problem}`);
  }
  const acceptedKeys = raw('ZG_JWT_ACCEPTED_KEYS')?.replace(/\\n/g, '\n');
  const acceptedKeyPems = acceptedKeys === undefined ? [] : pemBlocks(acceptedKeys);
  if (acceptedKeys !== undefined && acceptedKeyPems.length === 0)
    problems.push('ZG_JWT_ACCEPTED_KEYS: expected one or more PEM-encoded RSA keys');
  else if (acceptedKeys !== undefined && outsidePemBlocks(acceptedKeys) !== '')
    // A key cut short (no END line) would be left out without a word, and its tokens refused.
    problems.push(
      'ZG_JWT_ACCEPTED_KEYS: text outside the PEM blocks (a key cut short?): only keys, one after another',
    );
  for (const [i, pem] of acceptedKeyPems.entries()) {
    const problem = rsaKeyProblem(pem, 'public');
    if (problem) problems.push(`ZG_JWT_ACCEPTED_KEYS (key ${i + 1}): ${problem}`);
  }
  const kafkaPrefix = raw('ZG_KAFKA_PREFIX') ?? 'zg.';
  // Kafka names topics and groups with these characters only, in at most 249 of them.
  if (!/^[A-Za-z0-9._-]{0,180}$/.test(kafkaPrefix)) {
    problems.push('ZG_KAFKA_PREFIX: letters, digits, ".", "_" and "-" only, at most 180 of them');
  }

  const trustProxy = parseTrustProxy(raw('ZG_TRUST_PROXY') ?? 'false', problems);
  const corsOrigins = parseCorsOrigins(raw('ZG_CORS_ORIGINS') ?? '*', problems);

  const config: Config = {
    profile,
    role,
    host,
    port,
    publicUrl: publicUrl.replace(/\/+$/, ''),
    logLevel,
    dataDir: raw('ZG_DATA_DIR') ?? './data',
    mysqlUrl,
    mysqlTimeoutMs: int('ZG_MYSQL_TIMEOUT_MS', 0, 600_000),
    redisUrl,
    redisPrefix: redisPrefix(),
    redisCommandTimeoutMs: int('ZG_REDIS_COMMAND_TIMEOUT_MS', 0, 600_000),
    kafkaBrokers,
    kafkaPrefix,
    kafkaPartitions: int('ZG_KAFKA_PARTITIONS', 1, 1024),
    jwt: {
      privateKeyPem,
      acceptedKeyPems,
      keyId: raw('ZG_JWT_KID'),
      issuer: raw('ZG_JWT_ISSUER') ?? 'zhiguang',
      accessTtlSeconds: int('ZG_ACCESS_TOKEN_TTL', 60, 86_400),
      refreshTtlSeconds: int('ZG_REFRESH_TOKEN_TTL', 300, 90 * 86_400),
      refreshReuseGraceMs: int('ZG_REFRESH_REUSE_GRACE_MS', 0, 60_000),
    },
    sessionCheckCacheMs: int('ZG_SESSION_CHECK_CACHE_MS', 0, 60_000),
    passwordHashCost: int('ZG_PASSWORD_HASH_COST', 10, 20),
    smtp: { url: smtpUrl, from: raw('ZG_SMTP_FROM') ?? '', log: !smtpUrl },
    sms: {
      webhookUrl: url('ZG_SMS_WEBHOOK_URL', ['http:', 'https:']),
      webhookToken: raw('ZG_SMS_WEBHOOK_TOKEN'),
      log:
        oneOf(
          'ZG_SMS_LOG_CODES',
          ['false', 'true'],
          raw('ZG_SMS_LOG_CODES') ?? String(profile === 'embedded'),
        ) === 'true',
    },
    authLimits: {
      passwordPerIdentifier: int('ZG_AUTH_LOGIN_LIMIT', 1, 1_000_000),
      perIp: int('ZG_AUTH_IP_LIMIT', 1, 1_000_000_000),
      windowMs: 15 * 60_000,
    },
    loginAuditRetentionMs: int('ZG_LOGIN_AUDIT_DAYS', 1, 3650) * 86_400_000,
    counters: {
      groups: int('ZG_COUNTER_GROUPS', 1, 16_384),
      flushIntervalMs: int('ZG_COUNTER_FLUSH_MS', 10, 60_000),
      repairAfterMs: int('ZG_COUNTER_REPAIR_AFTER_MS', 100, 3_600_000),
      reconcileIntervalMs: int('ZG_COUNTER_RECONCILE_MS', 100, 86_400_000),
      togglesPerMinute: int('ZG_COUNTER_TOGGLE_LIMIT', 1, 1_000_000_000),
      autoReplay: oneOf('ZG_COUNTER_AUTO_REPLAY', ['true', 'false']) === 'true',
    },
    entityCacheMs: int('ZG_ENTITY_CACHE_MS', 0, 60_000),
    entityStaleIfErrorMs: int('ZG_ENTITY_STALE_IF_ERROR_MS', 0, 3_600_000),
    ai: {
      apiKey: raw('ZG_AI_API_KEY'),
      baseURL: url('ZG_AI_BASE_URL', ['http:', 'https:']) ?? 'https://api.deepseek.com',
      model: raw('ZG_AI_MODEL') ?? 'deepseek-chat',
      timeoutMs: int('ZG_AI_TIMEOUT_MS', 500, 60_000),
      maxRetries: int('ZG_AI_MAX_RETRIES', 0, 5),
      perUserPerMinute: int('ZG_AI_RATE_LIMIT', 1, 10_000),
      perUserPerDay: int('ZG_AI_DAILY_LIMIT', 1, 1_000_000),
    },
    storageSigningKey,
    s3: {
      endpoint: url('ZG_S3_ENDPOINT', ['http:', 'https:']),
      region: raw('ZG_S3_REGION') ?? 'us-east-1',
      bucket: s3Bucket,
      accessKeyId: s3AccessKeyId,
      secretAccessKey: s3SecretAccessKey,
      forcePathStyle: oneOf('ZG_S3_FORCE_PATH_STYLE', ['false', 'true']) === 'true',
      publicUrl: url('ZG_S3_PUBLIC_URL', ['http:', 'https:']),
    },
    nodeId: int('ZG_NODE_ID', 0, MAX_WORKER_ID),
    posts: {
      contentMaxBytes: int('ZG_POST_CONTENT_MAX_BYTES', 1024, 64 * 1024 * 1024),
      imageMaxBytes: int('ZG_POST_IMAGE_MAX_BYTES', 1024, 64 * 1024 * 1024),
      presignExpiresSeconds: int('ZG_PRESIGN_EXPIRES_SECONDS', 60, 7 * 24 * 3600),
      uploadRetentionMs: int('ZG_UPLOAD_RETENTION_HOURS', 1, 90 * 24) * 3_600_000,
    },
    postReads: {
      localCacheMs: int('ZG_POST_CACHE_MS', 0, 60_000),
      localCacheEntries: int('ZG_POST_CACHE_ENTRIES', 0, 10_000_000),
      sharedCacheMs: int('ZG_POST_SHARED_CACHE_MS', 100, 24 * 3600_000),
      urlTtlSeconds: int('ZG_POST_URL_TTL_SECONDS', 60, 7 * 24 * 3600),
      countsCacheMs: int('ZG_POST_COUNTS_CACHE_MS', 0, 1_000),
    },
    views: {
      flushItems: int('ZG_VIEW_FLUSH_ITEMS', 1, 1_000_000),
      flushMs: int('ZG_VIEW_FLUSH_MS', 10, 60_000),
    },
    bodyLimitBytes: int('ZG_BODY_LIMIT_BYTES', 1024, 64 * 1024 * 1024),
    metricsToken: raw('ZG_METRICS_TOKEN'),
    trustProxy,
    corsOrigins,
    avatarMaxBytes: int('ZG_AVATAR_MAX_BYTES', 1024, 64 * 1024 * 1024),
    shutdownTimeoutMs: int('ZG_SHUTDOWN_TIMEOUT_MS', 100, 600_000),
    shutdownDrainMs:
      raw('ZG_SHUTDOWN_DRAIN_MS') === undefined
        ? profile === 'cluster' && role !== 'worker'
          ? 5_000
          : 0
        : int('ZG_SHUTDOWN_DRAIN_MS', 0, 600_000),
    relations: {
      changesPerMinute: int('ZG_RELATION_CHANGE_LIMIT', 1, 1_000_000),
      bigAccountFollowers: int('ZG_RELATION_BIG_ACCOUNT_FOLLOWERS', 1, 1_000_000_000),
      firstPageCacheMs: int('ZG_RELATION_FIRST_PAGE_CACHE_MS', 0, 3_600_000),
      listCacheTtlMs: int('ZG_RELATION_LIST_CACHE_TTL_MS', 1_000, 7 * 86_400_000),
      listCacheMaxEntries: int('ZG_RELATION_LIST_CACHE_MAX', 0, 50_000),
      outboxPollMs: int('ZG_OUTBOX_POLL_MS', 10, 600_000),
      reconcileIntervalMs: int('ZG_RELATION_RECONCILE_MS', 100, 86_400_000),
    },
  };
  const reads = config.postReads;
  if (reads.urlTtlSeconds * 1000 < 2 * (reads.localCacheMs + reads.sharedCacheMs)) {
    problems.push(
      'ZG_POST_URL_TTL_SECONDS: must be at least twice ZG_POST_CACHE_MS + ZG_POST_SHARED_CACHE_MS (cached posts carry these URLs)',
    );
  }
  if (problems.length > 0) throw new ConfigError(problems);
  return config;
}
