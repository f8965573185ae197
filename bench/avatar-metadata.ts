/**
 * What stripping an avatar's metadata costs for a file of the largest size the route takes (5 MiB)
 * made of the smallest blocks its format allows: a GIF of 3-byte plain text extensions, a PNG of
 * empty 12-byte chunks, a JPEG of restart markers, and a GIF and a WebP whose blocks alternate
 * between kept and dropped ones. Prints the time and the growth of the process's resident memory
 * per file.
 *
 *   npx tsx bench/avatar-metadata.ts
 *   METADATA_MODULE=/path/to/other/src/profile/image-metadata.ts npx tsx bench/avatar-metadata.ts
 *
 * METADATA_MODULE: another checkout's module to measure instead of this one's (A/B runs).
 */
import { pathToFileURL } from 'node:url';

const SIZE = 5 * 1024 * 1024;
const modulePath = process.env.METADATA_MODULE;
const { withoutMetadata } = (await import(
  modulePath ? pathToFileURL(modulePath).href : '../src/profile/image-metadata.js'
)) as typeof import('../src/profile/image-metadata.js');

function tinyGif(): Buffer {
  const head = Buffer.concat([Buffer.from('GIF89a', 'latin1'), Buffer.from([1, 0, 1, 0, 0, 0, 0])]);
  const image = Buffer.from([0x2c, 0, 0, 0, 0, 1, 0, 1, 0, 0, 2, 2, 0x44, 0x01, 0]);
  const n = Math.floor(SIZE / 3);
  const blocks = Buffer.alloc(n * 3);
  for (let i = 0; i < n; i++) blocks.set([0x21, 0x01, 0], i * 3);
  return Buffer.concat([head, blocks, image, Buffer.of(0x3b)]);
}

function tinyPng(): Buffer {
  const chunk = (type: string) => {
    const c = Buffer.alloc(12);
    c.write(type, 4, 'latin1');
    return c;
  };
  const n = Math.floor(SIZE / 12);
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    ...Array.from({ length: n }, () => chunk('zzZz')),
    chunk('IEND'),
  ]);
}

/** SOI, 2-byte restart markers up to the size, EOI. */
function markerJpeg(): Buffer {
  const bytes = Buffer.alloc(SIZE, 0xd0);
  for (let i = 0; i < SIZE; i += 2) bytes[i] = 0xff;
  bytes[1] = 0xd8;
  bytes.writeUInt16BE(0xffd9, SIZE - 2);
  return bytes;
}

/** Plain text extensions (kept) and comments (dropped) in turn. */
function alternatingGif(): Buffer {
  const head = Buffer.concat([Buffer.from('GIF89a', 'latin1'), Buffer.from([1, 0, 1, 0, 0, 0, 0])]);
  const image = Buffer.from([0x2c, 0, 0, 0, 0, 1, 0, 1, 0, 0, 2, 2, 0x44, 0x01, 0]);
  const n = Math.floor(SIZE / 6);
  const blocks = Buffer.alloc(n * 6);
  for (let i = 0; i < n; i++) blocks.set([0x21, 0x01, 0, 0x21, 0xfe, 0], i * 6);
  return Buffer.concat([head, blocks, image, Buffer.of(0x3b)]);
}

/** Empty `VP8L` (kept) and unknown (dropped) chunks in turn. */
function alternatingWebp(): Buffer {
  const n = Math.floor(SIZE / 16);
  const body = Buffer.alloc(n * 16);
  for (let i = 0; i < n; i++) {
    body.write('VP8L', i * 16, 'latin1');
    body.write('XXXX', i * 16 + 8, 'latin1');
  }
  const header = Buffer.alloc(12);
  header.write('RIFF', 0, 'latin1');
  header.writeUInt32LE(4 + body.length, 4);
  header.write('WEBP', 8, 'latin1');
  return Buffer.concat([header, body]);
}

for (const [name, type, file] of [
  ['GIF of plain text extensions', 'image/gif', tinyGif()],
  ['PNG of empty chunks', 'image/png', tinyPng()],
  ['JPEG of restart markers', 'image/jpeg', markerJpeg()],
  ['GIF, kept and dropped extensions in turn', 'image/gif', alternatingGif()],
  ['WebP, kept and dropped chunks in turn', 'image/webp', alternatingWebp()],
] as const) {
  const rss = process.memoryUsage().rss;
  const started = performance.now();
  const out = withoutMetadata(file, type);
  const ms = performance.now() - started;
  const grew = (process.memoryUsage().rss - rss) / 1e6;
  console.log(
    `${name}: ${file.length} bytes in ${out?.length ?? 'refused'} out, ${ms.toFixed(0)} ms, resident memory +${grew.toFixed(0)} MB`,
  );
}
