import { createHash, createPrivateKey } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import type { FastifyInstance } from 'fastify';
import type { Logger } from 'pino';
import { AuthService } from './auth/auth.service.js';
import { authRoutes } from './auth/auth.routes.js';
import { installAuthGuards } from './auth/auth.guard.js';
import { Authenticator } from './auth/authenticator.js';
import { signingKeyFromPem, verificationKeyFromPem } from './auth/keys.js';
import { LoginAuditRepository, loginAuditDeletedCounter } from './auth/login-audit.repository.js';
import { PasswordHasher } from './auth/passwords.js';
import { SessionStore } from './auth/sessions.js';
import { TokenSigner } from './auth/tokens.js';
import { VerificationService } from './auth/verification.js';
import type { Config } from './platform/config/config.js';
import { UnavailableError } from './platform/errors/errors.js';
import { closeWithin, createHttpServer } from './platform/http/server.js';
import { opsRoutes } from './platform/http/ops.routes.js';
import { createLogger } from './platform/logging/logger.js';
import { damped } from './platform/logging/damper.js';
import { Metrics } from './platform/metrics/metrics.js';
import { OutboxRelay } from './platform/outbox/relay.js';
import { OutboxWakeSender, wakeOnAnnouncements } from './platform/outbox/wake.js';
import { DEFAULT_AVATAR_PATH, filesRoutes } from './platform/storage/files.routes.js';
import { createPlatform, type Platform } from './platform/wiring.js';
import { ProfileService } from './profile/profile.service.js';
import { profileRoutes } from './profile/profile.routes.js';
import { UsersRepository } from './profile/users.repository.js';
import { CounterAggregator } from './counter/aggregator.js';
import { CounterMetrics } from './counter/counter.metrics.js';
import { OutboxMetrics } from './platform/outbox/outbox.metrics.js';
import { MemoryRateLimiter } from './platform/ratelimit/memory-ratelimit.js';
import { recentCounts } from './counter/recent-counts.js';
import { counterRoutes } from './counter/counter.routes.js';
import { CounterService } from './counter/counter.service.js';
import { CachedEntityDirectory } from './counter/entity-directory.js';
import { CounterEventPublisher } from './counter/event-publisher.js';
import { CounterReconciler, flushPending, repairUnpublished } from './counter/maintenance.js';
import { COUNTER_TOPIC, type EntityRef } from './counter/model.js';
import { CounterRestorer } from './counter/restore.js';
import { KnowpostVisibilityRepository } from './knowpost/visibility.repository.js';
import { createDescriptionSuggester } from './knowpost/description/create.js';
import { descriptionRoutes } from './knowpost/description.routes.js';
import { PostCacheConsumer } from './knowpost/post-cache-consumer.js';
import { PostObjectPurger, postObjectsRemovedCounter } from './knowpost/post-purge.js';
import { PostUploadSweeper } from './knowpost/post-sweep.js';
import { POST_TOPIC, type PostChangeListener } from './knowpost/post-events.js';
import { PostRepository } from './knowpost/post.repository.js';
import { postRoutes, presignRoutes } from './knowpost/post.routes.js';
import { PostService } from './knowpost/post.service.js';
import { DetailService } from './knowpost/detail.service.js';
import { detailRoutes } from './knowpost/detail.routes.js';
import { FeedService, type PostInteractions } from './knowpost/feed.service.js';
import { feedRoutes } from './knowpost/feed.routes.js';
import {
  PostCache,
  POST_INVALIDATION_SCOPE,
  postCacheInvalidator,
  subscribePostCache,
} from './knowpost/post-cache.js';
import { PostUrlSigner } from './knowpost/post-read.model.js';
import { PostReadRepository } from './knowpost/post-read.repository.js';
import {
  counterRestoreParts,
  VIEW_TOPIC,
  ViewAggregator,
  ViewMetrics,
  ViewRecorder,
} from './knowpost/views.js';
import { OutboxWriter } from './platform/outbox/outbox.js';
import { SnowflakeGenerator } from './platform/ids/snowflake.js';
import { PeriodicTask } from './platform/workers/periodic.js';
import { createUserCounters, forgetEarlierPostCounts } from './user-counter/user-counters.js';
import { userCounterRoutes } from './user-counter/user-counter.routes.js';
import { RelationRepository } from './relation/relation.repository.js';
import { RelationMetrics } from './relation/relation.metrics.js';
import { HOLE_WAIT_MS, LikesReceivedConsumer, LikesReceivedRepository } from './relation/likes-received.js';
import { relationUserCountParts } from './relation/user-count-parts.js';
import { createRelations } from './relation/relations.js';
import { relationRoutes } from './relation/relation.routes.js';

