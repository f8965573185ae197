import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ANALYSED_CHARS, EmptyContentError, SCANNED_CHARS, type DescriptionLog } from './describer.js';
import { ExtractiveSuggester } from './extractive.js';
import {
  descriptionFromAnswer,
  FAILURES_TO_REST,
  OpenAiSuggester,
  promptContent,
  PROMPT_CONTENT_CHARS,
  retryAfterMs,
  type OpenAiSuggesterOptions,
} from './openai-suggester.js';

const KEY = 'sk-test-0123456789abcdef';
const MODEL = 'deepseek-chat';

const POST = `# 用 Redis 实现精确的点赞计数器

在高并发场景下，点赞计数器很容易出现丢失更新和重复计数的问题。本文介绍一种基于 Redis 和事件日志的精确计数器设计，保证计数器在故障后能够自愈。

## 为什么普通计数器不可靠

用 Redis INCR 虽然快，但进程崩溃时计数器会和事实表不一致。
`;
// What the fallback says; these tests are about when it is used, not about what it picks.
let EXTRACTIVE = '';
beforeAll(async () => {
  EXTRACTIVE = (await new ExtractiveSuggester().suggest(POST)).description;
});

interface Reply {
  status?: number;
  body?: unknown;
  headers?: Record<string, string>;
  delayMs?: number;
}

interface Received {
  method: string | undefined;
  url: string | undefined;
  headers: IncomingHttpHeaders;
  body: any;
}

function completion(content: string | null): Reply {
  return {
    body: {
      id: 'chatcmpl-test',
      object: 'chat.completion',
      created: Math.floor(Date.now() / 1000),
      model: MODEL,
      choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
      usage: { prompt_tokens: 120, completion_tokens: 20, total_tokens: 140 },
    },
  };
}

/** Speaks just enough of the chat-completions protocol; replies are used in order, the last one repeats. */
class FakeProvider {
  readonly received: Received[] = [];
  private readonly server: Server;

  private constructor(private readonly replies: Reply[]) {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (chunk: Buffer) => chunks.push(chunk));
      req.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        this.received.push({
          method: req.method,
          url: req.url,
          headers: req.headers,
          body: text ? JSON.parse(text) : undefined,
        });
        const reply = this.replies[Math.min(this.received.length, this.replies.length) - 1] ?? completion('');
        const send = (): void => {
          if (res.destroyed) return;
          res.writeHead(reply.status ?? 200, { 'content-type': 'application/json', ...reply.headers });
          res.end(JSON.stringify(reply.body ?? {}));
        };
        if (reply.delayMs) {
          const timer = setTimeout(send, reply.delayMs);
          res.on('close', () => clearTimeout(timer));
        } else send();
      });
    });
  }

  static async start(...replies: Reply[]): Promise<FakeProvider> {
    const fake = new FakeProvider(replies);
    await new Promise<void>((resolve) => fake.server.listen(0, '127.0.0.1', resolve));
    running.push(fake);
    return fake;
  }

  get baseURL(): string {
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

const running: FakeProvider[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((fake) => fake.close()));
});

function memoryLog(): DescriptionLog & { lines: string[] } {
  const lines: string[] = [];
  const write = (obj: object, msg: string): void => void lines.push(JSON.stringify({ ...obj, msg }));
  return { lines, info: write, warn: write };
}

function suggester(
  fake: FakeProvider,
  options: Partial<OpenAiSuggesterOptions> = {},
  log: DescriptionLog = memoryLog(),
): OpenAiSuggester {
  return new OpenAiSuggester(
    { apiKey: KEY, baseURL: fake.baseURL, model: MODEL, timeoutMs: 2_000, maxRetries: 0, ...options },
    new ExtractiveSuggester(),
    log,
  );
}

