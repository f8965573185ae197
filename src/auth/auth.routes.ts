import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { BadRequestError, NotFoundError } from '../platform/errors/errors.js';
import { errorResponses } from '../platform/http/schemas.js';
import { clientAddress } from '../platform/http/server.js';
import type { UsersRepository } from '../profile/users.repository.js';
import { toAuthUser } from '../profile/user.presenter.js';
import type { AuthGuards } from './auth.guard.js';
import { principalOf } from './auth.guard.js';
import {
  AuthResponse,
  AuthUserResponse,
  LoginBody,
  RefreshBody,
  RegisterBody,
  ResetPasswordBody,
  SendCodeBody,
  SendCodeResponse,
  TokenResponse,
} from './auth.schema.js';
import type { AuthService, RequestContext } from './auth.service.js';
import type { JWK } from 'jose';

export interface AuthRouteDeps {
  auth: AuthService;
  users: UsersRepository;
  guards: AuthGuards;
  jwks: JWK[];
}

const context = (request: FastifyRequest): RequestContext => ({
  // What a trusted proxy forwarded is text; only an address keys a rate limit or enters the audit.
  ip: clientAddress(request),
  userAgent: request.headers['user-agent'] ?? null,
});

export function authRoutes(deps: AuthRouteDeps) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['auth'];

    app.post(
      '/api/v1/auth/send-code',
      {
        schema: {
          tags,
          description:
            'Phone codes go to the SMS webhook (ZG_SMS_WEBHOOK_URL); without one they are logged where ' +
            'ZG_SMS_LOG_CODES allows (the embedded default), else refused with 503 UNAVAILABLE for ' +
            'every scene and number alike. 503 UNAVAILABLE also: the code could not be delivered. A code ' +
            'still valid is sent again rather than replaced, keeping its lifetime (expireSeconds: what it has left; ' +
            'one with less than a minute left is replaced). One send ' +
            'per 60 s and 10 a day per scene and identifier (429).',
          body: SendCodeBody,
          response: { 200: SendCodeResponse, ...errorResponses(400, 409, 429, 503) },
        },
      },
      async (request) => {
        const { scene, identifierType, identifier } = request.body;
        return deps.auth.sendCode(scene, identifierType, identifier, context(request));
      },
    );

    app.post(
      '/api/v1/auth/register',
      {
        schema: {
          tags,
          body: RegisterBody,
          response: { 200: AuthResponse, ...errorResponses(400, 409, 429) },
        },
      },
      async (request) => {
        const { user, token } = await deps.auth.register(request.body, context(request));
        return { user: toAuthUser(user), token };
      },
    );

    app.post(
      '/api/v1/auth/login',
      {
        schema: {
          tags,
          description:
            'Exactly one of password and code. Password sign-ins are limited per account and client ' +
            '(ZG_AUTH_LOGIN_LIMIT per 15 minutes, 10 by default; a success starts the count again) and ' +
            'per account from all clients together (ten times that; not for a client the account signed ' +
            'in from in the last 30 days), besides ZG_AUTH_IP_LIMIT per client: 429 past any. A code ' +
            'allows 5 tries. An unknown account answers as a wrong password (401 INVALID_CREDENTIALS) ' +
            'or code (400 VERIFICATION_MISMATCH) would: IDENTIFIER_NOT_FOUND is never sent.',
          body: LoginBody,
          response: { 200: AuthResponse, ...errorResponses(400, 401, 429) },
        },
      },
      async (request) => {
        const { identifierType, identifier, password, code } = request.body;
        if ((password === undefined) === (code === undefined)) {
          throw new BadRequestError('body needs exactly one of password and code');
        }
        const result =
          password !== undefined
            ? await deps.auth.loginWithPassword(identifierType, identifier, password, context(request))
            : await deps.auth.loginWithCode(identifierType, identifier, code ?? '', context(request));
        return { user: toAuthUser(result.user), token: result.token };
      },
    );

    app.post(
      '/api/v1/auth/token/refresh',
      {
        schema: {
          tags,
          description:
            'Rotates the refresh token: the one given is spent, and presenting it again ends the session ' +
            '(every token of this sign-in), except within ZG_REFRESH_REUSE_GRACE_MS (10 s) of its rotation: ' +
            'then the client it was rotated for (same address and user agent) gets the same answer again ' +
            '(its answer was lost, or two tabs refreshed at once), and any other caller is refused ' +
            '(401 REFRESH_TOKEN_INVALID) while the session goes on. A session is refreshed at most 60 times ' +
            'per 15 minutes (429 RATE_LIMITED past it). 503 UNAVAILABLE: the session store failed before ' +
            'the new token was kept; the token given is put back, so the same call can be made again.',
          body: RefreshBody,
          response: { 200: TokenResponse, ...errorResponses(400, 401, 429, 503) },
        },
      },
      async (request) => deps.auth.refresh(request.body.refreshToken, context(request)),
    );

    app.post(
      '/api/v1/auth/logout',
      { schema: { tags, body: RefreshBody, response: { 204: Type.Null(), ...errorResponses(400, 401) } } },
      async (request, reply) => {
        await deps.auth.logout(request.body.refreshToken);
        return reply.status(204).send(null);
      },
    );

    app.post(
      '/api/v1/auth/password/reset',
      {
        schema: {
          tags,
          body: ResetPasswordBody,
          response: { 204: Type.Null(), ...errorResponses(400, 429) },
        },
      },
      async (request, reply) => {
        const { identifierType, identifier, code, newPassword } = request.body;
        await deps.auth.resetPassword(identifierType, identifier, code, newPassword, context(request));
        return reply.status(204).send(null);
      },
    );

    app.get(
      '/api/v1/auth/me',
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security: [{ bearerAuth: [] }],
          response: { 200: AuthUserResponse, ...errorResponses(401, 404) },
        },
      },
      async (request) => {
        const user = await deps.users.findById(principalOf(request).userId);
        if (!user) throw new NotFoundError('User not found');
        return toAuthUser(user);
      },
    );

    // At the root, where JWKS consumers look, and under the auth routes, where the contract lists it.
    for (const url of ['/.well-known/jwks.json', '/api/v1/auth/.well-known/jwks.json']) {
      app.get(
        url,
        {
          schema: {
            tags,
            response: { 200: Type.Object({ keys: Type.Array(Type.Record(Type.String(), Type.Unknown())) }) },
          },
        },
        async (_request, reply) => {
          void reply.header('cache-control', 'public, max-age=300');
          return { keys: deps.jwks };
        },
      );
    }
  };
}