export interface App {
  config: Config;
  http: FastifyInstance;
  platform: Platform;
  log: Logger;
  /** Binds the HTTP server (every role serves /healthz, /readyz and /metrics) and starts the workers of the role. */
  start(): Promise<string>;
  /** Readiness answers "draining" from now on (so load balancers stop routing here); requests are still served. */
  drain(): void;
  /** Graceful: stop accepting, finish in-flight requests, drain workers, close connections. */
  close(): Promise<void>;
}

/**
 * The wait between two attempts to start the event log's consumers while it is out of reach: as a
 * lost broker is retried, at least every second, so counting resumes within seconds of its return.
 */
const CONSUMER_START_RETRY_MS = 1_000;
/** Longest a graceful stop of the embedded profile waits for its events to settle (see `settle`). */
const SETTLE_MAX_MS = 5_000;
/** The pause between two looks at whether they have. */
const SETTLE_POLL_MS = 10;
/**
 * How often a worker looks at whether the counter store needs restoring (`CounterRestorer`): a look
 * is one pipeline of HEXISTS, and likes are refused until the replay it starts is done.
 */
const RESTORE_CHECK_MS = 1_000;

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
  const platform = await createPlatform(config, log, { serves: true });
  const metrics = new Metrics();
  let draining = false;

  const http = await createHttpServer({
    logger: log,
    metrics,
    bodyLimitBytes: config.bodyLimitBytes,
    trustProxy: config.trustProxy,
    corsOrigins: config.corsOrigins,
    uploadLimitBytes: config.avatarMaxBytes,
    version,
    docs: config.role !== 'worker',
  });

  const users = new UsersRepository(platform.db);
  const signingKey = await signingKeyFromPem(platform.signingKeyPem, config.jwt.keyId);
  // The signing key given again, or a key given twice, is published once.
  const acceptedKeys = (await Promise.all(config.jwt.acceptedKeyPems.map(verificationKeyFromPem))).filter(
    (k, i, all) => !signingKey.publicKey.equals(k.publicKey) && all.findIndex((o) => o.kid === k.kid) === i,
  );
  const signer = new TokenSigner(
    signingKey,
    config.jwt.issuer,
    { access: config.jwt.accessTtlSeconds, refresh: config.jwt.refreshTtlSeconds },
    now,
    acceptedKeys,
  );
  const sessions = new SessionStore(
    platform.kv,
    config.jwt.refreshTtlSeconds * 1000,
    config.jwt.refreshReuseGraceMs,
    now,
  );
  const authenticator = new Authenticator(signer, sessions, config.sessionCheckCacheMs, 50_000, now);
  const guards = installAuthGuards(http, authenticator);
  const loginAudit = new LoginAuditRepository(platform.db, now);
  const auth = new AuthService(
    users,
    loginAudit,
    new VerificationService(platform.kv, platform.codeSender, now),
    new PasswordHasher(config.passwordHashCost),
    signer,
    sessions,
    authenticator,
    platform.limiter,
    platform.kv,
    config.authLimits,
    `${config.publicUrl}${DEFAULT_AVATAR_PATH}`,
    // From the key itself, not its text: processes given the same key written differently agree.
    createHash('sha256')
      .update('zhiguang refresh answers\0')
      .update(createPrivateKey(platform.signingKeyPem).export({ type: 'pkcs8', format: 'der' }))
      .digest(),
    now,
    log.child({ module: 'auth' }),
  );
  const profiles = new ProfileService(
    users,
    platform.storage,
    config.avatarMaxBytes,
    platform.limiter,
    log.child({ module: 'profile' }),
    now,
  );

  const counterMetrics = new CounterMetrics(metrics.registry);
  const visibility = new KnowpostVisibilityRepository(platform.db);
  // Serving from past its cache time is worth a line per minute: the database is away.
  const staleVisibilityWarning = damped(60_000);
  const directory = new CachedEntityDirectory(
    (refs) => visibility.load(refs),
    config.entityCacheMs,
    100_000,
    now,
    {
      staleIfErrorMs: config.entityStaleIfErrorMs,
      onStale: () => {
        counterMetrics.staleVisibility.inc();
        staleVisibilityWarning((heldBack) =>
          log.warn(
            { heldBack },
            'database out of reach: likes and counts are served on post visibility cached before',
          ),
        );
      },
    },
  );
  const publisher = new CounterEventPublisher(platform.events, platform.counterStore, {
    onPublished: (n) => counterMetrics.eventsPublished.inc(n),
    onFailed: (n, err) => {
      counterMetrics.eventsPublishFailed.inc(n);
      log.warn({ err, events: n }, 'counter events not published yet; will retry, then repair');
    },
    onDropped: (n) => counterMetrics.eventsDropped.inc(n),
    onMarkFailed: (n, err) =>
      log.warn({ err, events: n }, 'counter events published, but their records stay until the repair job'),
  });
  counterMetrics.buffered = () => publisher.buffered;
  // Counted in memory: a shared limiter would add a round trip to every like.
  const counters = new CounterService(platform.counterStore, directory, publisher, counterMetrics, now, {
    limiter: new MemoryRateLimiter({ now }),
    perMinute: config.counters.togglesPerMinute,
  });

  // After a commit that wrote outbox rows: the relay of this process starts a round at once; a
  // process without a relay (the api role) tells the relays of worker processes through the bus.
  // Every announcement fails alike while Redis is away: one line per 5 s is enough.
  const outboxWakeWarning = damped(5_000);
  const outboxWake = new OutboxWakeSender(platform.invalidation, (err) =>
    outboxWakeWarning((heldBack) =>
      log.warn({ err, heldBack }, 'could not announce outbox rows; relays find them at their next poll'),
    ),
  );
  const outboxCommitted = (): void => (config.role === 'api' ? outboxWake.committed() : relay.notify());

  // Told after every committed post change (this process only); caches of posts add themselves here.
  const postListeners: PostChangeListener[] = [
    (change) => directory.forget({ etype: 'knowpost', eid: change.id }),
    // Publishing, deleting a published post, a visibility change of one that is not a draft and a
    // new body or new pictures of a published one (announced as `updated`, as other edits are: a
    // wake for nothing costs a relay one look) append a post event.
    (change) => {
      if (change.draft) return;
      if (
        change.kind === 'published' ||
        change.kind === 'deleted' ||
        change.kind === 'visibility' ||
        change.kind === 'updated'
      )
        outboxCommitted();
    },
  ];
  const postRepo = new PostRepository(platform.db);
  const posts = new PostService({
    posts: postRepo,
    storage: platform.storage,
    limiter: platform.limiter,
    outbox: new OutboxWriter(now),
    ids: new SnowflakeGenerator(config.nodeId, now),
    limits: config.posts,
    onChange: postListeners,
    log: log.child({ module: 'knowpost' }),
    now,
  });

  // Read side of posts: caches in every process kept in step through the invalidation bus.
  const postReads = new PostReadRepository(platform.db);
  const sharedCacheWarning = damped(5_000);
  const postCache = new PostCache({
    repo: postReads,
    signer: new PostUrlSigner(platform.storage, config.postReads.urlTtlSeconds, now),
    shared: platform.sharedCache,
    localTtlMs: config.postReads.localCacheMs,
    localMaxEntries: config.postReads.localCacheEntries,
    sharedTtlMs: config.postReads.sharedCacheMs,
    staleIfErrorMs: config.entityStaleIfErrorMs,
    // Every read fails alike while Redis is away: one line per 5 s is enough.
    onError: (err) =>
      sharedCacheWarning((heldBack) =>
        log.warn({ err, heldBack }, 'shared post cache unavailable; reading the database'),
      ),
    now,
  });
  subscribePostCache(postCache, platform.invalidation);
  platform.invalidation.subscribe(POST_INVALIDATION_SCOPE, (ids) => {
    for (const eid of ids) directory.forget({ etype: 'knowpost', eid });
  });
  // Back on the bus after a disconnection: any post may have changed meanwhile.
  platform.invalidation.onGap(() => directory.forgetAll());
  postListeners.push(
    postCacheInvalidator(postCache, platform.invalidation, (err) =>
      log.warn(
        { err },
        'post change not announced to every process; the post-cache worker repeats publishes, deletes and visibility changes, other edits show once caches expire',
      ),
    ),
  );
  // Feeds and details reuse counts briefly; the count routes read them live (so their reads heal).
  const interactions: PostInteractions = {
    counts: recentCounts((refs) => counters.snapshots(refs), {
      ttlMs: config.postReads.countsCacheMs,
      maxEntries: config.postReads.localCacheEntries,
      now,
    }),
    flags: (userId, refs) => platform.counterStore.flags(userId, refs),
  };
  const viewMetrics = new ViewMetrics(metrics.registry);
  const viewsWarning = damped(5_000);
  const views = new ViewRecorder(platform.events, viewMetrics, {
    maxItems: config.views.flushItems,
    flushMs: config.views.flushMs,
    // Every record fails alike while Kafka is away: one line per 5 s is enough.
    onError: (err) =>
      viewsWarning((heldBack) => log.warn({ err, heldBack }, 'views not published yet; will retry')),
  });
  // Anonymous feed and detail answers live as long as cached counts do, so counts show no later
  // than elsewhere; at most 16 and 32 MiB of them (a 50-post page is about 100 kB, a detail a few).
  const anonymousAnswers = (maxEntries: number, maxBytes: number) => ({
    ttlMs: config.postReads.countsCacheMs,
    maxEntries,
    maxBytes,
    counts: (refs: readonly EntityRef[]) => counters.snapshots(refs),
    now,
  });
  const feeds = new FeedService(
    postCache,
    postReads,
    interactions,
    anonymousAnswers(1_000, 16 * 1024 * 1024),
  );
  const details = new DetailService(
    postCache,
    interactions,
    views,
    anonymousAnswers(5_000, 32 * 1024 * 1024),
  );

  const relationMetrics = new RelationMetrics(metrics.registry);
  const relationRepo = new RelationRepository(
    platform.db,
    new OutboxWriter(now),
    (changes) => relationMetrics.commitBatch.observe(changes),
    config.mysqlTimeoutMs,
  );
  const userCounters = createUserCounters({
    db: platform.db,
    store: platform.userCounterStore,
    events: platform.events,
    registry: metrics.registry,
    log,
    reconcileIntervalMs: config.counters.reconcileIntervalMs,
    parts: relationUserCountParts(platform.db, platform.counterStore),
    now,
  });
  await forgetEarlierPostCounts(platform.kv, platform.userCounterStore, log);
  const relations = createRelations({
    repo: relationRepo,
    metrics: relationMetrics,
    users,
    limiter: platform.limiter,
    lists: platform.relationLists,
    events: platform.events,
    bus: platform.invalidation,
    userCounterStore: platform.userCounterStore,
    userCounters: userCounters.service,
    registry: metrics.registry,
    log,
    config: config.relations,
    onCommitted: outboxCommitted,
    now,
  });

  // A process that serves the API rides out a Kafka outage (toggles wait in the counter store for
  // the repair, views are retried, follows wait in the outbox): Kafka down leaves it in rotation.
  // So does the database out of reach: every process shares it, so taking them all out of rotation
  // would end what is still served (likes and counts of posts read recently, posts from the shared
  // cache), and what needs it answers 503 at once.
  // A worker is ready once its consumers read the event log (they start late when it was out of
  // reach at start, and never when something else keeps them from joining their groups).
  let consumersStarted = false;
  await http.register(
    opsRoutes(
      metrics,
      {
        ...platform.readiness,
        consumers: async () => consumersStarted,
        // Down while likes and favourites are refused until a counters replay: the process serves
        // all else, so it stays in rotation (degraded), and tells why.
        // Unknown (Redis out of reach or not answering within the round, which its own check
        // reports) is not taken for a restore.
        counters: async () =>
          !(await Promise.race([
            platform.counterStore.restoring().catch(() => false),
            sleep(500, false, { ref: false }),
          ])),
      },
      () => draining,
      config.metricsToken,
      new Set(config.role === 'worker' ? ['counters'] : ['kafka', 'consumers', 'counters', 'database']),
    ),
  );
  if (config.role !== 'worker') {
    await http.register(
      authRoutes({
        auth,
        users,
        guards,
        jwks: [signingKey.publicJwk, ...acceptedKeys.map((k) => k.publicJwk)],
      }),
    );
    await http.register(profileRoutes({ profiles, guards, avatarMaxBytes: config.avatarMaxBytes }));
    await http.register(filesRoutes(platform.storage));
    await http.register(counterRoutes({ counters, guards }));
    await http.register(userCounterRoutes({ counters: userCounters.service, guards }));
    await http.register(relationRoutes({ relations: relations.service, guards }));
    await http.register(postRoutes({ posts, guards }));
    await http.register(presignRoutes({ posts, guards }));
    await http.register(feedRoutes({ feeds, guards }));
    await http.register(detailRoutes({ details, guards }));
    await http.register(
      descriptionRoutes({
        describer: createDescriptionSuggester(config.ai, log.child({ module: 'knowpost-description' })),
        guards,
        limiter: platform.limiter,
        perUserPerMinute: config.ai.perUserPerMinute,
        perUserPerDay: config.ai.perUserPerDay,
        maxBodyBytes: Math.max(config.bodyLimitBytes, 2 * config.posts.contentMaxBytes),
      }),
    );
  }

  const workerError = (name: string, err: unknown) =>
    log.warn({ err, worker: name }, 'background work failed; will retry');
  const outboxMetrics = new OutboxMetrics(metrics.registry);
  const relay = new OutboxRelay({
    store: platform.outboxStore,
    events: platform.events,
    // Woken at once by commits in this process or, through the bus, in API processes; the poll
    // covers a lost announcement.
    pollIntervalMs: config.relations.outboxPollMs,
    // Short back-off so the backlog goes out within seconds of the broker coming back.
    retryBackoffMs: { min: 200, max: 2_000 },
    onError: (err) => {
      outboxMetrics.failedRounds.inc();
      workerError('outbox-relay', err);
    },
    onPublished: (count, oldestAgeMs) => outboxMetrics.round(count, oldestAgeMs),
  });
  if (config.role !== 'api') wakeOnAnnouncements(platform.invalidation, relay);
  const reconciler = new CounterReconciler(platform.counterStore, counterMetrics);
  const aggregator = new CounterAggregator(
    platform.events,
    platform.counterStore,
    counterMetrics,
    (err) => workerError('counter-agg', err),
    {
      maxBatch: 20_000,
      maxWaitMs: 50,
      onApplied: (events) => reconciler.touched(events),
    },
  );
  const purger = new PostObjectPurger(postRepo, platform.storage, {
    // Past the last upload URL handed out before the deletion.
    graceMs: config.posts.presignExpiresSeconds * 1000 + 60_000,
    onError: (err, postId) => log.warn({ err, post: postId }, 'could not remove a deleted post’s objects'),
    now,
  });
  const objectsRemoved = postObjectsRemovedCounter(metrics.registry);
  const auditRowsDeleted = loginAuditDeletedCounter(metrics.registry);
  const sweeper = new PostUploadSweeper(postRepo, platform.storage, {
    retentionMs: config.posts.uploadRetentionMs,
    maxBytes: { content: config.posts.contentMaxBytes, image: config.posts.imageMaxBytes },
    onError: (err, postId) => log.warn({ err, post: postId }, 'could not check a post’s unused objects'),
    now,
  });
  const periodic = [
    new PeriodicTask(
      'counter-flush',
      config.counters.flushIntervalMs,
      () => flushPending(platform.counterStore, counterMetrics),
      workerError,
      { fixedRate: true },
    ),
    new PeriodicTask(
      'counter-repair',
      Math.max(100, Math.floor(config.counters.repairAfterMs / 3)),
      () =>
        repairUnpublished(
          platform.counterStore,
          platform.events,
          counterMetrics,
          now(),
          config.counters.repairAfterMs,
        ),
      workerError,
    ),
    new PeriodicTask(
      'post-purge',
      60_000,
      async (signal) => objectsRemoved.inc({ task: 'purge' }, (await purger.runOnce(signal)).objects),
      workerError,
    ),
    new PeriodicTask(
      'post-sweep',
      60_000,
      async (signal) => objectsRemoved.inc({ task: 'sweep' }, (await sweeper.runOnce(signal)).objects),
      workerError,
    ),
    new PeriodicTask(
      'login-audit-prune',
      600_000,
      async (signal) => {
        const rows = await loginAudit.deleteBefore(now() - config.loginAuditRetentionMs, { signal });
        if (rows > 0) auditRowsDeleted.inc(rows);
      },
      workerError,
    ),
    new PeriodicTask(
      'counter-reconcile',
      config.counters.reconcileIntervalMs,
      async () => {
        const round = await reconciler.runOnce();
        if (round.drifted > 0) log.warn(round, 'counter drift found and healed');
      },
      workerError,
    ),
  ];
  // Heals a counter store that lost its facts (or a replay that stopped half-way) by replaying the log.
  const restorer = config.counters.autoReplay
    ? new CounterRestorer(counterRestoreParts(platform), log, RESTORE_CHECK_MS)
    : undefined;
  // Refused while the counter store is restored (each batch again, about once a second): said once a minute.
  let viewsWaitTold = Number.NEGATIVE_INFINITY;
  const viewAggregator = new ViewAggregator(platform.events, platform.counterStore, viewMetrics, (err) => {
    if (!(err instanceof UnavailableError)) return workerError('view-agg', err);
    if (performance.now() - viewsWaitTold < 60_000) return;
    viewsWaitTold = performance.now();
    log.warn({ err }, 'views wait while the counter store is restored; they are added once it is whole');
  });
  const likesReceived = new LikesReceivedConsumer({
    events: platform.events,
    repo: new LikesReceivedRepository(platform.db),
    store: platform.userCounterStore,
    metrics: relations.metrics,
    onGap: (authorId) => userCounters.service.rebuild(authorId, 'overwrite', 'drift'),
    // A publish let go is republished by the repair job within about its delay: waited for first.
    holeWaitMs: Math.max(HOLE_WAIT_MS, 3 * config.counters.repairAfterMs),
    onApplied: (authorIds) => userCounters.reconciler.touched(authorIds),
    onError: (err) => workerError('user-likes-received', err),
    now,
  });
  // The durable path of post cache invalidation (the request's own attempt may fail).
  const postCacheConsumer = new PostCacheConsumer(platform.events, postCache, platform.invalidation, {
    onError: (err) => workerError('post-cache', err),
    registry: metrics.registry,
  });
  const workers: { start(): void | Promise<void>; stop(): Promise<void> }[] =
    config.role === 'api'
      ? []
      : [
          relay,
          aggregator,
          ...periodic,
          ...(restorer ? [restorer] : []),
          ...userCounters.workers,
          viewAggregator,
          ...relations.workers,
          likesReceived,
          postCacheConsumer,
        ];

  // The event log's consumers join their groups once its topics exist; the other workers (the relay,
  // periodic tasks) need nothing at start and ride out an outage themselves.
  const consumers = workers.filter(
    (worker) => worker !== relay && worker !== restorer && !(worker instanceof PeriodicTask),
  );
  const others = workers.filter((worker) => !consumers.includes(worker));
  const ensureTopics = () =>
    platform.events.ensureTopics(
      [...new Set([COUNTER_TOPIC, POST_TOPIC, VIEW_TOPIC, ...userCounters.topics, ...relations.topics])],
      { keepForever: [COUNTER_TOPIC] },
    );
  /**
   * Embedded, at a graceful stop, with requests and views closed: what they wrote is carried through
   * before the workers stop (outbox rows published, every consumer caught up with the log, pending
   * counts folded into snapshots), so that the counts on disk are whole and the admin commands find
   * nothing on its way. Within `budgetMs`; what is left then is carried on at the next start.
   */
  const settle = async (caughtUp: () => Promise<boolean>, budgetMs: number): Promise<void> => {
    if (!consumersStarted) {
      log.warn('the consumers never started; events written are carried on at the next start');
      return;
    }
    const deadline = performance.now() + budgetMs;
    // The relay's own rounds stop (the one under way finishes): this loop runs the last ones, so an
    // empty round here means nothing was published that the consumers have not been asked about.
    await relay.stop();
    let failure: unknown;
    for (;;) {
      failure = undefined;
      const published = await relay.runOnce().catch((err: unknown) => ((failure = err), -1));
      const consumed = await caughtUp().catch((err: unknown) => ((failure = err), false));
      if (published === 0 && consumed) break;
      if (performance.now() >= deadline) {
        log.warn(
          { budgetMs, err: failure },
          'events still on their way at shutdown; they are carried on at the next start',
        );
        break;
      }
      await sleep(SETTLE_POLL_MS);
    }
    // Whatever the consumers applied goes into the snapshots.
    await flushPending(platform.counterStore, counterMetrics).catch((err: unknown) =>
      log.warn({ err }, 'could not fold pending counts at shutdown; the next start does'),
    );
  };
  const stopping = new AbortController();
  let lateStart: Promise<void> = Promise.resolve();
  /** Starts the consumers in `pending` in order, taking each off once started; stops at the first failure. */
  const startInOrder = async (pending: (typeof workers)[number][]) => {
    while (pending.length > 0 && !stopping.signal.aborted) {
      await pending[0]!.start();
      pending.shift();
    }
  };
  /** Makes the topics (unless made) and starts the consumers not started yet, until all are. */
  const startConsumersLater = async (pending: (typeof workers)[number][], topicsMade: boolean) => {
    let failures = 0;
    while (pending.length > 0) {
      await sleep(CONSUMER_START_RETRY_MS, undefined, { signal: stopping.signal }).catch(() => undefined);
      if (stopping.signal.aborted) return;
      try {
        if (!topicsMade) await ensureTopics();
        topicsMade = true;
        await startInOrder(pending);
      } catch (err) {
        failures++;
        // The first failure and then one a minute or so, not one per attempt.
        if (failures % 60 === 1)
          log.warn(
            { err, failures },
            'the event log is still out of reach; its consumers start once it is back',
          );
      }
    }
    if (stopping.signal.aborted) return;
    consumersStarted = true;
    log.info('event-log consumers started');
  };

  return {
    config,
    http,
    platform,
    log,
    async start() {
      // Every process rides out a Kafka outage, also one under way when it starts: an API process's
      // toggles wait in the counter store for the repair, follows in the outbox, and a worker's
      // consumers start once the log is back (the periodic tasks, repair included, at once).
      const topicsMade = await ensureTopics().then(
        () => true,
        (err: unknown) => {
          log.warn(
            { err },
            consumers.length > 0
              ? 'Kafka unreachable at start; serving and running the periodic tasks without it, and starting its consumers once it is back'
              : 'Kafka unreachable at start; serving without it until it is back',
          );
          return false;
        },
      );
      const address = await http.listen({ host: config.host, port: config.port });
      for (const worker of others) await worker.start();
      const pending = [...consumers];
      if (topicsMade) {
        try {
          await startInOrder(pending);
        } catch (err) {
          log.warn({ err }, 'an event-log consumer could not join its group; trying again in the background');
        }
      }
      if (pending.length > 0) lateStart = startConsumersLater(pending, topicsMade);
      else consumersStarted = true;
      log.info({ address, profile: config.profile, role: config.role }, 'zhiguang started');
      return address;
    },
    drain() {
      draining = true;
    },
    async close() {
      const closingAt = performance.now();
      draining = true;
      // Consumers starting late stop trying; an attempt under way is waited for after everything
      // else has closed, for a few seconds at most (its join may take longer while Kafka is away).
      stopping.abort();
      // Half the shutdown's time for requests in flight; the rest for what follows.
      await closeWithin(http, Math.ceil(config.shutdownTimeoutMs / 2));
      outboxWake.close();
      // Side by side, and the publisher for a bounded time: what it leaves is in the store's records.
      await Promise.all([publisher.close(), views.close()]);
      // Within the shutdown's time, leaving a quarter of it for the workers and connections to close.
      const settleMs = Math.min(
        SETTLE_MAX_MS,
        (config.shutdownTimeoutMs * 3) / 4 - (performance.now() - closingAt),
      );
      if (platform.eventsCaughtUp && workers.length > 0 && settleMs > 0)
        await settle(platform.eventsCaughtUp, settleMs);
      // Side by side: each commits what it handled; one slow to leave its group holds up no other.
      const stopped = await Promise.allSettled(workers.map((worker) => worker.stop()));
      await platform.close();
      let waited: NodeJS.Timeout | undefined;
      await Promise.race([lateStart, new Promise((resolve) => (waited = setTimeout(resolve, 5_000)))]);
      clearTimeout(waited);
      // One that got started after all the same (its attempt ended just then) stops now.
      await Promise.allSettled(consumers.map((worker) => worker.stop()));
      for (const result of stopped) if (result.status === 'rejected') throw result.reason;
    },
  };
}
