import { describe, expect, it } from 'vitest';
import { openAnswer, sealAnswer } from './kept-answers.js';

describe('kept refresh answers', () => {
  const client = { ip: '10.0.0.1', userAgent: 'browser' };
  const answer = JSON.stringify({ accessToken: 'a.b.c', refreshToken: 'd.e.f' });

  it('open for the same token and client only', () => {
    const sealed = sealAnswer(answer, 'token', client);
    expect(sealed).not.toContain('a.b.c');
    expect(openAnswer(sealed, 'token', client)).toBe(answer);
    expect(openAnswer(sealed, 'token', { ...client })).toBe(answer);
    expect(openAnswer(sealed, 'tokem', client)).toBeNull();
    expect(openAnswer(sealed, 'token', { ...client, ip: '10.0.0.2' })).toBeNull();
    expect(openAnswer(sealed, 'token', { ...client, userAgent: 'other' })).toBeNull();
    expect(openAnswer(sealed, 'token', { ip: null, userAgent: null })).toBeNull();
    // The parts are told apart: moving text from one to the next makes another key.
    const split = sealAnswer(answer, 'ab', { ip: 'c', userAgent: null });
    expect(openAnswer(split, 'a', { ip: 'bc', userAgent: null })).toBeNull();
  });

  it('open nothing altered, cut short or made up', () => {
    const sealed = Buffer.from(sealAnswer(answer, 'token', client), 'base64url');
    const flipped = Buffer.from(sealed);
    flipped[sealed.length - 1]! ^= 1;
    expect(openAnswer(flipped.toString('base64url'), 'token', client)).toBeNull();
    expect(openAnswer(sealed.subarray(0, 27).toString('base64url'), 'token', client)).toBeNull();
    expect(openAnswer('', 'token', client)).toBeNull();
    expect(openAnswer('not base64 at all!', 'token', client)).toBeNull();
  });

  it('seal the same answer differently each time', () => {
    expect(sealAnswer(answer, 'token', client)).not.toBe(sealAnswer(answer, 'token', client));
  });
});
