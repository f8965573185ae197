import { Type } from 'typebox';

const EntityType = Type.Literal('knowpost');
const EntityIdPattern = '^[1-9][0-9]{0,19}$';
/** Ids travel as strings (64-bit snowflakes); small integers are accepted for old clients. */
const EntityId = Type.Union([
  Type.String({ pattern: EntityIdPattern }),
  Type.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER }),
]);

export const ActionBody = Type.Object({ entityType: EntityType, entityId: EntityId });
export const LikeResponse = Type.Object({ changed: Type.Boolean(), liked: Type.Boolean() });
export const FavResponse = Type.Object({ changed: Type.Boolean(), faved: Type.Boolean() });

const CountsObject = Type.Record(Type.String(), Type.Integer());

export const SingleParams = Type.Object({
  etype: EntityType,
  eid: Type.String({ pattern: EntityIdPattern }),
});
export const TypeParams = Type.Object({ etype: EntityType });
export const MetricsQuery = Type.Object({ metrics: Type.Optional(Type.String({ maxLength: 200 })) });
export const BatchQuery = Type.Object({
  ids: Type.String({ minLength: 1, maxLength: 2100, description: 'comma-separated entity ids, at most 100' }),
  metrics: Type.Optional(Type.String({ maxLength: 200 })),
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
