import { createServer, type Server as HttpServer } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, signUp, startServer, type ProfileName, type Server } from './harness.js';

const POST = `# 用 Redis 位图统计点赞

点赞数要精确，也要快。本文介绍如何用分片位图记录谁点了赞，并在故障后从事实重建计数。

## 背景
原来的实现会在 Kafka 故障时丢失计数。`;

describe.each<ProfileName>(['embedded', 'cluster'])('description suggestions (%s profile)', (profile) => {
  let server: Server;
  let client: Client;
  let fakeModel: HttpServer;
  const asked: { model: string | undefined; auth: string | undefined }[] = [];

  beforeAll(async () => {
    // An OpenAI-compatible endpoint on loopback: the embedded run uses it, the cluster run has no key.
    fakeModel = createServer((req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        asked.push({
          model: (JSON.parse(body) as { model?: string }).model,
          auth: req.headers.authorization,
        });
        res.setHeader('content-type', 'application/json');
        res.end(
          JSON.stringify({
            id: 'x',
            object: 'chat.completion',
            created: 0,
            model: 'm',
            choices: [
              {
                index: 0,
                message: { role: 'assistant', content: '“用分片位图精确统计点赞，故障后可从事实重建。”' },
                finish_reason: 'stop',
              },
            ],
          }),
        );
      });
    });
    await new Promise<void>((ok) => fakeModel.listen(0, '127.0.0.1', ok));
    const port = (fakeModel.address() as { port: number }).port;
    const ai =
      profile === 'embedded'
        ? {
            ZG_AI_API_KEY: 'test-key',
            ZG_AI_BASE_URL: `http://127.0.0.1:${port}/v1`,
            ZG_AI_MODEL: 'deepseek-chat',
          }
        : {};
    server = await startServer(profile, { ...ai, ZG_AI_RATE_LIMIT: '3' });
    client = new Client(server.baseUrl);
  });
  afterAll(async () => {
    await server?.stop();
    await new Promise<void>((ok) => fakeModel.close(() => ok()));
  });

  it('suggests a description of at most 50 characters for a signed-in user', async () => {
    const user = await signUp(server, client);
    const res = await client.call('POST', '/api/v1/knowposts/description/suggest', {
      token: user.accessToken,
      body: { content: POST },
    });
    expect(res.status).toBe(200);
    expect([...res.body.description].length).toBeLessThanOrEqual(50);
    if (profile === 'embedded') {
      expect(res.body.description).toBe('用分片位图精确统计点赞，故障后可从事实重建');
      expect(asked.at(-1)).toEqual({ model: 'deepseek-chat', auth: 'Bearer test-key' });
    } else {
      expect(res.body.description).toContain('分片位图');
    }
  });

  it('refuses anonymous callers, empty content, and more than the per-user rate', async () => {
    expect(
      (await client.call('POST', '/api/v1/knowposts/description/suggest', { body: { content: POST } }))
        .status,
    ).toBe(401);
    const user = await signUp(server, client);
    const empty = await client.call('POST', '/api/v1/knowposts/description/suggest', {
      token: user.accessToken,
      body: { content: '' },
    });
    expect([empty.status, empty.body.code]).toEqual([400, 'BAD_REQUEST']);
    const blank = await client.call('POST', '/api/v1/knowposts/description/suggest', {
      token: user.accessToken,
      body: { content: '   \n # \n' },
    });
    expect(blank.status).toBe(400);
    // Characters that show nothing are no text either.
    const invisible = await client.call('POST', '/api/v1/knowposts/description/suggest', {
      token: user.accessToken,
      body: { content: '\u200b\u200b\n\u3164' },
    });
    expect(invisible.status).toBe(400);
    const statuses: number[] = [];
    for (let i = 0; i < 3; i++)
      statuses.push(
        (
          await client.call('POST', '/api/v1/knowposts/description/suggest', {
            token: user.accessToken,
            body: { content: POST },
          })
        ).status,
      );
    expect(statuses.filter((s) => s === 429).length).toBeGreaterThanOrEqual(1);
  });
});
