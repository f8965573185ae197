import { Type, type TSchema } from 'typebox';
import type { FastifyReply } from 'fastify';

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

/**
 * Sends JSON the route wrote itself, as UTF-8 bytes, past the response serializer: for answers that
 * reuse bytes encoded earlier. The route's response schema still documents them, and the route's
 * tests check that they match it.
 */
export function sendJsonBytes(reply: FastifyReply, bytes: Buffer): FastifyReply {
  return reply.type('application/json; charset=utf-8').send(bytes);
}
