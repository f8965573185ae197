import { createHash, randomBytes } from 'node:crypto';
import {
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect } from 'node:net';
import { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import cors from '@fastify/cors';
import multipart from '@fastify/multipart';
import Fastify, { type FastifyInstance } from 'fastify';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { services, uniqueBucket } from '../../../test/rig/resources.js';
import { deleteS3Buckets } from '../../../test/rig/services.js';
import { installErrorHandling } from '../http/error-handler.js';
import { filesRoutes } from './files.routes.js';
import { LocalObjectStorage, loadOrCreateSigningKey } from './local-object-storage.js';
import { defineObjectStorageContract, type ObjectStorageFixture } from './object-storage.contract.js';
import { S3ObjectStorage } from './s3-object-storage.js';

interface LocalServer extends ObjectStorageFixture {
  sut: LocalObjectStorage;
  root: string;
  baseUrl: string;
  signingKey: Buffer;
  app: FastifyInstance;
}

/**
 * The app's files routes on a port of their own, over a fresh directory. The port is known only once
 * listening, so the routes get one instance and the test another with the real base URL: both share
 * the directory, the secret and the clock, as two processes of one deployment would.
 */
async function startLocal(options: { uploadFinishMs?: number } = {}): Promise<LocalServer> {
  const root = mkdtempSync(join(tmpdir(), 'zg-storage-'));
  const signingKey = randomBytes(32);
  let now = Date.now();
  const clock = { signingKey, now: () => now };
  // A client may hold the whole body of a streamed file before the server sees its stream end; the
  // connection then is not idle yet and `close` would wait out the keep-alive timeout (72 s).
  const app = Fastify({ forceCloseConnections: true });
  installErrorHandling(app);
  // The real server's parsers and CORS, to show the upload route is not affected by them.
  await app.register(cors, { origin: true, exposedHeaders: ['X-Request-Id'] });
  await app.register(multipart, { limits: { fileSize: 1024 } });
  await app.register(
    filesRoutes(new LocalObjectStorage(root, 'http://unused.invalid/files', { ...clock, ...options })),
  );
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  if (address === null || typeof address === 'string') throw new Error('no TCP address');
  const baseUrl = `http://127.0.0.1:${address.port}/files`;
  return {
    sut: new LocalObjectStorage(root, baseUrl, clock),
    advance: (ms) => {
      now += ms;
    },
    root,
    baseUrl,
    signingKey,
    app,
    cleanup: async () => {
      await app.close();
      rmSync(root, { recursive: true, force: true });
    },
  };
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' }).filter((name) =>
    statSync(join(dir, name)).isFile(),
  );
}

async function s3Fixture(): Promise<ObjectStorageFixture & { sut: S3ObjectStorage; bucket: string }> {
  const bucket = uniqueBucket('store');
  const storage = new S3ObjectStorage({
    endpoint: services.s3Endpoint(),
    region: 'us-east-1',
    bucket,
    ...services.s3Credentials(),
    forcePathStyle: true,
  });
  await storage.ensureBucket();
  return {
    sut: storage,
    bucket,
    cleanup: async () => {
      await deleteS3Buckets(services.s3Endpoint(), bucket);
      storage.close();
    },
  };
}

defineObjectStorageContract('local files served by the app', startLocal, {
  checksSignatures: true,
  capsPresignedPutSize: true,
});

// S3Mock checks no signature; the S3-specific cases below show what the URLs sign instead.
defineObjectStorageContract('S3 (S3Mock)', s3Fixture, {
  checksSignatures: false,
  capsPresignedPutSize: false,
});

