import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import type { AuthGuards } from '../auth/auth.guard.js';
import { principalOf } from '../auth/auth.guard.js';
import { errorResponses } from '../platform/http/schemas.js';
import { RateLimitedError } from '../platform/errors/errors.js';
import { enforceLimit, type RateLimiter } from '../platform/ratelimit/ratelimit.js';
import type { DescriptionSuggester } from './description/describer.js';

export interface DescriptionRouteDeps {
  describer: DescriptionSuggester;
  guards: AuthGuards;
  limiter: RateLimiter;
  perUserPerMinute: number;
  perUserPerDay: number;
  /** The largest request body taken, in bytes: room for any post body the service stores, as JSON. */
  maxBodyBytes: number;
  /** Requests this process answers at once (`DESCRIPTIONS_IN_FLIGHT` by default); 429 past it. */
  maxInFlight?: number;
  /** How long a body may take to arrive (`DESCRIPTION_BODY_DEADLINE_MS` by default); 408 past it. */
  bodyDeadlineMs?: number;
}

/**
 * Description requests one process serves at once. Each may hold a body of megabytes for as long
 * as the model takes (`ZG_AI_TIMEOUT_MS`), so the per-user limits alone would let many accounts
 * together fill the heap; past this, 429 with `Retry-After: 1`.
 */
export const DESCRIPTIONS_IN_FLIGHT = 16;
/** Of those, how many one user may have: one account cannot take them all with slow bodies. */
export const DESCRIPTIONS_IN_FLIGHT_PER_USER = 2;
/**
 * A place is taken before the body is read (that keeps bodies off the heap); a body sent a byte at
 * a time would hold it until the server's request timeout (10 minutes), so a few accounts could keep
 * every place. The largest body arrives within this at 70 KB/s.
 */
export const DESCRIPTION_BODY_DEADLINE_MS = 30_000;

/**
 * Whether the caller hung up: judged by the connection, since a response waiting behind others on
 * the same connection (pipelined requests) has no socket of its own yet.
 */
function callerLeft(request: FastifyRequest): boolean {
  return request.raw.socket.destroyed;
}

/**
 * Answers 408 to a caller whose body did not arrive in time and ends the connection, which gives its
 * place back.
 */
function tooSlow(request: FastifyRequest, reply: FastifyReply): void {
  const res = reply.raw;
  if (res.headersSent || res.destroyed) {
    request.raw.socket.destroy();
    return;
  }
  const body = JSON.stringify({
    code: 'REQUEST_TIMEOUT',
    message: 'The request body did not arrive in time',
    requestId: String(request.id),
  });
  // With the headers every answer carries (CORS, request id, no-store), set before the body.
  const kept = Object.entries(reply.getHeaders()).filter(
    (entry): entry is [string, string | number | string[]] => entry[1] !== undefined,
  );
  res.writeHead(408, {
    ...Object.fromEntries(kept),
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    connection: 'close',
  });
  res.end(body, () => request.raw.socket.destroy());
}

