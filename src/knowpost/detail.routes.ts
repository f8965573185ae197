import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { AuthGuards } from '../auth/auth.guard.js';
import { errorResponses, sendJsonBytes } from '../platform/http/schemas.js';
import { DetailParams, KnowPostDetailResponse } from './detail.schema.js';
import type { DetailService } from './detail.service.js';
import { detailResponseBytes } from './read-answers.js';

export function detailRoutes(deps: { details: DetailService; guards: AuthGuards }) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();

    app.get(
      '/api/v1/knowposts/detail/:id',
      {
        onRequest: deps.guards.optional,
        schema: {
          tags: ['knowposts'],
          description:
            'A published public or unlisted post for everyone, any of its own posts for the author, else 404',
          params: DetailParams,
          response: { 200: KnowPostDetailResponse, ...errorResponses(400, 401, 404) },
        },
      },
      async (request, reply) => {
        const viewer = request.principal?.userId ?? null;
        const id = request.params.id;
        if (viewer === null) return sendJsonBytes(reply, await deps.details.anonymousDetailBytes(id));
        return sendJsonBytes(reply, detailResponseBytes(await deps.details.detail(id, viewer)));
      },
    );
  };
}
