/**
 * What stripping an avatar's metadata costs for a file of the largest size the route takes (5 MiB)
 * made of the smallest blocks its format allows: a GIF of 3-byte plain text extensions and a PNG of
 * empty 12-byte chunks. Prints the time and the growth of the process's resident memory per file.
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

for (const [type, file] of [
  ['image/gif', tinyGif()],
  ['image/png', tinyPng()],
] as const) {
  const rss = process.memoryUsage().rss;
  const started = performance.now();
  const out = withoutMetadata(file, type);
  const ms = performance.now() - started;
  const grew = (process.memoryUsage().rss - rss) / 1e6;
  console.log(
    `${type}: ${file.length} bytes in ${out?.length ?? 'refused'} out, ${ms.toFixed(0)} ms, resident memory +${grew.toFixed(0)} MB`,
  );
}
