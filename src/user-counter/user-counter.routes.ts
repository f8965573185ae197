import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { AuthGuards } from '../auth/auth.guard.js';
import { errorResponses } from '../platform/http/schemas.js';
import { UserCounterQuery, UserCounterResponse } from './user-counter.schema.js';
import type { UserCounterService } from './user-counter.service.js';

export function userCounterRoutes(deps: { counters: UserCounterService; guards: AuthGuards }) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();

    app.get(
      '/api/v1/relation/counter',
      {
        onRequest: deps.guards.required,
        schema: {
          tags: ['relations'],
          security: [{ bearerAuth: [] }],
          description:
            "A user's counts; posts are their public posts (published and public: what anyone may read), " +
            'likedPosts and favedPosts the likes and favourites received on every post they wrote, also ' +
            'those since deleted or no longer public (what was received stays received), so they may be more ' +
            "than the sum of their public posts' counts",
          querystring: UserCounterQuery,
          response: { 200: UserCounterResponse, ...errorResponses(400, 401, 404) },
        },
      },
      async (request) => {
        const c = await deps.counters.counts(request.query.userId);
        return {
          followings: c.followings,
          followers: c.followers,
          posts: c.posts,
          likedPosts: c.likesReceived,
          favedPosts: c.favsReceived,
        };
      },
    );
  };
}
