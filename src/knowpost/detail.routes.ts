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
          // A token is optional: sent, it adds the caller's own view.
          security: [{}, { bearerAuth: [] }],
          description:
            'A published public post, for everyone. Its author also gets their own drafts and their ' +
            'unlisted, private, followers and school posts (audiences are not modelled yet, so only the ' +
            'author sees those). Anything else is 404, deleted posts too, also for their author. Each 200 counts a view, except ' +
            "an author's read of a post only they may see and a HEAD request.",
          params: DetailParams,
          response: { 200: KnowPostDetailResponse, ...errorResponses(400, 401, 404) },
        },
      },
      async (request, reply) => {
        const viewer = request.principal?.userId ?? null;
        const id = request.params.id;
        // Fastify answers HEAD with this handler too: a look at the headers is no read.
        const view = request.method !== 'HEAD';
        if (viewer === null) return sendJsonBytes(reply, await deps.details.anonymousDetailBytes(id, view));
        return sendJsonBytes(reply, detailResponseBytes(await deps.details.detail(id, viewer, view)));
      },
    );
  };
}
