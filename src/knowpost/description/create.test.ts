import { Writable } from 'node:stream';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { createDescriptionSuggester } from './create.js';
import { ExtractiveSuggester } from './extractive.js';
import { OpenAiSuggester } from './openai-suggester.js';

function capturingLogger(): { logger: pino.Logger; text: () => string } {
  const chunks: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      chunks.push(chunk.toString('utf8'));
      done();
    },
  });
  return { logger: pino({ level: 'info' }, stream), text: () => chunks.join('') };
}

const base = {
  baseURL: 'https://api.deepseek.com',
  model: 'deepseek-chat',
  timeoutMs: 10_000,
  maxRetries: 1,
};

describe('createDescriptionSuggester', () => {
  it('is extractive only without a key', () => {
    const { logger } = capturingLogger();
    expect(createDescriptionSuggester({ ...base, apiKey: undefined }, logger)).toBeInstanceOf(
      ExtractiveSuggester,
    );
    expect(createDescriptionSuggester({ ...base, apiKey: '  ' }, logger)).toBeInstanceOf(ExtractiveSuggester);
    expect(createDescriptionSuggester(base, logger)).toBeInstanceOf(ExtractiveSuggester);
  });

  it('asks the model with a key, and logs neither the key nor URL credentials', () => {
    const { logger, text } = capturingLogger();
    const suggester = createDescriptionSuggester(
      {
        ...base,
        baseURL: 'https://user:secret-pass@gateway.example/v1?api-key=secret-query',
        apiKey: 'sk-secret-key-123',
      },
      logger,
    );
    expect(suggester).toBeInstanceOf(OpenAiSuggester);
    expect(text()).toContain('gateway.example/v1');
    expect(text()).not.toMatch(/secret/);
  });
});
