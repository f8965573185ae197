import type { Counts } from './model.js';

/** Five unsigned 32-bit big-endian fields, 20 bytes: one read returns every count of an entity. */
export const SNAPSHOT_BYTES = 20;

export function encodeSnapshot(counts: Counts): Buffer {
  const buf = Buffer.alloc(SNAPSHOT_BYTES);
  counts.forEach((value, i) =>
    buf.writeUInt32BE(Math.min(Math.max(0, Math.trunc(value)), 0xffffffff), i * 4),
  );
  return buf;
}

/** The counts, or null when the bytes are not a well-formed snapshot (then it is rebuilt from facts). */
export function decodeSnapshot(buf: Buffer | Uint8Array | null | undefined): Counts | null {
  if (!buf || buf.length !== SNAPSHOT_BYTES) return null;
  const b = Buffer.isBuffer(buf) ? buf : Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
  return [b.readUInt32BE(0), b.readUInt32BE(4), b.readUInt32BE(8), b.readUInt32BE(12), b.readUInt32BE(16)];
}
