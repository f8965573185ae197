import cors from '@fastify/cors';
import Fastify from 'fastify';
import { describe, expect, it } from 'vitest';
import { isSingleLine, isVisible, sendJsonBytes, TEXT_FORMATS } from './schemas.js';

describe('text checks', () => {
  it('takes a name that shows something, not only blanks drawn as letters', () => {
    for (const shown of ['a', ' 知光 ', 'x\u200b', '\u3164a', '\u2801', 'e\u0301', '7', '!', '☀'])
      expect({ shown, visible: isVisible(shown) }).toEqual({ shown, visible: true });
    for (const blank of [
      '',
      '   ',
      '\u200b\u200d',
      '\u115f',
      '\u1160',
      '\u3164',
      '\uffa0',
      '\u2800\u2800',
      '\u3000',
      // Combining marks with nothing to combine with, and the grapheme joiner.
      '\u0301\u0301',
      '\u034f',
      '\u17b4',
    ])
      expect({ blank, visible: isVisible(blank) }).toEqual({ blank, visible: false });
  });

  it('keeps a single line to one line and the right direction, longer text its line breaks', () => {
    expect(isSingleLine('a \u200f b \u2067c\u2069')).toBe(true);
    for (const bad of ['a\nb', 'a\u2028b', 'a\u2029b', 'a\u202eb', 'a\u0000b', 'a\u0085b'])
      expect({ bad, ok: isSingleLine(bad) }).toEqual({ bad, ok: false });
    const multi = TEXT_FORMATS['multi-line'].validate;
    expect(multi('one\ntwo\r\n\tthree \u2028 four')).toBe(true);
    expect(multi('bell\u0007')).toBe(false);
  });

  it('refuses unpaired surrogates and piles of combining marks, taking the marks real scripts stack', () => {
    const multi = TEXT_FORMATS['multi-line'].validate;
    // Vietnamese in decomposed form, Thai with a vowel and a tone mark, Devanagari, a flag emoji.
    for (const fine of ['Vie\u0323\u0302t', 'ก\u0e34\u0e49', 'क\u094d\u0937\u093f', '\u{1f1e8}\u{1f1f3}'])
      expect({ fine, single: isSingleLine(fine), multi: multi(fine) }).toEqual({
        fine,
        single: true,
        multi: true,
      });
    for (const bad of [
      'a\ud800b',
      '\udc00',
      'x\ud83d',
      'a' + '\u0301'.repeat(5),
      'Z' + '\u0336\u0317'.repeat(30),
    ])
      expect({ bad, single: isSingleLine(bad), multi: multi(bad) }).toEqual({
        bad,
        single: false,
        multi: false,
      });
  });
});

describe(sendJsonBytes.name, () => {
  it('adds Authorization to the answer’s Vary, keeping the Origin of the CORS hook', async () => {
    const app = Fastify();
    await app.register(cors, { origin: true });
    app.get('/', (_request, reply) => sendJsonBytes(reply, Buffer.from('{"a":1}')));
    try {
      const cross = await app.inject({ url: '/', headers: { origin: 'https://one.example' } });
      expect(cross.json()).toEqual({ a: 1 });
      expect(cross.headers['access-control-allow-origin']).toBe('https://one.example');
      expect(cross.headers.vary).toBe('Origin, Authorization');
      const plain = await app.inject({ url: '/', headers: { authorization: 'Bearer x' } });
      expect(plain.headers.vary).toMatch(/^(Origin, )?Authorization$/);
      expect(plain.headers['cache-control']).toBe('private, no-store');
    } finally {
      await app.close();
    }
  });
});
