import {
  DESCRIPTION_MAX_LENGTH,
  EmptyContentError,
  analysedPart,
  type DescriptionSuggester,
  type SuggestedDescription,
} from './describer.js';
import { hasDescribableText, normalizeDescription } from './normalize.js';
import {
  codePointLength,
  fenceOf,
  foldCompatibility,
  headingText,
  isHeading,
  isRule,
  isTableRow,
  isTableSeparator,
  joinLines,
  listItemText,
  quoteText,
  stripInlineMarkdown,
} from './text.js';

type BlockKind = 'paragraph' | 'item' | 'quote';

interface Block {
  kind: BlockKind | 'heading';
  text: string;
}

interface Sentence {
  text: string;
  kind: BlockKind;
  block: number;
  indexInBlock: number;
  order: number;
  terms: string[];
}

const STOPWORDS = new Set(
  (
    'a an the and or but nor of to in on at by for with from as into onto about over than then so if ' +
    'is are was were be been being am do does did done has have had having can could will would shall ' +
    'should may might must it its this that these those there here i me my we us our you your he him ' +
    'his she her they them their what which who whom whose how why when where all any some each every ' +
    'no not only just also very more most such own same too other out up down off again once s t don ' +
    'let get got like one two new via vs etc'
  ).split(' '),
);

// Function characters: a CJK bigram containing one says nothing about the topic.
const STOP_CHARS = new Set([
  ...'的了是在和与及或也就都而着把被个这那我你他她它们吗呢吧啊呀有不没很更最又还让给从对为以之其此于即',
]);
const STOP_BIGRAMS = new Set(
  (
    '可以 因为 所以 但是 如果 然后 什么 怎么 已经 其实 一下 一些 ' +
    '一种 一样 这样 那么 今天 大家 自己 时候 进行 需要 如何'
  ).split(' '),
);

const GENERIC_TITLES = new Set(
  (
    '前言|引言|简介|介绍|概述|背景|总结|小结|目录|正文|写在前面|序|序言|开篇|说明|笔记|草稿|无标题|更新|随笔|杂记|问题|求助|提问|分享|' +
    'introduction|intro|overview|background|summary|conclusion|contents|table of contents|toc|readme|notes|note|draft|untitled|tl;dr|tldr|preface|foreword|update|question|help'
  ).split('|'),
);

