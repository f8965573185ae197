import { describe, expect, it } from 'vitest';
import {
  bodyCopyExtension,
  confirmedContentKey,
  isContentKey,
  isExternalImageUrl,
  isImageKey,
  isReadableContentKey,
  isStoredImageKey,
  isStoredImageOf,
  storedImageKey,
  uploadTarget,
} from './post-keys.js';
import { normalizeEtag } from '../platform/storage/object-storage.js';

const NOW = Date.UTC(2025, 0, 31, 23, 59);

describe(uploadTarget.name, () => {
  it('derives the extension from the content type and puts images under the day', () => {
    expect(uploadTarget('knowpost_content', '42', 'text/markdown', undefined, NOW)).toEqual({
      key: 'posts/42/content.md',
      contentType: 'text/markdown',
    });
    // Matched lower-cased, signed as written: a client may set the upload's header from its own value.
    expect(uploadTarget('knowpost_content', '42', ' Application/JSON ', undefined, NOW)).toEqual({
      key: 'posts/42/content.json',
      contentType: 'Application/JSON',
    });
    expect(
      uploadTarget('knowpost_content', '42', 'text/markdown; charset=UTF-8', '.md', NOW).contentType,
    ).toBe('text/markdown; charset=UTF-8');
    expect(uploadTarget('knowpost_image', '42', 'image/jpeg', '.jpeg', NOW, () => 'deadbeef')).toEqual({
      key: 'posts/42/images/20250131/deadbeef.jpeg',
      contentType: 'image/jpeg',
    });
    // Without its dot, as clients of the original service may send it.
    expect(uploadTarget('knowpost_content', '42', 'text/markdown', 'MD', NOW).key).toBe(
      'posts/42/content.md',
    );
    expect(uploadTarget('knowpost_image', '42', 'image/png', 'png', NOW, () => 'deadbeef').key).toBe(
      'posts/42/images/20250131/deadbeef.png',
    );
    expect(uploadTarget('knowpost_image', '42', 'image/webp', undefined, NOW).key).toMatch(
      /^posts\/42\/images\/20250131\/[0-9a-f]{8}\.webp$/,
    );
  });

  it('refuses types and extensions outside the scene or disagreeing with each other', () => {
    const cases: [Parameters<typeof uploadTarget>[0], string, string | undefined][] = [
      ['knowpost_content', 'image/png', undefined],
      ['knowpost_image', 'text/markdown', undefined],
      ['knowpost_content', 'text/markdown', '.txt'],
      ['knowpost_content', 'text/markdown', '.png'],
      ['knowpost_content', 'text/markdown', 'txt'],
      ['knowpost_content', 'text/markdown', '..md'],
      ['knowpost_image', 'image/svg+xml', undefined],
      ['knowpost_content', 'text/html; charset=utf-8\r\nX: y', undefined],
      ['knowpost_content', 'text/html; boundary=x', undefined],
      // Only spaces around the parameter: a signed header is sent back verbatim.
      ['knowpost_content', 'text/plain;\tcharset=utf-8', undefined],
      ['knowpost_content', 'text/plain;\ncharset=utf-8', undefined],
      ['knowpost_content', 'text/plain;\u00a0charset=utf-8', undefined],
      // Lower-cases to text/markdown, but is no header value.
      ['knowpost_content', 'text/mar\u212adown', undefined],
    ];
    for (const [scene, type, ext] of cases) {
      expect(() => uploadTarget(scene, '42', type, ext, NOW), `${scene} ${type} ${ext}`).toThrow(
        /must|match/,
      );
    }
  });
});

