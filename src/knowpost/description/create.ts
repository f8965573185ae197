import type { DescriptionLog, DescriptionSuggester } from './describer.js';
import { ExtractiveSuggester } from './extractive.js';
import { OpenAiSuggester } from './openai-suggester.js';

export interface DescriptionSuggesterConfig {
  /** Without a key, descriptions are extractive only. */
  apiKey?: string | undefined;
  baseURL: string;
  model: string;
  timeoutMs: number;
  maxRetries: number;
}

export function createDescriptionSuggester(
  config: DescriptionSuggesterConfig,
  log: DescriptionLog,
): DescriptionSuggester {
  const extractive = new ExtractiveSuggester();
  const apiKey = config.apiKey?.trim();
  if (!apiKey) {
    log.info(
      { source: 'extractive' },
      'post descriptions: no AI API key set, using the extractive summariser',
    );
    return extractive;
  }
  const { baseURL, model, timeoutMs, maxRetries } = config;
  log.info(
    { source: 'ai', baseURL: withoutCredentials(baseURL), model, timeoutMs, maxRetries },
    'post descriptions: AI model with extractive fallback',
  );
  return new OpenAiSuggester({ apiKey, baseURL, model, timeoutMs, maxRetries }, extractive, log);
}

// Some gateways take a key in the URL's user info or query string.
function withoutCredentials(url: string): string {
  try {
    const parsed = new URL(url);
    return `${parsed.origin}${parsed.pathname}`;
  } catch {
    return '(not a valid URL)';
  }
}
