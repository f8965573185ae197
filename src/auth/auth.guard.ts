import type { FastifyInstance, FastifyRequest, onRequestAsyncHookHandler } from 'fastify';
import { UnauthorizedError } from '../platform/errors/errors.js';
import type { Authenticator, Principal } from './authenticator.js';

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal | null;
  }
}

/**
 * Route `onRequest` hooks: the token is checked before the body is read or validated, so a caller
 * without a valid token learns nothing from the route but 401, and costs no body parsing.
 */
export interface AuthGuards {
  /** The route needs a signed-in caller. */
  required: onRequestAsyncHookHandler;
  /** Anyone may call; a token, when sent, must be valid (clients refresh on the 401). */
  optional: onRequestAsyncHookHandler;
}

function bearer(request: FastifyRequest): string | null | undefined {
  const header = request.headers.authorization;
  if (header === undefined) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1] ?? null;
}

export function installAuthGuards(app: FastifyInstance, authenticator: Authenticator): AuthGuards {
  app.decorateRequest('principal', null);
  return {
    required: async (request) => {
      const token = bearer(request);
      if (!token) throw new UnauthorizedError();
      request.principal = await authenticator.authenticate(token);
    },
    optional: async (request) => {
      const token = bearer(request);
      if (token === undefined) return;
      if (token === null) throw new UnauthorizedError('Malformed Authorization header');
      request.principal = await authenticator.authenticate(token);
    },
  };
}

/** The signed-in caller; only for routes behind the `required` guard. */
export function principalOf(request: FastifyRequest): Principal {
  if (!request.principal) throw new UnauthorizedError();
  return request.principal;
}
