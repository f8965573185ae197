import { expect } from 'vitest';

/** Bad input for any route: what must be a 4xx in the contract's error shape, never a 5xx. */

/** Values of the wrong type or beyond any sane bound, to put in place of each valid field. */
export const WRONG_VALUES: readonly unknown[] = [
  null,
  0,
  -1,
  1.5,
  true,
  [],
  {},
  ['a'],
  { a: 1 },
  'x'.repeat(5000),
  '',
  '\u0000',
  '../../etc/passwd',
];

/** Asserts a 4xx answer with `{code, message, requestId}`; `label` names the case on failure. */
export function expect4xx(label: string, res: { status: number; body: any }): void {
  expect({ label, status: res.status >= 400 && res.status < 500 ? '4xx' : res.status }).toEqual({
    label,
    status: '4xx',
  });
  expect({
    label,
    shape:
      typeof res.body?.code === 'string' &&
      typeof res.body?.message === 'string' &&
      typeof res.body?.requestId === 'string',
  }).toEqual({ label, shape: true });
}

/** Deterministic pseudo-random JSON values whose objects use `keys`, so a failure can be replayed. */
export function* randomBodies(seed: number, count: number, keys: readonly string[]): Generator<unknown> {
  let s = seed;
  const next = () => (s = (s * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff;
  const atoms = () => [
    null,
    next() * 1e12,
    -next(),
    next() > 0.5,
    'ü'.repeat(Math.floor(next() * 40)),
    '{"',
    '1e999',
    '\ud800',
    'posts/',
  ];
  const value = (depth: number): unknown => {
    const r = next();
    if (depth > 2 || r < 0.5) {
      const choices = atoms();
      return choices[Math.floor(next() * choices.length)];
    }
    if (r < 0.75) return Array.from({ length: Math.floor(next() * 4) }, () => value(depth + 1));
    return Object.fromEntries(
      Array.from({ length: Math.floor(next() * 5) }, () => [
        keys[Math.floor(next() * keys.length)],
        value(depth + 1),
      ]),
    );
  };
  for (let i = 0; i < count; i++) yield value(0);
}
