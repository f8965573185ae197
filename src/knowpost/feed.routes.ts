import type { FastifyInstance, FastifyReply } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { AuthGuards } from '../auth/auth.guard.js';
import { principalOf } from '../auth/auth.guard.js';
import { errorResponses, sendJsonBytes } from '../platform/http/schemas.js';
import { clampSize, FEED_DEPTH, FeedPageResponse, PageQuery } from './feed.schema.js';
import type { FeedService } from './feed.service.js';
import { feedResponseBytes, type FeedPage } from './read-answers.js';

/** Answers with the page's JSON bytes (`FeedPageResponse`; see read-answers.ts). */
function sendPage(reply: FastifyReply, page: FeedPage): FastifyReply {
  return sendJsonBytes(reply, feedResponseBytes(page));
}

export function feedRoutes(deps: { feeds: FeedService; guards: AuthGuards }) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['knowposts'];

    app.get(
      '/api/v1/knowposts/feed',
      {
        onRequest: deps.guards.optional,
        schema: {
          tags,
          // A token is optional: sent, it adds the caller's own view.
          security: [{}, { bearerAuth: [] }],
          description:
            'Published public posts, newest first; liked and faved are filled when a token is sent. ' +
            `Pages reach through the newest ${FEED_DEPTH} posts: the last page that does says hasMore ` +
            'false, and a page starting beyond them is empty.',
          querystring: PageQuery,
          response: { 200: FeedPageResponse, ...errorResponses(400, 401) },
        },
      },
      async (request, reply) => {
        const page = request.query.page ?? 1;
        const size = clampSize(request.query.size);
        const { depth } = deps.feeds;
        // Beyond its reach the feed answers as past its end: a client paging until an empty page
        // stops there, as one reading hasMore stopped a page before.
        if ((page - 1) * size >= depth) return { items: [], page, size, hasMore: false };
        const viewer = request.principal?.userId ?? null;
        return sendJsonBytes(
          reply,
          viewer === null
            ? await deps.feeds.anonymousFeedBytes(page, size)
            : await deps.feeds.viewerFeedBytes(page, size, viewer),
        );
      },
    );

    app.get(
      '/api/v1/knowposts/mine',
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security: [{ bearerAuth: [] }],
          description: "The caller's published posts of any visibility, top ones first, then newest",
          querystring: PageQuery,
          response: { 200: FeedPageResponse, ...errorResponses(400, 401) },
        },
      },
      async (request, reply) =>
        sendPage(
          reply,
          await deps.feeds.mine(
            request.query.page ?? 1,
            clampSize(request.query.size),
            principalOf(request).userId,
          ),
        ),
    );
  };
}
