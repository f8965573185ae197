/**
 * Removes what a photo says about where and how it was taken before it is published as an avatar:
 * EXIF (GPS position, camera serial, capture time), XMP, IPTC and comments. Phones write them into
 * every picture, and an avatar is served to anyone.
 *
 * - JPEG: every APPn segment and comment goes, also between the scans of a progressive file, but
 *   a JFIF header (APP0; without the thumbnail it may carry, which can show the uncropped
 *   original), ICC colour profile parts (APP2) and the Adobe segment (APP14: how the colours are
 *   encoded), each known by its identifier; so JFXX thumbnails, FlashPix data and the index of
 *   further pictures (MPF) go. Nothing after the end of the image is kept (motion photos append
 *   a video there). An EXIF orientation other than upright comes back as a minimal EXIF holding
 *   only it, so a photo taken sideways still shows upright.
 * - PNG: only the chunks that draw the picture are kept (image data, palette, transparency, colour
 *   space and profile, pixel size, animation frames); `eXIf`, text, time, content credentials and
 *   any other chunk go (an orientation with them).
 * - WebP: only image data, alpha, animation and the colour profile are kept; `EXIF`, `XMP ` and any
 *   other chunk go (an orientation with them), and the header's flags for EXIF and XMP are cleared.
 * - GIF: only images, graphic control and plain text extensions are kept, and of application
 *   extensions the loop count of animations (`NETSCAPE2.0`, `ANIMEXTS1.0`); comments, XMP, colour
 *   profiles and any other extension go, and nothing after the trailer is kept (a file that ends
 *   after an image without one gets one).
 *
 * Only the containers are read (never the pixels): a file whose structure does not hold together is
 * refused (null), since no viewer would show it either, and so is one made of more pieces than any
 * picture has (`MAX_JPEG_SEGMENTS`, `MAX_KEPT_PARTS`): a file of millions of tiny blocks would
 * otherwise cost seconds and hundreds of megabytes.
 *
 * A picture whose headers give it more pixels than `MAX_IMAGE_SIDE` a side or `MAX_IMAGE_PIXELS` in
 * all throws `ImageTooLargeError`: a few kilobytes of compressed nothing can say 40000 × 40000, and
 * every viewer's browser would try to decode it into gigabytes.
 */
export function withoutMetadata(bytes: Buffer, type: string): Buffer | null {
  try {
    if (type === 'image/jpeg') return jpeg(bytes);
    if (type === 'image/png') return png(bytes);
    if (type === 'image/webp') return webp(bytes);
    if (type === 'image/gif') return gif(bytes);
    return bytes;
  } catch (err) {
    if (err instanceof ImageTooLargeError) throw err;
    return null;
  }
}

/** Most pixels a published picture may have a side: twice a 48-megapixel phone photo's long side. */
export const MAX_IMAGE_SIDE = 16_384;
/** Most pixels a published picture may have in all (64 Mi; a 48-megapixel photo fits). */
export const MAX_IMAGE_PIXELS = 64 * 1024 * 1024;

export class ImageTooLargeError extends Error {
  constructor(
    readonly width: number,
    readonly height: number,
  ) {
    super(
      `image is ${width} × ${height} pixels; at most ${MAX_IMAGE_SIDE} a side and ${MAX_IMAGE_PIXELS / 1024 / 1024} Mi in all`,
    );
    this.name = 'ImageTooLargeError';
  }
}

/** Throws `ImageTooLargeError` for a size over the bounds. */
function checkSize(width: number, height: number): void {
  if (width > MAX_IMAGE_SIDE || height > MAX_IMAGE_SIDE || width * height > MAX_IMAGE_PIXELS)
    throw new ImageTooLargeError(width, height);
}

class Malformed extends Error {}

function need(condition: boolean): void {
  if (!condition) throw new Malformed();
}

/** The APPn segments kept, by marker and the identifier their payload starts with. */
const JPEG_KEPT_APP = new Map([
  [0xe0, 'JFIF\0'],
  [0xe2, 'ICC_PROFILE\0'],
  [0xee, 'Adobe'],
]);
/** A JFIF header's payload up to its thumbnail: identifier, version, units, densities, thumbnail size. */
const JFIF_HEADER = 14;
/** Markers a JPEG may have outside its entropy-coded data; a real one has tens. */
export const MAX_JPEG_SEGMENTS = 10_000;

