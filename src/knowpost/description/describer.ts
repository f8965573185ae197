import { BadRequestError } from '../../platform/errors/errors.js';

/** Longest description a post may carry, in Unicode code points. */
export const DESCRIPTION_MAX_LENGTH = 50;

export type DescriptionSource = 'ai' | 'extractive';

export interface SuggestedDescription {
  /** Plain text, normalised (see `normalizeDescription`), 1 to `DESCRIPTION_MAX_LENGTH` code points. */
  description: string;
  /** Who wrote it: the language model, or the offline summariser. */
  source: DescriptionSource;
}

/**
 * Suggests the one-line description shown under a post's title, from the post's markdown.
 *
 * - Never throws because a provider failed, timed out, was misconfigured or answered with something
 *   unusable: an implementation that depends on one falls back to another (in the end the offline
 *   summariser) and says so in `source`.
 * - Always resolves to a normalised description of at most `DESCRIPTION_MAX_LENGTH` code points.
 * - Reads the opening `ANALYSED_CHARS` of the content (`analysedPart`), in time linear in it.
 * - Rejects with `EmptyContentError` (a 400) when that opening has no text left once normalised, and
 *   with `signal.reason` when the caller aborts: nobody is waiting for an answer any more.
 */
export interface DescriptionSuggester {
  suggest(content: string, signal?: AbortSignal): Promise<SuggestedDescription>;
}

/**
 * How much of a post the suggesters read: its opening says what it is about, and reading a whole
 * 200,000-character body would only hold up the request. A post whose opening shows no text is empty.
 */
export const ANALYSED_CHARS = 20_000;

/** The opening of `content` the suggesters read: at most `max` characters, ended at its last line break when it has one. */
export function analysedPart(content: string, max: number = ANALYSED_CHARS): string {
  if (content.length <= max) return content;
  const lineEnd = content.lastIndexOf('\n', max);
  if (lineEnd > 0) return content.slice(0, lineEnd);
  const cut = content.slice(0, max);
  return /[\uD800-\uDBFF]$/.test(cut) ? cut.slice(0, -1) : cut;
}

export class EmptyContentError extends BadRequestError {
  constructor() {
    super('content has no text to describe', 'DESCRIPTION_CONTENT_EMPTY');
    this.name = 'EmptyContentError';
  }
}

/** What the suggesters log through; a pino logger fits. */
export interface DescriptionLog {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}
