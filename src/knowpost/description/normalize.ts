import { isVisible } from '../../platform/http/schemas.js';
import { DESCRIPTION_MAX_LENGTH } from './describer.js';
import {
  codePointLength,
  collapseWhitespace,
  foldCompatibility,
  isUnspacedChar,
  markdownToText,
} from './text.js';

const LABELS = [
  '描述',
  '简介',
  '簡介',
  '摘要',
  '概要',
  '概述',
  '概括',
  '总结',
  '總結',
  '简述',
  '導語',
  '导语',
  '标题',
  '回答',
  '答',
  '一句话(?:描述|总结|简介|概括|摘要)?',
  '文章(?:描述|摘要|简介|概要)',
  '内容(?:描述|摘要|简介)',
  '(?:short |meta |post )?description',
  '(?:one[- ](?:line|sentence) )?summary',
  'abstract',
  'tl;? ?dr',
  'answer',
].join('|');
const LABEL = new RegExp(
  `^(?:【\\s*(?:${LABELS})\\s*】|\\[\\s*(?:${LABELS})\\s*\\]|(?:${LABELS})\\s*[:：])\\s*`,
  'iu',
);

/** Opening quote → the closing quotes accepted for it (models mix curly and straight quotes). */
const QUOTES: ReadonlyMap<string, readonly string[]> = new Map([
  ['"', ['"', '”']],
  ["'", ["'", '’']],
  ['“', ['”', '"', '“']],
  ['‘', ['’', "'", '‘']],
  ['「', ['」']],
  ['『', ['』']],
  ['《', ['》']],
  ['«', ['»']],
]);
const CLOSERS = new Set([...QUOTES.values()].flat());

const TRAILING = new Set([...'。．.!！?？,，;；:：、…~～—–', ' ']);
const LEADING = new Set([...',，;；:：、', ' ']);

const SENTENCE_END = new Set([...'。！？!?；;…']);
const CLAUSE_END = new Set([...'，,、：:—']);
const WORD_CHAR = /^[\p{L}\p{N}]$/u;

const graphemes = new Intl.Segmenter(undefined, { granularity: 'grapheme' });
const words = new Intl.Segmenter('zh', { granularity: 'word' });

// Every character in TRAILING, LEADING and QUOTES is in the BMP, so code units can be compared directly.
function stripTrailing(text: string): string {
  let end = text.length;
  while (end > 0 && TRAILING.has(text[end - 1] ?? '')) end--;
  return text.slice(0, end);
}

function stripLeading(text: string): string {
  let start = 0;
  while (start < text.length && LEADING.has(text[start] ?? '')) start++;
  return text.slice(start);
}

function isWrappedBy(inner: string, open: string, close: string): boolean {
  if (open === close) return !inner.includes(open);
  let depth = 0;
  for (const char of inner) {
    if (char === open) depth++;
    else if (char === close) {
      if (depth === 0) return false;
      depth--;
    }
  }
  return depth === 0;
}

function unwrapQuotes(text: string): string {
  const first = text[0] ?? '';
  const last = text[text.length - 1] ?? '';
  const closers = QUOTES.get(first);
  if (closers && text.length >= 2 && closers.includes(last)) {
    const inner = text.slice(1, -1);
    if (isWrappedBy(inner, first, last)) return inner;
  }
  // A quote left alone at either end (a cut-off answer) is no quotation.
  if (closers && !closers.some((close) => text.includes(close, 1))) return text.slice(1);
  if (CLOSERS.has(last) && !QUOTES.has(last)) {
    const openers = [...QUOTES].filter(([, close]) => close.includes(last)).map(([open]) => open);
    if (!openers.some((open) => text.includes(open))) return text.slice(0, -1);
  }
  return text;
}

// What shows nothing at either end: at the start anything but a letter, digit, punctuation mark or
// symbol (blank fillers too), so a description starts with something seen; at the end spaces,
// format characters and fillers (a combining mark there belongs to the letter before it).
const BLANK_START = /^(?:[^\p{L}\p{N}\p{P}\p{S}]|[\u115f\u1160\u3164\uffa0\u2800])+/u;
const BLANK_END = /[\s\p{Cf}\u115f\u1160\u3164\uffa0\u2800]+$/u;

function peel(text: string): string {
  let current = text;
  for (let round = 0; round < 8; round++) {
    const before = current;
    current = stripLeading(current.replace(BLANK_START, '')).replace(LABEL, '');
    current = stripTrailing(unwrapQuotes(current).trim()).replace(BLANK_END, '');
    if (current === before) break;
  }
  return current;
}

function isMidWord(before: string | undefined, after: string | undefined): boolean {
  if (before === undefined || after === undefined) return false;
  return WORD_CHAR.test(before) && WORD_CHAR.test(after) && !isUnspacedChar(before) && !isUnspacedChar(after);
}

