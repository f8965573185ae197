import { crc32 } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import {
  ImageTooLargeError,
  MAX_IMAGE_PIXELS,
  MAX_IMAGE_SIDE,
  MAX_JPEG_SEGMENTS,
  MAX_KEPT_PARTS,
  withoutMetadata,
} from './image-metadata.js';

const SECRET = 'GPS 31.2304N 121.4737E serial 0xC0FFEE';

/** A JPEG segment: marker and payload, with its length. */
function segment(marker: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(4);
  head.writeUInt16BE(0xff00 | marker, 0);
  head.writeUInt16BE(payload.length + 2, 2);
  return Buffer.concat([head, payload]);
}

/** An EXIF block (little-endian TIFF) with an orientation and a text entry standing for GPS data. */
function exif(orientation: number): Buffer {
  const text = Buffer.from(`${SECRET}\0`, 'latin1');
  const tiff = Buffer.alloc(8 + 2 + 2 * 12 + 4 + text.length);
  tiff.write('II', 0, 'latin1');
  tiff.writeUInt16LE(42, 2);
  tiff.writeUInt32LE(8, 4);
  tiff.writeUInt16LE(2, 8);
  // ImageDescription (ASCII) pointing at the text after the IFD.
  tiff.writeUInt16LE(0x010e, 10);
  tiff.writeUInt16LE(2, 12);
  tiff.writeUInt32LE(text.length, 14);
  tiff.writeUInt32LE(8 + 2 + 24 + 4, 18);
  tiff.writeUInt16LE(0x0112, 22);
  tiff.writeUInt16LE(3, 24);
  tiff.writeUInt32LE(1, 26);
  tiff.writeUInt16LE(orientation, 30);
  text.copy(tiff, 8 + 2 + 24 + 4);
  return Buffer.concat([Buffer.from('Exif\0\0', 'latin1'), tiff]);
}

function jpeg(orientation: number): Buffer {
  return Buffer.concat([
    Buffer.from([0xff, 0xd8]),
    segment(0xe0, Buffer.from('JFIF\0\x01\x01\0\0\x01\0\x01\0\0', 'latin1')),
    segment(0xe1, exif(orientation)),
    segment(0xe1, Buffer.from(`http://ns.adobe.com/xap/1.0/\0<x:xmpmeta>${SECRET}</x:xmpmeta>`, 'latin1')),
    segment(0xed, Buffer.from(`Photoshop 3.0\0${SECRET}`, 'latin1')),
    segment(0xfe, Buffer.from(SECRET, 'latin1')),
    segment(0xdb, Buffer.alloc(65, 1)),
    segment(0xda, Buffer.from([1, 1, 0, 0, 0x3f, 0])),
    Buffer.from([0x12, 0x34, 0xff, 0x00, 0x56, 0xff, 0xd0, 0x57]),
    // A second scan with a comment before it, as a progressive file may have.
    segment(0xfe, Buffer.from(SECRET, 'latin1')),
    segment(0xda, Buffer.from([1, 1, 0, 0, 0x3f, 0])),
    Buffer.from([0x58, 0xff, 0xd9]),
    // A phone's trailer after the end of the image.
    Buffer.from(`MotionPhoto_Data ${SECRET}`, 'latin1'),
  ]);
}

function pngChunk(type: string, data: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt32BE(data.length, 0);
  head.write(type, 4, 'latin1');
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32(Buffer.concat([head.subarray(4), data])), 0);
  return Buffer.concat([head, data, crc]);
}

function riffChunk(fourcc: string, data: Buffer): Buffer {
  const head = Buffer.alloc(8);
  head.write(fourcc, 0, 'latin1');
  head.writeUInt32LE(data.length, 4);
  return Buffer.concat([head, data, data.length % 2 ? Buffer.alloc(1) : Buffer.alloc(0)]);
}

function webp(chunks: Buffer[]): Buffer {
  const body = Buffer.concat(chunks);
  const header = Buffer.alloc(12);
  header.write('RIFF', 0, 'latin1');
  header.writeUInt32LE(4 + body.length, 4);
  header.write('WEBP', 8, 'latin1');
  return Buffer.concat([header, body]);
}