function jpeg(bytes: Buffer): Buffer {
  need(bytes[0] === 0xff && bytes[1] === 0xd8);
  const out = new Kept(bytes);
  out.keep(0, 2);
  /** Where an orientation goes: right after the JFIF header when it comes first, else after SOI. */
  let orientationAt = 2;
  let orientation = 1;
  let at = 2;
  for (let segments = 0; ; segments++) {
    need(segments < MAX_JPEG_SEGMENTS);
    // Stray bytes before a marker are skipped (viewers do), and so are fill bytes.
    while (at < bytes.length && bytes[at] !== 0xff) at++;
    let markerAt = at + 1;
    while (bytes[markerAt] === 0xff) markerAt++;
    need(markerAt < bytes.length);
    const marker = bytes[markerAt]!;
    if (marker === 0xd9) {
      // End of image: whatever follows (a phone's motion video, its trailers) is not published.
      out.keep(markerAt - 1, markerAt + 1);
      break;
    }
    if (marker === 0x01 || (marker >= 0xd0 && marker <= 0xd8)) {
      // Markers without a length.
      if (marker !== 0xd8) out.keep(markerAt - 1, markerAt + 1);
      at = markerAt + 1;
      continue;
    }
    need(markerAt + 3 <= bytes.length);
    const length = bytes.readUInt16BE(markerAt + 1);
    need(length >= 2 && markerAt + 1 + length <= bytes.length);
    let end = markerAt + 1 + length;
    const isApp = marker >= 0xe0 && marker <= 0xef;
    // A start of frame (every SOFn; C4, C8 and CC are other markers): precision, height, width.
    if (
      marker >= 0xc0 &&
      marker <= 0xcf &&
      marker !== 0xc4 &&
      marker !== 0xc8 &&
      marker !== 0xcc &&
      length >= 7
    )
      checkSize(bytes.readUInt16BE(markerAt + 6), bytes.readUInt16BE(markerAt + 4));
    if (marker === 0xe1) orientation = exifOrientation(bytes.subarray(markerAt + 3, end)) ?? orientation;
    const id = JPEG_KEPT_APP.get(marker);
    const kept =
      (!isApp && marker !== 0xfe) ||
      (id !== undefined &&
        bytes
          .subarray(markerAt + 3, end)
          .toString('latin1')
          .startsWith(id));
    if (marker === 0xda) {
      // Start of scan: its entropy-coded data runs to the next marker that is neither a stuffed
      // 0xFF00 nor a restart marker.
      while (end < bytes.length) {
        if (bytes[end] === 0xff && end + 1 < bytes.length) {
          const next = bytes[end + 1]!;
          if (next !== 0x00 && next !== 0xff && !(next >= 0xd0 && next <= 0xd7)) break;
        }
        end++;
      }
      need(end < bytes.length);
    }
    if (marker === 0xe0 && kept) {
      // A JFIF header as it is, but without a thumbnail (none of a header too short to say).
      if (length - 2 >= JFIF_HEADER) {
        const header = Buffer.from(bytes.subarray(markerAt - 1, markerAt + 3 + JFIF_HEADER));
        header.writeUInt16BE(2 + JFIF_HEADER, 2);
        header[2 + 2 + JFIF_HEADER - 2] = 0;
        header[2 + 2 + JFIF_HEADER - 1] = 0;
        if (out.size === 2) orientationAt = 2 + header.length;
        out.add(header);
      }
    } else if (kept) out.keep(markerAt - 1, end);
    at = end;
  }
  const result = out.result();
  if (orientation === 1) return result;
  // The orientation the dropped EXIF carried, right after JFIF (or first).
  return Buffer.concat([
    result.subarray(0, orientationAt),
    orientationExif(orientation),
    result.subarray(orientationAt),
  ]);
}

/** The orientation (1–8) an EXIF block (after its APP1 length) records, if it records one. */
function exifOrientation(exif: Buffer): number | undefined {
  if (exif.length < 14 || exif.subarray(0, 6).toString('latin1') !== 'Exif\0\0') return undefined;
  const tiff = exif.subarray(6);
  const order = tiff.subarray(0, 2).toString('latin1');
  if (order !== 'II' && order !== 'MM') return undefined;
  const le = order === 'II';
  const u16 = (at: number) => (le ? tiff.readUInt16LE(at) : tiff.readUInt16BE(at));
  const u32 = (at: number) => (le ? tiff.readUInt32LE(at) : tiff.readUInt32BE(at));
  const ifd = u32(4);
  if (ifd + 2 > tiff.length) return undefined;
  const entries = u16(ifd);
  for (let i = 0; i < entries; i++) {
    const entry = ifd + 2 + i * 12;
    if (entry + 12 > tiff.length) return undefined;
    if (u16(entry) === 0x0112 && u16(entry + 2) === 3) {
      const value = u16(entry + 8);
      return value >= 1 && value <= 8 ? value : undefined;
    }
  }
  return undefined;
}