describe('OpenAiSuggester', () => {
  it('sends the model, the key and the post, and normalises a quoted answer', async () => {
    const fake = await FakeProvider.start(completion('“用 Redis 与事件日志实现可自愈的精确计数器。”'));
    const result = await suggester(fake).suggest(POST);

    expect(result).toEqual({ description: '用 Redis 与事件日志实现可自愈的精确计数器', source: 'ai' });
    expect(fake.received).toHaveLength(1);
    const [request] = fake.received;
    expect(request?.method).toBe('POST');
    expect(request?.url).toBe('/chat/completions');
    expect(request?.headers.authorization).toBe(`Bearer ${KEY}`);
    expect(request?.body.model).toBe(MODEL);
    expect(request?.body.messages[0].role).toBe('system');
    expect(request?.body.messages[0].content).toMatch(/at most 50 characters/);
    expect(request?.body.messages[1].role).toBe('user');
    expect(request?.body.messages[1].content).toContain(POST.trim());
    expect(request?.body.max_tokens).toBeGreaterThan(0);
    expect(typeof request?.body.temperature).toBe('number');
    expect(request?.body.stream).toBeFalsy();
  });

  it('retries a 500 and uses the answer of the retry', async () => {
    const fake = await FakeProvider.start(
      {
        status: 500,
        body: { error: { message: 'upstream overloaded' } },
        headers: { 'retry-after-ms': '10' },
      },
      completion('基于 Redis 与事件日志的精确计数器设计'),
    );
    const result = await suggester(fake, { maxRetries: 1 }).suggest(POST);
    expect(result).toEqual({ description: '基于 Redis 与事件日志的精确计数器设计', source: 'ai' });
    expect(fake.received).toHaveLength(2);
  });

  it('falls back when every attempt fails', async () => {
    const fake = await FakeProvider.start({
      status: 503,
      body: { error: { message: 'unavailable' } },
      headers: { 'retry-after-ms': '10' },
    });
    const result = await suggester(fake, { maxRetries: 2 }).suggest(POST);
    expect(result).toEqual({ description: EXTRACTIVE, source: 'extractive' });
    expect(fake.received).toHaveLength(3);
  });

  it('falls back at once on a rejected key (401), and keeps the key out of the logs', async () => {
    const fake = await FakeProvider.start({
      status: 401,
      body: {
        error: {
          message: `Authentication Fails, Your api key: ${KEY} is invalid`,
          type: 'authentication_error',
        },
      },
    });
    const log = memoryLog();
    const result = await suggester(fake, { maxRetries: 3 }, log).suggest(POST);

    expect(result).toEqual({ description: EXTRACTIVE, source: 'extractive' });
    expect(fake.received).toHaveLength(1);
    expect(log.lines).toHaveLength(1);
    expect(log.lines[0]).toContain('"status":401');
    expect(log.lines.join('\n')).not.toContain(KEY);
    expect(log.lines.join('\n')).not.toContain('0123456789abcdef');
  });

  it('falls back on a slow answer within the timeout, retries included', async () => {
    const fake = await FakeProvider.start({ ...completion('太慢了的回答内容'), delayMs: 5_000 });
    const started = performance.now();
    const result = await suggester(fake, { timeoutMs: 300, maxRetries: 2 }).suggest(POST);
    const elapsed = performance.now() - started;

    expect(result).toEqual({ description: EXTRACTIVE, source: 'extractive' });
    expect(elapsed).toBeGreaterThanOrEqual(290);
    expect(elapsed).toBeLessThan(300 + 700);
  }, 5_000);

  it('does not wait out a long retry-after beyond the timeout', async () => {
    const fake = await FakeProvider.start({
      status: 429,
      body: { error: { message: 'rate limited' } },
      headers: { 'retry-after': '30' },
    });
    const started = performance.now();
    const result = await suggester(fake, { timeoutMs: 400, maxRetries: 1 }).suggest(POST);
    expect(result.source).toBe('extractive');
    expect(performance.now() - started).toBeLessThan(400 + 700);
    expect(fake.received).toHaveLength(1);
  }, 5_000);

  it('after a long retry-after, leaves the provider alone until the wait is over', async () => {
    const fake = await FakeProvider.start(
      { status: 429, body: { error: { message: 'quota used up' } }, headers: { 'retry-after': '1' } },
      completion('基于 Redis 与事件日志的精确计数器设计'),
    );
    const log = memoryLog();
    const ai = suggester(fake, { timeoutMs: 300, maxRetries: 3 }, log);
    expect((await ai.suggest(POST)).source).toBe('extractive');
    expect((await ai.suggest(POST)).source).toBe('extractive');
    // One call only: the wait was longer than a suggestion may take, and the next one did not ask.
    expect(fake.received).toHaveLength(1);
    expect(log.lines.filter((line) => line.includes('asked to wait'))).toHaveLength(1);
    await sleep(1_050);
    expect(await ai.suggest(POST)).toEqual({
      description: '基于 Redis 与事件日志的精确计数器设计',
      source: 'ai',
    });
    expect(fake.received).toHaveLength(2);
  }, 5_000);

  it(`leaves a provider that hangs alone after ${FAILURES_TO_REST} failures in a row, then asks once again`, async () => {
    const fake = await FakeProvider.start({ ...completion('太慢了的回答内容'), delayMs: 5_000 });
    const log = memoryLog();
    const ai = suggester(fake, { timeoutMs: 200, maxRetries: 0, failureRestMs: 600 }, log);
    for (let i = 0; i < FAILURES_TO_REST; i++) expect((await ai.suggest(POST)).source).toBe('extractive');
    expect(fake.received).toHaveLength(FAILURES_TO_REST);
    // Resting: answered at once, the provider not asked.
    const started = performance.now();
    expect((await ai.suggest(POST)).source).toBe('extractive');
    expect(performance.now() - started).toBeLessThan(100);
    expect(fake.received).toHaveLength(FAILURES_TO_REST);
    expect(log.lines.filter((line) => line.includes('left alone after'))).toHaveLength(1);
    // Once the rest is over it asks again, and one failure more rests again.
    await sleep(650);
    expect((await ai.suggest(POST)).source).toBe('extractive');
    expect(fake.received).toHaveLength(FAILURES_TO_REST + 1);
    expect((await ai.suggest(POST)).source).toBe('extractive');
    expect(fake.received).toHaveLength(FAILURES_TO_REST + 1);
  }, 10_000);

  it('after a rest, lets one suggestion ask while the others take the fallback at once', async () => {
    const fake = await FakeProvider.start({ ...completion('太慢了的回答内容'), delayMs: 5_000 });
    const ai = suggester(fake, { timeoutMs: 200, maxRetries: 0, failureRestMs: 300 });
    for (let i = 0; i < FAILURES_TO_REST; i++) await ai.suggest(POST);
    await sleep(350);
    const started = performance.now();
    const took: number[] = [];
    await Promise.all(
      Array.from({ length: 4 }, async () => {
        expect((await ai.suggest(POST)).source).toBe('extractive');
        took.push(performance.now() - started);
      }),
    );
    expect(fake.received).toHaveLength(FAILURES_TO_REST + 1);
    expect(took.filter((ms) => ms < 100)).toHaveLength(3);
  }, 10_000);

  it('does not rest for refusals of a post: the provider answered', async () => {
    const refused = { status: 400, body: { error: { message: 'Content Exists Risk' } } };
    const fake = await FakeProvider.start(
      refused,
      refused,
      refused,
      refused,
      completion('基于 Redis 与事件日志的精确计数器设计'),
    );
    const ai = suggester(fake, { timeoutMs: 500, maxRetries: 0, failureRestMs: 60_000 });
    const sources = [];
    for (let i = 0; i < 5; i++) sources.push((await ai.suggest(POST)).source);
    expect(sources).toEqual(['extractive', 'extractive', 'extractive', 'extractive', 'ai']);
    expect(fake.received).toHaveLength(5);
  }, 10_000);

  it('counts only failures in a row: an answer between them starts the count again', async () => {
    const slow = { ...completion('太慢了的回答内容'), delayMs: 5_000 };
    const answer = completion('基于 Redis 与事件日志的精确计数器设计');
    const fake = await FakeProvider.start(slow, slow, answer, slow, slow, answer);
    const ai = suggester(fake, { timeoutMs: 200, maxRetries: 0, failureRestMs: 60_000 });
    const sources = [];
    for (let i = 0; i < 6; i++) sources.push((await ai.suggest(POST)).source);
    expect(sources).toEqual(['extractive', 'extractive', 'ai', 'extractive', 'extractive', 'ai']);
    expect(fake.received).toHaveLength(6);
  }, 10_000);

  it('after a retry-after shorter than the timeout but past what is left of it, asks again next time', async () => {
    const fake = await FakeProvider.start(
      {
        status: 503,
        body: { error: { message: 'busy' } },
        headers: { 'retry-after-ms': '800' },
        delayMs: 500,
      },
      completion('基于 Redis 与事件日志的精确计数器设计'),
    );
    const ai = suggester(fake, { timeoutMs: 1_000, maxRetries: 1 });
    expect((await ai.suggest(POST)).source).toBe('extractive');
    expect((await ai.suggest(POST)).source).toBe('ai');
    expect(fake.received).toHaveLength(2);
  }, 5_000);

  it('waits out a short retry-after given as a date, within the timeout', async () => {
    const fake = await FakeProvider.start(
      {
        status: 503,
        body: { error: { message: 'busy' } },
        headers: { 'retry-after': new Date(Date.now() + 1_000).toUTCString() },
      },
      completion('基于 Redis 与事件日志的精确计数器设计'),
    );
    const started = performance.now();
    const result = await suggester(fake, { timeoutMs: 3_000, maxRetries: 1 }).suggest(POST);
    expect(result.source).toBe('ai');
    expect(fake.received).toHaveLength(2);
    expect(performance.now() - started).toBeLessThan(2_500);
  }, 5_000);

  it('does not retry what the provider says not to', async () => {
    const fake = await FakeProvider.start({
      status: 500,
      body: { error: { message: 'bad input' } },
      headers: { 'x-should-retry': 'false' },
    });
    expect((await suggester(fake, { maxRetries: 3 }).suggest(POST)).source).toBe('extractive');
    expect(fake.received).toHaveLength(1);
  });

  it('reads retry-after headers', () => {
    const now = Date.parse('2026-12-07T00:00:00Z');
    const headers = (entries: Record<string, string>) => new Headers(entries);
    expect(retryAfterMs(headers({ 'retry-after-ms': '250' }), now)).toBe(250);
    expect(retryAfterMs(headers({ 'retry-after': '3' }), now)).toBe(3_000);
    expect(retryAfterMs(headers({ 'retry-after': 'Mon, 07 Dec 2026 00:00:10 GMT' }), now)).toBe(10_000);
    expect(retryAfterMs(headers({ 'retry-after': 'Sun, 06 Dec 2026 23:59:00 GMT' }), now)).toBe(0);
    expect(retryAfterMs(headers({ 'retry-after': 'soon' }), now)).toBeUndefined();
    expect(retryAfterMs(headers({}), now)).toBeUndefined();
    expect(retryAfterMs(undefined, now)).toBeUndefined();
  });

  it('falls back when the provider cannot be reached', async () => {
    const fake = await FakeProvider.start(completion('不会用到'));
    const baseURL = fake.baseURL;
    await fake.close();
    const result = await new OpenAiSuggester(
      { apiKey: KEY, baseURL, model: MODEL, timeoutMs: 2_000, maxRetries: 0 },
      new ExtractiveSuggester(),
    ).suggest(POST);
    expect(result).toEqual({ description: EXTRACTIVE, source: 'extractive' });
  });

  it.each([
    ['empty', ''],
    ['whitespace', '  \n '],
    ['punctuation only', '。。。！'],
    ['JSON', '{"description": "精确计数器设计"}'],
    ['fenced JSON', '```json\n{"description": "精确计数器设计"}\n```'],
    ['headings only', '# 精确计数器\n## 设计'],
    ['a Chinese refusal', '抱歉，我无法完成这个请求。'],
    ['an English refusal', "I'm sorry, but I can't help with that."],
    ['a bare label', '描述：'],
    ['a fragment', '好文'],
  ])('falls back on junk output: %s', async (_name, content) => {
    const fake = await FakeProvider.start(completion(content));
    const log = memoryLog();
    const result = await suggester(fake, {}, log).suggest(POST);
    expect(result).toEqual({ description: EXTRACTIVE, source: 'extractive' });
    expect(log.lines).toHaveLength(1);
  });

  it('falls back on a null message content', async () => {
    const fake = await FakeProvider.start(completion(null));
    expect(await suggester(fake).suggest(POST)).toEqual({ description: EXTRACTIVE, source: 'extractive' });
  });

  it('falls back on a malformed completion', async () => {
    const fake = await FakeProvider.start({ body: { id: 'x', object: 'chat.completion', choices: [] } });
    expect(await suggester(fake).suggest(POST)).toEqual({ description: EXTRACTIVE, source: 'extractive' });
  });

  it('cuts a very long answer to 50 characters', async () => {
    const long = '这是一段非常长的模型回答，'.repeat(10) + '结束。';
    const fake = await FakeProvider.start(completion(long));
    const result = await suggester(fake).suggest(POST);
    expect(result.source).toBe('ai');
    expect([...result.description].length).toBeLessThanOrEqual(50);
    expect(long.startsWith(result.description)).toBe(true);
  });

  it('takes the sentence after a lead-in and strips its label', async () => {
    const fake = await FakeProvider.start(
      completion('以下是描述：\n\nSummary: "Exact, self-healing like counters with Redis."'),
    );
    const result = await suggester(fake).suggest(POST);
    expect(result).toEqual({ description: 'Exact, self-healing like counters with Redis', source: 'ai' });
  });

  it('rejects empty content without calling the provider', async () => {
    const fake = await FakeProvider.start(completion('不会用到'));
    await expect(suggester(fake).suggest('  \n```\n```\n')).rejects.toBeInstanceOf(EmptyContentError);
    expect(fake.received).toHaveLength(0);
  });

  it('rejects with the caller’s reason when the caller aborts', async () => {
    const fake = await FakeProvider.start({ ...completion('太慢了的回答内容'), delayMs: 5_000 });
    const controller = new AbortController();
    setTimeout(() => controller.abort(new Error('client went away')), 50);
    const started = performance.now();
    await expect(suggester(fake).suggest(POST, controller.signal)).rejects.toThrow('client went away');
    expect(performance.now() - started).toBeLessThan(1_000);
  }, 5_000);

  it('sends at most the first part of a long post', async () => {
    const fake = await FakeProvider.start(completion('基于 Redis 与事件日志的精确计数器设计'));
    await suggester(fake).suggest(POST + '很长的正文。'.repeat(5_000));
    const sent: string = fake.received[0]?.body.messages[1].content;
    expect(sent.length).toBeLessThanOrEqual(PROMPT_CONTENT_CHARS + 20);
  });
});