describe(withoutMetadata.name, () => {
  it('takes EXIF, XMP, IPTC and comments out of a JPEG, keeping its image and an orientation', () => {
    const source = jpeg(6);
    const out = withoutMetadata(source, 'image/jpeg')!;
    expect(out.toString('latin1')).not.toContain('GPS');
    expect(out.toString('latin1')).not.toContain('C0FFEE');
    // JFIF first, then an EXIF with the orientation alone, then the tables and the scan untouched.
    expect(out.subarray(0, 4)).toEqual(Buffer.from([0xff, 0xd8, 0xff, 0xe0]));
    const exifAt = out.indexOf(Buffer.from('Exif\0\0', 'latin1'));
    expect(exifAt).toBeGreaterThan(0);
    expect(out.readUInt16BE(exifAt - 2)).toBe(34);
    expect(out.readUInt16BE(exifAt + 6 + 8 + 2 + 8)).toBe(6);
    // The tables and both scans, up to the end of the image.
    const tables = source.subarray(source.indexOf(Buffer.from([0xff, 0xdb])));
    const firstScan = tables.subarray(0, tables.indexOf(Buffer.from([0xff, 0xfe])));
    expect(out.includes(firstScan)).toBe(true);
    expect(out.subarray(out.length - 3 - 8)).toEqual(
      Buffer.concat([
        Buffer.from([0xff, 0xda, 0, 8, 1, 1, 0, 0, 0x3f, 0]).subarray(2),
        Buffer.from([0x58, 0xff, 0xd9]),
      ]),
    );
    expect(out.toString('latin1')).not.toContain('MotionPhoto');
  });

  it('keeps of a JPEG’s other APP segments a JFIF header without its thumbnail, ICC profile parts and Adobe’s', () => {
    const thumbnail = Buffer.alloc(2 * 1 * 3, 0x7f); // 2×1 RGB: what the original showed
    const jfif = Buffer.concat([Buffer.from('JFIF\0\x01\x02\x01\0\x48\0\x48\x02\x01', 'latin1'), thumbnail]);
    const icc = Buffer.from('ICC_PROFILE\0\x01\x01profile bytes', 'latin1');
    const adobe = Buffer.from('Adobe\0\x64\0\0\0\0\x01', 'latin1');
    const tables = segment(0xdb, Buffer.alloc(65, 1));
    const scan = Buffer.concat([
      segment(0xda, Buffer.from([1, 1, 0, 0, 0x3f, 0])),
      Buffer.from([0x12, 0xff, 0xd9]),
    ]);
    const source = Buffer.concat([
      Buffer.from([0xff, 0xd8]),
      segment(0xe0, jfif),
      segment(0xe0, Buffer.concat([Buffer.from('JFXX\0\x10', 'latin1'), Buffer.from(SECRET, 'latin1')])),
      segment(0xe2, icc),
      segment(0xe2, Buffer.from(`FPXR\0${SECRET}`, 'latin1')),
      segment(0xe2, Buffer.from(`MPF\0${SECRET}`, 'latin1')),
      segment(0xee, adobe),
      segment(0xee, Buffer.from(SECRET, 'latin1')),
      tables,
      scan,
    ]);
    expect(withoutMetadata(source, 'image/jpeg')).toEqual(
      Buffer.concat([
        Buffer.from([0xff, 0xd8]),
        // Same version, units and densities; no thumbnail.
        segment(0xe0, Buffer.from('JFIF\0\x01\x02\x01\0\x48\0\x48\0\0', 'latin1')),
        segment(0xe2, icc),
        segment(0xee, adobe),
        tables,
        scan,
      ]),
    );
  });

  it('drops an upright JPEG’s EXIF entirely', () => {
    const out = withoutMetadata(jpeg(1), 'image/jpeg')!;
    expect(out.includes(Buffer.from('Exif', 'latin1'))).toBe(false);
  });

  it('keeps of a PNG only the chunks that draw it: no text, time, EXIF, credentials or private chunks', () => {
    const ihdr = pngChunk('IHDR', pngHeader(640, 480));
    const idat = pngChunk('IDAT', Buffer.from([1, 2, 3]));
    const iend = pngChunk('IEND', Buffer.alloc(0));
    const source = Buffer.concat([
      Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
      ihdr,
      pngChunk('tEXt', Buffer.from(`Comment\0${SECRET}`, 'latin1')),
      pngChunk('eXIf', exif(1).subarray(6)),
      pngChunk('tIME', Buffer.alloc(7)),
      // Content credentials (C2PA), which may carry the capture's EXIF, and a private chunk.
      pngChunk('caBX', Buffer.from(SECRET, 'latin1')),
      pngChunk('prVt', Buffer.from(SECRET, 'latin1')),
      idat,
      iend,
    ]);
    expect(withoutMetadata(source, 'image/png')).toEqual(
      Buffer.concat([source.subarray(0, 8), ihdr, idat, iend]),
    );
  });

  it('takes EXIF, XMP and any chunk it does not draw with out of a WebP and clears their flags', () => {
    const vp8x = Buffer.alloc(10);
    vp8x[0] = 0x08 | 0x04 | 0x10;
    const image = riffChunk('VP8L', Buffer.from([0x2f, 1, 2]));
    const source = webp([
      riffChunk('VP8X', vp8x),
      image,
      riffChunk('EXIF', exif(1)),
      riffChunk('XMP ', Buffer.from(SECRET, 'latin1')),
      riffChunk('C2PA', Buffer.from(SECRET, 'latin1')),
    ]);
    const out = withoutMetadata(source, 'image/webp')!;
    const flags = Buffer.from(vp8x);
    flags[0] = 0x10;
    expect(out).toEqual(webp([riffChunk('VP8X', flags), image]));
    expect(out.readUInt32LE(4)).toBe(out.length - 8);
  });

  it('refuses files of more pieces than a picture has, quickly and without copying each', () => {
    const size = 5 * 1024 * 1024;
    // A JPEG of restart markers: 2.6 million segments.
    const markers = Buffer.alloc(size, 0xd0);
    for (let i = 0; i < size; i += 2) markers[i] = 0xff;
    markers[1] = 0xd8;
    markers.writeUInt16BE(0xffd9, size - 2);
    // A GIF whose kept and dropped extensions alternate, and a WebP whose empty chunks do.
    const kept = Buffer.from([0x21, 0x01, 0]);
    const dropped = Buffer.from([0x21, 0xfe, 0]);
    const pairs = Math.floor(size / 6);
    const gif = gifOf([...Array.from({ length: pairs }, () => [kept, dropped]).flat(), gifImage]);
    const chunks = Array.from({ length: Math.floor(size / 16) }, () => [
      riffChunk('VP8L', Buffer.alloc(0)),
      riffChunk('XXXX', Buffer.alloc(0)),
    ]).flat();
    const empty = webp(chunks);
    for (const [bytes, type] of [
      [markers, 'image/jpeg'],
      [gif, 'image/gif'],
      [empty, 'image/webp'],
    ] as const) {
      const started = performance.now();
      expect(withoutMetadata(bytes, type)).toBeNull();
      expect(performance.now() - started).toBeLessThan(1_000);
    }
    // Below the bounds they are pictures like any other.
    const few = Buffer.concat([
      Buffer.from([0xff, 0xd8]),
      Buffer.alloc(2 * (MAX_JPEG_SEGMENTS - 10), 0xd0).map((b, i) => (i % 2 === 0 ? 0xff : b)),
      Buffer.from([0xff, 0xd9]),
    ]);
    expect(withoutMetadata(few, 'image/jpeg')).toEqual(few);
    const gifFew = gifOf([
      ...Array.from({ length: MAX_KEPT_PARTS / 2 - 10 }, () => [kept, dropped]).flat(),
      gifImage,
    ]);
    expect(withoutMetadata(gifFew, 'image/gif')).not.toBeNull();
  });

  it('refuses a picture whose headers make it too many pixels to show, in each format', () => {
    const sof = (width: number, height: number): Buffer => {
      const payload = Buffer.from([8, 0, 0, 0, 0, 1, 1, 0x11, 0]);
      payload.writeUInt16BE(height, 1);
      payload.writeUInt16BE(width, 3);
      return segment(0xc2, payload); // progressive
    };
    const jpegOf = (width: number, height: number): Buffer =>
      Buffer.concat([
        Buffer.from([0xff, 0xd8]),
        sof(width, height),
        segment(0xda, Buffer.from([1, 1, 0, 0, 0x3f, 0])),
        Buffer.from([0x12, 0xff, 0xd9]),
      ]);
    const pngOf = (width: number, height: number): Buffer =>
      Buffer.concat([
        Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
        pngChunk('IHDR', pngHeader(width, height)),
        pngChunk('IDAT', Buffer.from([1, 2, 3])),
        pngChunk('IEND', Buffer.alloc(0)),
      ]);
    const gifScreenOf = (width: number, height: number): Buffer => {
      const file = gifOf([gifImage]);
      file.writeUInt16LE(width, 6);
      file.writeUInt16LE(height, 8);
      return file;
    };
    const gifFrameOf = (width: number, height: number): Buffer => {
      const frame = Buffer.from(gifImage);
      frame.writeUInt16LE(width, 5);
      frame.writeUInt16LE(height, 7);
      return gifOf([frame]);
    };
    const canvasOf = (width: number, height: number): Buffer => {
      const vp8x = Buffer.alloc(10);
      vp8x.writeUIntLE(width - 1, 4, 3);
      vp8x.writeUIntLE(height - 1, 7, 3);
      return webp([riffChunk('VP8X', vp8x), riffChunk('VP8L', Buffer.from([0x2f, 0, 0, 0, 0]))]);
    };
    const lossyOf = (width: number, height: number): Buffer => {
      const frame = Buffer.from([0x50, 0x01, 0x00, 0x9d, 0x01, 0x2a, 0, 0, 0, 0]);
      frame.writeUInt16LE(width, 6);
      frame.writeUInt16LE(height, 8);
      return webp([riffChunk('VP8 ', frame)]);
    };
    const losslessOf = (width: number, height: number): Buffer => {
      const frame = Buffer.from([0x2f, 0, 0, 0, 0]);
      frame.writeUInt32LE((width - 1) | ((height - 1) << 14), 1);
      return webp([riffChunk('VP8L', frame)]);
    };
    const cases = [
      [jpegOf, 'image/jpeg'],
      [pngOf, 'image/png'],
      [gifScreenOf, 'image/gif'],
      [gifFrameOf, 'image/gif'],
      [canvasOf, 'image/webp'],
      [lossyOf, 'image/webp'],
      [losslessOf, 'image/webp'],
    ] as const;
    // A 48-megapixel phone photo is a picture like any other.
    const [side, pixels] = [MAX_IMAGE_SIDE, MAX_IMAGE_PIXELS];
    for (const [make, type] of cases) {
      // VP8 frames have 14 bits a side.
      const vp8 = make === losslessOf || make === lossyOf;
      const fits = vp8 ? [16_383, 4_096] : [8_000, 6_000];
      expect(withoutMetadata(make(fits[0]!, fits[1]!), type), `${make.name} fits`).not.toBeNull();
      const huge = vp8 ? [16_383, 16_383] : [40_000, 40_000];
      expect(() => withoutMetadata(make(huge[0]!, huge[1]!), type), make.name).toThrow(ImageTooLargeError);
      if (!vp8) {
        expect(() => withoutMetadata(make(side + 1, 1), type), `${make.name} side`).toThrow(
          ImageTooLargeError,
        );
      }
    }
    expect(() => withoutMetadata(pngOf(pixels / 4_096, 4_097), 'image/png')).toThrow(
      'image is 16384 × 4097 pixels; at most 16384 a side and 64 Mi in all',
    );
    expect(withoutMetadata(pngOf(pixels / 4_096, 4_096), 'image/png')).not.toBeNull();
  });

  it('refuses a container that does not hold together', () => {
    const cut = jpeg(6).subarray(0, 30);
    expect(withoutMetadata(cut, 'image/jpeg')).toBeNull();
    expect(
      withoutMetadata(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0]), 'image/png'),
    ).toBeNull();
    expect(withoutMetadata(Buffer.from('GIF89a....', 'latin1'), 'image/gif')).toBeNull();
    expect(withoutMetadata(gifOf([gifImage]).subarray(0, 30), 'image/gif')).toBeNull();
  });

  it('drops comments and application extensions from a GIF, but the loop of an animation', () => {
    const loop = Buffer.concat([
      Buffer.from([0x21, 0xff, 11]),
      Buffer.from('NETSCAPE2.0', 'latin1'),
      Buffer.from([3, 1, 0, 0, 0]),
    ]);
    const xmp = Buffer.concat([
      Buffer.from([0x21, 0xff, 11]),
      Buffer.from('XMP DataXMP', 'latin1'),
      Buffer.from([12]),
      Buffer.from('<gps>31.2N</', 'latin1'),
      Buffer.from([0]),
    ]);
    const comment = Buffer.concat([
      Buffer.from([0x21, 0xfe, 9]),
      Buffer.from('Shanghai!', 'latin1'),
      Buffer.from([0]),
    ]);
    const control = Buffer.from([0x21, 0xf9, 4, 0, 10, 0, 0, 0]);
    const source = Buffer.concat([
      gifOf([loop, xmp, comment, control, gifImage, comment, control, gifImage]),
      Buffer.from('trailing', 'latin1'),
    ]);
    const out = withoutMetadata(source, 'image/gif')!;
    expect(out).toEqual(gifOf([loop, control, gifImage, control, gifImage]));
    expect(out.toString('latin1')).not.toMatch(/XMP|gps|Shanghai|trailing/);
  });

  it('keeps only the loop count of a loop extension, drops extensions it does not know, and ends a GIF without a trailer', () => {
    const loopWithMore = Buffer.concat([
      Buffer.from([0x21, 0xff, 11]),
      Buffer.from('NETSCAPE2.0', 'latin1'),
      Buffer.from([3, 1, 0, 0, 6]),
      Buffer.from('SECRET', 'latin1'),
      Buffer.from([0]),
    ]);
    const unknown = Buffer.concat([
      Buffer.from([0x21, 0x99, 4]),
      Buffer.from('where', 'latin1').subarray(0, 4),
      Buffer.from([0]),
    ]);
    const text = Buffer.from([0x21, 0x01, 0]);
    const out = withoutMetadata(gifOf([loopWithMore, unknown, text, gifImage]), 'image/gif')!;
    expect(out).toEqual(
      gifOf([
        Buffer.concat([
          Buffer.from([0x21, 0xff, 11]),
          Buffer.from('NETSCAPE2.0', 'latin1'),
          Buffer.from([3, 1, 0, 0, 0]),
        ]),
        text,
        gifImage,
      ]),
    );
    const noTrailer = gifOf([gifImage]).subarray(0, -1);
    expect(withoutMetadata(noTrailer, 'image/gif')).toEqual(gifOf([gifImage]));
    // Without an image it is not a picture.
    expect(withoutMetadata(gifOf([]).subarray(0, -1), 'image/gif')).toBeNull();
  });
});

/** A 1×1 image: descriptor with a local colour table of 2 entries, LZW minimum code size, data. */
const gifImage = Buffer.from([
  0x2c, 0, 0, 0, 0, 1, 0, 1, 0, 0x80, 0, 0, 0, 255, 255, 255, 2, 2, 0x44, 0x01, 0,
]);

/** A GIF89a with a global colour table of 2 entries, then `blocks`, then the trailer. */
function gifOf(blocks: Buffer[]): Buffer {
  const header = Buffer.concat([
    Buffer.from('GIF89a', 'latin1'),
    Buffer.from([1, 0, 1, 0, 0x80, 0, 0]),
    Buffer.from([0, 0, 0, 255, 255, 255]),
  ]);
  return Buffer.concat([header, ...blocks, Buffer.from([0x3b])]);
}

/** A PNG header: size, 8-bit RGB, no interlace. */
function pngHeader(width: number, height: number): Buffer {
  const header = Buffer.from([0, 0, 0, 0, 0, 0, 0, 0, 8, 2, 0, 0, 0]);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(height, 4);
  return header;
}
