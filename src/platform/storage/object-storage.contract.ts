import { createHash, randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { ObjectStorage } from './object-storage.js';

export interface ObjectStorageFixture {
  sut: ObjectStorage;
  /** Moves the URL signer's clock forward; without it the suite waits expiries out in real time. */
  advance?: (ms: number) => void;
  cleanup: () => Promise<void>;
}

/** What the server behind an adapter enforces; a case that needs more is skipped, by name. */
export interface ObjectStorageCapabilities {
  /** Refuses presigned requests whose signature does not hold: other Content-Type, altered or expired URL. */
  checksSignatures: boolean;
  /** Refuses a presigned PUT over its `maxBytes` (S3 cannot; its size is checked after the fact). */
  capsPresignedPutSize: boolean;
}

const md5 = (bytes: Uint8Array): string => `"${createHash('md5').update(bytes).digest('hex')}"`;

// Stores may reformat media-type parameters (`a/b; charset=x` comes back as `a/b;charset=x` from some).
const mediaType = (value: string | null | undefined): string =>
  (value ?? '').replace(/\s*;\s*/g, ';').toLowerCase();

function withSignatureTampered(url: string): string {
  const u = new URL(url);
  for (const name of ['sig', 'X-Amz-Signature']) {
    const value = u.searchParams.get(name);
    // The first character: the last one of a base64 text may carry only padding bits.
    if (value) u.searchParams.set(name, `${value.startsWith('a') ? 'b' : 'a'}${value.slice(1)}`);
  }
  return u.toString();
}

function withKeyReplaced(url: string, key: string, other: string): string {
  const u = new URL(url);
  u.pathname = u.pathname.replace(key, other);
  return u.toString();
}

/**
 * The behaviour every `ObjectStorage` adapter must show, driven the way clients use it: objects
 * through the port, presigned URLs through a plain `fetch`.
 */
export function defineObjectStorageContract(
  name: string,
  factory: () => Promise<ObjectStorageFixture>,
  capabilities: ObjectStorageCapabilities,
): void {
  describe(`ObjectStorage contract: ${name}`, () => {
    let fx: ObjectStorageFixture;
    let storage: ObjectStorage;
    const elapse = async (ms: number): Promise<void> => {
      if (fx.advance) fx.advance(ms);
      else await sleep(ms);
    };
    const key = (file: string): string => `posts/${randomBytes(4).toString('hex')}/${file}`;

    beforeEach(async () => {
      fx = await factory();
      storage = fx.sut;
    });
    afterEach(async () => {
      await fx.cleanup();
    });

    describe('put / head / get / delete', () => {
      it('deletes every object under a prefix and nothing beside it', async () => {
        const base = key('x').replace(/\/x$/, '');
        const inside = [`${base}/content.md`, `${base}/body/abc.md`, `${base}/images/20250101/00000000.png`];
        for (const k of inside) await storage.put(k, randomBytes(10), 'text/plain');
        const beside = `${base}0/content.md`;
        await storage.put(beside, randomBytes(10), 'text/plain');
        expect(await storage.deletePrefix(base)).toBe(3);
        for (const k of inside) expect(await storage.head(k)).toBeNull();
        expect(await storage.head(beside)).not.toBeNull();
        expect(await storage.deletePrefix(base)).toBe(0);
        expect(await storage.deletePrefix(`${base}/nothing`)).toBe(0);
      });

      it('lists every object under a prefix with when it was written and its size, and nothing beside it', async () => {
        const base = key('x').replace(/\/x$/, '');
        const before = Date.now();
        const inside = [`${base}/content.md`, `${base}/body/abc.md`, `${base}/images/20250101/00000000.png`];
        for (const [i, k] of inside.entries()) await storage.put(k, randomBytes(10 + i), 'text/plain');
        await storage.put(`${base}0/content.md`, randomBytes(10), 'text/plain');
        const listed = await storage.listPrefix(base);
        expect(listed.map((o) => o.key).sort()).toEqual([...inside].sort());
        expect(listed.map((o) => o.size).sort()).toEqual([10, 11, 12]);
        // Stores keep whole seconds at least; the clocks are this machine's.
        for (const o of listed) {
          expect(o.lastModified).toBeGreaterThan(before - 2000);
          expect(o.lastModified).toBeLessThan(Date.now() + 2000);
        }
        // A copy is written when it is made.
        await sleep(1100);
        const source = (await storage.head(inside[0]!))!;
        const copied = Date.now();
        await storage.copy(inside[0]!, `${base}/body/def.md`, source.etag);
        const copy = (await storage.listPrefix(`${base}/body`)).find((o) => o.key === `${base}/body/def.md`);
        expect(copy?.lastModified).toBeGreaterThan(copied - 1000);
        expect(await storage.listPrefix(`${base}/nothing`)).toEqual([]);
        await storage.deletePrefix(base);
        expect(await storage.listPrefix(base)).toEqual([]);
      });

      it('copies an object, content type included, only while it has the ETag given', async () => {
        const from = key('content.md');
        const to = from.replace('content.md', 'body/copy.md');
        const bytes = randomBytes(2000);
        const put = await storage.put(from, bytes, 'text/markdown');
        const copy = await storage.copy(from, to, put.etag);
        expect(copy).toEqual({ size: 2000, etag: md5(bytes), contentType: 'text/markdown' });
        expect(await storage.head(to)).toEqual(copy);
        expect(Buffer.concat(await (await storage.get(to))!.body.toArray())).toEqual(bytes);
        // Unquoted ETags are the same ETag.
        expect(await storage.copy(from, key('x.md'), put.etag.replaceAll('"', ''))).toMatchObject({
          size: 2000,
        });

        // The source replaced since its ETag was read: nothing is copied, the old copy stays.
        await storage.put(from, randomBytes(10), 'text/markdown');
        expect(await storage.copy(from, to, put.etag)).toBeNull();
        expect(await storage.head(to)).toEqual(copy);
        const other = key('other.md');
        expect(await storage.copy(from, other, put.etag)).toBeNull();
        expect(await storage.head(other)).toBeNull();
        // A missing source.
        expect(await storage.copy(key('missing.md'), other, put.etag)).toBeNull();
        expect(await storage.head(other)).toBeNull();
      });

      it('stores bytes and reports their size, MD5 ETag and content type', async () => {
        const k = key('image.png');
        const bytes = randomBytes(3000);
        const put = await storage.put(k, bytes, 'image/png');
        expect(put).toEqual({ size: 3000, etag: md5(bytes), contentType: 'image/png' });
        expect(await storage.head(k)).toEqual(put);
        const found = await storage.get(k);
        expect(found?.object).toEqual(put);
        expect(Buffer.concat(await found!.body.toArray())).toEqual(bytes);
      });

      it('replaces an object as a whole', async () => {
        const k = key('body.md');
        await storage.put(k, Buffer.from('first version, rather long'), 'text/markdown');
        await storage.put(k, Buffer.from('second'), 'text/plain');
        expect(await storage.head(k)).toMatchObject({
          size: 6,
          etag: md5(Buffer.from('second')),
          contentType: 'text/plain',
        });
      });

      it('answers null for a missing key', async () => {
        expect(await storage.head(key('missing.md'))).toBeNull();
        expect(await storage.get(key('missing.md'))).toBeNull();
      });

      it('deletes, and deleting a missing object is not an error', async () => {
        const k = key('body.md');
        await storage.put(k, Buffer.from('x'), 'text/markdown');
        await storage.delete(k);
        expect(await storage.head(k)).toBeNull();
        await expect(storage.delete(k)).resolves.toBeUndefined();
      });

      it('finds nothing under an object, as under any missing key', async () => {
        const k = key('file.md');
        await storage.put(k, Buffer.from('x'), 'text/markdown');
        expect(await storage.head(`${k}/x`)).toBeNull();
        expect(await storage.get(`${k}/x`)).toBeNull();
      });

      it.each([
        'posts/../secret',
        '../outside',
        'posts/./x',
        '/posts/x',
        'posts//x',
        'posts/x y',
        '',
        `posts/${'a'.repeat(201)}`,
      ])('rejects the unsafe key %j everywhere', async (bad) => {
        const presign = { contentType: 'text/plain', maxBytes: 10, expiresInSeconds: 60 };
        await expect(storage.put(bad, Buffer.from('x'), 'text/plain')).rejects.toThrow(/unsafe object key/);
        await expect(storage.head(bad)).rejects.toThrow(/unsafe object key/);
        await expect(storage.get(bad)).rejects.toThrow(/unsafe object key/);
        await expect(storage.delete(bad)).rejects.toThrow(/unsafe object key/);
        await expect(storage.presignPut(bad, presign)).rejects.toThrow(/unsafe object key/);
        await expect(storage.presignGet(bad, 60)).rejects.toThrow(/unsafe object key/);
      });
    });

    describe('presigned PUT', () => {
      it('takes the bytes with the signed Content-Type and answers the ETag head reports', async () => {
        const k = key('body.md');
        const body = Buffer.from('# 知光\n\nA post body.\n');
        const signed = await storage.presignPut(k, {
          contentType: 'text/markdown; charset=utf-8',
          maxBytes: 1024,
          expiresInSeconds: 300,
        });
        expect(signed.headers).toEqual({ 'Content-Type': 'text/markdown; charset=utf-8' });
        expect(signed.expiresIn).toBe(300);
        const res = await fetch(signed.url, { method: 'PUT', headers: signed.headers, body });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        const head = await storage.head(k);
        expect(head).toMatchObject({ size: body.length, etag: md5(body) });
        expect(res.headers.get('etag')).toBe(head?.etag);
        expect(mediaType(head?.contentType)).toBe('text/markdown;charset=utf-8');
      });

      it('takes a Content-Type signed as the caller spelled it, sent from the caller’s own value', async () => {
        const k = key('spelled.md');
        const contentType = 'Text/Markdown; charset=UTF-8';
        const signed = await storage.presignPut(k, { contentType, maxBytes: 1024, expiresInSeconds: 300 });
        expect(signed.headers).toEqual({ 'Content-Type': contentType });
        const res = await fetch(signed.url, {
          method: 'PUT',
          headers: { 'content-type': contentType },
          body: 'x',
        });
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        expect(mediaType((await storage.head(k))?.contentType)).toBe('text/markdown;charset=utf-8');
      });

      it('takes binary bytes unchanged', async () => {
        const k = key('image.webp');
        const bytes = randomBytes(64 * 1024);
        const signed = await storage.presignPut(k, {
          contentType: 'image/webp',
          maxBytes: bytes.length,
          expiresInSeconds: 60,
        });
        const res = await fetch(signed.url, { method: 'PUT', headers: signed.headers, body: bytes });
        expect(res.status).toBe(200);
        expect(res.headers.get('etag')).toBe(md5(bytes));
        const found = await storage.get(k);
        // Compared as one buffer: element-wise diffing of 64 KiB takes the matcher a second.
        expect(Buffer.concat(await found!.body.toArray()).equals(bytes)).toBe(true);
      });

      it('refuses to sign a malformed content type or an expiry out of range', async () => {
        const k = key('x.md');
        await expect(
          storage.presignPut(k, { contentType: 'text/plain\r\nX: y', maxBytes: 1, expiresInSeconds: 60 }),
        ).rejects.toThrow();
        await expect(
          storage.presignPut(k, { contentType: 'text/plain', maxBytes: 1, expiresInSeconds: 0 }),
        ).rejects.toThrow();
        await expect(
          storage.presignPut(k, { contentType: 'text/plain', maxBytes: 1, expiresInSeconds: 8 * 86_400 }),
        ).rejects.toThrow();
        await expect(storage.presignGet(k, 0)).rejects.toThrow();
      });

      it.runIf(capabilities.checksSignatures)(
        'refuses another Content-Type with 403 and stores nothing',
        async () => {
          const k = key('body.md');
          const signed = await storage.presignPut(k, {
            contentType: 'text/markdown',
            maxBytes: 1024,
            expiresInSeconds: 60,
          });
          const res = await fetch(signed.url, {
            method: 'PUT',
            headers: { 'Content-Type': 'text/html' },
            body: '<script>',
          });
          expect(res.status).toBe(403);
          await res.arrayBuffer();
          expect(await storage.head(k)).toBeNull();
        },
      );

      it.runIf(capabilities.checksSignatures)(
        'refuses an expired URL with 403 and stores nothing',
        async () => {
          const k = key('body.md');
          const signed = await storage.presignPut(k, {
            contentType: 'text/markdown',
            maxBytes: 1024,
            expiresInSeconds: 1,
          });
          await elapse(2100);
          const res = await fetch(signed.url, { method: 'PUT', headers: signed.headers, body: 'late' });
          expect(res.status).toBe(403);
          await res.arrayBuffer();
          expect(await storage.head(k)).toBeNull();
        },
      );

      it.runIf(capabilities.checksSignatures)(
        'refuses a URL moved to another key, or with an altered signature',
        async () => {
          const k = key('body.md');
          const other = key('body.md');
          const signed = await storage.presignPut(k, {
            contentType: 'text/markdown',
            maxBytes: 1024,
            expiresInSeconds: 60,
          });
          for (const url of [withKeyReplaced(signed.url, k, other), withSignatureTampered(signed.url)]) {
            const res = await fetch(url, { method: 'PUT', headers: signed.headers, body: 'forged' });
            expect(res.status).toBe(403);
            await res.arrayBuffer();
          }
          expect(await storage.head(k)).toBeNull();
          expect(await storage.head(other)).toBeNull();
        },
      );

      it.runIf(capabilities.capsPresignedPutSize)(
        'refuses a body over the limit with 413 and keeps nothing',
        async () => {
          const k = key('image.png');
          const signed = await storage.presignPut(k, {
            contentType: 'image/png',
            maxBytes: 1000,
            expiresInSeconds: 60,
          });
          const over = await fetch(signed.url, {
            method: 'PUT',
            headers: signed.headers,
            body: randomBytes(1001),
          });
          expect(over.status).toBe(413);
          await over.arrayBuffer();
          expect(await storage.head(k)).toBeNull();
          const exact = await fetch(signed.url, {
            method: 'PUT',
            headers: signed.headers,
            body: randomBytes(1000),
          });
          expect(exact.status).toBe(200);
          expect((await storage.head(k))?.size).toBe(1000);
        },
      );
    });

    describe('keyOf', () => {
      it('names the key of every URL the store gives out, with or without its query', async () => {
        const k = key('images/20261204/0a1b2c3d.png');
        const put = await storage.presignPut(k, {
          contentType: 'image/png',
          maxBytes: 1_000,
          expiresInSeconds: 60,
        });
        const get = await storage.presignGet(k, 60);
        for (const url of [put.url, get, storage.publicUrl(k)]) {
          expect(storage.keyOf(url)).toBe(k);
          expect(storage.keyOf(url.split('?')[0]!)).toBe(k);
          expect(storage.keyOf(`${url.split('?')[0]!}#top`)).toBe(k);
        }
      });

      it('names no key for other URLs', async () => {
        const k = key('images/20261204/0a1b2c3d.png');
        const get = new URL(await storage.presignGet(k, 60));
        const elsewhere = new URL(get);
        elsewhere.host = 'images.example.com';
        const otherScheme = new URL(get);
        otherScheme.protocol = 'ftp:';
        for (const url of [
          elsewhere.toString(),
          otherScheme.toString(),
          'https://images.example.com/a.png',
          'not a url',
          '',
          `${get.origin}/`,
          // Not a key this store could hold.
          withKeyReplaced(get.toString(), k, `${k}%20copy`),
        ]) {
          expect(storage.keyOf(url), url).toBeNull();
        }
      });
    });

    describe('presigned GET', () => {
      it('returns the bytes and content type of any key', async () => {
        const k = key('body.md');
        const body = Buffer.from('private draft');
        await storage.put(k, body, 'text/markdown');
        const res = await fetch(await storage.presignGet(k, 60));
        expect(res.status).toBe(200);
        expect(mediaType(res.headers.get('content-type'))).toBe('text/markdown');
        expect(Buffer.from(await res.arrayBuffer())).toEqual(body);
      });

      it('never lets a stored HTML or SVG page run script where it is served', async () => {
        for (const [name, type] of [
          ['page.html', 'text/html'],
          ['drawing.svg', 'image/svg+xml'],
        ] as const) {
          const k = key(name);
          await storage.put(k, Buffer.from('<script>alert(1)</script>'), type);
          const res = await fetch(await storage.presignGet(k, 60));
          expect(res.status).toBe(200);
          await res.arrayBuffer();
          const sandboxed = /(^|;)\s*sandbox\b/.test(res.headers.get('content-security-policy') ?? '');
          const download = /^attachment\b/i.test(res.headers.get('content-disposition') ?? '');
          expect(sandboxed || download, name).toBe(true);
        }
      });

      it('lets anyone keep a public object for good (its name is never written again)', async () => {
        const k = `avatars/${randomBytes(4).toString('hex')}/a.png`;
        await storage.put(k, Buffer.from('png'), 'image/png');
        const res = await fetch(storage.publicUrl(k));
        expect(res.status).toBe(200);
        await res.arrayBuffer();
        expect(res.headers.get('cache-control')).toBe('public, max-age=31536000, immutable');
        await storage.delete(k);
      });

      it('lets the reader alone keep what it read, for no longer than the URL lasts', async () => {
        const k = key('body.md');
        await storage.put(k, Buffer.from('private draft'), 'text/markdown');
        const res = await fetch(await storage.presignGet(k, 120));
        await res.arrayBuffer();
        const cache = res.headers.get('cache-control') ?? '';
        expect(cache).toMatch(/^private, max-age=\d+$/);
        expect(Number(/max-age=(\d+)/.exec(cache)![1])).toBeLessThanOrEqual(120);
      });

      it('answers 404 for a missing object', async () => {
        const res = await fetch(await storage.presignGet(key('missing.md'), 60));
        expect(res.status).toBe(404);
        await res.arrayBuffer();
      });

      it.runIf(capabilities.checksSignatures)(
        'refuses an expired, moved or altered URL with 403',
        async () => {
          const k = key('body.md');
          const other = key('body.md');
          await storage.put(k, Buffer.from('mine'), 'text/markdown');
          await storage.put(other, Buffer.from('not yours'), 'text/markdown');
          const url = await storage.presignGet(k, 1);
          for (const bad of [withKeyReplaced(url, k, other), withSignatureTampered(url)]) {
            const res = await fetch(bad);
            expect(res.status).toBe(403);
            await res.arrayBuffer();
          }
          await elapse(2100);
          const expired = await fetch(url);
          expect(expired.status).toBe(403);
          await expired.arrayBuffer();
        },
      );
    });
  });
}
