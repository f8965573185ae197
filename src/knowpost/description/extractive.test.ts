import { describe, expect, it } from 'vitest';
import { ANALYSED_CHARS, EmptyContentError } from './describer.js';
import { ExtractiveSuggester } from './extractive.js';

const COUNTER_POST = `# 用 Redis 实现精确的点赞计数器

大家好，我是小明。

在高并发场景下，点赞计数器很容易出现丢失更新和重复计数的问题。本文介绍一种基于 Redis 和事件日志的精确计数器设计，保证计数器在故障后能够自愈。

## 为什么普通计数器不可靠

直接对 MySQL 执行 UPDATE 会产生行锁竞争。用 Redis INCR 虽然快，但进程崩溃时计数器会和事实表不一致。

\`\`\`lua
-- 计数器 计数器 计数器
redis.call('INCR', KEYS[1])
\`\`\`

## 设计

| 组件 | 作用 |
|---|---|
| Redis | 计数器 |
| 事件日志 | 计数器的事实来源 |

- 事件先写入事件日志
- 计数器异步折叠增量

![架构图](https://example.com/arch.png)

欢迎关注我的公众号，点赞收藏！
`;

const NODE_POST = `Node.js 24 带来了很多新特性。

其中最重要的是内置的 TypeScript 类型剥离，可以直接运行 .ts 文件，不再需要额外的编译步骤。此外，Node.js 24 升级了 V8 引擎，性能也有明显提升。

1. 类型剥离
2. V8 升级
3. 权限模型

> 注意：类型剥离不做类型检查，CI 里仍然要跑 tsc。
`;

const QUESTION_POST = `## 求助

最近在学习 **Kafka**，有个问题一直没想明白：

消费者组重平衡的时候，已经拉取但还没提交位移的消息会不会被重复消费？如果会，应该怎样让消费逻辑做到幂等，避免重复消费导致的数据错误？

我的环境是 Kafka 3.7，消费者用的是 [kafkajs](https://kafka.js.org)。
`;

const KAFKA_POST = `---
title: "Understanding Kafka consumer groups"
tags: [kafka]
---

Kafka consumer groups let several consumers share the partitions of a topic. This post explains how partition assignment works, what happens during a rebalance, and how to avoid duplicate processing.

## Partition assignment

Each partition is assigned to exactly one consumer in the group. When a consumer joins or leaves, the group rebalances.

\`\`\`js
const consumer = kafka.consumer({ groupId: 'demo' });
\`\`\`

## Avoiding duplicates

Commit offsets after processing, and make processing idempotent so that a rebalance never double counts.
`;

const HOOKS_POST = `Hi everyone! I'm Alex, a frontend developer.

React hooks changed how we write components, but stale closures in useEffect still bite experienced developers. In this post we look at why stale closures happen in useEffect and three ways to fix them.

### The problem

A useEffect callback captures the props and state of the render that created it.

- Add the value to the dependency array
- Use a ref
- Use the functional form of setState

Thanks for reading, and follow me for more!
`;

const suggester = new ExtractiveSuggester();
const cp = (text: string): number => [...text].length;

async function describe50(content: string): Promise<string> {
  const result = await suggester.suggest(content);
  expect(result.source).toBe('extractive');
  expect(cp(result.description)).toBeGreaterThan(0);
  expect(cp(result.description)).toBeLessThanOrEqual(50);
  return result.description;
}

