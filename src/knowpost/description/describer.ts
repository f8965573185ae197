import { BadRequestError } from '../../platform/errors/errors.js';
import { fenceOf } from './text.js';

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

/**
 * How far into a body the suggesters look for that opening's text past what no reader sees (pasted
 * images' data, script and style elements). Text first shown further in is not read, so a body of
 * megabytes costs no more than this.
 */
export const SCANNED_CHARS = 1_000_000;

/**
 * The opening of `content` the suggesters read: at most `max` characters of it once inline data
 * (`withoutInlineData`) and what no reader sees (`withoutHiddenHtml`) are left out and runs of blank
 * lines made one, ended at its last line break when that keeps a few sentences. What is left out does not use up the opening: a post that starts
 * with a pasted screenshot is read from the text after it, within the first `SCANNED_CHARS`.
 */
export function analysedPart(content: string, max: number = ANALYSED_CHARS): string {
  // A window four times larger each round until it shows `max` characters: linear in what it reads.
  for (let window = max; ; window = Math.min(window * 4, SCANNED_CHARS)) {
    const opening = openingOf(content, window);
    // Blank lines run together (as a renderer shows them): the lines of a hidden element are no text.
    const shown = withoutHiddenHtml(withoutInlineData(opening)).replace(/\n(?:[ \t]*\n){2,}/g, '\n\n');
    if (shown.length >= max || opening.length === content.length || window >= SCANNED_CHARS) {
      return openingOf(shown, max);
    }
  }
}

/** The markdown with the data of `data:` URLs (images pasted into the text) left out: `data:` stays. */
export function withoutInlineData(markdown: string): string {
  return markdown.replace(/data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+/g, 'data:');
}

/** Characters before a line break that are enough of an opening to end it there (a few sentences). */
const OPENING_ENOUGH = 200;

function openingOf(content: string, max: number): string {
  if (content.length <= max) return content;
  // Ended at a line break only when that keeps a few sentences (or half of it): a short heading
  // followed by one long paragraph is read into the paragraph, not as the heading alone.
  const lineEnd = content.lastIndexOf('\n', max);
  if (lineEnd >= Math.min(max / 2, OPENING_ENOUGH)) return content.slice(0, lineEnd);
  const cut = content.slice(0, max);
  return /[\uD800-\uDBFF]$/.test(cut) ? cut.slice(0, -1) : cut;
}

// Raw HTML whose text a reader never sees: a script or style element.
const HIDDEN_TAG = /<(script|style)(?=[\s/>]|$)/gi;
const HIDDEN_BLOCK = /^ {0,3}<(script|style)(?=[\s/>]|$)/i;

/**
 * The markdown without the contents of `<script>` and `<style>` elements, as a markdown renderer
 * that passes HTML through would show it: a line opening with such a tag starts an HTML block that
 * runs to the line holding its closing tag (or to the end); within a line, only an element closed on
 * that line goes. Code (fenced or inline) keeps its text. Linear in the input.
 */
export function withoutHiddenHtml(markdown: string): string {
  HIDDEN_TAG.lastIndex = 0;
  if (!HIDDEN_TAG.test(markdown)) return markdown;
  const lines = markdown.split('\n');
  let block: RegExp | undefined;
  let fence: string | undefined;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    if (block) {
      const rest = afterClosing(line, block, 0);
      lines[i] = rest ?? '';
      if (rest !== undefined) block = undefined;
      continue;
    }
    const marker = fenceOf(line);
    if (fence !== undefined) {
      if (marker !== undefined && marker[0] === fence[0] && marker.length >= fence.length) fence = undefined;
      continue;
    }
    if (marker !== undefined) {
      fence = marker;
      continue;
    }
    const opening = HIDDEN_BLOCK.exec(line);
    if (opening) {
      const closing = new RegExp(`</${opening[1]}`, 'gi');
      const rest = afterClosing(line, closing, opening[0].length);
      lines[i] = rest ?? '';
      if (rest === undefined) block = closing;
      continue;
    }
    lines[i] = withoutInlineElements(line);
  }
  return lines.join('\n');
}

/** What follows the closing tag `closing` matches from `from` on, or undefined when there is none. */
function afterClosing(line: string, closing: RegExp, from: number): string | undefined {
  closing.lastIndex = from;
  if (!closing.test(line)) return undefined;
  const end = line.indexOf('>', closing.lastIndex);
  return end < 0 ? '' : line.slice(end + 1);
}

/** A line without the script and style elements closed on it, leaving code spans alone. */
function withoutInlineElements(line: string): string {
  let kept = '';
  let at = 0;
  // Backticks before `counted`: an odd number means a code span is open there.
  let ticks = 0;
  let counted = 0;
  while (at < line.length) {
    HIDDEN_TAG.lastIndex = at;
    const open = HIDDEN_TAG.exec(line);
    if (!open) break;
    for (; counted < open.index; counted++) if (line[counted] === '`') ticks++;
    if (ticks % 2 === 1) break;
    const closing = new RegExp(`</${open[1]}`, 'gi');
    closing.lastIndex = HIDDEN_TAG.lastIndex;
    // No closing tag after this opening: none after a later one either.
    if (!closing.test(line)) break;
    const end = line.indexOf('>', closing.lastIndex);
    kept += `${line.slice(at, open.index)} `;
    at = end < 0 ? line.length : end + 1;
    counted = at;
  }
  return kept + line.slice(at);
}

export class EmptyContentError extends BadRequestError {
  constructor() {
    // The contract's validation answer: BAD_REQUEST, naming the field.
    super('body.content has no text to describe');
    this.name = 'EmptyContentError';
  }
}

/** What the suggesters log through; a pino logger fits. */
export interface DescriptionLog {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
}