/** An APP1 segment whose EXIF holds the orientation alone (big-endian TIFF, one IFD entry). */
function orientationExif(orientation: number): Buffer {
  const segment = Buffer.alloc(36);
  segment.writeUInt16BE(0xffe1, 0);
  segment.writeUInt16BE(34, 2);
  segment.write('Exif\0\0', 4, 'latin1');
  segment.write('MM', 10, 'latin1');
  segment.writeUInt16BE(42, 12);
  segment.writeUInt32BE(8, 14); // IFD0 right after the header
  segment.writeUInt16BE(1, 18); // one entry
  segment.writeUInt16BE(0x0112, 20); // Orientation
  segment.writeUInt16BE(3, 22); // SHORT
  segment.writeUInt32BE(1, 24); // one value
  segment.writeUInt16BE(orientation, 28); // in the value field, left-aligned
  segment.writeUInt32BE(0, 32); // no next IFD
  return segment;
}

/**
 * PNG chunks kept: image data and what says how to draw it (palette, transparency, gamma, colour
 * space and profile, HDR levels, significant bits, background, pixel size, suggested palettes, the
 * histogram) and animation frames (APNG).
 */
const PNG_KEPT = new Set([
  'IHDR',
  'PLTE',
  'IDAT',
  'IEND',
  'tRNS',
  'gAMA',
  'cHRM',
  'sRGB',
  'iCCP',
  'cICP',
  'mDCV',
  'mDCv',
  'cLLI',
  'cLLi',
  'sBIT',
  'bKGD',
  'pHYs',
  'sPLT',
  'hIST',
  'acTL',
  'fcTL',
  'fdAT',
]);

function png(bytes: Buffer): Buffer {
  need(bytes.length >= 8);
  const out = new Kept(bytes);
  out.keep(0, 8);
  let at = 8;
  for (;;) {
    need(at + 12 <= bytes.length);
    const length = bytes.readUInt32BE(at);
    const type = bytes.subarray(at + 4, at + 8).toString('latin1');
    const end = at + 12 + length;
    need(end <= bytes.length);
    if (type === 'IHDR' && length >= 8) checkSize(bytes.readUInt32BE(at + 8), bytes.readUInt32BE(at + 12));
    if (PNG_KEPT.has(type)) out.keep(at, end);
    at = end;
    if (type === 'IEND') break;
  }
  return out.result();
}

/** WebP chunks kept: image data (lossy, lossless, alpha), animation and the colour profile. */
const WEBP_KEPT = new Set(['VP8 ', 'VP8L', 'VP8X', 'ALPH', 'ANIM', 'ANMF', 'ICCP']);
/** The VP8X header's flags for an EXIF and an XMP chunk. */
const VP8X_EXIF = 0x08;
const VP8X_XMP = 0x04;

function webp(bytes: Buffer): Buffer {
  need(bytes.length >= 12);
  const out = new Kept(bytes);
  const header = Buffer.from(bytes.subarray(0, 12));
  out.add(header);
  let at = 12;
  while (at < bytes.length) {
    need(at + 8 <= bytes.length);
    const fourcc = bytes.subarray(at, at + 4).toString('latin1');
    const size = bytes.readUInt32LE(at + 4);
    const end = at + 8 + size + (size % 2);
    need(at + 8 + size <= bytes.length);
    const data = at + 8;
    // The canvas (extended format), or the frame of a still lossy or lossless picture.
    if (fourcc === 'VP8X' && size >= 10)
      checkSize(bytes.readUIntLE(data + 4, 3) + 1, bytes.readUIntLE(data + 7, 3) + 1);
    else if (fourcc === 'VP8 ' && size >= 10)
      checkSize(bytes.readUInt16LE(data + 6) & 0x3fff, bytes.readUInt16LE(data + 8) & 0x3fff);
    else if (fourcc === 'VP8L' && size >= 5 && bytes[data] === 0x2f) {
      const bits = bytes.readUInt32LE(data + 1);
      checkSize((bits & 0x3fff) + 1, ((bits >>> 14) & 0x3fff) + 1);
    }
    if (fourcc === 'VP8X' && size >= 1) {
      const chunk = Buffer.from(bytes.subarray(at, Math.min(end, bytes.length)));
      chunk[8] = chunk[8]! & ~(VP8X_EXIF | VP8X_XMP);
      out.add(chunk);
    } else if (WEBP_KEPT.has(fourcc)) out.keep(at, Math.min(end, bytes.length));
    at = end;
  }
  // The RIFF size: everything after its own field (the header is copied only at the end).
  header.writeUInt32LE(out.size - 8, 4);
  return out.result();
}

