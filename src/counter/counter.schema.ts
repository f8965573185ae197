import { Type } from 'typebox';
import { ENTITY_ID_PATTERN } from './model.js';

const EntityType = Type.Literal('knowpost');
/** Ids travel as strings (64-bit snowflakes); small integers are accepted for old clients. */
const EntityId = Type.Union([
  Type.String({ pattern: ENTITY_ID_PATTERN }),
  Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER }),
]);

export const ActionBody = Type.Object({ entityType: EntityType, entityId: EntityId });
export const LikeResponse = Type.Object({ changed: Type.Boolean(), liked: Type.Boolean() });
export const FavResponse = Type.Object({ changed: Type.Boolean(), faved: Type.Boolean() });

/**
 * The requested counts of a post, in snapshot order. Declared field by field (not as a record) so the
 * serializer writes known properties instead of testing every key against a pattern.
 */
const CountsObject = Type.Object(
  {
    read: Type.Optional(Type.Integer()),
    like: Type.Optional(Type.Integer()),
    fav: Type.Optional(Type.Integer()),
    comment: Type.Optional(Type.Integer()),
    repost: Type.Optional(Type.Integer()),
  },
  { additionalProperties: false },
);

export const SingleParams = Type.Object({
  etype: EntityType,
  eid: Type.String({ pattern: ENTITY_ID_PATTERN }),
});
export const TypeParams = Type.Object({ etype: EntityType });
const Metrics = Type.Optional(
  Type.String({
    maxLength: 200,
    description:
      'comma-separated metric names (read, like, fav, comment, repost); unknown names are ignored, and ' +
      'without a known one every metric is answered',
  }),
);
export const MetricsQuery = Type.Object({ metrics: Metrics });
export const BatchQuery = Type.Object({
  ids: Type.String({ minLength: 1, maxLength: 2100, description: 'comma-separated entity ids, at most 100' }),
  metrics: Metrics,
});
export const StatusQuery = Type.Object({
  entityType: EntityType,
  ids: Type.String({ minLength: 1, maxLength: 2100 }),
});

export const SingleCountsResponse = Type.Object({
  entityType: Type.String(),
  entityId: Type.String(),
  counts: CountsObject,
});
export const BatchCountsResponse = Type.Object({
  entityType: Type.String(),
  items: Type.Array(Type.Object({ entityId: Type.String(), counts: CountsObject })),
});
export const StatusResponse = Type.Object({
  items: Type.Array(Type.Object({ entityId: Type.String(), liked: Type.Boolean(), faved: Type.Boolean() })),
});
