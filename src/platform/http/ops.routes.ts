import { createHash, timingSafeEqual } from 'node:crypto';
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import { UnauthorizedError } from '../errors/errors.js';
import type { Metrics } from '../metrics/metrics.js';
import { READINESS_ROUTE } from './schemas.js';

export type ReadinessCheck = () => Promise<boolean>;

/** How long one round of readiness checks answers `/readyz`. */
const READINESS_KEPT_MS = 1_000;
/** A process not ready this long after it started is warned about, as one that was ready and is no more. */
const READINESS_START_GRACE_MS = 60_000;
/**
 * How long an advisory check may take before it counts as down: a dependency the process rides
 * out that hangs (a stopped host) must not make `/readyz` itself slower than a probe waits
 * (Kubernetes: 1 s by default), or it would take the process out of rotation after all.
 */
export const READINESS_CHECK_TIMEOUT_MS = 750;
/** The same for a check the process is not ready without: longer, so a busy process does not flap. */
export const READINESS_REQUIRED_CHECK_TIMEOUT_MS = 2_000;
/**
 * A check still running after this long is called anew: one that never settles must not keep the
 * dependency down once it is back for longer than this.
 */
export const READINESS_PROBE_ABANDON_MS = 5_000;

/**
 * Liveness, readiness and metrics, served by every role. Readiness is every check but the advisory
 * ones: those are reported, and one that is down makes the status `degraded`, still 200 (a
 * dependency the process rides out, such as Kafka for the API).
 */
export function opsRoutes(
  metrics: Metrics,
  checks: Record<string, ReadinessCheck>,
  isDraining: () => boolean,
  /** When set, `/metrics` answers only `Authorization: Bearer <metricsToken>`. */
  metricsToken?: string,
  advisory: ReadonlySet<string> = new Set(),
  /** How long one round of checks answers `/readyz` (0: each request checks again). */
  readinessKeptMs = READINESS_KEPT_MS,
  /** How long a process may take to be ready at start before not being so is a warning. */
  startGraceMs = READINESS_START_GRACE_MS,
) {
  const createdAt = performance.now();
  const digest = (text: string) => createHash('sha256').update(text).digest();
  const expected = metricsToken === undefined ? undefined : digest(metricsToken);
  let lastReadiness: string | undefined;
  /**
   * Whether it was ready once: not ready before that is a process starting (its consumers joining),
   * not an outage, unless it lasts past `startGraceMs`.
   */
  let beenReady = false;
  // A round of checks answers for a second: a client polling hard (the route is public) asks the
  // database, Redis and Kafka no more often than that. A check is ok only when it answers within
  // its time limit of being called; a round counts it down past that, but does not call it again
  // while it still runs (up to READINESS_PROBE_ABANDON_MS): a dependency that hangs gets one probe
  // at a time, not one more every round.
  let checking: Promise<(readonly [string, 'ok' | 'down'])[]> | undefined;
  let checkedAt = -Infinity;
  const running = new Map<string, { call: Promise<boolean>; at: number }>();
  const probe = (name: string, check: ReadinessCheck) => {
    const now = performance.now();
    const current = running.get(name);
    if (current && now - current.at < READINESS_PROBE_ABANDON_MS) return current;
    const entry = { call: Promise.resolve(false), at: now };
    entry.call = check()
      .catch(() => false)
      .finally(() => {
        if (running.get(name) === entry) running.delete(name);
      });
    running.set(name, entry);
    return entry;
  };
  const runChecks = () =>
    Promise.all(
      Object.entries(checks).map(async ([name, check]) => {
        const limitMs = advisory.has(name) ? READINESS_CHECK_TIMEOUT_MS : READINESS_REQUIRED_CHECK_TIMEOUT_MS;
        const { call, at } = probe(name, check);
        const ok = await Promise.race([
          // A late answer to a call an earlier round made is no answer: too slow is down.
          call.then((answer) => answer && performance.now() - at <= limitMs),
          new Promise<boolean>((resolve) => setTimeout(() => resolve(false), limitMs).unref()),
        ]);
        return [name, ok ? 'ok' : 'down'] as const;
      }),
    );
  const currentChecks = () => {
    if (!checking || performance.now() - checkedAt >= readinessKeptMs) {
      checkedAt = performance.now();
      checking = runChecks();
    }
    return checking;
  };
  return async (app: FastifyInstance): Promise<void> => {
    const tags = ['operations'];
    app.get(
      '/healthz',
      { schema: { tags, response: { 200: Type.Object({ status: Type.String() }) } } },
      async () => ({ status: 'ok' }),
    );

    const states = Type.Record(Type.String(), Type.Union([Type.Literal('ok'), Type.Literal('down')]));
    const readySchema = {
      tags,
      response: {
        200: Type.Object({
          status: Type.Union([Type.Literal('ok'), Type.Literal('degraded')]),
          checks: states,
        }),
        503: Type.Object({
          code: Type.String(),
          message: Type.String(),
          requestId: Type.String(),
          status: Type.Union([Type.Literal('draining'), Type.Literal('unavailable')]),
          checks: states,
        }),
      },
    };
    app.get(READINESS_ROUTE, { schema: readySchema }, async (request, reply) => {
      const entries = await currentChecks();
      const draining = isDraining();
      const down = entries.filter(([, state]) => state !== 'ok').map(([name]) => name);
      const ready = !draining && down.every((name) => advisory.has(name));
      const status = !ready ? (draining ? 'draining' : 'unavailable') : down.length > 0 ? 'degraded' : 'ok';
      const states = Object.fromEntries(entries);
      // Polled every few seconds: told once per change, not once per answer (the end of the start's
      // grace counts as one while it is not ready).
      const warnable = beenReady || performance.now() - createdAt >= startGraceMs;
      const starting = !ready && !warnable;
      const summary = `${status} ${JSON.stringify(states)}${starting ? ' starting' : ''}`;
      if (summary !== lastReadiness) {
        lastReadiness = summary;
        const level = warnable && (status === 'unavailable' || status === 'degraded') ? 'warn' : 'info';
        request.log[level]({ status, checks: states }, 'readiness changed');
      }
      if (ready) beenReady = true;
      if (ready) return reply.send({ status, checks: states });
      // The contract's error shape, with the states for whoever operates the service.
      return reply.status(503).send({
        code: 'UNAVAILABLE',
        message: draining
          ? 'Stopping: draining requests'
          : `Not ready: ${down.filter((name) => !advisory.has(name)).join(', ')} unreachable`,
        requestId: request.id,
        status,
        checks: states,
      });
    });

    app.get('/metrics', { schema: { tags, hide: true } }, async (request, reply) => {
      // Compared as digests, so the time taken tells nothing of the token.
      const given = /^Bearer\s+(.*?)\s*$/is.exec(request.headers.authorization ?? '')?.[1] ?? '';
      if (expected && !timingSafeEqual(digest(given), expected)) {
        throw new UnauthorizedError('/metrics needs the metrics token');
      }
      void reply.header('content-type', metrics.registry.contentType);
      return metrics.registry.metrics();
    });
  };
}
