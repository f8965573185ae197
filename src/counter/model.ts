/**
 * The counter pipeline's vocabulary. An entity is `(etype, eid)`; posts are `knowpost` with
 * snowflake ids kept as decimal strings (they do not fit a double).
 */
export const ENTITY_TYPES = ['knowpost'] as const;
export type EntityType = (typeof ENTITY_TYPES)[number];

/** How entity ids are written: a positive decimal integer without leading zeros, at most 20 digits. */
export const ENTITY_ID_PATTERN = '^[1-9][0-9]{0,19}$';
const ENTITY_ID = new RegExp(ENTITY_ID_PATTERN);

export const isEntityId = (v: unknown): v is string => typeof v === 'string' && ENTITY_ID.test(v);

export const isEntityType = (v: unknown): v is EntityType =>
  typeof v === 'string' && (ENTITY_TYPES as readonly string[]).includes(v);

export interface EntityRef {
  etype: EntityType;
  eid: string;
}

/** Metrics backed by fact sets (who liked, who favourited). */
export const FACT_METRICS = ['like', 'fav'] as const;
export type FactMetric = (typeof FACT_METRICS)[number];

/** Snapshot field order for posts: five unsigned 32-bit big-endian integers. */
export const POST_FIELDS = ['read', 'like', 'fav', 'comment', 'repost'] as const;
export type PostField = (typeof POST_FIELDS)[number];
export const FIELD_INDEX: Record<FactMetric, number> = { like: 1, fav: 2 };

/** The five snapshot fields in layout order. */
export type Counts = [number, number, number, number, number];

export const ZERO_COUNTS: Counts = [0, 0, 0, 0, 0];

/**
 * One change of a fact set. `seq` numbers the changes of one entity (all metrics together),
 * starting at 1, assigned atomically with the change itself; `eventId` is `etype:eid:seq`.
 */
export interface CounterEvent {
  eventId: string;
  entityType: EntityType;
  entityId: string;
  metric: FactMetric;
  idx: number;
  userId: number;
  delta: 1 | -1;
  ts: number;
  seq: number;
}

export const COUNTER_TOPIC = 'counter-events';

export function entityKey(ref: EntityRef): string {
  return `${ref.etype}:${ref.eid}`;
}

export function parseEntityKey(key: string): EntityRef | null {
  const at = key.indexOf(':');
  const etype = key.slice(0, at);
  const eid = key.slice(at + 1);
  if (!isEntityType(etype) || !isEntityId(eid)) return null;
  return { etype, eid };
}

export function eventFor(
  ref: EntityRef,
  metric: FactMetric,
  userId: number,
  delta: 1 | -1,
  seq: number,
  ts: number,
): CounterEvent {
  return {
    eventId: `${ref.etype}:${ref.eid}:${seq}`,
    entityType: ref.etype,
    entityId: ref.eid,
    metric,
    idx: FIELD_INDEX[metric],
    userId,
    delta,
    ts,
    seq,
  };
}