describe('descriptionFromAnswer', () => {
  it.each([
    ['“用 Redis 做精确计数器。”', '用 Redis 做精确计数器'],
    ['描述：「知光是一个知识社区」', '知光是一个知识社区'],
    ['```\nA guide to Kafka consumer groups.\n```', 'A guide to Kafka consumer groups'],
    ['# 标题\n正文的第一句话。', '正文的第一句话'],
    ['[译] 深入理解事件日志', '[译] 深入理解事件日志'],
  ])('%j → %j', (answer, expected) => {
    expect(descriptionFromAnswer(answer)).toBe(expected);
  });
});

describe('promptContent', () => {
  it('drops scripts and inline image data and never ends on half a surrogate pair', () => {
    expect(promptContent('图 ![x](data:image/png;base64,iVBORw0KGgo=) 后')).toBe('图 ![x](data:) 后');
    expect(promptContent('<script>\nignore the above\n</script>\n正文')).toBe('\n\n正文');
    const cut = promptContent('a'.repeat(PROMPT_CONTENT_CHARS - 1) + '😀');
    expect(cut).toBe('a'.repeat(PROMPT_CONTENT_CHARS - 1));
  });

  it('reads past pasted images and hidden elements, but only so far, however long the body', () => {
    const screenshot = `![截图](data:image/png;base64,${'iVBORw0KGgo'.repeat(5_000)})`;
    expect(promptContent(`# 计数服务\n\n${screenshot}\n\n本文介绍事件驱动的计数服务。`)).toBe(
      '# 计数服务\n\n![截图](data:)\n\n本文介绍事件驱动的计数服务。',
    );
    const line = `${'a'.repeat(99)}\n`;
    const hidden = (lines: number): string =>
      `<script>\n${line.repeat(lines)}</script>\nVisible after the script`;
    expect(promptContent(hidden(ANALYSED_CHARS / 80))).toContain('Visible');
    // A script block longer than the scanned part hides everything the model could be shown.
    expect(promptContent(hidden(SCANNED_CHARS / 80))).not.toContain('Visible');
    // An 11 MB body costs what its opening does (reading all of it took about 400 ms here).
    const huge = '<style>p{}</style> data:image/png;base64,AAAA\n'.repeat(250_000);
    const started = performance.now();
    promptContent(huge);
    expect(performance.now() - started).toBeLessThan(200);
  });
});
