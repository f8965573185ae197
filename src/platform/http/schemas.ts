import { Type, type TSchema } from 'typebox';

export const ErrorSchema = Type.Object({
  code: Type.String(),
  message: Type.String(),
  requestId: Type.String(),
});

/** Nullable helper: fast-json-stringify and ajv both understand anyOf with null. */
export const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);

/** Standard error answers to list in a route's schema so the OpenAPI document shows them. */
export function errorResponses(...statuses: number[]): Record<number, typeof ErrorSchema> {
  return Object.fromEntries(statuses.map((s) => [s, ErrorSchema]));
}