/** Application extensions that make animations loop: the only ones kept (their loop count alone). */
const GIF_LOOP_APPLICATIONS = new Set(['NETSCAPE2.0', 'ANIMEXTS1.0']);
/** Extensions kept: graphic control (frame timing, transparency) and plain text (drawn text). */
const GIF_KEPT_EXTENSIONS = new Set([0xf9, 0x01]);

function gif(bytes: Buffer): Buffer {
  const signature = bytes.subarray(0, 6).toString('latin1');
  need(signature === 'GIF87a' || signature === 'GIF89a');
  need(bytes.length >= 13);
  checkSize(bytes.readUInt16LE(6), bytes.readUInt16LE(8));
  // Header and logical screen descriptor, with the global colour table when the flags say so.
  const flags = bytes[10]!;
  let at = 13 + (flags & 0x80 ? 3 * 2 ** ((flags & 0x07) + 1) : 0);
  need(at <= bytes.length);
  const out = new Kept(bytes);
  out.keep(0, at);
  /** Where the data sub-blocks starting at `from` end (after their zero-length terminator). */
  const subBlocksEnd = (from: number): number => {
    let i = from;
    for (;;) {
      need(i < bytes.length);
      const size = bytes[i]!;
      i += 1 + size;
      if (size === 0) return i;
    }
  };
  let images = 0;
  for (;;) {
    // Some encoders end the file after its last image without the trailer; viewers show it.
    if (at === bytes.length && images > 0) return out.result(Buffer.of(0x3b));
    need(at < bytes.length);
    const introducer = bytes[at]!;
    if (introducer === 0x3b) {
      out.keep(at, at + 1);
      return out.result();
    }
    if (introducer === 0x2c) {
      // Image descriptor, local colour table, LZW minimum code size, image data.
      need(at + 10 <= bytes.length);
      checkSize(bytes.readUInt16LE(at + 5), bytes.readUInt16LE(at + 7));
      const local = bytes[at + 9]!;
      const data = at + 10 + (local & 0x80 ? 3 * 2 ** ((local & 0x07) + 1) : 0) + 1;
      const end = subBlocksEnd(data);
      out.keep(at, end);
      images++;
      at = end;
      continue;
    }
    need(introducer === 0x21 && at + 2 <= bytes.length);
    const label = bytes[at + 1]!;
    const end = subBlocksEnd(at + 2);
    if (GIF_KEPT_EXTENSIONS.has(label)) out.keep(at, end);
    else if (
      label === 0xff &&
      bytes[at + 2] === 11 &&
      GIF_LOOP_APPLICATIONS.has(bytes.subarray(at + 3, at + 14).toString('latin1'))
    ) {
      // The identifier and the first sub-block (the loop count); nothing else it may carry.
      const first = at + 14;
      need(first < end);
      const firstEnd = first + 1 + bytes[first]!;
      need(firstEnd <= end);
      out.keep(at, firstEnd);
      if (bytes[first] !== 0) out.add(Buffer.of(0));
    }
    at = end;
  }
}

/** Separate pieces (ranges apart, or bytes added) a file may leave; a real picture leaves a few hundred. */
export const MAX_KEPT_PARTS = 65_536;

/**
 * What is kept of a file: ranges of it in order, and bytes added between them, written into one
 * buffer at the end (adjacent ranges as one), so a file of a million tiny blocks costs a copy, not a
 * million buffers.
 */
class Kept {
  private readonly parts: (readonly [number, number] | Buffer)[] = [];
  private length = 0;

  constructor(private readonly bytes: Buffer) {}

  /** Bytes kept so far. */
  get size(): number {
    return this.length;
  }

  keep(start: number, end: number): void {
    const last = this.parts[this.parts.length - 1];
    if (last && !Buffer.isBuffer(last) && last[1] === start)
      this.parts[this.parts.length - 1] = [last[0], end];
    else this.push([start, end]);
    this.length += end - start;
  }

  add(extra: Buffer): void {
    this.push(extra);
    this.length += extra.length;
  }

  private push(part: readonly [number, number] | Buffer): void {
    need(this.parts.length < MAX_KEPT_PARTS);
    this.parts.push(part);
  }

  result(tail?: Buffer): Buffer {
    if (tail) this.add(tail);
    const out = Buffer.allocUnsafe(this.length);
    let w = 0;
    for (const part of this.parts) {
      if (Buffer.isBuffer(part)) w += part.copy(out, w);
      else w += this.bytes.copy(out, w, part[0], part[1]);
    }
    return out;
  }
}