/** The longest grapheme-whole prefix of at most `max` code points, ended at a boundary when one is near. */
function cut(text: string, max: number): string {
  if (text.length <= max || codePointLength(text) <= max) return text;
  let prefix = '';
  let count = 0;
  for (const { segment } of graphemes.segment(text)) {
    const size = codePointLength(segment);
    if (count + size > max) break;
    prefix += segment;
    count += size;
  }
  const rest = text.slice(prefix.length);
  const next = rest.codePointAt(0);
  const nextChar = next === undefined ? undefined : String.fromCodePoint(next);
  if (nextChar === undefined || /\s/.test(nextChar) || TRAILING.has(nextChar)) return stripTrailing(prefix);

  const chars = [...prefix];
  // Only the last ~30% is worth giving up for a cleaner ending.
  const floor = Math.max(1, Math.ceil(chars.length * 0.7));
  const findFromEnd = (accept: (char: string, following: string | undefined) => boolean): number => {
    for (let i = chars.length - 1; i >= floor; i--) {
      if (accept(chars[i] ?? '', chars[i + 1] ?? nextChar)) return i;
    }
    return -1;
  };
  let at = findFromEnd((c, f) => SENTENCE_END.has(c) || (c === '.' && f !== undefined && /\s/.test(f)));
  if (at < 0) at = findFromEnd((c) => CLAUSE_END.has(c));
  if (at < 0 && isMidWord(chars[chars.length - 1], nextChar)) at = findFromEnd((c) => /\s/.test(c));
  const shortened = at > 0 ? stripTrailing(chars.slice(0, at).join('')) : '';
  if (shortened !== '') return shortened;
  // Chinese and Japanese have no spaces: a dictionary finds where the word that runs past the cut
  // begins.
  const last = chars[chars.length - 1];
  if (last !== undefined && isUnspacedChar(last) && isUnspacedChar(nextChar ?? '')) {
    const start = wordStartBefore(text, prefix.length, chars.slice(0, floor).join('').length);
    if (start !== undefined) return stripTrailing(text.slice(0, start));
  }
  return stripTrailing(prefix);
}

/**
 * Where the word that spans code-unit index `at` of `text` begins, when that is at or after `floor`
 * (undefined when `at` is already between two words, or the word began too early).
 */
function wordStartBefore(text: string, at: number, floor: number): number | undefined {
  // A few characters past the cut are enough to see the whole word around it.
  const window = text.slice(0, at + 16);
  let start: number | undefined;
  for (const { index } of words.segment(window)) {
    if (index > at) break;
    start = index;
  }
  if (start === undefined || start === at || start < floor || start === 0) return undefined;
  return start;
}

/* eslint-disable no-control-regex -- this pattern exists to find control characters */
/**
 * What a description's `single-line` format refuses (see `platform/http/schemas.ts`) apart from the
 * whitespace `collapseWhitespace` folds: C0 and C1 controls, DEL, the line and paragraph separators
 * and the bidirectional overrides.
 */
const CONTROLS = /[\u0000-\u0008\u000e-\u001f\u007f-\u009f\u2028\u2029\u202d\u202e]/g;
/* eslint-enable no-control-regex */

/** Line breaks by another name (next line, line and paragraph separators) break lines; other controls go. */
function withoutControls(text: string): string {
  return text.replace(CONTROLS, (c) => (c === '\u0085' || c === '\u2028' || c === '\u2029' ? '\n' : ''));
}

/**
 * Turns model output, or any markdown, into a plain one-line description: NFKC (keeping full-width
 * punctuation inside CJK text), markdown and code fences gone, whitespace collapsed, wrapping quotes,
 * control characters, leading labels ("描述：", "Summary:") and trailing punctuation removed, then cut to at most `max`
 * code points without splitting a character, preferably at a sentence, clause or word boundary.
 */
export function normalizeDescription(raw: string, max: number = DESCRIPTION_MAX_LENGTH): string {
  const limit = Math.floor(max);
  if (!(limit > 0)) return '';
  const text = normalizedText(raw);
  // It starts with something seen, so a cut of it shows something, or is empty (punctuation alone,
  // which the suggesters then do without).
  return isVisible(text) ? cut(text, limit) : '';
}

/** Whether `raw` holds text a description can be drawn from: something seen once normalised, however far in. */
export function hasDescribableText(raw: string): boolean {
  return isVisible(normalizedText(raw));
}

/**
 * `normalizeDescription`'s text before the cut: without what a description's `single-line` format
 * refuses (controls, unpaired surrogates, piles of combining marks), so a suggestion can be saved,
 * and without what shows nothing at either end.
 */
function normalizedText(raw: string): string {
  const plain = withoutControls(markdownToText(foldCompatibility(raw)))
    .replace(/\p{Cs}/gu, '')
    .replace(/(\p{M}{4})\p{M}+/gu, '$1');
  return peel(collapseWhitespace(plain));
}