describe('LocalObjectStorage served by filesRoutes', () => {
  let server: LocalServer;
  const key = (file: string): string => `posts/${randomBytes(4).toString('hex')}/${file}`;

  beforeEach(async () => {
    server = await startLocal();
  });
  afterEach(async () => {
    await server.cleanup();
  });

  it('signs upload URLs as {base}/upload/{key}?ct&max&exp&sig', async () => {
    const k = key('body.md');
    const signed = await server.sut.presignPut(k, {
      contentType: 'text/markdown; charset=utf-8',
      maxBytes: 5,
      expiresInSeconds: 60,
    });
    const url = new URL(signed.url);
    expect(`${url.origin}${url.pathname}`).toBe(`${server.baseUrl}/upload/${k}`);
    expect([...url.searchParams.keys()]).toEqual(['ct', 'max', 'exp', 'sig']);
    expect(url.searchParams.get('ct')).toBe('text/markdown; charset=utf-8');
    expect(url.searchParams.get('max')).toBe('5');
    expect(Number(url.searchParams.get('exp')) - Math.floor(Date.now() / 1000)).toBeGreaterThanOrEqual(59);
  });

  it('keeps each object’s bytes and metadata together when uploads to one key overlap', async () => {
    const k = key('image.png');
    const md5 = (text: string) => `"${createHash('md5').update(text).digest('hex')}"`;
    const other = new LocalObjectStorage(server.root, server.baseUrl, { signingKey: server.signingKey });
    for (let round = 0; round < 100; round++) {
      const bodies = [`first ${round}`, `second, longer ${round}`];
      // One through the upload route's writer, one stored directly: two instances, one directory.
      await Promise.all([
        other.write(k, Readable.from([Buffer.from(bodies[0]!)]), 'image/png', 1024),
        server.sut.put(k, Buffer.from(bodies[1]!), 'image/png'),
      ]);
      const got = await server.sut.get(k);
      const bytes = Buffer.concat(await got!.body.toArray()).toString();
      expect({ round, etag: got!.object.etag, size: got!.object.size }).toEqual({
        round,
        etag: md5(bytes),
        size: bytes.length,
      });
    }
  });

  /**
   * A raw connection that sent the head of a PUT whose URL's signature is wrong (`framing`: its
   * body's length or chunked), and what it received; `paused`, it does not read yet.
   */
  async function refusedUpload(framing: string, options: { allowHalfOpen?: boolean; paused?: boolean } = {}) {
    const signed = await server.sut.presignPut(key('body.md'), {
      contentType: 'text/markdown',
      maxBytes: 4,
      expiresInSeconds: 60,
    });
    const url = new URL(signed.url);
    url.searchParams.set('sig', 'x'.repeat(43));
    const socket = connect({
      port: Number(url.port),
      host: url.hostname,
      allowHalfOpen: options.allowHalfOpen,
    });
    const seen = { received: '', failed: undefined as Error | undefined };
    socket.on('data', (chunk: Buffer) => (seen.received += chunk.toString('utf8')));
    socket.on('error', (err) => (seen.failed = err));
    const closed = new Promise<number>((resolve) => socket.on('close', () => resolve(Date.now())));
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
    if (options.paused) socket.pause();
    socket.write(
      `PUT ${url.pathname}${url.search} HTTP/1.1\r\nHost: x\r\nContent-Type: text/markdown\r\n${framing}\r\n\r\n`,
    );
    return { socket, seen, closed };
  }

  it('answers a refused upload and closes its connection within seconds rather than read an endless body', async () => {
    // A client that goes on sending after the server's FIN.
    const started = Date.now();
    const { socket, seen, closed } = await refusedUpload('Transfer-Encoding: chunked', {
      allowHalfOpen: true,
    });
    // An endless body: a chunk every few milliseconds, until the server closes the connection.
    const chunk = `4000\r\n${'a'.repeat(0x4000)}\r\n`;
    const feeding = setInterval(() => {
      if (!socket.destroyed) socket.write(chunk);
    }, 2);
    try {
      expect((await closed) - started).toBeLessThan(8_000);
    } finally {
      clearInterval(feeding);
      socket.destroy();
    }
    expect(seen.received).toMatch(/^HTTP\/1\.1 403 /);
    expect(seen.received).toMatch(/\r\nconnection: close\r\n/i);
    expect(seen.received).toContain('SIGNATURE_INVALID');
  });

  it('cuts off an upload still running once its URL has expired and the time to finish has passed', async () => {
    await server.cleanup();
    server = await startLocal({ uploadFinishMs: 300 });
    const k = key('body.md');
    const signed = await server.sut.presignPut(k, {
      contentType: 'text/markdown',
      maxBytes: 1024,
      expiresInSeconds: 1,
    });
    const url = new URL(signed.url);
    const socket = connect({ port: Number(url.port), host: url.hostname });
    let received = '';
    socket.on('data', (chunk: Buffer) => (received += chunk.toString('utf8')));
    socket.on('error', () => undefined);
    await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
    // Started in time, then one byte every 100 ms: it would take minutes.
    socket.write(
      `PUT ${url.pathname}${url.search} HTTP/1.1\r\nHost: x\r\nContent-Type: text/markdown\r\nContent-Length: 1024\r\n\r\na`,
    );
    const dripping = setInterval(() => {
      if (!socket.destroyed) socket.write('a');
    }, 100);
    try {
      const deadline = Date.now() + 5_000;
      while (!received.startsWith('HTTP/1.1') && Date.now() < deadline) await sleep(20);
    } finally {
      clearInterval(dripping);
      socket.destroy();
    }
    expect(received).toMatch(/^HTTP\/1\.1 408 /);
    expect(received).toContain('REQUEST_TIMEOUT');
    expect(await server.sut.head(k)).toBeNull();
    expect(filesUnder(server.root)).toEqual([]);
  });

  it('lists what a write that died left, so it can be deleted, and removes its stale temporary files', async () => {
    const post = `posts/${randomBytes(4).toString('hex')}`;
    await server.sut.put(`${post}/whole.png`, Buffer.from('png'), 'image/png');
    const dir = join(server.root, post);
    mkdirSync(join(dir, 'images'), { recursive: true });
    // Bytes whose metadata never came, metadata whose bytes never came, and temporary files.
    writeFileSync(join(dir, 'images', 'bytes-only.png'), 'x');
    writeFileSync(join(dir, 'meta-only.md.meta.json'), '{}');
    const stale = join(dir, 'images', 'dead.png.a1b2c3d4e5f6.tmp');
    const fresh = join(dir, 'running.md.a1b2c3d4e5f7.tmp');
    writeFileSync(stale, 'half');
    writeFileSync(`${stale}.meta`, '{}');
    writeFileSync(fresh, 'half');
    const hourAgo = (Date.now() - 3_700_000) / 1000;
    utimesSync(stale, hourAgo, hourAgo);
    utimesSync(`${stale}.meta`, hourAgo, hourAgo);

    const listed = await server.sut.listPrefix(post);
    expect(listed.map((o) => o.key).sort()).toEqual(
      [`${post}/images/bytes-only.png`, `${post}/meta-only.md`, `${post}/whole.png`].sort(),
    );
    // The stale temporary files went; the running write's stays.
    expect(filesUnder(dir).filter((f) => f.endsWith('.tmp') || f.endsWith('.tmp.meta'))).toEqual([
      'running.md.a1b2c3d4e5f7.tmp',
    ]);
    for (const o of listed) if (!o.key.endsWith('whole.png')) await server.sut.delete(o.key);
    expect(filesUnder(dir).sort()).toEqual([
      'running.md.a1b2c3d4e5f7.tmp',
      'whole.png',
      'whole.png.meta.json',
    ]);
  });

  it('lets a refused client that sends its whole body before reading read the answer', async () => {
    const body = Buffer.alloc(4 * 1024 * 1024, 'a');
    // The whole request first, as some clients write it, and only then read.
    const { socket, seen } = await refusedUpload(`Content-Length: ${body.length}`, { paused: true });
    await new Promise<void>((resolve) => socket.write(body, () => resolve()));
    await sleep(200);
    socket.resume();
    const deadline = Date.now() + 5_000;
    while (!seen.received.includes('SIGNATURE_INVALID') && !seen.failed && Date.now() < deadline)
      await sleep(20);
    socket.destroy();
    expect({ failed: seen.failed?.message, status: seen.received.slice(0, 12) }).toEqual({
      failed: undefined,
      status: 'HTTP/1.1 403',
    });
    // It is told not to send another request on this connection.
    expect(seen.received).toMatch(/\r\nconnection: close\r\n/i);
  });

  it('answers refusals in the contract error shape', async () => {
    const k = key('body.md');
    const signed = await server.sut.presignPut(k, {
      contentType: 'text/markdown',
      maxBytes: 4,
      expiresInSeconds: 1,
    });
    const put = (url: string, body: string, type = 'text/markdown') =>
      fetch(url, { method: 'PUT', headers: { 'Content-Type': type }, body });

    const wrongType = await put(signed.url, 'x', 'text/plain');
    expect(wrongType.status).toBe(403);
    expect(await wrongType.json()).toEqual({
      code: 'SIGNATURE_INVALID',
      message: expect.any(String),
      requestId: expect.any(String),
    });

    const tooLarge = await put(signed.url, '12345');
    expect(tooLarge.status).toBe(413);
    expect(await tooLarge.json()).toMatchObject({ code: 'PAYLOAD_TOO_LARGE' });

    server.advance!(2000);
    const expired = await put(signed.url, 'x');
    expect(expired.status).toBe(403);
    expect(await expired.json()).toMatchObject({ code: 'URL_EXPIRED' });
    expect(filesUnder(server.root)).toEqual([]);
  });

  it('caps a streamed body of undeclared length and keeps no partial file', async () => {
    const k = key('image.png');
    const signed = await server.sut.presignPut(k, {
      contentType: 'image/png',
      maxBytes: 64 * 1024,
      expiresInSeconds: 60,
    });
    const chunks = Array.from({ length: 8 }, () => randomBytes(16 * 1024));
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        const next = chunks.shift();
        if (next) controller.enqueue(next);
        else controller.close();
      },
    });
    const res = await fetch(signed.url, { method: 'PUT', headers: signed.headers, body, duplex: 'half' });
    expect(res.status).toBe(413);
    await res.arrayBuffer();
    expect(await server.sut.head(k)).toBeNull();
    expect(filesUnder(server.root)).toEqual([]);

    // The connection is still good for the next upload.
    const ok = await fetch(signed.url, {
      method: 'PUT',
      headers: signed.headers,
      body: randomBytes(64 * 1024),
    });
    expect(ok.status).toBe(200);
  });

  it('refuses an upload without a Content-Type', async () => {
    const k = key('body.md');
    const signed = await server.sut.presignPut(k, {
      contentType: 'text/markdown',
      maxBytes: 100,
      expiresInSeconds: 60,
    });
    const res = await fetch(signed.url, { method: 'PUT', body: new Uint8Array([1, 2, 3]) });
    expect(res.status).toBe(403);
    await res.arrayBuffer();
    expect(await server.sut.head(k)).toBeNull();
  });

  it.each([
    'application/json',
    'multipart/form-data; boundary=x',
    'application/x-www-form-urlencoded',
    'text/plain',
  ])('stores a %s body as raw bytes, unparsed', async (type) => {
    const k = key('data.bin');
    const body = Buffer.from('{"not": "parsed"}\r\n--x--&a=b');
    const signed = await server.sut.presignPut(k, { contentType: type, maxBytes: 100, expiresInSeconds: 60 });
    const res = await fetch(signed.url, { method: 'PUT', headers: signed.headers, body });
    expect(res.status).toBe(200);
    const found = await server.sut.get(k);
    expect(found?.object.contentType).toBe(type);
    expect(Buffer.concat(await found!.body.toArray())).toEqual(body);
  });

  it('lets browsers read the ETag of an upload', async () => {
    const k = key('body.md');
    const signed = await server.sut.presignPut(k, {
      contentType: 'text/markdown',
      maxBytes: 100,
      expiresInSeconds: 60,
    });
    const res = await fetch(signed.url, {
      method: 'PUT',
      headers: { ...signed.headers, Origin: 'https://app.example' },
      body: 'x',
    });
    expect(res.status).toBe(200);
    expect(res.headers.get('access-control-expose-headers')?.split(/,\s*/)).toEqual(
      expect.arrayContaining(['X-Request-Id', 'ETag']),
    );
  });

  it('serves public prefixes without a signature and nothing else', async () => {
    await server.sut.put('avatars/u1.png', Buffer.from('png'), 'image/png');
    await server.sut.put('posts/p1/body.md', Buffer.from('draft'), 'text/markdown');
    const avatar = await fetch(server.sut.publicUrl('avatars/u1.png'));
    expect(avatar.status).toBe(200);
    expect(avatar.headers.get('cache-control')).toContain('public');
    await avatar.arrayBuffer();
    const post = await fetch(server.sut.publicUrl('posts/p1/body.md'));
    expect(post.status).toBe(404);
    expect(await post.json()).toMatchObject({ code: 'NOT_FOUND' });
  });

  it('reads an object deleted after its read began to the end', async () => {
    await server.sut.put('avatars/gone.png', Buffer.from('still here'), 'image/png');
    const found = (await server.sut.get('avatars/gone.png'))!;
    await server.sut.delete('avatars/gone.png');
    const chunks: Buffer[] = [];
    for await (const chunk of found.body) chunks.push(chunk as Buffer);
    expect(Buffer.concat(chunks).toString()).toBe('still here');
    expect(await server.sut.get('avatars/gone.png')).toBeNull();
  });

  it('serves signed reads privately and sandboxed', async () => {
    await server.sut.put('posts/p1/page.html', Buffer.from('<script>alert(1)</script>'), 'text/html');
    const res = await fetch(await server.sut.presignGet('posts/p1/page.html', 120));
    expect(res.status).toBe(200);
    expect(res.headers.get('cache-control')).toMatch(/^private, max-age=1[12]\d$/);
    expect(res.headers.get('content-security-policy')).toContain('sandbox');
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
    await res.arrayBuffer();
  });

  it('refuses a signed path smuggling .. in encoded form', async () => {
    await server.sut.put('avatars/u1.png', Buffer.from('png'), 'image/png');
    // `%2F` keeps the client from resolving the dot segment; the server decodes it into the key.
    const read = await server.sut.presignGet('avatars/u1.png', 60);
    const res = await fetch(read.replace('/avatars/u1.png', '/avatars%2F..%2Favatars/u1.png'));
    expect(res.status).toBe(403);
    await res.arrayBuffer();
    const upload = await server.sut.presignPut('posts/p1/body.md', {
      contentType: 'text/plain',
      maxBytes: 10,
      expiresInSeconds: 60,
    });
    const put = await fetch(upload.url.replace('/posts/p1/', '/posts%2F..%2Fposts/p1/'), {
      method: 'PUT',
      headers: upload.headers,
      body: 'x',
    });
    expect(put.status).toBe(403);
    expect(await put.json()).toMatchObject({ code: 'SIGNATURE_INVALID' });
    expect(filesUnder(server.root).sort()).toEqual(['avatars/u1.png', 'avatars/u1.png.meta.json']);
  });

  it('accepts URLs signed by another instance with the same secret only', async () => {
    const k = key('body.md');
    const twin = new LocalObjectStorage(join(server.root, 'unused'), server.baseUrl, {
      signingKey: server.signingKey,
    });
    const stranger = new LocalObjectStorage(join(server.root, 'unused'), server.baseUrl, {
      signingKey: randomBytes(32),
    });
    const options = { contentType: 'text/markdown', maxBytes: 100, expiresInSeconds: 60 };
    const ok = await twin.presignPut(k, options);
    expect((await fetch(ok.url, { method: 'PUT', headers: ok.headers, body: 'x' })).status).toBe(200);
    const forged = await stranger.presignPut(k, options);
    expect((await fetch(forged.url, { method: 'PUT', headers: forged.headers, body: 'y' })).status).toBe(403);
  });

  it('wants a secret of at least 32 bytes', () => {
    expect(() => new LocalObjectStorage(server.root, server.baseUrl, { signingKey: 'short' })).toThrow(
      /32 bytes/,
    );
  });

  it('creates the signing secret once and reuses it', () => {
    const path = join(server.root, 'keys', 'storage-signing.key');
    const first = loadOrCreateSigningKey(path);
    expect(first.length).toBeGreaterThanOrEqual(32);
    expect(loadOrCreateSigningKey(path)).toEqual(first);
    expect(statSync(path).mode & 0o777).toBe(0o600);
    expect(readFileSync(path, 'utf8').trim()).toBe(first.toString('utf8'));
  });
});

