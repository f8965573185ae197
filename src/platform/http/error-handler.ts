import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { AppError, RateLimitedError, UnavailableError } from '../errors/errors.js';
import { isDependencyOutage } from '../errors/outage.js';
import { damped, dampedByKind } from '../logging/damper.js';
import { TEXT_FORMATS } from './schemas.js';

/** The contract's error body: every non-2xx answer has this shape. */
export interface ErrorBody {
  code: string;
  message: string;
  requestId: string;
}

const FRAMEWORK_CODES: Record<number, string> = {
  400: 'BAD_REQUEST',
  401: 'UNAUTHORIZED',
  403: 'FORBIDDEN',
  404: 'NOT_FOUND',
  405: 'BAD_REQUEST',
  406: 'BAD_REQUEST',
  409: 'CONFLICT',
  413: 'PAYLOAD_TOO_LARGE',
  415: 'UNSUPPORTED_MEDIA_TYPE',
  429: 'RATE_LIMITED',
  503: 'UNAVAILABLE',
};

function validationMessage(err: FastifyError): string {
  const first = err.validation?.[0];
  if (!first) return err.message;
  const context = err.validationContext ?? 'request';
  const params = first.params;
  if (first.keyword === 'required') return `${context}.${String(params.missingProperty)} is required`;
  if (first.keyword === 'additionalProperties') {
    return `${context}.${String(params.additionalProperty)} is not allowed`;
  }
  const field = first.instancePath ? first.instancePath.slice(1).replaceAll('/', '.') : '';
  const name = `${context}${field ? `.${field}` : ''}`;
  if (first.keyword === 'const') {
    // A choice of values (a union of constants) fails once per value: name them all.
    const allowed = err.validation!.filter(
      (e) => e.keyword === 'const' && e.instancePath === first.instancePath,
    );
    return `${name} must be one of ${allowed.map((e) => JSON.stringify(e.params.allowedValue)).join(', ')}`;
  }
  const format =
    first.keyword === 'format' ? TEXT_FORMATS[params.format as keyof typeof TEXT_FORMATS] : undefined;
  if (format) return `${name} ${format.message}`;
  return `${name} ${first.message ?? 'is invalid'}`;
}

/** What a failure is, for damping its lines: its code, else its name and its message's first word. */
function kindOf(error: unknown, depth = 0): string {
  const { code, cause, name, message } = (error ?? {}) as {
    code?: unknown;
    cause?: unknown;
    name?: unknown;
    message?: unknown;
  };
  if (typeof code === 'string') return code;
  if (cause instanceof Error && depth < 5) return kindOf(cause, depth + 1);
  const first = typeof message === 'string' ? (message.split(/\s/, 1)[0] ?? '') : '';
  return `${typeof name === 'string' ? name : 'Error'}:${first}`;
}

/**
 * Maps every error to the contract's shape; 5xx answers never carry internals. A backing service
 * that cannot be reached answers 503 with `Retry-After`, anything else unexpected 500.
 */
export function installErrorHandling(app: FastifyInstance): void {
  // While a dependency is out every request fails alike: a line a second says so, with the count.
  const refusal = damped();
  // Per kind of failure: a deadlock during a Redis outage still gets its line, with its stack.
  const outage = dampedByKind();
  app.setErrorHandler(
    (error: FastifyError | AppError | Error, request: FastifyRequest, reply: FastifyReply) => {
      const requestId = String(request.id);
      if (error instanceof AppError) {
        // A refusal that knows how long to wait says so; any other 503, a second.
        const wait =
          error instanceof RateLimitedError || error instanceof UnavailableError
            ? error.retryAfterSeconds
            : error.status === 503
              ? 1
              : undefined;
        if (wait !== undefined && wait !== null)
          void reply.header('retry-after', String(Math.max(1, Math.ceil(wait))));
        // A refusal the service decided on with nothing failing behind it (likes refused while
        // counts are restored, told where that was found) is said without a stack; one with a
        // failure behind it (a code the mail server would not take) is logged with that failure.
        if (error instanceof UnavailableError && error.cause === undefined)
          refusal((heldBack) =>
            request.log.warn(
              { code: error.code, reason: error.message, heldBack },
              'request refused: unavailable',
            ),
          );
        else if (error.status === 503)
          outage(kindOf(error), (heldBack) => request.log.error({ err: error, heldBack }, 'request failed'));
        else if (error.status >= 500) request.log.error({ err: error }, 'request failed');
        return reply.status(error.status).send({ code: error.code, message: error.message, requestId });
      }
      const fe = error as FastifyError;
      if (fe.validation) {
        return reply.status(400).send({ code: 'BAD_REQUEST', message: validationMessage(fe), requestId });
      }
      const status = typeof fe.statusCode === 'number' ? fe.statusCode : 500;
      if (status >= 400 && status < 500) {
        const code = FRAMEWORK_CODES[status] ?? 'BAD_REQUEST';
        return reply.status(status).send({ code, message: fe.message, requestId });
      }
      const unavailable = status === 503 || isDependencyOutage(error);
      if (unavailable) {
        outage(kindOf(error), (heldBack) =>
          request.log.error({ err: error, heldBack }, 'a backing service is unavailable'),
        );
        void reply.header('retry-after', '1');
      } else request.log.error({ err: error }, 'unhandled error');
      return reply.status(unavailable ? 503 : 500).send({
        code: unavailable ? 'UNAVAILABLE' : 'INTERNAL_ERROR',
        message: unavailable ? 'Service temporarily unavailable' : 'Internal error',
        requestId,
      });
    },
  );

  app.setNotFoundHandler((request, reply) =>
    reply.status(404).send({
      code: 'NOT_FOUND',
      message: `No route ${request.method} ${request.url.split('?')[0]}`,
      requestId: String(request.id),
    }),
  );
}
