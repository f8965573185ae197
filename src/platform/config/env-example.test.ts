import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { CONFIG_VARS } from './config.js';

describe('.env.example', () => {
  const text = readFileSync(new URL('../../../.env.example', import.meta.url), 'utf8');
  const listed = [...text.matchAll(/^#? ?([A-Z][A-Z0-9_]+)=/gm)].map((m) => m[1]);

  it('lists exactly the variables the config module reads, each with its description', () => {
    expect([...listed].sort()).toEqual(Object.keys(CONFIG_VARS).sort());
    // The whole description line, right above the variable with its default (or commented out).
    for (const [name, spec] of Object.entries<{ description: string; default?: string }>(CONFIG_VARS)) {
      const line = spec.default === undefined ? `# ${name}=` : `${name}=${spec.default}`;
      expect({ name, found: text.includes(`\n# ${spec.description}\n${line}\n`) }).toEqual({
        name,
        found: true,
      });
    }
  });
});
