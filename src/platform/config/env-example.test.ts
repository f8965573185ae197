import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { CONFIG_VARS } from './config.js';

describe('.env.example', () => {
  const file = new URL('../../../.env.example', import.meta.url);
  const text = readFileSync(file, 'utf8');
  const listed = [...text.matchAll(/^#? ?([A-Z][A-Z0-9_]+)=/gm)].map((m) => m[1]);

  it('can be read by a shell (`set -a; . ./.env.example`) and gives the defaults as they are', () => {
    const read = execFileSync('bash', ['-c', 'set -a; . "$1"; env -0', 'bash', fileURLToPath(file)], {
      env: { PATH: process.env.PATH ?? '' },
      encoding: 'utf8',
    });
    const values = new Map(
      read.split('\0').map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
    );
    for (const [name, spec] of Object.entries<{ description: string; default?: string }>(CONFIG_VARS))
      if (spec.default !== undefined)
        expect({ name, value: values.get(name) }).toEqual({ name, value: spec.default });
  });

  it('lists exactly the variables the config module reads, each with its description', () => {
    expect([...listed].sort()).toEqual(Object.keys(CONFIG_VARS).sort());
    // The whole description line, right above the variable with its default (or commented out).
    for (const [name, spec] of Object.entries<{ description: string; default?: string }>(CONFIG_VARS)) {
      const line = spec.default === undefined ? `# ${name}=` : `${name}=${shellWord(spec.default)}`;
      expect({ name, found: text.includes(`\n# ${spec.description}\n${line}\n`) }).toEqual({
        name,
        found: true,
      });
    }
  });
});

/** A default as the file writes it: in single quotes when a shell would read it otherwise. */
function shellWord(value: string): string {
  return /^[\w./:@,+=-]*$/.test(value) ? value : `'${value}'`;
}
