import { createHash, createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import {
  createReadStream,
  createWriteStream,
  existsSync,
  mkdirSync,
  readFileSync,
  writeFileSync,
  type Dirent,
} from 'node:fs';
import {
  mkdir,
  open,
  readdir,
  readFile,
  rename,
  rm,
  stat,
  writeFile,
  type FileHandle,
} from 'node:fs/promises';
import { dirname, join, sep } from 'node:path';
import { PassThrough, Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { AppError, PayloadTooLargeError } from '../errors/errors.js';
import {
  assertContentType,
  assertPresignExpiry,
  assertSafeKey,
  keyBelow,
  normalizeEtag,
  isSafeKey,
  type ListedObject,
  type ObjectStorage,
  type PresignedPut,
  type PresignPutOptions,
  type StoredObject,
} from './object-storage.js';

export interface LocalObjectStorageOptions {
  /**
   * Secret the URL signatures are made with (at least 32 bytes). Every process serving the same files
   * must share it, and it must survive restarts for URLs handed out before one to keep working;
   * without it, a random one makes URLs valid in this instance only.
   */
  signingKey?: string | Buffer;
  /** Clock of the signer, in ms; tests move it. */
  now?: () => number;
  /**
   * How long after its URL expired an upload that started in time may still take to finish (30
   * minutes by default): one still running then is cut off, so none can land after the post's
   * checks for late uploads ended (they go on until the expiry plus the upload retention, an hour at
   * least), and a client dripping its body cannot hold a connection and a file for good.
   */
  uploadFinishMs?: number;
}

export const DEFAULT_UPLOAD_FINISH_MS = 30 * 60_000;

/** Query parameters of a signed upload URL as they arrive (any may be missing or forged). */
export interface UploadQuery {
  ct?: string | undefined;
  max?: string | undefined;
  exp?: string | undefined;
  sig?: string | undefined;
}

/** Query parameters of a signed download URL as they arrive. */
export interface DownloadQuery {
  exp?: string | undefined;
  sig?: string | undefined;
}

export type SignatureCheck =
  | { status: 'valid'; expiresAt: number }
  | { status: 'invalid' }
  /** Genuine, but past its expiry. */
  | { status: 'expired' };

export type UploadCheck =
  | { status: 'valid'; contentType: string; maxBytes: number; expiresAt: number }
  | { status: 'invalid' }
  | { status: 'expired' };

const MIN_SIGNING_KEY_BYTES = 32;
const DIGITS = /^\d{1,15}$/;
const SIGNATURE = /^[A-Za-z0-9_-]{43}$/;

/** A temporary file untouched this long belongs to a write that stopped (see `listPrefix`). */
const STALE_WRITE_MS = 3_600_000;

/** The commit or delete in progress per object path, of every instance in the process (see `commit`). */
const committing = new Map<string, Promise<unknown>>();

/**
 * Objects as files under a directory, each with a small JSON sidecar for its content type and
 * ETag. Writes go to a temporary file first and are renamed into place, so readers never see a
 * partial object. The app itself serves them (files.routes.ts): public prefixes at `{baseUrl}/{key}`,
 * any key through URLs this class signs with HMAC-SHA256 (`{baseUrl}/{key}?exp&sig` to read,
 * `{baseUrl}/upload/{key}?ct&max&exp&sig` to write). The signature covers the method, key, exact
 * Content-Type, size limit and expiry, so none of them can be changed without the secret.
 */
export class LocalObjectStorage implements ObjectStorage {
  private readonly signingKey: Buffer;
  private readonly now: () => number;
  private readonly uploadFinishMs: number;

  constructor(
    private readonly root: string,
    private readonly baseUrl: string,
    options: LocalObjectStorageOptions = {},
  ) {
    const key = options.signingKey ?? randomBytes(MIN_SIGNING_KEY_BYTES);
    this.signingKey = typeof key === 'string' ? Buffer.from(key, 'utf8') : key;
    if (this.signingKey.length < MIN_SIGNING_KEY_BYTES)
      throw new Error(`the storage signing key must have at least ${MIN_SIGNING_KEY_BYTES} bytes`);
    this.now = options.now ?? Date.now;
    this.uploadFinishMs = options.uploadFinishMs ?? DEFAULT_UPLOAD_FINISH_MS;
  }

  async put(key: string, body: Buffer, contentType: string): Promise<StoredObject> {
    const path = this.pathOf(key);
    await mkdir(dirname(path), { recursive: true });
    const meta: StoredObject = {
      size: body.length,
      etag: `"${createHash('md5').update(body).digest('hex')}"`,
      contentType,
    };
    const tmp = tmpPathOf(path);
    try {
      await writeFile(tmp, body);
      await this.commit(path, tmp, meta);
    } catch (err) {
      await rm(tmp, { force: true });
      throw err;
    }
    return meta;
  }

  /**
   * Stores what `source` yields, at most `maxBytes` of it, all or nothing. Beyond the limit it throws
   * `PayloadTooLargeError` and keeps nothing; an upload through a URL expiring at `expiresAt` (in
   * seconds) still running `uploadFinishMs` after that is cut off with a 408 and keeps nothing.
   * `source` is never destroyed (for a request, that would reset the connection before the client
   * reads the answer): on failure the rest of it is discarded.
   */
  async write(
    key: string,
    source: Readable,
    contentType: string,
    maxBytes: number,
    expiresAt?: number,
  ): Promise<StoredObject> {
    const path = this.pathOf(key);
    await mkdir(dirname(path), { recursive: true });
    const tmp = tmpPathOf(path);
    const limit = measuring(maxBytes);
    // `pipe` (unlike `pipeline`) leaves the source alone when the write fails; its own end is relayed.
    const input = new PassThrough();
    const onError = (err: Error): void => void input.destroy(err);
    const onClose = (): void => {
      if (!source.readableEnded) input.destroy(new Error('the upload was cut off'));
    };
    source.once('error', onError).once('close', onClose).pipe(input);
    const late =
      expiresAt === undefined
        ? undefined
        : setTimeout(
            () =>
              input.destroy(
                new AppError('REQUEST_TIMEOUT', 'The upload did not finish in time; start it again', 408),
              ),
            Math.max(0, expiresAt * 1000 + this.uploadFinishMs - this.now()),
          );
    try {
      await pipeline(input, limit.stream, createWriteStream(tmp, { flags: 'wx' }));
      const meta: StoredObject = { size: limit.size(), etag: limit.etag(), contentType };
      await this.commit(path, tmp, meta);
      return meta;
    } catch (err) {
      source.unpipe(input);
      source.resume();
      await rm(tmp, { force: true });
      throw err;
    } finally {
      clearTimeout(late);
      source.off('error', onError).off('close', onClose);
    }
  }

  async head(key: string): Promise<StoredObject | null> {
    // A safe key with a suffix this adapter keeps for itself names no object (and no 500).
    if (isSafeKey(key) && isReservedKey(key)) return null;
    const path = this.pathOf(key);
    try {
      const [meta, info] = await Promise.all([readFile(`${path}.meta.json`, 'utf8'), stat(path)]);
      const parsed = JSON.parse(meta) as StoredObject;
      return { ...parsed, size: info.size };
    } catch (err) {
      // Nothing there, also when part of the path is a file (`…/a.png/x`).
      if (isAbsent(err)) return null;
      throw err;
    }
  }

  async get(key: string) {
    // The file is opened first: a delete after that leaves the stream its bytes (the open file
    // outlives its name), and the length answered is the opened file's, so an answer whose headers
    // went out is never cut short (bytes written to the key meanwhile may come with their newer
    // metadata, for a moment).
    if (isSafeKey(key) && isReservedKey(key)) return null;
    let file: FileHandle;
    try {
      file = await open(this.pathOf(key), 'r');
    } catch (err) {
      if (isAbsent(err)) return null;
      throw err;
    }
    try {
      const object = await this.head(key);
      if (object) {
        const { size } = await file.stat();
        return { object: { ...object, size }, body: file.createReadStream() };
      }
    } catch (err) {
      await file.close();
      throw err;
    }
    await file.close();
    return null;
  }

  async delete(key: string): Promise<void> {
    const path = this.pathOf(key);
    // In turn with commits to the path: one between a commit's two renames would leave bytes
    // without metadata, which no read could serve and no delete by listing would find.
    await this.inTurn(path, async () => {
      await rm(path, { force: true });
      await rm(`${path}.meta.json`, { force: true });
    });
  }

  async copy(from: string, to: string, ifEtag: string): Promise<StoredObject | null> {
    const source = this.pathOf(from);
    const path = this.pathOf(to);
    const object = await this.head(from);
    if (!object) return null;
    await mkdir(dirname(path), { recursive: true });
    const tmp = tmpPathOf(path);
    const digest = measuring(Infinity);
    try {
      await pipeline(createReadStream(source), digest.stream, createWriteStream(tmp, { flags: 'wx' }));
      // Judged on the bytes copied: the source may have been replaced since its metadata was read.
      const etag = digest.etag();
      if (etag !== `"${normalizeEtag(ifEtag)}"`) {
        await rm(tmp, { force: true });
        return null;
      }
      const meta: StoredObject = { size: digest.size(), etag, contentType: object.contentType };
      await this.commit(path, tmp, meta);
      return meta;
    } catch (err) {
      await rm(tmp, { force: true });
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw err;
    }
  }

  async deletePrefix(prefix: string): Promise<number> {
    const { objects } = await this.entriesUnder(prefix);
    await rm(this.pathOf(prefix), { recursive: true, force: true });
    return objects.length;
  }

  /**
   * Also lists what a process that died mid-write left: bytes without metadata and metadata without
   * bytes (listed by their key, so a delete removes them), and removes temporary files of writes
   * that stopped an hour ago or more (a running upload writes to its own all along).
   */
  async listPrefix(prefix: string): Promise<ListedObject[]> {
    const dir = this.pathOf(prefix);
    const { objects, temporary } = await this.entriesUnder(prefix);
    const stale = this.now() - STALE_WRITE_MS;
    await Promise.all(
      temporary.map(async (name) => {
        const info = await stat(join(dir, name)).catch(() => null);
        if (info && info.mtimeMs < stale) await rm(join(dir, name), { force: true });
      }),
    );
    const listed = await Promise.all(
      objects.map(async (name) => {
        const path = join(dir, name);
        // The bytes, or else the metadata (bytes not written yet, or lost).
        const info =
          (await stat(path).catch(() => null)) ?? (await stat(`${path}.meta.json`).catch(() => null));
        // Gone since the directory was read.
        if (!info) return [];
        return [
          { key: `${prefix}/${name.split(sep).join('/')}`, lastModified: info.mtimeMs, size: info.size },
        ];
      }),
    );
    return listed.flat();
  }

  /** The objects under `{prefix}/` (paths relative to it), whole or not, and temporary files. */
  private async entriesUnder(prefix: string): Promise<{ objects: string[]; temporary: string[] }> {
    let entries: Dirent[];
    try {
      entries = await readdir(this.pathOf(prefix), { recursive: true, withFileTypes: true });
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' || code === 'ENOTDIR') return { objects: [], temporary: [] };
      throw err;
    }
    const base = this.pathOf(prefix);
    const objects = new Set<string>();
    const temporary: string[] = [];
    for (const entry of entries) {
      if (!entry.isFile()) continue;
      const name = join(entry.parentPath, entry.name).slice(base.length + 1);
      if (name.endsWith('.tmp') || name.endsWith('.tmp.meta')) temporary.push(name);
      else objects.add(name.endsWith('.meta.json') ? name.slice(0, -'.meta.json'.length) : name);
    }
    return { objects: [...objects], temporary };
  }

  async presignPut(key: string, options: PresignPutOptions): Promise<PresignedPut> {
    this.pathOf(key);
    assertContentType(options.contentType);
    if (!Number.isSafeInteger(options.maxBytes) || options.maxBytes < 0)
      throw new Error(`maxBytes must be a non-negative integer (got ${options.maxBytes})`);
    assertPresignExpiry(options.expiresInSeconds);
    const exp = String(this.nowSeconds() + options.expiresInSeconds);
    const max = String(options.maxBytes);
    const query = new URLSearchParams({
      ct: options.contentType,
      max,
      exp,
      sig: this.sign('PUT', key, options.contentType, max, exp),
    });
    return {
      url: `${this.baseUrl}/upload/${key}?${query.toString()}`,
      headers: { 'Content-Type': options.contentType },
      expiresIn: options.expiresInSeconds,
    };
  }

  async presignGet(key: string, expiresInSeconds: number): Promise<string> {
    this.pathOf(key);
    assertPresignExpiry(expiresInSeconds);
    const exp = String(this.nowSeconds() + expiresInSeconds);
    return `${this.baseUrl}/${key}?${new URLSearchParams({ exp, sig: this.sign('GET', key, '', '', exp) }).toString()}`;
  }

  publicUrl(key: string): string {
    return `${this.baseUrl}/${key}`;
  }

  keyOf(url: string): string | null {
    return keyBelow(url, [`${this.baseUrl}/upload`, this.baseUrl]);
  }

  /**
   * Checks an upload URL for `key` and the Content-Type the request carries. Only a `valid` result
   * names the content type and limit to store with; they are the signed ones, never the client's.
   */
  verifyUpload(key: string, query: UploadQuery, contentType: string | undefined): UploadCheck {
    const { ct, max, exp, sig } = query;
    if (ct === undefined || max === undefined || !DIGITS.test(max)) return { status: 'invalid' };
    const check = this.verifySignature(['PUT', key, ct, max], exp, sig);
    if (check.status !== 'valid') return check;
    if (contentType !== ct) return { status: 'invalid' };
    return { status: 'valid', contentType: ct, maxBytes: Number(max), expiresAt: check.expiresAt };
  }

  /** Checks a download URL for `key`. */
  verifyDownload(key: string, query: DownloadQuery): SignatureCheck {
    return this.verifySignature(['GET', key, '', ''], query.exp, query.sig);
  }

  /**
   * Checks `sig` against the signed fields (method, key, content type, limit) plus `exp`, then the
   * expiry; a forged or altered URL is `invalid` whatever its expiry.
   */
  verifySignature(
    fields: [string, string, string, string],
    exp: string | undefined,
    sig: string | undefined,
  ): SignatureCheck {
    if (exp === undefined || sig === undefined || !DIGITS.test(exp) || !SIGNATURE.test(sig))
      return { status: 'invalid' };
    // Compared as text: base64url decoding would let several spellings of one signature through.
    const expected = Buffer.from(this.sign(...fields, exp), 'latin1');
    const given = Buffer.from(sig, 'latin1');
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return { status: 'invalid' };
    const expiresAt = Number(exp);
    if (this.nowSeconds() >= expiresAt) return { status: 'expired' };
    return { status: 'valid', expiresAt };
  }

  /** Seconds left before a URL expiring at `expiresAt` (as verified) stops working. */
  secondsLeft(expiresAt: number): number {
    return Math.max(0, expiresAt - this.nowSeconds());
  }

  private sign(method: string, key: string, contentType: string, max: string, exp: string): string {
    // JSON keeps the fields apart whatever they contain.
    const payload = JSON.stringify(['zg-storage-v1', method, key, contentType, max, exp]);
    return createHmac('sha256', this.signingKey).update(payload).digest('base64url');
  }

  private nowSeconds(): number {
    return Math.floor(this.now() / 1000);
  }

  /**
   * Sidecar first, then the bytes: a reader finding the bytes always finds their metadata. Commits
   * to one path take turns (in this process, which the embedded profile's storage belongs to), so
   * two uploads to one key cannot leave one's bytes with the other's metadata.
   */
  private commit(path: string, tmp: string, meta: StoredObject): Promise<void> {
    return this.inTurn(path, () => this.commitNow(path, tmp, meta));
  }

  /** Runs `work` once the commits and deletes of `path` queued before it are done. */
  private async inTurn(path: string, work: () => Promise<void>): Promise<void> {
    const before = committing.get(path) ?? Promise.resolve();
    const mine = before.then(work);
    const settled = mine.catch(() => undefined);
    committing.set(path, settled);
    try {
      await mine;
    } finally {
      if (committing.get(path) === settled) committing.delete(path);
    }
  }

  private async commitNow(path: string, tmp: string, meta: StoredObject): Promise<void> {
    const metaTmp = `${tmp}.meta`;
    try {
      await writeFile(metaTmp, JSON.stringify(meta));
      await rename(metaTmp, `${path}.meta.json`);
      await rename(tmp, path);
    } catch (err) {
      await rm(metaTmp, { force: true });
      throw err;
    }
  }

  private pathOf(key: string): string {
    assertSafeKey(key);
    if (isReservedKey(key)) throw new Error(`unsafe object key: ${key}`);
    return join(this.root, key);
  }
}

/** Where an object is written before it is renamed into place. */
function tmpPathOf(path: string): string {
  return `${path}.${randomBytes(6).toString('hex')}.tmp`;
}

/**
 * Passes bytes through, counting them and their MD5 (the object's ETag); more than `maxBytes` fails
 * the stream with `PayloadTooLargeError`.
 */
function measuring(maxBytes: number): { stream: Transform; size(): number; etag(): string } {
  const md5 = createHash('md5');
  let size = 0;
  const stream = new Transform({
    transform(chunk: Buffer, _encoding, callback) {
      size += chunk.length;
      if (size > maxBytes) {
        callback(new PayloadTooLargeError(`The upload exceeds its limit of ${maxBytes} bytes`));
        return;
      }
      md5.update(chunk);
      callback(null, chunk);
    },
  });
  return { stream, size: () => size, etag: () => `"${md5.digest('hex')}"` };
}

/** Names of the files kept beside an object (its metadata, uploads in progress). */
function isReservedKey(key: string): boolean {
  return key.endsWith('.meta.json') || key.endsWith('.tmp') || key.endsWith('.tmp.meta');
}

/**
 * Reads the URL signing secret at `path`, creating a random one (mode 0600) on first start: the
 * embedded profile's counterpart of a configured key, so signed URLs survive restarts.
 */
export function loadOrCreateSigningKey(path: string): Buffer {
  if (!existsSync(path)) {
    mkdirSync(dirname(path), { recursive: true });
    try {
      writeFileSync(path, randomBytes(48).toString('base64url'), { mode: 0o600, flag: 'wx' });
    } catch (err) {
      // Another process created it first; use theirs.
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
  }
  const key = readFileSync(path, 'utf8').trim();
  if (key.length < MIN_SIGNING_KEY_BYTES) throw new Error(`${path} holds no usable storage signing key`);
  return Buffer.from(key, 'utf8');
}

/** A path error that means no object is there. */
function isAbsent(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ENOTDIR';
}