describe('ExtractiveSuggester', () => {
  it('picks the sentence that carries the post’s recurring terms, skipping greetings, code and sign-offs', async () => {
    const description = await describe50(COUNTER_POST);
    expect(description).toBe('本文介绍一种基于 Redis 和事件日志的精确计数器设计，保证计数器在故障后能够自愈');
  });

  it('prefers the salient sentence to a vague opening', async () => {
    const description = await describe50(NODE_POST);
    expect(description.startsWith('其中最重要的是内置的 TypeScript 类型剥离')).toBe(true);
  });

  it('takes the question of a question post, not its lead-in', async () => {
    const description = await describe50(QUESTION_POST);
    expect(description.startsWith('消费者组重平衡的时候')).toBe(true);
  });

  it('summarises an English post with front matter at a word boundary', async () => {
    const description = await describe50(KAFKA_POST);
    expect(description).toBe('Kafka consumer groups let several consumers share');
  });

  it('skips a greeting and favours the sentence saying what the post does', async () => {
    const description = await describe50(HOOKS_POST);
    expect(description).not.toMatch(/Alex|Hi everyone/);
    expect(description).toBe('In this post we look at why stale closures happen');
  });

  it('drops a greeting and self-introduction but keeps the rest of the sentence', async () => {
    const description = await describe50('大家好，我是小明，今天聊聊 Redis 计数器的幂等设计。');
    expect(description).toBe('今天聊聊 Redis 计数器的幂等设计');
  });

  it('keeps words that merely begin like a greeting', async () => {
    expect(await describe50('Hibernate caches entities per session.')).toBe(
      'Hibernate caches entities per session',
    );
    expect(await describe50('History of the event log design.')).toBe('History of the event log design');
    expect(await describe50('Heyting algebras model intuitionistic logic.')).toBe(
      'Heyting algebras model intuitionistic logic',
    );
    expect(await describe50('Hello world programs show the toolchain works.')).toBe(
      'Hello world programs show the toolchain works',
    );
    expect(await describe50('Hi, this guide sets up Kafka in KRaft mode.')).toBe(
      'this guide sets up Kafka in KRaft mode',
    );
    expect(await describe50('Hey everyone I tuned our Redis listpack limits.')).toBe(
      'I tuned our Redis listpack limits',
    );
  });

  it('does not end a sentence at an abbreviation or an initial', async () => {
    expect(await describe50('Mr. Smith explains how bitmaps count likes.')).toBe(
      'Mr. Smith explains how bitmaps count likes',
    );
    expect(await describe50('We compare e.g. Kafka and NATS for events.')).toBe(
      'We compare e.g. Kafka and NATS for events',
    );
    expect(await describe50('J. R. Smith wrote the event log design.')).toBe(
      'J. R. Smith wrote the event log design',
    );
  });

  it('uses an informative title when no sentence says much', async () => {
    const description = await describe50('# 用 Kysely 写类型安全的 SQL 查询\n\n今天试了一下，效果不错。');
    expect(description).toBe('用 Kysely 写类型安全的 SQL 查询');
  });

  it('does not use a generic title', async () => {
    const description = await describe50('# 前言\n\n今天试了一下 Kysely，效果不错。');
    expect(description).toBe('今天试了一下 Kysely，效果不错');
  });

  it('joins a short sentence with the next one when both fit', async () => {
    const description = await describe50(
      '计数器必须幂等。重放事件时，幂等的计数器不会重复计数，点赞数也就不会虚高。',
    );
    expect(description).toBe('计数器必须幂等。重放事件时，幂等的计数器不会重复计数，点赞数也就不会虚高');
  });

  it('adds no space after full-width punctuation when it joins two sentences', async () => {
    expect(await describe50('Redis 计数器很快。Redis 计数器也能精确。')).toBe(
      'Redis 计数器很快。Redis 计数器也能精确',
    );
  });

  it('falls back to the text of a post that is only code', async () => {
    const description = await describe50("```js\nconsole.log('hello')\n```");
    expect(description).toBe("console.log('hello')");
  });

  it('leaves out the text of scripts and styles, which no reader sees', async () => {
    const post = `<script>\ndocument.cookie 计数器 计数器 计数器\n</script>\n<style>p { color: red }</style>\n\n${COUNTER_POST}`;
    expect(await describe50(post)).toBe(await describe50(COUNTER_POST));
    await expect(
      suggester.suggest('<script>alert("hi")</script>\n<style>\nbody {}\n</style>'),
    ).rejects.toBeInstanceOf(EmptyContentError);
  });

  it('is deterministic', async () => {
    for (const post of [COUNTER_POST, NODE_POST, QUESTION_POST, KAFKA_POST, HOOKS_POST]) {
      const first = await new ExtractiveSuggester().suggest(post);
      const again = await new ExtractiveSuggester().suggest(post);
      expect(again).toEqual(first);
    }
  });

  it('rejects content with nothing to describe', async () => {
    for (const empty of [
      '',
      '   \n\n',
      '---',
      '。。。',
      '![](a.png)',
      '\u200b\u200b\n\u3164',
      '\u2800\n'.repeat(30),
    ]) {
      await expect(suggester.suggest(empty)).rejects.toBeInstanceOf(EmptyContentError);
    }
    // What shows nothing before the text does not make it empty.
    const spaced = `${'\u2800\n'.repeat(30)}${'\u200b'.repeat(60)}本文介绍基于 Redis 与事件日志的精确计数器设计。`;
    await expect(suggester.suggest(spaced)).resolves.toEqual({
      description: '本文介绍基于 Redis 与事件日志的精确计数器设计',
      source: 'extractive',
    });
    // A validation answer in the contract's terms.
    await expect(suggester.suggest('---')).rejects.toMatchObject({
      code: 'BAD_REQUEST',
      status: 400,
      message: 'body.content has no text to describe',
    });
  });

  it('reads only the opening of a long post, in time linear in it', async () => {
    const started = performance.now();
    for (const unit of ['[', '![', '[x](', '<http://', '*\n']) {
      await suggester.suggest(unit.repeat(200_000 / unit.length)).catch((err: unknown) => {
        expect(err).toBeInstanceOf(EmptyContentError);
      });
    }
    const prose = `${'![](a.png)\n'.repeat(1_000)}Redis 计数器如何在故障后自愈。`;
    await expect(suggester.suggest(prose)).resolves.toMatchObject({ source: 'extractive' });
    const buried = `${'![](a.png)\n'.repeat(ANALYSED_CHARS / 10)}The only sentence, far past the opening.`;
    await expect(suggester.suggest(buried)).rejects.toBeInstanceOf(EmptyContentError);
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it('reads the text after a pasted screenshot or a long style element at the start', async () => {
    const sentence = '本文介绍如何在 Node.js 中使用 Kafka 构建事件驱动的计数服务。';
    const screenshot = `![截图](data:image/png;base64,${'iVBORw0KGgo'.repeat(5_000)})`;
    expect(await describe50(`${screenshot}\n\n${sentence}`)).toBe(
      '本文介绍如何在 Node.js 中使用 Kafka 构建事件驱动的计数服务',
    );
    // Long lines, and more short lines than the opening has characters.
    for (const style of [
      `<style>\n${'p { margin: 0 }\n'.repeat(2_000)}</style>`,
      `<style>\n${'a{}\n'.repeat(21_000)}</style>`,
    ]) {
      expect(await describe50(`${style}\n\n${sentence}`)).toBe(
        '本文介绍如何在 Node.js 中使用 Kafka 构建事件驱动的计数服务',
      );
    }
  });

  it('reads long runs of backticks and of spaces before closing hashes in time linear in them', async () => {
    for (const content of [
      `x ${'`'.repeat(ANALYSED_CHARS)}`,
      `# a${' '.repeat(ANALYSED_CHARS)}#x`,
      `# a${' #'.repeat(ANALYSED_CHARS / 2)}x`,
    ]) {
      const started = performance.now();
      await suggester.suggest(content).catch((err: unknown) => {
        expect(err).toBeInstanceOf(EmptyContentError);
      });
      expect(performance.now() - started, content.slice(0, 8)).toBeLessThan(150);
    }
  });

  it('rejects with the reason of an aborted signal', async () => {
    const controller = new AbortController();
    controller.abort(new Error('gone'));
    await expect(suggester.suggest(COUNTER_POST, controller.signal)).rejects.toThrow('gone');
  });

  it('handles a very long post quickly', async () => {
    const long = COUNTER_POST + '\n\n' + '这是一段很长的正文，用来测试性能。'.repeat(60_000);
    const started = performance.now();
    const description = await describe50(long);
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(description).toBe('本文介绍一种基于 Redis 和事件日志的精确计数器设计，保证计数器在故障后能够自愈');
  });
});
