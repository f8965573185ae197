import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { CONFIG_VARS } from './config.js';

describe('.env.example', () => {
  const text = readFileSync(new URL('../../../.env.example', import.meta.url), 'utf8');
  const listed = [...text.matchAll(/^#? ?([A-Z][A-Z0-9_]+)=/gm)].map((m) => m[1]);

  it('lists exactly the variables the config module reads, each with its description', () => {
    expect([...listed].sort()).toEqual(Object.keys(CONFIG_VARS).sort());
    for (const spec of Object.values(CONFIG_VARS)) expect(text).toContain(`# ${spec.description}`);
  });
});