/** Suggests a post description of at most 50 characters; signed-in and rate limited, since a call may cost money. */
export function descriptionRoutes(deps: DescriptionRouteDeps) {
  const maxInFlight = deps.maxInFlight ?? DESCRIPTIONS_IN_FLIGHT;
  const bodyDeadlineMs = deps.bodyDeadlineMs ?? DESCRIPTION_BODY_DEADLINE_MS;
  const bodyDeadlines = new WeakMap<FastifyRequest, NodeJS.Timeout>();
  let inFlight = 0;
  const inFlightOf = new Map<number, number>();
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    app.post(
      '/api/v1/knowposts/description/suggest',
      {
        // Signed in, given a place and within the rate before the body, which may run to
        // megabytes, is read. A refusal for want of a place does not count against the rate.
        onRequest: [
          deps.guards.required,
          async (request, reply) => {
            const { userId } = principalOf(request);
            const mine = inFlightOf.get(userId) ?? 0;
            if (inFlight >= maxInFlight || mine >= DESCRIPTIONS_IN_FLIGHT_PER_USER)
              throw new RateLimitedError(
                'Too many descriptions are being written right now; try again shortly',
                1,
              );
            inFlight++;
            inFlightOf.set(userId, mine + 1);
            // Given back once the answer is sent or the connection ends, whichever way the request
            // went (a response still queued behind others may never see its own 'close'); at once
            // when the caller already left (its 'close' came while the guard was waiting).
            const socket = request.raw.socket;
            let held = true;
            const release = (): void => {
              if (!held) return;
              held = false;
              reply.raw.off('close', release);
              socket.off('close', release);
              inFlight--;
              const left = inFlightOf.get(userId)! - 1;
              if (left === 0) inFlightOf.delete(userId);
              else inFlightOf.set(userId, left);
            };
            reply.raw.once('close', release);
            socket.once('close', release);
            if (callerLeft(request)) release();
            // Ended once the body is read (preValidation), or with the request.
            const slow = setTimeout(() => tooSlow(request, reply), bodyDeadlineMs);
            slow.unref();
            bodyDeadlines.set(request, slow);
            reply.raw.once('close', () => clearTimeout(slow));
          },
          async (request) => {
            const { userId } = principalOf(request);
            await enforceLimit(
              deps.limiter,
              `describe:${userId}`,
              deps.perUserPerMinute,
              60_000,
              'description requests',
            );
            await enforceLimit(
              deps.limiter,
              `describe-day:${userId}`,
              deps.perUserPerDay,
              86_400_000,
              'description requests today',
            );
          },
        ],
        preValidation: async (request) => clearTimeout(bodyDeadlines.get(request)),
        bodyLimit: deps.maxBodyBytes,
        schema: {
          tags: ['knowposts'],
          security: [{ bearerAuth: [] }],
          description:
            'A description (at most 50 characters) of the post markdown in `content`, drawn from its first ' +
            "20,000 characters once pasted images' data and script and style elements are left out " +
            '(looking no further than the first 1,000,000); 400 BAD_REQUEST when they show no text. ' +
            'The body may be as large as a post body may be (twice ZG_POST_CONTENT_MAX_BYTES, ' +
            'room for JSON escapes; 413 past that). At most ' +
            'ZG_AI_RATE_LIMIT requests per user per minute (20 by default) and ZG_AI_DAILY_LIMIT per day ' +
            '(200 by default); 429 past either. 429 with Retry-After also while the server is writing 16 ' +
            "descriptions at once, or 2 for the caller (not counted against the caller's limits). " +
            '408 REQUEST_TIMEOUT, and the connection closed, when the body has not arrived 30 seconds ' +
            'after the request began.',
          body: Type.Object({ content: Type.String({ minLength: 1 }) }),
          response: {
            200: Type.Object({ description: Type.String({ maxLength: 50 }) }),
            ...errorResponses(400, 401, 408, 413, 429),
          },
        },
      },
      async (request, reply) => {
        // A caller who hangs up stops the model call. The request's own 'close' comes as soon as the
        // body is read; the response's comes when the connection ends, before an answer only if
        // the caller left.
        const abort = new AbortController();
        const hungUp = (): void => {
          if (!reply.raw.writableFinished) abort.abort();
        };
        const socket = request.raw.socket;
        reply.raw.once('close', hungUp);
        socket.once('close', hungUp);
        // Left while the guards or the body were still on their way: no model call at all.
        if (callerLeft(request)) abort.abort();
        try {
          const { description } = await deps.describer.suggest(request.body.content, abort.signal);
          return { description };
        } catch (err) {
          if (!abort.signal.aborted) throw err;
          // Nobody is waiting for an answer: not a failure of the service, and nothing to send.
          request.log.info('description request abandoned by its caller');
          reply.hijack();
          reply.raw.destroy();
          return undefined;
        } finally {
          reply.raw.off('close', hungUp);
          socket.off('close', hungUp);
        }
      },
    );
  };
}
