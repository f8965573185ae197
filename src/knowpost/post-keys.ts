import { createHash, randomBytes } from 'node:crypto';
import { BadRequestError } from '../platform/errors/errors.js';
import type { UploadScene } from './post.schema.js';

/**
 * Where a post's files live in object storage and which files are allowed:
 *  - body:   uploaded to `posts/{postId}/content{ext}`, ext one of .md .markdown .txt .html .json;
 *            confirm copies what it checked to `posts/{postId}/body/{64 hex}{ext}`, the key readers
 *            get, which no presigned URL can write (a body confirmed before that scheme keeps its
 *            upload key)
 *  - images: uploaded to `posts/{postId}/images/{yyyyMMdd}/{8 hex}{ext}`, ext one of .jpg .jpeg .png
 *            .webp .gif; a patch that refers to one copies it to `posts/{postId}/pictures/{32 hex}{ext}`,
 *            the key stored and read (images patched before that scheme keep their upload keys)
 * Each extension names one media type; a presign request's content type and extension must agree.
 */
const EXTENSIONS: Record<UploadScene, Record<string, string>> = {
  knowpost_content: {
    '.md': 'text/markdown',
    '.markdown': 'text/markdown',
    '.txt': 'text/plain',
    '.html': 'text/html',
    '.json': 'application/json',
  },
  knowpost_image: {
    '.jpg': 'image/jpeg',
    '.jpeg': 'image/jpeg',
    '.png': 'image/png',
    '.webp': 'image/webp',
    '.gif': 'image/gif',
  },
};

/** `type/subtype`, optionally with a charset parameter, matched lower-cased (the caller's spelling is signed). */
const CONTENT_TYPE = /^([a-z]+\/[a-z0-9.+-]+)(?: *; *charset=(?:"?[a-z0-9_-]{1,32}"?))?$/;

export interface UploadTarget {
  key: string;
  contentType: string;
}

/**
 * Checks a presign request against the allow-lists and names the key it may write. `ext` is
 * optional: without it the first extension of the content type is used.
 */
export function uploadTarget(
  scene: UploadScene,
  postId: string,
  contentType: string,
  ext: string | undefined,
  now: number,
  random: () => string = () => randomBytes(4).toString('hex'),
): UploadTarget {
  const allowed = EXTENSIONS[scene];
  const normalized = contentType.trim().toLowerCase();
  // ASCII only: a few other letters lower-case to ASCII ones (the Kelvin sign to "k"), and the
  // value as written is what gets signed and sent as a header.
  const mediaType = /^[\x20-\x7e]*$/.test(contentType) ? CONTENT_TYPE.exec(normalized)?.[1] : undefined;
  const extensions = Object.entries(allowed).filter(([, type]) => type === mediaType);
  if (mediaType === undefined || extensions.length === 0) {
    throw new BadRequestError(
      `contentType must be one of ${[...new Set(Object.values(allowed))].join(', ')} for ${scene}`,
    );
  }
  let extension: string;
  if (ext === undefined) {
    extension = extensions[0]![0];
  } else {
    extension = ext.toLowerCase();
    if (!extension.startsWith('.')) extension = `.${extension}`;
    if (!(extension in allowed))
      throw new BadRequestError(`ext must be one of ${Object.keys(allowed).join(' ')} for ${scene}`);
    if (allowed[extension] !== mediaType)
      throw new BadRequestError(`ext ${extension} does not match contentType ${mediaType}`);
  }
  // Signed and sent back as the caller wrote it: a client that sets its upload's Content-Type from
  // its own value rather than from the answer's headers must still match the signature.
  const signed = contentType.trim();
  if (scene === 'knowpost_content') return { key: contentKey(postId, extension), contentType: signed };
  const day = new Date(now).toISOString().slice(0, 10).replaceAll('-', '');
  return { key: `posts/${postId}/images/${day}/${random()}${extension}`, contentType: signed };
}

export function contentKey(postId: string, extension: string): string {
  return `posts/${postId}/content${extension}`;
}

/** True for exactly the keys a body of this post is uploaded to (`posts/{id}/content.md`, …). */
export function isContentKey(postId: string, key: string): boolean {
  return contentExtension(postId, key) !== undefined;
}

