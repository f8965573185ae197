import type { Readable } from 'node:stream';

/**
 * Object storage for uploaded files: avatars, post bodies and post images.
 *
 * Keys are `/`-separated paths of `[A-Za-z0-9._-]` without empty, `.` or `..` segments; every method
 * rejects another key with an `Error` before touching the store. `put` is all-or-nothing: a reader
 * never sees a partly written object. `etag` is the quoted hex MD5 of the bytes for objects written
 * in one piece (`put` or a presigned PUT), as S3 reports it.
 *
 * Presigned URLs let a client move bytes without the API process in between:
 *  - `presignPut` signs one PUT of one key with one Content-Type. The client sends the returned
 *    `headers` verbatim; a PUT with another Content-Type, to another key, after expiry or with an
 *    altered URL is refused (403) and stores nothing. A successful PUT answers 200 with an `ETag`
 *    header equal to `head(key).etag`. The URL may be used more than once until it expires; each use
 *    replaces the object.
 *  - `maxBytes` is a hint to the store, not a guarantee: the local adapter refuses a larger body (413,
 *    nothing kept), but an S3 presigned PUT cannot cap the size (only POST policies can). Whoever
 *    accepts an upload must therefore `head` the object and reject (and delete) one over the limit;
 *    post publishing does so at confirm.
 *  - `presignGet` signs GETs of one key, private or public, until it expires; a missing object is 404.
 *  - Expiry is checked when the request arrives, against the signer's clock; a transfer that has
 *    started completes. Both adapters accept 1 s to 7 days (the SigV4 limit).
 *
 * `publicUrl` is where anyone may GET an object under a public prefix (avatars), without a signature.
 */
/** Where objects anyone may read through `publicUrl` live. */
const PUBLIC_PREFIXES = ['avatars/'];

/** Whether `key` lies under a public prefix. */
export function isPublicKey(key: string): boolean {
  return PUBLIC_PREFIXES.some((p) => key.startsWith(p));
}

/** How long a public object may be kept: for good, since its name is never written twice. */
export const PUBLIC_OBJECT_CACHE_CONTROL = 'public, max-age=31536000, immutable';

export interface StoredObject {
  size: number;
  etag: string;
  contentType: string;
}

/** An object as a listing names it. */
export interface ListedObject {
  key: string;
  /** When its bytes were last written (a PUT or a copy to it), in ms since the epoch. */
  lastModified: number;
  /** Its length in bytes. */
  size: number;
}

export interface PresignPutOptions {
  /** Exact Content-Type the PUT must carry; part of the signature. */
  contentType: string;
  /** Largest body the caller means to accept; see above for where it is enforced. */
  maxBytes: number;
  expiresInSeconds: number;
}

export interface PresignedPut {
  url: string;
  /** Headers the client must send with the PUT, exactly as given. */
  headers: Record<string, string>;
  /** Seconds the URL stays valid from when it was signed. */
  expiresIn: number;
}

export interface ObjectStorage {
  put(key: string, body: Buffer, contentType: string): Promise<StoredObject>;
  head(key: string): Promise<StoredObject | null>;
  /** The object's bytes as a stream, or null when it does not exist. */
  get(key: string): Promise<{ object: StoredObject; body: Readable } | null>;
  /** Deletes the object; deleting a missing one is not an error. */
  delete(key: string): Promise<void>;
  /**
   * Copies `from` to `to` inside the store (no bytes through the caller), content type included,
   * only while `from` still has the ETag `ifEtag` (quoted or not; as `head` or `get` gave it, since
   * some stores compare its case too). Resolves to the copy, or to null
   * when `from` is missing or now holds other bytes; nothing is written then. Replaces `to`.
   */
  copy(from: string, to: string, ifEtag: string): Promise<StoredObject | null>;
  /**
   * Deletes every object whose key starts with `{prefix}/` (`prefix` is a safe key); resolves to how
   * many there were. An object written under the prefix meanwhile may survive.
   */
  deletePrefix(prefix: string): Promise<number>;
  /** Every object whose key starts with `{prefix}/` (`prefix` is a safe key), in no set order. */
  listPrefix(prefix: string): Promise<ListedObject[]>;
  presignPut(key: string, options: PresignPutOptions): Promise<PresignedPut>;
  presignGet(key: string, expiresInSeconds: number): Promise<string>;
  publicUrl(key: string): string;
  /**
   * The key a URL of this store names: one `presignPut`, `presignGet` or `publicUrl` gave, with or
   * without its query (a signed URL that expired still names its key). Null for any other URL.
   */
  keyOf(url: string): string | null;
}

/**
 * The key `url` names below the first of `bases` it starts with (scheme, host, port and path
 * compared; query and fragment ignored), or null. Keys are percent-decoded and must be safe.
 */
export function keyBelow(url: string, bases: readonly string[]): string | null {
  let target: URL;
  try {
    target = new URL(url);
  } catch {
    return null;
  }
  if (target.protocol !== 'http:' && target.protocol !== 'https:') return null;
  const path = `${target.origin}${target.pathname}`;
  for (const base of bases) {
    let parsed: URL;
    try {
      parsed = new URL(base);
    } catch {
      continue;
    }
    const prefix = `${parsed.origin}${parsed.pathname.replace(/\/+$/, '')}/`;
    if (!path.startsWith(prefix)) continue;
    let key: string;
    try {
      key = decodeURIComponent(path.slice(prefix.length));
    } catch {
      return null;
    }
    return isSafeKey(key) ? key : null;
  }
  return null;
}

/** ETags compare without quotes, weakness marker or case (clients and stores differ in all three). */
export function normalizeEtag(etag: string): string {
  return etag
    .trim()
    .replace(/^W\//i, '')
    .replace(/^"(.*)"$/, '$1')
    .toLowerCase();
}

/** The longest validity a presigned URL may have: SigV4's limit, applied to every adapter alike. */
export const MAX_PRESIGN_SECONDS = 7 * 24 * 3600;

const SAFE_KEY = /^(?!.*(?:^|\/)\.\.?(?:\/|$))[A-Za-z0-9._\-/]{1,512}$/;

/** Longest part of a key between slashes: a file name on disk, with room for a temporary suffix. */
const MAX_SEGMENT = 200;

export function assertSafeKey(key: string): void {
  if (
    !SAFE_KEY.test(key) ||
    key.startsWith('/') ||
    key.endsWith('/') ||
    key.includes('//') ||
    key.split('/').some((segment) => segment.length > MAX_SEGMENT)
  )
    throw new Error(`unsafe object key: ${key}`);
}

export function isSafeKey(key: string): boolean {
  try {
    assertSafeKey(key);
    return true;
  } catch {
    return false;
  }
}

export function assertPresignExpiry(expiresInSeconds: number): void {
  if (!Number.isInteger(expiresInSeconds) || expiresInSeconds < 1 || expiresInSeconds > MAX_PRESIGN_SECONDS)
    throw new Error(
      `presigned URL expiry must be 1 to ${MAX_PRESIGN_SECONDS} seconds (got ${expiresInSeconds})`,
    );
}

/** A header value a client can send verbatim: visible ASCII and spaces, no line breaks. */
export function assertContentType(contentType: string): void {
  if (!/^[\x21-\x7e][\x20-\x7e]{0,254}$/.test(contentType) || !contentType.includes('/'))
    throw new Error(`invalid content type: ${JSON.stringify(contentType)}`);
}
