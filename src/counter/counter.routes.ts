import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { AuthGuards } from '../auth/auth.guard.js';
import { principalOf } from '../auth/auth.guard.js';
import { BadRequestError } from '../platform/errors/errors.js';
import { errorResponses } from '../platform/http/schemas.js';
import type { CounterService } from './counter.service.js';
import { POST_FIELDS, type EntityRef, type EntityType, type FactMetric, type PostField } from './model.js';
import {
  ActionBody,
  BatchCountsResponse,
  BatchQuery,
  FavResponse,
  LikeResponse,
  MetricsQuery,
  SingleCountsResponse,
  SingleParams,
  StatusQuery,
  StatusResponse,
  TypeParams,
} from './counter.schema.js';

const MAX_IDS = 100;

/** Unknown metric names are ignored (the contract); none given means all. */
function parseMetrics(raw: string | undefined): PostField[] {
  if (raw === undefined || raw.trim() === '') return [...POST_FIELDS];
  const wanted = new Set(raw.split(',').map((m) => m.trim()));
  return POST_FIELDS.filter((f) => wanted.has(f));
}

function parseIds(raw: string): string[] {
  const ids = [
    ...new Set(
      raw
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean),
    ),
  ];
  if (ids.length === 0 || ids.length > MAX_IDS)
    throw new BadRequestError(`query.ids must list 1 to ${MAX_IDS} ids`);
  if (!ids.every((id) => /^[1-9][0-9]{0,19}$/.test(id)))
    throw new BadRequestError('query.ids must be positive integers');
  return ids;
}

export function counterRoutes(deps: { counters: CounterService; guards: AuthGuards }) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['counters'];
    const security = [{ bearerAuth: [] }];

    const action = (path: string, metric: FactMetric, on: boolean) => {
      const field = metric === 'like' ? 'liked' : 'faved';
      app.post(
        `/api/v1/action/${path}`,
        {
          preHandler: deps.guards.required,
          schema: {
            tags,
            security,
            body: ActionBody,
            response: {
              200: metric === 'like' ? LikeResponse : FavResponse,
              ...errorResponses(400, 401, 404),
            },
          },
        },
        async (request) => {
          const ref: EntityRef = { etype: request.body.entityType, eid: String(request.body.entityId) };
          const { changed, state } = await deps.counters.toggle(ref, metric, principalOf(request).userId, on);
          return { changed, [field]: state } as { changed: boolean; liked: boolean; faved: boolean };
        },
      );
    };
    action('like', 'like', true);
    action('unlike', 'like', false);
    action('fav', 'fav', true);
    action('unfav', 'fav', false);

    app.get(
      '/api/v1/action/status',
      {
        preHandler: deps.guards.required,
        schema: {
          tags,
          security,
          querystring: StatusQuery,
          response: { 200: StatusResponse, ...errorResponses(400, 401, 404) },
        },
      },
      async (request) => {
        const ids = parseIds(request.query.ids);
        const etype: EntityType = request.query.entityType;
        const flags = await deps.counters.flags(
          ids.map((eid) => ({ etype, eid })),
          principalOf(request).userId,
        );
        // Entities the caller may not see are left out, so the list cannot be used to probe for them.
        return {
          items: ids.flatMap((entityId, i) => {
            const f = flags[i];
            return f ? [{ entityId, liked: f.like, faved: f.fav }] : [];
          }),
        };
      },
    );

    app.get(
      '/api/v1/counter/:etype/:eid',
      {
        preHandler: deps.guards.optional,
        schema: {
          tags,
          params: SingleParams,
          querystring: MetricsQuery,
          response: { 200: SingleCountsResponse, ...errorResponses(400, 401, 404) },
        },
      },
      async (request) => {
        const { etype, eid } = request.params;
        const counts = await deps.counters.counts(
          { etype, eid },
          request.principal?.userId ?? null,
          parseMetrics(request.query.metrics),
        );
        return { entityType: etype, entityId: eid, counts };
      },
    );

    app.get(
      '/api/v1/counter/:etype',
      {
        preHandler: deps.guards.optional,
        schema: {
          tags,
          params: TypeParams,
          querystring: BatchQuery,
          response: { 200: BatchCountsResponse, ...errorResponses(400, 401, 404) },
        },
      },
      async (request) => {
        const { etype } = request.params;
        const ids = parseIds(request.query.ids);
        const counts = await deps.counters.countsMany(
          ids.map((eid) => ({ etype, eid })),
          request.principal?.userId ?? null,
          parseMetrics(request.query.metrics),
        );
        return {
          entityType: etype,
          items: ids.flatMap((entityId, i) => {
            const c = counts[i];
            return c ? [{ entityId, counts: c }] : [];
          }),
        };
      },
    );
  };
}
