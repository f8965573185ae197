import type { Readable } from 'node:stream';

/**
 * Object storage for uploaded files (avatars now; post bodies and images later).
 * Keys are `/`-separated paths without `..` segments. `put` is all-or-nothing: a reader never sees
 * a partly written object. `publicUrl` is where anyone may GET a public object.
 */
export interface StoredObject {
  size: number;
  etag: string;
  contentType: string;
}

export interface ObjectStorage {
  put(key: string, body: Buffer, contentType: string): Promise<StoredObject>;
  head(key: string): Promise<StoredObject | null>;
  /** The object's bytes as a stream, or null when it does not exist. */
  get(key: string): Promise<{ object: StoredObject; body: Readable } | null>;
  delete(key: string): Promise<void>;
  publicUrl(key: string): string;
}

const SAFE_KEY = /^(?!.*(?:^|\/)\.\.?(?:\/|$))[A-Za-z0-9._\-/]{1,512}$/;

export function assertSafeKey(key: string): void {
  if (!SAFE_KEY.test(key) || key.startsWith('/') || key.includes('//'))
    throw new Error(`unsafe object key: ${key}`);
}