describe('S3ObjectStorage', () => {
  let fx: Awaited<ReturnType<typeof s3Fixture>>;

  beforeEach(async () => {
    fx = await s3Fixture();
  });
  afterEach(async () => {
    await fx.cleanup();
  });

  it('signs the Content-Type and the expiry into upload URLs, and no checksum', async () => {
    const signed = await fx.sut.presignPut('posts/p1/body.md', {
      contentType: 'text/markdown',
      maxBytes: 10,
      expiresInSeconds: 900,
    });
    const url = new URL(signed.url);
    expect(url.pathname).toBe(`/${fx.bucket}/posts/p1/body.md`);
    expect(url.searchParams.get('X-Amz-SignedHeaders')?.split(';')).toEqual(['content-type', 'host']);
    expect(url.searchParams.get('X-Amz-Expires')).toBe('900');
    expect([...url.searchParams.keys()].filter((name) => /checksum/i.test(name))).toEqual([]);
    expect(signed.headers).toEqual({ 'Content-Type': 'text/markdown' });
  });

  it('cannot cap an upload: whoever confirms it must check head().size', async () => {
    const k = 'posts/p1/image.png';
    const signed = await fx.sut.presignPut(k, {
      contentType: 'image/png',
      maxBytes: 10,
      expiresInSeconds: 60,
    });
    const res = await fetch(signed.url, { method: 'PUT', headers: signed.headers, body: randomBytes(100) });
    expect(res.status).toBe(200);
    expect((await fx.sut.head(k))?.size).toBe(100);
  });

  it('creates its bucket once', async () => {
    await expect(fx.sut.ensureBucket()).resolves.toBeUndefined();
    await expect(fx.sut.ping()).resolves.toBe(true);
  });

  it('builds public URLs from the configured base, or the bucket URL', () => {
    expect(fx.sut.publicUrl('avatars/u1.png')).toBe(`${services.s3Endpoint()}/${fx.bucket}/avatars/u1.png`);
    const common = { region: 'eu-west-1', bucket: 'media', accessKeyId: 'a', secretAccessKey: 'b' };
    const cdn = new S3ObjectStorage({ ...common, forcePathStyle: false, publicUrl: 'https://cdn.example/' });
    const aws = new S3ObjectStorage({ ...common, forcePathStyle: false });
    const hosted = new S3ObjectStorage({
      ...common,
      endpoint: 'https://s3.example:9000',
      forcePathStyle: false,
    });
    expect(cdn.publicUrl('avatars/u1.png')).toBe('https://cdn.example/avatars/u1.png');
    expect(aws.publicUrl('avatars/u1.png')).toBe('https://media.s3.eu-west-1.amazonaws.com/avatars/u1.png');
    expect(hosted.publicUrl('avatars/u1.png')).toBe('https://media.s3.example:9000/avatars/u1.png');
    for (const s of [cdn, aws, hosted]) s.close();
  });
});
