import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { S3ObjectStorage } from './s3-object-storage.js';

/** A store whose endpoint is `server`, with attempts bounded at `timeoutMs` (else the default). */
function storeAt(server: Server, timeoutMs?: number): S3ObjectStorage {
  return new S3ObjectStorage({
    endpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    region: 'us-east-1',
    bucket: 'b',
    accessKeyId: 'k',
    secretAccessKey: 's',
    forcePathStyle: true,
    ...(timeoutMs === undefined ? {} : { timeoutMs }),
  });
}

describe(S3ObjectStorage.name, () => {
  let server: Server;
  const seen: IncomingHttpHeaders[] = [];
  let storage: S3ObjectStorage;

  beforeAll(async () => {
    // A store that refuses every copy's condition, as one would whose ETag is now another.
    server = createServer((req, res) => {
      seen.push(req.headers);
      req.resume();
      res.writeHead(412, { 'content-type': 'application/xml' });
      res.end('<?xml version="1.0"?><Error><Code>PreconditionFailed</Code><Message>no</Message></Error>');
    });
    await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
    storage = storeAt(server);
  });
  afterAll(() => new Promise<void>((ok) => server.close(() => ok())));

  it('conditions a copy on the ETag as the store gave it, case included, quoted', async () => {
    for (const given of [
      '"9B2CF535F27731C974343645A3985328"',
      'W/"9B2CF535F27731C974343645A3985328"',
      ' 9B2CF535F27731C974343645A3985328 ',
    ])
      expect(await storage.copy('posts/1/a.md', 'posts/1/b.md', given)).toBeNull();
    expect(seen.map((h) => h['x-amz-copy-source-if-match'])).toEqual(
      Array(3).fill('"9B2CF535F27731C974343645A3985328"'),
    );
  });

  it('gives up on a store that takes a request and never answers', async () => {
    // Reads the request, answers nothing, keeps the connection: TCP alone would wait for ever.
    const mute = createServer((req) => req.resume());
    await new Promise<void>((ok) => mute.listen(0, '127.0.0.1', ok));
    try {
      const silent = storeAt(mute, 200);
      const started = performance.now();
      await expect(silent.listPrefix('posts/1')).rejects.toThrow();
      await expect(silent.head('posts/1/a.md')).rejects.toThrow();
      // Three attempts each, with the SDK's back-off between them.
      expect(performance.now() - started).toBeLessThan(4_000);
    } finally {
      mute.closeAllConnections();
      await new Promise<void>((ok) => mute.close(() => ok()));
    }
  }, 10_000);

  it('gives an upload the time it takes to send, besides the time the answer may take', async () => {
    // Takes in the body slowly (400 ms), as over a slow link, then answers at once.
    const slow = createServer((req, res) => {
      req.pause();
      setTimeout(() => {
        req.resume();
        req.on('end', () => {
          res.writeHead(200, { etag: '"abc"' });
          res.end();
        });
      }, 400);
    });
    await new Promise<void>((ok) => slow.listen(0, '127.0.0.1', ok));
    try {
      const store = storeAt(slow, 200);
      // 256 kB: 1 s more at 256 kB/s.
      expect(await store.put('avatars/1.png', Buffer.alloc(256 * 1024), 'image/png')).toMatchObject({
        etag: '"abc"',
      });
    } finally {
      slow.closeAllConnections();
      await new Promise<void>((ok) => slow.close(() => ok()));
    }
  }, 10_000);

  it('knows its objects in the URLs it hands out, whichever form the SDK addresses the bucket in', async () => {
    const cases: { bucket: string; region: string; endpoint?: string; forcePathStyle: boolean }[] = [
      { bucket: 'my.bucket', region: 'eu-west-1', forcePathStyle: false },
      { bucket: 'plain-bucket', region: 'eu-west-1', forcePathStyle: false },
      {
        bucket: 'my.bucket',
        region: 'eu-west-1',
        endpoint: 'https://objects.example.test',
        forcePathStyle: false,
      },
      {
        bucket: 'plain-bucket',
        region: 'us-east-1',
        endpoint: 'https://objects.example.test',
        forcePathStyle: true,
      },
      // Addresses, as a store on this machine: no host names below them.
      { bucket: 'zg', region: 'us-east-1', endpoint: 'http://127.0.0.1:9090', forcePathStyle: true },
      { bucket: 'zg', region: 'us-east-1', endpoint: 'http://[::1]:9090', forcePathStyle: false },
    ];
    for (const settings of cases) {
      const s3 = new S3ObjectStorage({ ...settings, accessKeyId: 'k', secretAccessKey: 's' });
      try {
        const key = 'posts/1/images/20250601/0badc0de.png';
        const signed = await s3.presignGet(key, 60);
        expect({ settings, signed, key: s3.keyOf(signed) }).toEqual({ settings, signed, key });
        expect(s3.keyOf(signed.split('?')[0]!)).toBe(key);
        // Another bucket's object is not this store's.
        expect(s3.keyOf(signed.replace(settings.bucket, 'other'))).toBeNull();
        expect(s3.keyOf('https://example.com/x.png')).toBeNull();
        // Public objects are read where the SDK addresses the bucket.
        expect(s3.publicUrl(key)).toBe(signed.split('?')[0]);
      } finally {
        s3.close();
      }
    }
  });
});