const CJK_RUN = /[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}]+/gu;
const WORD = /[\p{L}\p{N}]+(?:['’.+#-][\p{L}\p{N}]+)*[+#]*/gu;
// A full stop after a title, a Latin abbreviation or a capital initial ("Mr.", "e.g.", "J.") ends no sentence.
const SENTENCE_END =
  /(?:[。！？!?；;]|(?<!(?:^|[^\p{L}\p{N}.])(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|vs|cf|approx|Fig|e\.g|i\.e|\p{Lu}))\.(?=["'”’)）」』]*(?:\s|$)))+["'”’)）」』]*/gu;
const URL = /\b(?:https?|ftp):\/\/[^\s<>()（）]+/g;
// A Latin greeting must end at a word boundary and be followed by punctuation or an addressee, so
// that "Hibernate", "History" and "Hello world programs" keep their first word.
const GREETING =
  /^(?:(?:大家好|各位好|哈喽|嗨)\s*[，,！!。.~～]*|(?:hello|hi|hey)(?:(?: everyone| all| there| folks)(?![\p{L}\p{N}])\s*[，,！!。.~～]*|\s*[，,！!。.~～]+))\s*/iu;
const SELF_INTRODUCTION = /^(?:我是|i'm |i am |my name is )[^，,。.!！]{0,20}[，,。.!！]\s*/iu;
// A sentence opening with a connective continues a thought begun elsewhere.
const CONTINUATION =
  /^(?:此外|另外|同时|而且|并且|但是|然而|不过|所以|因此|于是|另一方面|总之|(?:also|however|but|and|so|moreover|furthermore|additionally|besides|therefore|thus)(?![\p{L}\p{N}]))/iu;
const BOILERPLATE =
  /欢迎关注|关注我|(?:求|记得)?点赞(?:收藏|关注|转发|支持)|点个赞|一键三连|转载(?:请|须|需)|原文链接|原文地址|本文首发|公众号|版权声明|未经(?:允许|授权)|感谢(?:阅读|观看)|谢谢(?:阅读|观看)|copyright|all rights reserved|follow me|subscribe|thanks for reading/iu;
// A sentence that says what the post itself does is what a description is.
const SELF_REFERENCE =
  /本文|这篇文章|本篇|这篇|文章将|这里将|\b(?:this|the present) (?:post|article|guide|tutorial|write-up|piece)\b|\bin this (?:post|article|guide|tutorial)\b/iu;

function terms(text: string): string[] {
  const found: string[] = [];
  for (const run of text.matchAll(CJK_RUN)) {
    const chars = [...run[0]];
    for (let i = 0; i + 1 < chars.length; i++) {
      const a = chars[i] ?? '';
      const b = chars[i + 1] ?? '';
      const bigram = a + b;
      if (!STOP_CHARS.has(a) && !STOP_CHARS.has(b) && !STOP_BIGRAMS.has(bigram)) found.push(bigram);
    }
  }
  for (const match of text.replace(CJK_RUN, ' ').matchAll(WORD)) {
    let word = match[0].toLowerCase();
    if (word.length < 2 || STOPWORDS.has(word) || /^\d+$/.test(word)) continue;
    if (word.length > 4 && word.endsWith('s') && !word.endsWith('ss')) word = word.slice(0, -1);
    found.push(word);
  }
  return found;
}

function frontMatterTitle(lines: readonly string[]): { title: string | undefined; skip: number } {
  if (lines[0]?.trim() !== '---') return { title: undefined, skip: 0 };
  for (let i = 1; i < Math.min(lines.length, 60); i++) {
    const line = lines[i] ?? '';
    if (line.trim() === '---' || line.trim() === '...') {
      const titleLine = lines.slice(1, i).find((l) => /^title\s*:/i.test(l));
      const title = titleLine
        ?.replace(/^title\s*:\s*/i, '')
        .replace(/^["']|["']$/g, '')
        .trim();
      return { title: title || undefined, skip: i + 1 };
    }
  }
  return { title: undefined, skip: 0 };
}

function plain(text: string): string {
  return stripInlineMarkdown(text).replace(URL, ' ');
}

/** The prose of a post, block by block; code, tables, math, rules and images are not prose. */
function parseBlocks(markdown: string): { blocks: Block[]; frontTitle: string | undefined } {
  const lines = markdown.split(/\r\n?|\n/);
  const { title: frontTitle, skip } = frontMatterTitle(lines);
  const blocks: Block[] = [];
  let current: { kind: BlockKind; lines: string[] } | undefined;
  let fence: string | undefined;
  let inMath = false;
  let inTable = false;

  const flush = (): void => {
    if (current) {
      const text = joinLines(current.lines.map(plain));
      if (/[\p{L}\p{N}]/u.test(text)) blocks.push({ kind: current.kind, text });
    }
    current = undefined;
  };
  const add = (kind: BlockKind, text: string): void => {
    if (current?.kind !== kind) {
      flush();
      current = { kind, lines: [] };
    }
    current.lines.push(text);
  };

  for (const line of lines.slice(skip)) {
    const marker = fenceOf(line);
    if (fence !== undefined) {
      if (
        marker !== undefined &&
        marker[0] === fence[0] &&
        marker.length >= fence.length &&
        line.trim() === marker
      ) {
        fence = undefined;
      }
      continue;
    }
    if (marker !== undefined) {
      flush();
      fence = marker;
      continue;
    }
    if (line.trim() === '$$') {
      flush();
      inMath = !inMath;
      continue;
    }
    if (inMath) continue;
    if (line.trim() === '') {
      inTable = false;
      flush();
      continue;
    }
    if (isHeading(line)) {
      flush();
      const text = joinLines([plain(headingText(line))]);
      if (text) blocks.push({ kind: 'heading', text });
      continue;
    }
    if (inTable && line.includes('|')) continue;
    inTable = false;
    if (isTableSeparator(line)) {
      // The paragraph so far was the table's header row.
      if (current?.kind === 'paragraph') current.lines.pop();
      flush();
      inTable = true;
      continue;
    }
    if (isRule(line)) {
      // Setext: a paragraph underlined with === or --- is a heading.
      if (current?.kind === 'paragraph' && /^\s*[=-]+\s*$/.test(line)) {
        const text = joinLines(current.lines.map(plain));
        current = undefined;
        if (text) blocks.push({ kind: 'heading', text });
      } else flush();
      continue;
    }
    if (isTableRow(line)) {
      flush();
      continue;
    }
    const quoted = quoteText(line);
    if (quoted !== undefined) {
      add('quote', listItemText(quoted) ?? quoted);
      continue;
    }
    const item = listItemText(line);
    if (item !== undefined) {
      flush();
      add('item', item);
      continue;
    }
    if (current) current.lines.push(line);
    else add('paragraph', line);
  }
  flush();
  return { blocks, frontTitle };
}

function cleanSentence(sentence: string): string {
  return sentence.trim().replace(GREETING, '').replace(SELF_INTRODUCTION, '').trim();
}

function splitSentences(text: string): string[] {
  const sentences: string[] = [];
  let start = 0;
  for (const match of text.matchAll(SENTENCE_END)) {
    const end = match.index + match[0].length;
    sentences.push(text.slice(start, end));
    start = end;
  }
  sentences.push(text.slice(start));
  return sentences.map(cleanSentence).filter((s) => /[\p{L}\p{N}]/u.test(s));
}

function isInformativeTitle(title: string): boolean {
  const key = title.toLowerCase().replace(/[\s:：。.!！?？]+$/u, '');
  if (GENERIC_TITLES.has(key)) return false;
  const cjk = [...title.matchAll(CJK_RUN)].reduce((n, m) => n + codePointLength(m[0]), 0);
  const words = [...title.replace(CJK_RUN, ' ').matchAll(WORD)].length;
  return cjk + 2 * words >= 6;
}

function lengthFactor(length: number): number {
  if (length < 8) return 0.3;
  if (length < 15) return 0.7;
  if (length > 120) return 0.8;
  return 1;
}

const KIND_FACTOR: Record<BlockKind, number> = { paragraph: 1, item: 0.7, quote: 0.8 };

/**
 * Offline and deterministic: picks the sentence that best says what a post is about. Sentences score
 * by how many of the post's recurring terms they carry (CJK character bigrams, Latin words without
 * stopwords; the title's terms count extra), favouring the opening of the post and sentences that
 * say what the post does, and penalising greetings, connectives, lead-ins ending in a colon and
 * sign-offs. The title stands in when no sentence carries a recurring term and the title itself says
 * something.
 */
export class ExtractiveSuggester implements DescriptionSuggester {
  async suggest(content: string, signal?: AbortSignal): Promise<SuggestedDescription> {
    signal?.throwIfAborted();
    const analysed = analysedPart(content);
    if (!hasDescribableText(analysed)) throw new EmptyContentError();
    return { description: this.summarise(analysed), source: 'extractive' };
  }

  private summarise(content: string): string {
    const markdown = foldCompatibility(content);
    const { blocks, frontTitle } = parseBlocks(markdown);
    const firstHeading = blocks.find((b) => b.kind === 'heading')?.text;
    const title = frontTitle ?? firstHeading;

    const sentences: Sentence[] = [];
    const frequency = new Map<string, number>();
    const count = (words: readonly string[]): void => {
      for (const term of new Set(words)) frequency.set(term, (frequency.get(term) ?? 0) + 1);
    };
    blocks.forEach((block, index) => {
      const kind = block.kind;
      if (kind === 'heading') {
        count(terms(block.text));
        return;
      }
      splitSentences(block.text).forEach((text, indexInBlock) => {
        const sentence = {
          text,
          kind,
          block: index,
          indexInBlock,
          order: sentences.length,
          terms: terms(text),
        };
        sentences.push(sentence);
        count(sentence.terms);
      });
    });
    const titleTerms = new Set(title === undefined ? [] : terms(title));

    let best: { sentence: Sentence; score: number; salience: number } | undefined;
    for (const sentence of sentences) {
      let salience = 0;
      const distinct = new Set(sentence.terms);
      for (const term of distinct) {
        salience += Math.log(frequency.get(term) ?? 1) + (titleTerms.has(term) ? 1 : 0);
      }
      // Dividing by the square root of the length weighs density against coverage; the floor keeps
      // a short sentence with one recurring term from outscoring the sentence that explains the post.
      salience /= Math.sqrt(Math.max(distinct.size, 8));
      const text = sentence.text;
      // The constant lets position and form still rank sentences when none carries a recurring term.
      let score = salience + 0.25;
      score *= 1 + 0.6 * Math.max(0, 1 - sentence.order / 5);
      if (sentence.indexInBlock === 0) score *= 1.1;
      score *= KIND_FACTOR[sentence.kind];
      score *= lengthFactor(codePointLength(text));
      if (BOILERPLATE.test(text)) score *= 0.1;
      if (SELF_REFERENCE.test(text)) score *= 1.3;
      if (CONTINUATION.test(text)) score *= 0.7;
      if (/[:：]\s*$/u.test(text)) score *= 0.5;
      if (!best || score > best.score) best = { sentence, score, salience };
    }

    if (title !== undefined && isInformativeTitle(title) && (!best || best.salience === 0)) {
      const described = normalizeDescription(title);
      if (described) return described;
    }
    if (best) {
      const described = normalizeDescription(this.extend(best.sentence, sentences));
      if (described) return described;
    }
    if (title !== undefined) {
      const described = normalizeDescription(title);
      if (described) return described;
    }
    return normalizeDescription(content);
  }

  /** A short sentence says more with the one after it, when both fit. */
  private extend(sentence: Sentence, sentences: readonly Sentence[]): string {
    const next = sentences[sentence.order + 1];
    const length = codePointLength(sentence.text);
    if (length >= 20 || next?.block !== sentence.block) return sentence.text;
    // Full-width punctuation carries its own spacing: the next sentence follows it directly.
    const joined = /[。！？；]["'”’)）」』]*$/u.test(sentence.text)
      ? sentence.text + next.text
      : joinLines([sentence.text, next.text]);
    return codePointLength(joined) <= DESCRIPTION_MAX_LENGTH ? joined : sentence.text;
  }
}
