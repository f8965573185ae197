import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import type { AuthGuards } from '../auth/auth.guard.js';
import { principalOf } from '../auth/auth.guard.js';
import { BadRequestError } from '../platform/errors/errors.js';
import { errorResponses } from '../platform/http/schemas.js';
import type { CounterService, CountsView } from './counter.service.js';
import {
  isEntityId,
  POST_FIELDS,
  type EntityRef,
  type EntityType,
  type FactMetric,
  type PostField,
} from './model.js';
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

/** Parsed `metrics` values seen recently; a few distinct ones cover nearly all requests. */
const metricsSeen = new Map<string, readonly PostField[]>();
const METRICS_SEEN_MAX = 64;

/**
 * Unknown metric names are ignored (the contract); none given means all, and so does a list of
 * only unknown names (a client that asks for a metric this server does not have yet still gets counts).
 */
function parseMetrics(raw: string | undefined): readonly PostField[] {
  if (raw === undefined) return POST_FIELDS;
  let fields = metricsSeen.get(raw);
  if (fields) return fields;
  if (raw.trim() === '') fields = POST_FIELDS;
  else {
    const wanted = raw.split(',').map((m) => m.trim());
    fields = POST_FIELDS.filter((f) => wanted.includes(f));
    if (fields.length === 0) fields = POST_FIELDS;
  }
  if (metricsSeen.size < METRICS_SEEN_MAX) metricsSeen.set(raw, fields);
  return fields;
}

/** Distinct ids in order of first mention. */
function parseIds(raw: string): string[] {
  const ids: string[] = [];
  const seen = new Set<string>();
  for (const part of raw.split(',')) {
    const id = part.trim();
    if (id === '' || seen.has(id)) continue;
    seen.add(id);
    ids.push(id);
  }
  if (ids.length === 0 || ids.length > MAX_IDS)
    throw new BadRequestError(`querystring.ids must list 1 to ${MAX_IDS} ids`);
  for (const id of ids)
    if (!isEntityId(id)) throw new BadRequestError('querystring.ids must be positive integers');
  return ids;
}

export function counterRoutes(deps: { counters: CounterService; guards: AuthGuards }) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['counters'];
    const security = [{ bearerAuth: [] }];

    const action = (path: string, metric: FactMetric, on: boolean) => {
      const answer =
        metric === 'like'
          ? (r: { changed: boolean; state: boolean }) => ({ changed: r.changed, liked: r.state })
          : (r: { changed: boolean; state: boolean }) => ({ changed: r.changed, faved: r.state });
      app.post(
        `/api/v1/action/${path}`,
        {
          onRequest: deps.guards.required,
          schema: {
            tags,
            security,
            description:
              'Likes, unlikes, favourites and unfavourites together: at most ZG_COUNTER_TOGGLE_LIMIT per user ' +
              'per minute in each API process (300 by default; 429 past that, changing nothing). A post the ' +
              'caller may not see is 404. 503 UNAVAILABLE while Redis is unreachable (changing nothing, unless ' +
              'Redis took the change and only its answer was lost: `/action/status` tells), and ' +
              'on the cluster profile from a loss of its data until `zhiguang counters replay` has brought the ' +
              'likes back (also while a replay runs).',
            body: ActionBody,
            response: {
              200: metric === 'like' ? LikeResponse : FavResponse,
              ...errorResponses(400, 401, 404, 429, 503),
            },
          },
        },
        async (request) => {
          const { entityType, entityId } = request.body;
          const ref: EntityRef = {
            etype: entityType,
            eid: typeof entityId === 'string' ? entityId : String(entityId),
          };
          return answer(await deps.counters.toggle(ref, metric, principalOf(request).userId, on));
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
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          querystring: StatusQuery,
          response: { 200: StatusResponse, ...errorResponses(400, 401) },
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
        onRequest: deps.guards.optional,
        schema: {
          tags,
          // A token is optional: sent, it adds the caller's own view.
          security: [{}, { bearerAuth: [] }],
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
        onRequest: deps.guards.optional,
        schema: {
          tags,
          // A token is optional: sent, it adds the caller's own view.
          security: [{}, { bearerAuth: [] }],
          params: TypeParams,
          querystring: BatchQuery,
          response: { 200: BatchCountsResponse, ...errorResponses(400, 401) },
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
        const items: { entityId: string; counts: CountsView }[] = [];
        for (let i = 0; i < ids.length; i++) {
          const c = counts[i];
          if (c) items.push({ entityId: ids[i]!, counts: c });
        }
        return { entityType: etype, items };
      },
    );
  };
}
