/**
 * Text helpers shared by the normaliser and the extractive summariser. Every pattern here is linear
 * in its input: they run on whole posts (up to the body limit) inside a request.
 */

// Scripts written without spaces between words: a line break between two of them is not a space.
const UNSPACED = String.raw`\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\u3000-\u303F`;
// NFKC turns these into ASCII, which reads wrong inside Chinese or Japanese text.
const CJK_PUNCTUATION_KEPT = '！（），：；？～';

const UNSPACED_CHAR = new RegExp(`[${UNSPACED}${CJK_PUNCTUATION_KEPT}…]`, 'u');
const ENDS_UNSPACED = new RegExp(`[${UNSPACED}${CJK_PUNCTUATION_KEPT}]$`, 'u');
const STARTS_UNSPACED = new RegExp(`^[${UNSPACED}${CJK_PUNCTUATION_KEPT}]`, 'u');
const KEPT_OR_ELLIPSIS = new RegExp(`[${CJK_PUNCTUATION_KEPT}…]`, 'gu');

export function isUnspacedChar(char: string): boolean {
  return UNSPACED_CHAR.test(char);
}

export function codePointLength(text: string): number {
  let n = 0;
  for (const _ of text) n++;
  return n;
}

/**
 * NFKC (full-width Latin letters and digits, ideographic spaces, ligatures, circled numbers…), except
 * that full-width punctuation between CJK characters stays full-width and `…` stays one character.
 */
export function foldCompatibility(text: string): string {
  let out = '';
  let last = 0;
  for (const match of text.matchAll(KEPT_OR_ELLIPSIS)) {
    const at = match.index;
    const char = match[0];
    out += text.slice(last, at).normalize('NFKC');
    const inCjk =
      char === '…' ||
      ENDS_UNSPACED.test(text.slice(Math.max(0, at - 2), at)) ||
      STARTS_UNSPACED.test(text.slice(at + 1, at + 3));
    out += inCjk ? char : char.normalize('NFKC');
    last = at + char.length;
  }
  return out + text.slice(last).normalize('NFKC');
}

/** Runs of whitespace become one space, or nothing where a line break falls inside CJK text. */
export function collapseWhitespace(text: string): string {
  return text
    .replace(/\s+/g, (ws, offset: number, whole: string) => {
      if (!ws.includes('\n')) return ' ';
      const before = whole.slice(Math.max(0, offset - 2), offset);
      const after = whole.slice(offset + ws.length, offset + ws.length + 2);
      return ENDS_UNSPACED.test(before) && STARTS_UNSPACED.test(after) ? '' : ' ';
    })
    .trim();
}

/** Joins the lines of one paragraph the way a renderer would show them. */
export function joinLines(lines: readonly string[]): string {
  return collapseWhitespace(lines.join('\n'));
}

const ENTITIES: Record<string, string> = {
  '&nbsp;': ' ',
  '&amp;': '&',
  '&lt;': '<',
  '&gt;': '>',
  '&quot;': '"',
  '&#39;': "'",
  '&apos;': "'",
};

function removeHtmlComments(text: string): string {
  let out = '';
  let from = 0;
  for (;;) {
    const open = text.indexOf('<!--', from);
    if (open < 0) return out + text.slice(from);
    const close = text.indexOf('-->', open + 4);
    out += text.slice(from, open) + ' ';
    if (close < 0) return out;
    from = close + 3;
  }
}

