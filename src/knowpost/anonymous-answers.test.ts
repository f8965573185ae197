import { describe, expect, it } from 'vitest';
import { AnonymousAnswers } from './anonymous-answers.js';

describe(AnonymousAnswers.name, () => {
  const written = (text: string) => async () => Buffer.from(text);

  it('keeps answers up to a number of bytes, the oldest going first', async () => {
    const now = 1_000;
    const sut = new AnonymousAnswers<Buffer>(
      () => 0,
      { ttlMs: 1_000, maxEntries: 100, maxBytes: 10, now: () => now },
      (b) => b.length,
    );
    await sut.get('a', written('aaaa'));
    await sut.get('b', written('bbbb'));
    // 12 bytes would be too many: the oldest goes.
    await sut.get('c', written('cccc'));
    expect(sut.peek('a')).toBeUndefined();
    expect(sut.peek('b')?.toString()).toBe('bbbb');
    expect(sut.peek('c')?.toString()).toBe('cccc');
    // One answer larger than all is not kept at all.
    await sut.get('d', written('d'.repeat(11)));
    expect(sut.peek('d')).toBeUndefined();
  });
});
