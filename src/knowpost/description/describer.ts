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
 * - Rejects with `EmptyContentError` (a 400) when the content has no text left once normalised, and
 *   with `signal.reason` when the caller aborts: nobody is waiting for an answer any more.
 */
export interface DescriptionSuggester {
  suggest(content: string, signal?: AbortSignal): Promise<SuggestedDescription>;
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
