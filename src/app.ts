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

  await http.register(opsRoutes(metrics, platform.readiness, () => draining));
  if (config.role !== 'worker') {
    await http.register(authRoutes({ auth, users, guards, jwks: [signingKey.publicJwk] }));
    await http.register(profileRoutes({ profiles, guards, avatarMaxBytes: config.avatarMaxBytes }));
    await http.register(filesRoutes(platform.storage));
  }

  const relay = new OutboxRelay({
    store: platform.outboxStore,
    events: platform.events,
    onError: (err) => log.warn({ err }, 'outbox relay: publish failed, will retry'),
  });
  const workers = config.role === 'api' ? [] : [relay];

  return {
    config,
    http,
    platform,
    log,
    async start() {
      const address = await http.listen({ host: config.host, port: config.port });
      for (const worker of workers) worker.start();
      log.info({ address, profile: config.profile, role: config.role }, 'zhiguang started');
      return address;
    },
    async close() {
      draining = true;
      await http.close();
      for (const worker of workers) await worker.stop();
      await platform.close();
    },
  };
}
