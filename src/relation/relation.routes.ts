import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { AuthGuards } from '../auth/auth.guard.js';
import { principalOf } from '../auth/auth.guard.js';
import { BadRequestError } from '../platform/errors/errors.js';
import { errorResponses } from '../platform/http/schemas.js';
import { decodeCursor, type ListKind, type ListPosition } from './model.js';
import {
  ChangedResponse,
  DEFAULT_LIST_LIMIT,
  MAX_OFFSET,
  ListQuery,
  ListResponse,
  StatusResponse,
  TargetQuery,
} from './relation.schema.js';
import type { RelationService } from './relation.service.js';

export function relationRoutes(deps: { relations: RelationService; guards: AuthGuards }) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['relations'];
    const security = [{ bearerAuth: [] }];

    for (const action of ['follow', 'unfollow'] as const) {
      app.post(
        `/api/v1/relation/${action}`,
        {
          onRequest: deps.guards.required,
          schema: {
            tags,
            security,
            description:
              'Follows plus unfollows: at most ZG_RELATION_CHANGE_LIMIT per user per minute (60 by default; ' +
              '429 past that). Following or unfollowing yourself is 400; an unknown user is 404 and still counts ' +
              'against the limit. 503 when the database could not take the change in time: one that waited ' +
              'ZG_MYSQL_TIMEOUT_MS for its transaction was not made; after a database outage it may have been ' +
              '(the status route tells).',
            querystring: TargetQuery,
            response: { 200: ChangedResponse, ...errorResponses(400, 401, 404, 429, 503) },
          },
        },
        async (request) => {
          const me = principalOf(request).userId;
          const to = request.query.toUserId;
          return action === 'follow' ? deps.relations.follow(me, to) : deps.relations.unfollow(me, to);
        },
      );
    }

    app.get(
      '/api/v1/relation/status',
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          querystring: TargetQuery,
          response: { 200: StatusResponse, ...errorResponses(400, 401, 404) },
        },
      },
      async (request) => deps.relations.status(principalOf(request).userId, request.query.toUserId),
    );

    const list = (kind: ListKind) =>
      app.get(
        `/api/v1/relation/${kind}`,
        {
          onRequest: deps.guards.required,
          schema: {
            tags,
            security,
            description:
              'Newest first. When more items follow, the X-Next-Cursor header holds the cursor of the next page.',
            querystring: ListQuery,
            response: { 200: ListResponse, ...errorResponses(400, 401, 404) },
          },
        },
        async (request, reply) => {
          // Optional in the contract; the schema's defaults fill them in.
          const { userId, limit = DEFAULT_LIST_LIMIT, offset = 0, cursor } = request.query;
          let position: ListPosition = { offset };
          if (cursor !== undefined) {
            const after = decodeCursor(cursor);
            if (!after) throw new BadRequestError('querystring.cursor is not a cursor this server issued');
            position = { after };
          } else if (offset > MAX_OFFSET) {
            throw new BadRequestError(
              `querystring.offset must be <= ${MAX_OFFSET}; page further with the cursor of X-Next-Cursor`,
            );
          }
          const page = await deps.relations.list(userId, kind, position, limit);
          if (page.nextCursor !== null) void reply.header('x-next-cursor', page.nextCursor);
          return page.items;
        },
      );
    list('following');
    list('followers');
  };
}
