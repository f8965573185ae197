import { Type, type TSchema, type TStringOptions } from 'typebox';
import type { FastifyReply, FastifyRequest } from 'fastify';

export const ErrorSchema = Type.Object({
  code: Type.String(),
  message: Type.String(),
  requestId: Type.String(),
});

/** Nullable helper: fast-json-stringify and ajv both understand anyOf with null. */
export const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);

// C0 and C1 controls and DEL: never part of a name or a title, and a NUL breaks many a reader. In
// one line, the line and paragraph separators (U+2028, U+2029) break it, and the bidirectional overrides (U+202D, U+202E) make a name read backwards; embeddings,
// isolates and marks, which mixed right-to-left text carries, stay allowed, and longer text keeps
// the overrides too.
/* eslint-disable no-control-regex -- these patterns exist to find control characters */
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202d\u202e]/;
const CONTROL_BUT_LINE_BREAKS = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]/;
/* eslint-enable no-control-regex */

/**
 * More combining marks in a row than any script's letters carry (Thai or Devanagari stack two or
 * three): a run like this draws over the lines above and below it wherever the text is shown.
 */
const MARK_PILE = /\p{M}{5}/u;

/**
 * Whether `value` is text fit to keep and show: well-formed UTF-16 (an unpaired surrogate would be
 * kept as U+FFFD, or written back as JSON that strict clients refuse) and no pile of combining marks.
 */
function isShowable(value: string): boolean {
  return value.isWellFormed() && !MARK_PILE.test(value);
}

/** Whether `value` may be a name, title or tag (`single-line`). */
export function isSingleLine(value: string): boolean {
  return !CONTROL.test(value) && isShowable(value);
}

/**
 * Whether `value` shows something: a letter, digit, punctuation mark or symbol other than those
 * drawn blank (the Hangul fillers, the blank Braille pattern). Spaces, invisible format characters
 * and combining marks with nothing to combine with show nothing.
 */
export function isVisible(value: string): boolean {
  return /[\p{L}\p{N}\p{P}\p{S}]/u.test(value.replace(/[\u115f\u1160\u3164\uffa0\u2800]/gu, ''));
}

/** String formats the validators know, with what a value of each must not contain. */
export const TEXT_FORMATS = {
  'single-line': {
    validate: isSingleLine,
    message:
      'must not contain control characters, unpaired surrogates or more than 4 combining marks in a row',
  },
  'multi-line': {
    validate: (value: string) => !CONTROL_BUT_LINE_BREAKS.test(value) && isShowable(value),
    message:
      'must not contain control characters other than line breaks and tabs, unpaired surrogates or more than 4 combining marks in a row',
  },
} as const;

/** A name, title or tag: any characters but control characters. */
export const SingleLine = (options: TStringOptions = {}) =>
  Type.String({ ...options, format: 'single-line' });

/** Longer text (a bio): line breaks and tabs allowed, other control characters not. */
export const MultiLine = (options: TStringOptions = {}) => Type.String({ ...options, format: 'multi-line' });

/** Standard error answers to list in a route's schema so the OpenAPI document shows them. */
export function errorResponses(...statuses: number[]): Record<number, typeof ErrorSchema> {
  return Object.fromEntries(statuses.map((s) => [s, ErrorSchema]));
}

/**
 * Sends JSON the route wrote itself, as UTF-8 bytes, past the response serializer: for answers that
 * reuse bytes encoded earlier (feeds and details, which differ by caller: their flags, an author's
 * own posts). The route's response schema still documents them, and the route's tests check that
 * they match it. An answer to a signed-in caller is marked for no shared cache to keep, and every
 * one as varying by `Authorization`, so a cache in front keyed by URL cannot hand one to another.
 */
export function sendJsonBytes(reply: FastifyReply, bytes: Buffer): FastifyReply {
  if (reply.request.headers.authorization !== undefined)
    void reply.header('cache-control', 'private, no-store');
  // Added to what is there: the CORS hook's `Origin` (an answer echoes the caller's origin).
  const vary = reply.getHeader('vary');
  const already = vary === undefined ? '' : Array.isArray(vary) ? vary.join(', ') : String(vary);
  if (!/(^|,)\s*(authorization|\*)\s*(,|$)/i.test(already))
    void reply.header('vary', already === '' ? 'Authorization' : `${already}, Authorization`);
  return reply.type('application/json; charset=utf-8').send(bytes);
}

/**
 * For edits where every field is optional: drops the body's fields sent as null (all but `keep`,
 * where null means something) before validation, so null leaves a field as it is. The original
 * service took edits so, and clients that serialise every field of their edit object send nulls.
 * Run it as (or in) a `preValidation` hook.
 */
export function dropNullFields(request: FastifyRequest, keep: readonly string[] = []): void {
  const body: unknown = request.body;
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return;
  const record = body as Record<string, unknown>;
  for (const [key, value] of Object.entries(record)) {
    if (value === null && !keep.includes(key)) delete record[key];
  }
}

/** The readiness route (`ops.routes.ts`), whose answers the server itself gives while it closes. */
export const READINESS_ROUTE = '/readyz';