describe('key checks', () => {
  it('accepts exactly the shapes presign hands out for this post', () => {
    expect(isContentKey('42', 'posts/42/content.md')).toBe(true);
    expect(isContentKey('42', 'posts/42/content.exe')).toBe(false);
    expect(isContentKey('42', 'posts/421/content.md')).toBe(false);
    const sha = 'ab'.repeat(32);
    expect(confirmedContentKey('42', '.md', sha)).toBe(`posts/42/body/${sha}.md`);
    // Every confirm names its own copy, shaped as an earlier release named copies by their SHA-256.
    const copy = confirmedContentKey('42', '.md');
    expect(copy).toMatch(/^posts\/42\/body\/[0-9a-f]{64}\.md$/);
    expect(confirmedContentKey('42', '.md')).not.toBe(copy);
    expect(isContentKey('42', copy)).toBe(false);
    expect(isReadableContentKey('42', copy)).toBe(true);
    expect(bodyCopyExtension('42', copy)).toBe('.md');
    expect(bodyCopyExtension('42', `posts/42/body/${sha}.txt`)).toBe('.txt');
    // Bodies confirmed before copies were made are read from their upload key.
    expect(isReadableContentKey('42', 'posts/42/content.md')).toBe(true);
    expect(bodyCopyExtension('42', 'posts/42/content.md')).toBeUndefined();
    for (const key of [
      `posts/421/body/${sha}.md`,
      `posts/42/body/${sha}-0123456789abcdef.md`,
      `posts/42/body/${sha}.exe`,
      `posts/42/body/${sha.slice(1)}.md`,
      `posts/42/body/${sha.toUpperCase()}.md`,
      `posts/42/body/x/${sha}.md`,
    ])
      expect({ key, readable: isReadableContentKey('42', key) }).toEqual({ key, readable: false });
    expect(isImageKey('42', 'posts/42/images/20250131/deadbeef.png')).toBe(true);
    expect(isImageKey('42', 'posts/42/images/20250131/deadbeef.png/x')).toBe(false);
    expect(isImageKey('42', 'posts/42/images/../content.md')).toBe(false);
    expect(isImageKey('4', 'posts/42/images/20250131/deadbeef.png')).toBe(false);
    expect(isExternalImageUrl('https://cdn.example.com/a.png?x=1')).toBe(true);
    expect(isExternalImageUrl('javascript:alert(1)')).toBe(false);
    expect(isExternalImageUrl('https://exa mple.com/')).toBe(false);
    expect(isExternalImageUrl('//example.com/a.png')).toBe(false);
  });

  it('names every image copy anew, in the shape earlier releases read, and tells which upload it came from', () => {
    const upload = 'posts/42/images/20250131/deadbeef.png';
    const copy = storedImageKey('42', upload);
    expect(copy).toMatch(/^posts\/42\/pictures\/[0-9a-f]{32}\.png$/);
    expect(isStoredImageKey('42', copy)).toBe(true);
    expect(isStoredImageKey('4', copy)).toBe(false);
    expect(isStoredImageKey('42', `posts/42/pictures/${'a'.repeat(48)}.png`)).toBe(false);
    // The same upload names a new copy each time, all known as copies of it.
    const again = storedImageKey('42', upload);
    expect(again).not.toBe(copy);
    expect(isStoredImageOf('42', upload, copy)).toBe(true);
    expect(isStoredImageOf('42', upload, again)).toBe(true);
    expect(storedImageKey('42', upload, 'ab'.repeat(8))).toBe(
      copy.slice(0, copy.length - 20) + 'ab'.repeat(8) + '.png',
    );
    expect(isStoredImageOf('42', 'posts/42/images/20250131/deadbeee.png', copy)).toBe(false);
    expect(isStoredImageOf('42', upload.replace('.png', '.gif'), copy)).toBe(false);
    expect(isStoredImageOf('42', upload, copy.replace('.png', '.gif'))).toBe(false);
    expect(isStoredImageOf('42', upload, upload)).toBe(false);
  });

  it('compares ETags without quotes, weakness or case', () => {
    expect(normalizeEtag('"ABC"')).toBe('abc');
    expect(normalizeEtag('W/"abc"')).toBe('abc');
    expect(normalizeEtag(' abc ')).toBe('abc');
  });
});
