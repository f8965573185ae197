import { describe, expect, it } from 'vitest';
import { openAnswer, sealAnswer } from './kept-answers.js';

const SECRET = Buffer.alloc(32, 7);

describe('kept refresh answers', () => {
  const client = { ip: '10.0.0.1', userAgent: 'browser' };
  const answer = JSON.stringify({ accessToken: 'a.b.c', refreshToken: 'd.e.f' });

  it('open for the same token and client only', () => {
    const sealed = sealAnswer(answer, SECRET, 'token', client);
    expect(sealed).not.toContain('a.b.c');
    expect(openAnswer(sealed, SECRET, 'token', client)).toBe(answer);
    expect(openAnswer(sealed, SECRET, 'token', { ...client })).toBe(answer);
    expect(openAnswer(sealed, SECRET, 'tokem', client)).toBeNull();
    expect(openAnswer(sealed, SECRET, 'token', { ...client, ip: '10.0.0.2' })).toBeNull();
    expect(openAnswer(sealed, SECRET, 'token', { ...client, userAgent: 'other' })).toBeNull();
    expect(openAnswer(sealed, SECRET, 'token', { ip: null, userAgent: null })).toBeNull();
    // Another deployment's secret opens nothing, even with the token and the client.
    expect(openAnswer(sealed, Buffer.alloc(32, 8), 'token', client)).toBeNull();
    // The parts are told apart: moving text from one to the next makes another key.
    const split = sealAnswer(answer, SECRET, 'ab', { ip: 'c', userAgent: null });
    expect(openAnswer(split, SECRET, 'a', { ip: 'bc', userAgent: null })).toBeNull();
  });

  it('open nothing altered, cut short or made up', () => {
    const sealed = Buffer.from(sealAnswer(answer, SECRET, 'token', client), 'base64url');
    const flipped = Buffer.from(sealed);
    flipped[sealed.length - 1]! ^= 1;
    expect(openAnswer(flipped.toString('base64url'), SECRET, 'token', client)).toBeNull();
    expect(openAnswer(sealed.subarray(0, 27).toString('base64url'), SECRET, 'token', client)).toBeNull();
    expect(openAnswer('', SECRET, 'token', client)).toBeNull();
    expect(openAnswer('not base64 at all!', SECRET, 'token', client)).toBeNull();
  });

  it('seal the same answer differently each time', () => {
    expect(sealAnswer(answer, SECRET, 'token', client)).not.toBe(sealAnswer(answer, SECRET, 'token', client));
  });
});
