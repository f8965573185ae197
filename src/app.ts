import { readFileSync } from 'node:fs';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { AuthService } from './auth/auth.service.js';
import { authRoutes } from './auth/auth.routes.js';
import { installAuthGuards } from './auth/auth.guard.js';
import { Authenticator } from './auth/authenticator.js';
import { signingKeyFromPem } from './auth/keys.js';
import { LoginAuditRepository } from './auth/login-audit.repository.js';
import { PasswordHasher } from './auth/passwords.js';
import { SessionStore } from './auth/sessions.js';
import { TokenSigner } from './auth/tokens.js';
import { VerificationService } from './auth/verification.js';
import type { Config } from './platform/config/config.js';
import { createHttpServer } from './platform/http/server.js';
import { opsRoutes } from './platform/http/ops.routes.js';
import { createLogger } from './platform/logging/logger.js';
import { Metrics } from './platform/metrics/metrics.js';
import { OutboxRelay } from './platform/outbox/relay.js';
import { DEFAULT_AVATAR_PATH, filesRoutes } from './platform/storage/files.routes.js';
import { createPlatform, type Platform } from './platform/wiring.js';
import { ProfileService } from './profile/profile.service.js';
import { profileRoutes } from './profile/profile.routes.js';
import { UsersRepository } from './profile/users.repository.js';
import { CounterAggregator } from './counter/aggregator.js';
import { CounterMetrics } from './counter/counter.metrics.js';
import { counterRoutes } from './counter/counter.routes.js';
import { CounterService } from './counter/counter.service.js';
import { CachedEntityDirectory } from './counter/entity-directory.js';
import { CounterEventPublisher } from './counter/event-publisher.js';
import { CounterReconciler, flushPending, repairUnpublished } from './counter/maintenance.js';
import { COUNTER_TOPIC } from './counter/model.js';
import { KnowpostVisibilityRepository } from './knowpost/visibility.repository.js';
import { createDescriptionSuggester } from './knowpost/description/create.js';
import { descriptionRoutes } from './knowpost/description.routes.js';
import { PeriodicTask } from './platform/workers/periodic.js';

export interface App {
  config: Config;
  http: FastifyInstance;
  platform: Platform;
  log: Logger;
  /** Binds the HTTP server (every role serves /healthz, /readyz and /metrics) and starts the workers of the role. */
  start(): Promise<string>;
  /** Graceful: stop accepting, finish in-flight requests, drain workers, close connections. */
  close(): Promise<void>;
}

export interface BuildOptions {
  logger?: Logger;
  now?: () => number;
}

const version = (
  JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }
).version;

/** Wires the whole service for `config`: ports from the platform, services with only what they use, routes. */
export async function buildApp(config: Config, options: BuildOptions = {}): Promise<App> {
  const log = options.logger ?? createLogger(config.logLevel);
  const now = options.now ?? Date.now;
  const platform = await createPlatform(config, log);
  const metrics = new Metrics();
  let draining = false;

  const http = await createHttpServer({
    logger: log,
    metrics,
    bodyLimitBytes: config.bodyLimitBytes,
    uploadLimitBytes: config.avatarMaxBytes,
    version,
  });

  const users = new UsersRepository(platform.db);
  const signingKey = await signingKeyFromPem(platform.signingKeyPem, config.jwt.keyId);
  const signer = new TokenSigner(
    signingKey,
    config.jwt.issuer,
    { access: config.jwt.accessTtlSeconds, refresh: config.jwt.refreshTtlSeconds },
    now,
  );
  const sessions = new SessionStore(platform.kv, config.jwt.refreshTtlSeconds * 1000);
  const authenticator = new Authenticator(signer, sessions, config.sessionCheckCacheMs, 50_000, now);
  const guards = installAuthGuards(http, authenticator);
  const auth = new AuthService(
    users,
    new LoginAuditRepository(platform.db, now),
    new VerificationService(platform.kv, platform.codeSender, now),
    new PasswordHasher(config.passwordHashCost),
    signer,
    sessions,
    authenticator,
    platform.limiter,
    config.authLimits,
    `${config.publicUrl}${DEFAULT_AVATAR_PATH}`,
    now,
  );
  const profiles = new ProfileService(users, platform.storage, config.avatarMaxBytes, now);

  const counterMetrics = new CounterMetrics(metrics.registry);
  const visibility = new KnowpostVisibilityRepository(platform.db);
  const directory = new CachedEntityDirectory(
    (refs) => visibility.load(refs),
    config.entityCacheMs,
    100_000,
    now,
  );
  const publisher = new CounterEventPublisher(platform.events, platform.counterStore, {
    onPublished: (n) => counterMetrics.eventsPublished.inc(n),
    onFailed: (n, err) => {
      counterMetrics.eventsPublishFailed.inc(n);
      log.warn({ err, events: n }, 'counter events not published yet; will retry, then repair from facts');
    },
  });
  const counters = new CounterService(platform.counterStore, directory, publisher, counterMetrics, now);

  await http.register(opsRoutes(metrics, platform.readiness, () => draining));
  if (config.role !== 'worker') {
    await http.register(authRoutes({ auth, users, guards, jwks: [signingKey.publicJwk] }));
    await http.register(profileRoutes({ profiles, guards, avatarMaxBytes: config.avatarMaxBytes }));
    await http.register(filesRoutes(platform.storage));
    await http.register(counterRoutes({ counters, guards }));
    await http.register(
      descriptionRoutes({
        describer: createDescriptionSuggester(config.ai, log.child({ module: 'knowpost-description' })),
        guards,
        limiter: platform.limiter,
        perUserPerMinute: config.ai.perUserPerMinute,
      }),
    );
  }

  const workerError = (name: string, err: unknown) =>
    log.warn({ err, worker: name }, 'background work failed; will retry');
  const relay = new OutboxRelay({
    store: platform.outboxStore,
    events: platform.events,
    onError: (err) => workerError('outbox-relay', err),
  });
  const reconciler = new CounterReconciler(platform.counterStore, counterMetrics);
  const aggregator = new CounterAggregator(
    platform.events,
    platform.counterStore,
    counterMetrics,
    (err) => workerError('counter-agg', err),
    {
      maxBatch: 5000,
      maxWaitMs: 50,
      onApplied: (events) => reconciler.touched(events),
    },
  );
  const periodic = [
    new PeriodicTask(
      'counter-flush',
      config.counters.flushIntervalMs,
      () => flushPending(platform.counterStore, counterMetrics),
      workerError,
    ),
    new PeriodicTask(
      'counter-repair',
      Math.max(100, Math.floor(config.counters.repairAfterMs / 3)),
      () => repairUnpublished(platform.counterStore, counterMetrics, now(), config.counters.repairAfterMs),
      workerError,
    ),
    new PeriodicTask(
      'counter-reconcile',
      config.counters.reconcileIntervalMs,
      () => reconciler.runOnce(),
      workerError,
    ),
  ];
  const workers: { start(): void | Promise<void>; stop(): Promise<void> }[] =
    config.role === 'api' ? [] : [relay, aggregator, ...periodic];

  return {
    config,
    http,
    platform,
    log,
    async start() {
      await platform.events.ensureTopics([COUNTER_TOPIC]);
      const address = await http.listen({ host: config.host, port: config.port });
      for (const worker of workers) await worker.start();
      log.info({ address, profile: config.profile, role: config.role }, 'zhiguang started');
      return address;
    },
    async close() {
      draining = true;
      await http.close();
      await publisher.close();
      for (const worker of workers) await worker.stop();
      await platform.close();
    },
  };
}
