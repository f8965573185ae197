import { describe, expect, it } from 'vitest';
import { isSingleLine } from '../../platform/http/schemas.js';
import { hasDescribableText, normalizeDescription } from './normalize.js';

const codePoints = (text: string): number => [...text].length;

describe('normalizeDescription', () => {
  it.each([
    // quotes of every kind
    ['"Redis 计数器"', 'Redis 计数器'],
    ["'Kafka consumer groups'", 'Kafka consumer groups'],
    ['“用 Redis 做精确计数器的三个坑。”', '用 Redis 做精确计数器的三个坑'],
    ['‘精确计数’', '精确计数'],
    ['「知光是一个知识社区」', '知光是一个知识社区'],
    ['『深入理解事件日志』', '深入理解事件日志'],
    ['《三体》读书笔记', '《三体》读书笔记'],
    ['《深入理解计算机系统》', '深入理解计算机系统'],
    ['“混用的引号"', '混用的引号'],
    ['「A」和「B」的区别', '「A」和「B」的区别'],
    ['"He said "hi" twice"', '"He said "hi" twice"'],
    ['"没有结尾的引号', '没有结尾的引号'],
    // labels
    ['描述：知光是一个知识社区', '知光是一个知识社区'],
    ['摘要: 用 Kysely 写类型安全的 SQL', '用 Kysely 写类型安全的 SQL'],
    ['一句话总结：幂等消费者的三种写法', '幂等消费者的三种写法'],
    ['Description: A short guide to Kafka consumer groups.', 'A short guide to Kafka consumer groups'],
    ['SUMMARY - not a label', 'SUMMARY - not a label'],
    ['TL;DR: use idempotent consumers', 'use idempotent consumers'],
    ['【摘要】事件日志与计数器', '事件日志与计数器'],
    ['**描述**：「知光是一个知识社区」。', '知光是一个知识社区'],
    ['描述：“用 Redis 做计数器”。', '用 Redis 做计数器'],
    ['“描述：用 Redis 做计数器。”', '用 Redis 做计数器'],
    // trailing punctuation, kept inside
    ['知光，一个知识社区。', '知光，一个知识社区'],
    ['真的吗？！', '真的吗'],
    ['Ready, set, go!!! ', 'Ready, set, go'],
    ['未完待续……', '未完待续'],
    ['先这样吧～', '先这样吧'],
    ['列举：A、B、', '列举：A、B'],
    ['版本 3.14 发布了.', '版本 3.14 发布了'],
    ['.NET 8 新特性', '.NET 8 新特性'],
    // whitespace
    ['  多个   空格\t和\n换行  ', '多个 空格 和换行'],
    ['第一行\n第二行', '第一行第二行'],
    ['first line\nsecond line', 'first line second line'],
    // NFKC: full-width letters and digits fold, CJK punctuation inside Chinese stays full-width
    ['ＡＢＣ１２３　全角字符，测试！', 'ABC123 全角字符，测试'],
    ['Ｈｅｌｌｏ，ｗｏｒｌｄ！', 'Hello,world'],
    ['ｆｉｌｅ①', 'file1'],
    ['ﬁnal ﬂow', 'final flow'],
    // markdown and code fences
    ['```\n介绍 Node 24 的新特性\n```', '介绍 Node 24 的新特性'],
    ['```text\n"Kafka 消费者组详解"\n```', 'Kafka 消费者组详解'],
    ['# 标题也可以', '标题也可以'],
    ['- **粗体** 与 *斜体* 和 `code`', '粗体 与 斜体 和 code'],
    ['看 [这篇文章](https://example.com) ![图](a.png)', '看 这篇文章'],
    ['<b>HTML</b> 标签 &amp; 实体', 'HTML 标签 & 实体'],
    ['snake_case_name stays', 'snake_case_name stays'],
    ['2 * 3 * 4 = 24', '2 * 3 * 4 = 24'],
    // nothing left
    ['', ''],
    ['   ', ''],
    ['。。。！', ''],
    ['""', ''],
    ['描述：', ''],
  ])('%j → %j', (raw, expected) => {
    expect(normalizeDescription(raw)).toBe(expected);
  });

  it('leaves out every character a description may not hold, so a suggestion can be saved', () => {
    const got = normalizeDescription('Kubernetes\u0007 operators\u202e explained\u0085in\u2028depth\u0000.');
    expect(got).toBe('Kubernetes operators explained in depth');
    expect(isSingleLine(got)).toBe(true);
  });

  it('leaves out unpaired surrogates and piles of combining marks, which a description may not hold either', () => {
    const piled = normalizeDescription('Z\u0301\u0302\u0303\u0304\u0305\u0306 计数\ud800器 设计');
    // NFKC makes Z and the first mark one letter, Ź; four of the five marks after it stay.
    expect(piled).toBe('\u0179\u0302\u0303\u0304\u0305 计数器 设计');
    expect(isSingleLine(piled)).toBe(true);
    expect(isSingleLine(normalizeDescription('a\udfff lone low surrogate, and a pair 😀'))).toBe(true);
  });

  it('is empty when nothing left shows', () => {
    expect(normalizeDescription('\u200b\u200b\u200b')).toBe('');
    expect(normalizeDescription('\u3164\u200d \u2800')).toBe('');
    expect(normalizeDescription('\u200b可见\u200b')).toBe('可见');
  });

  it('starts with what shows, however much shows nothing before it', () => {
    const text = '本文介绍基于 Redis 与事件日志的精确计数器设计。';
    for (const blank of [
      '\u2800\n'.repeat(30),
      '\u3164\n'.repeat(30),
      '\u200b'.repeat(60),
      '\u0301'.repeat(3),
    ]) {
      expect(normalizeDescription(`${blank}${text}`)).toBe(text.slice(0, -1));
      expect(hasDescribableText(`${blank}${text}`)).toBe(true);
      expect(hasDescribableText(blank)).toBe(false);
    }
    // Marks at the end belong to the letter before them.
    expect(normalizeDescription('हिंदी में लिखि')).toBe('हिंदी में लिखि');
    expect(normalizeDescription('👩\u200d💻 开发者\u200d')).toBe('👩\u200d💻 开发者');
  });

  it('cuts Chinese at the last clause boundary in the final 30%', () => {
    const raw =
      '这是一个非常长的中文描述，它的长度远远超过了五十个字符的限制，因此需要被截断，我们希望它在合适的标点处截断，而不是在中间随意截断。';
    const result = normalizeDescription(raw);
    expect(result).toBe('这是一个非常长的中文描述，它的长度远远超过了五十个字符的限制，因此需要被截断');
    expect(codePoints(result)).toBeLessThanOrEqual(50);
  });

  it('prefers a sentence end to a later clause boundary', () => {
    const first = '计数器在高并发下会丢失更新和重复计数，这是一个非常常见而且很难排查的问题';
    const raw = `${first}。本文给出，一种基于事件日志的设计并说明如何自愈以及如何对账。`;
    expect(normalizeDescription(raw)).toBe(first);
  });

  it('cuts unpunctuated Chinese at exactly 50 code points', () => {
    const raw = '这是一个没有任何标点的很长的中文句子'.repeat(4);
    const result = normalizeDescription(raw);
    expect(codePoints(result)).toBe(50);
    expect(raw.startsWith(result)).toBe(true);
  });

  it('cuts unpunctuated Chinese between words, not inside one', () => {
    const raw =
      '我们在生产环境中使用分布式缓存和消息队列来提高系统的吞吐量并降低数据库的压力同时保证数据最终一致性以及服务的高可用性';
    // The 50th code point is the 以 of 以及.
    expect([...raw].slice(49, 51).join('')).toBe('以及');
    expect(normalizeDescription(raw)).toBe(
      '我们在生产环境中使用分布式缓存和消息队列来提高系统的吞吐量并降低数据库的压力同时保证数据最终一致性',
    );
  });

  it('cuts English at a word boundary, never inside a word', () => {
    const raw =
      'This is a very long English description that certainly goes past the fifty character limit by a lot.';
    const result = normalizeDescription(raw);
    expect(result).toBe('This is a very long English description that');
    expect(codePoints(result)).toBeLessThanOrEqual(50);
  });

  it('ends English at a sentence when one ends late enough', () => {
    const raw =
      'Consumer groups share the partitions of a topic. Rebalances move them around when members change.';
    expect(normalizeDescription(raw)).toBe('Consumer groups share the partitions of a topic');
  });

  it('keeps text that ends exactly at the limit whole', () => {
    const raw = '字'.repeat(50) + '。后面还有';
    expect(normalizeDescription(raw)).toBe('字'.repeat(50));
  });

  it('counts code points and never splits a surrogate pair', () => {
    const emoji = normalizeDescription('😀'.repeat(60));
    expect(codePoints(emoji)).toBe(50);
    expect(emoji).toBe('😀'.repeat(50));

    const edge = normalizeDescription('a'.repeat(49) + '😀' + 'bcd');
    expect(codePoints(edge)).toBe(50);
    expect(edge.endsWith('😀')).toBe(true);

    const astralHan = normalizeDescription('𠮷'.repeat(70));
    expect(astralHan).toBe('𠮷'.repeat(50));
    expect(astralHan).not.toMatch(/[\uD800-\uDBFF]$/);
  });

  it('keeps grapheme clusters whole', () => {
    const family = '👨‍👩‍👧'; // five code points
    const result = normalizeDescription(family.repeat(20));
    expect(result).toBe(family.repeat(10));
    const accented = normalizeDescription('e\u0301'.repeat(30));
    expect(codePoints(accented)).toBeLessThanOrEqual(50);
  });

  it('honours another maximum', () => {
    expect(normalizeDescription('用 Redis 做精确计数器的三个坑', 8)).toBe('用 Redis');
    // 精确 is one word: the cut does not split it.
    expect(normalizeDescription('用 Redis 做精确计数器的三个坑', 10)).toBe('用 Redis 做');
    expect(normalizeDescription('anything', 0)).toBe('');
  });

  // Each of these once made a pattern rescan the rest of its line from every occurrence.
  it.each(['[', '![', '[^', '[x](', '![x][', '[x][', '<http://', '`', '**a', '<a '])(
    'stays linear on one long line of %j',
    (unit) => {
      const hostile = 'Intro.\n' + unit.repeat(Math.ceil(100_000 / unit.length));
      const started = performance.now();
      normalizeDescription(hostile);
      expect(performance.now() - started).toBeLessThan(1_000);
    },
  );

  it('stays fast on a large hostile input', () => {
    const hostile = '**_`[<!--'.repeat(50_000) + '。'.repeat(50_000);
    const started = performance.now();
    normalizeDescription(hostile);
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});