// Every construct stripInlineMarkdown removes starts with one of these.
const INLINE_MARKUP = /[[<`*_~=&]/;

/** Inline markdown to the text a reader sees: images go, links keep their text, emphasis and tags go. */
export function stripInlineMarkdown(text: string): string {
  if (!INLINE_MARKUP.test(text)) return text;
  return (
    removeHtmlComments(text)
      .replace(/!\[[^[\]\n]*\]\((?:[^()\n]|\([^()\n]*\))*\)/g, ' ')
      .replace(/!\[[^[\]\n]*\]\[[^[\]\n]*\]/g, ' ')
      .replace(/\[\^[^[\]\n]+\]/g, '')
      .replace(/\[([^[\]\n]*)\]\((?:[^()\n]|\([^()\n]*\))*\)/g, '$1')
      .replace(/\[([^[\]\n]+)\]\[[^[\]\n]*\]/g, '$1')
      .replace(/<(https?:\/\/[^<>\s]+)>/g, '$1')
      .replace(/<\/?[A-Za-z][\w-]*(?:\s[^<>\n]*)?\/?>/g, ' ')
      // From the start of a run of backticks only, and without giving any back (a lookahead does not
      // backtrack): otherwise a long run with no closing one takes time quadratic in its length.
      .replace(/(?<!`)(?=(`+))\1([^`\n]+)`+/g, '$2')
      .replace(/\*\*([^*\n]+)\*\*/g, '$1')
      .replace(/__([^_\n]+)__/g, '$1')
      .replace(/~~([^~\n]+)~~/g, '$1')
      .replace(/==([^=\n]+)==/g, '$1')
      .replace(/\*(?=[^\s*])([^*\n]*[^\s*])\*/g, '$1')
      .replace(/\*([^\s*])\*/g, '$1')
      .replace(/(^|[^\p{L}\p{N}_])_(?=[^\s_])([^_\n]*[^\s_])_(?![\p{L}\p{N}_])/gu, '$1$2')
      .replace(/&(?:nbsp|amp|lt|gt|quot|apos|#39);/g, (entity) => ENTITIES[entity] ?? entity)
  );
}

const HEADING = /^\s{0,3}#{1,6}(?:\s+|$)/;
const LIST_MARKER = /^\s*(?:[-*+•]|\d{1,3}[.)、])\s+(?:\[[ xX]\]\s+)?/;
const QUOTE_MARKER = /^\s*(?:>\s?)+/;
const RULE = /^\s{0,3}(?:(?:-\s*){3,}|(?:\*\s*){3,}|(?:_\s*){3,}|(?:=\s*){3,})$/;

export function fenceOf(line: string): string | undefined {
  return /^\s{0,3}(`{3,}|~{3,})/.exec(line)?.[1];
}

export function isHeading(line: string): boolean {
  return HEADING.test(line);
}

export function isRule(line: string): boolean {
  return RULE.test(line);
}

export function isTableSeparator(line: string): boolean {
  return /^[\s|:-]+$/.test(line) && line.includes('-') && line.includes('|');
}

export function isTableRow(line: string): boolean {
  const trimmed = line.trim();
  return trimmed.startsWith('|') && trimmed.endsWith('|') && trimmed.length > 1;
}

export function headingText(line: string): string {
  // Closing hashes after the first of a run of spaces only: linear in a long run not followed by them.
  return line.replace(HEADING, '').replace(/(?<!\s)\s+#+\s*$/, '');
}

export function listItemText(line: string): string | undefined {
  const match = LIST_MARKER.exec(line);
  return match ? line.slice(match[0].length) : undefined;
}

export function quoteText(line: string): string | undefined {
  const match = QUOTE_MARKER.exec(line);
  return match ? line.slice(match[0].length) : undefined;
}

/**
 * Markdown to plain text, keeping what code fences wrap (a model sometimes fences its whole answer)
 * and the cells of tables.
 */
export function markdownToText(markdown: string): string {
  const lines: string[] = [];
  for (const raw of markdown.split(/\r\n?|\n/)) {
    if (raw.trim() === '') {
      lines.push('');
      continue;
    }
    if (fenceOf(raw) !== undefined || isRule(raw) || isTableSeparator(raw)) {
      lines.push('');
      continue;
    }
    let line = raw;
    if (isHeading(line)) line = headingText(line);
    line = quoteText(line) ?? line;
    line = listItemText(line) ?? line;
    if (isTableRow(line)) line = line.trim().slice(1, -1).replaceAll('|', ' ');
    lines.push(stripInlineMarkdown(line));
  }
  return lines.join('\n');
}