/** The extension of an upload key of this post's body, or undefined for any other key. */
export function contentExtension(postId: string, key: string): string | undefined {
  return Object.keys(EXTENSIONS.knowpost_content).find((ext) => key === contentKey(postId, ext));
}

/**
 * Where confirm keeps a body it checked, out of reach of presigned URLs: a random name of 64 hex
 * digits (the body's SHA-256 is in the row), so no later confirm ever writes that name again. A
 * confirm deletes the body it replaced; were names the bytes' SHA-256 (as an earlier release made
 * them, and as these still look to it), a second confirm of those bytes, overlapping, could write
 * the name again just before the first one's delete, and the post would point at nothing.
 */
export function confirmedContentKey(
  postId: string,
  extension: string,
  name: string = randomBytes(32).toString('hex'),
): string {
  return `posts/${postId}/body/${name}${extension}`;
}

/** The scene's extensions as a regular expression alternation. */
const extensions = (scene: UploadScene): string =>
  Object.keys(EXTENSIONS[scene])
    .map((e) => e.replace('.', '\\.'))
    .join('|');

/** A body copy's name: random now, the body's SHA-256 in copies an earlier release made. */
const BODY_NAME = new RegExp(`^[0-9a-f]{64}(${extensions('knowpost_content')})$`);

/** The extension of a confirmed body copy of this post (`confirmedContentKey`), or undefined. */
export function bodyCopyExtension(postId: string, key: string): string | undefined {
  const prefix = `posts/${postId}/body/`;
  return key.startsWith(prefix) ? BODY_NAME.exec(key.slice(prefix.length))?.[1] : undefined;
}

/** True for the keys a confirmed body of this post may be read from (either scheme). */
export function isReadableContentKey(postId: string, key: string): boolean {
  return isContentKey(postId, key) || bodyCopyExtension(postId, key) !== undefined;
}

const IMAGE_NAME = new RegExp(`^\\d{8}/[0-9a-f]{8}(?:${extensions('knowpost_image')})$`);

/** True for keys of the shape presign hands out for this post's images. */
export function isImageKey(postId: string, key: string): boolean {
  const prefix = `posts/${postId}/images/`;
  return key.startsWith(prefix) && IMAGE_NAME.test(key.slice(prefix.length));
}

/**
 * Where a patch keeps an image it checked, copied from its upload key (`isImageKey`), out of reach
 * of presigned URLs: 16 hex digits of a digest of the upload key (`isStoredImageOf`), then 16 random
 * ones. Every copy is a new object, so a patch that drops a copy can never delete one an overlapping
 * patch has just made of the same upload; the name keeps the shape earlier releases gave copies
 * (32 hex digits), so processes of both read each other's.
 */
export function storedImageKey(
  postId: string,
  uploadKey: string,
  nonce: string = randomBytes(8).toString('hex'),
): string {
  return `posts/${postId}/pictures/${digest16(uploadKey)}${nonce}${uploadKey.slice(uploadKey.lastIndexOf('.'))}`;
}

/** True when `key` is a copy `storedImageKey` names for this upload key. */
export function isStoredImageOf(postId: string, uploadKey: string, key: string): boolean {
  const prefix = `posts/${postId}/pictures/${digest16(uploadKey)}`;
  return (
    isStoredImageKey(postId, key) &&
    key.startsWith(prefix) &&
    key.endsWith(uploadKey.slice(uploadKey.lastIndexOf('.')))
  );
}

const digest16 = (text: string): string => createHash('sha256').update(text).digest('hex').slice(0, 16);

const STORED_IMAGE_NAME = new RegExp(`^[0-9a-f]{32}(?:${extensions('knowpost_image')})$`);

/** True for the copies `storedImageKey` names for this post. */
export function isStoredImageKey(postId: string, key: string): boolean {
  const prefix = `posts/${postId}/pictures/`;
  return key.startsWith(prefix) && STORED_IMAGE_NAME.test(key.slice(prefix.length));
}

/** An absolute http(s) URL of printable ASCII (an image hosted elsewhere). */
export function isExternalImageUrl(value: string): boolean {
  if (!/^https?:\/\/[\x21-\x7e]+$/i.test(value)) return false;
  try {
    const url = new URL(value);
    return (url.protocol === 'http:' || url.protocol === 'https:') && url.hostname !== '';
  } catch {
    return false;
  }
}
