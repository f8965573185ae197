import { isIP } from 'node:net';
import { createHash } from 'node:crypto';
import { Readable } from 'node:stream';
import {
  CopyObjectCommand,
  CreateBucketCommand,
  DeleteObjectCommand,
  DeleteObjectsCommand,
  GetObjectCommand,
  HeadBucketCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3Client,
  type BucketLocationConstraint,
} from '@aws-sdk/client-s3';
import { getSignedUrl } from '@aws-sdk/s3-request-presigner';
import {
  assertContentType,
  assertPresignExpiry,
  assertSafeKey,
  isPublicKey,
  keyBelow,
  PUBLIC_OBJECT_CACHE_CONTROL,
  type ListedObject,
  type ObjectStorage,
  type PresignedPut,
  type PresignPutOptions,
  type StoredObject,
} from './object-storage.js';

export interface S3ObjectStorageOptions {
  /** Base URL of an S3-compatible store (MinIO, S3Mock, …); AWS S3 itself when absent. */
  endpoint?: string;
  region: string;
  bucket: string;
  accessKeyId: string;
  secretAccessKey: string;
  /** `{endpoint}/{bucket}/{key}` rather than `{bucket}.{host}/{key}`; most self-hosted stores need it. */
  forcePathStyle: boolean;
  /** Where public objects are read (a CDN, or the bucket's own URL when absent). */
  publicUrl?: string;
  /**
   * Longest an attempt may wait for the store's answer (an upload's time at 256 kB/s besides);
   * default 20 s. The SDK makes three attempts, so a call gives up after about a minute. A body
   * being read may pause for a minute. Without a bound, a store that accepts a connection and never
   * answers would hold a request, or a worker's task, for ever.
   */
  timeoutMs?: number;
}

const DEFAULT_TIMEOUT_MS = 20_000;
const CONNECT_TIMEOUT_MS = 5_000;
const IDLE_TIMEOUT_MS = 60_000;

/** Keys whose type a browser may run script in when the URL is opened (HTML, SVG, XML). */
const SCRIPTABLE = /\.(html?|xhtml|svg|xml)$/i;

/** A failure the store answered with, as the SDK reports it. */
interface ServiceError {
  name?: string;
  $metadata?: { httpStatusCode?: number };
}

function statusOf(err: unknown): number | undefined {
  return (err as ServiceError | null)?.$metadata?.httpStatusCode;
}

/**
 * Objects in one bucket of any S3-compatible store, through the AWS SDK v3. Presigned PUTs sign the
 * Content-Type (the store refuses another one) but cannot cap the size: see `ObjectStorage`.
 * Importing this module only defines it; the SDK is loaded with it, so the embedded profile never
 * imports it.
 */
export class S3ObjectStorage implements ObjectStorage {
  private readonly client: S3Client;
  private readonly bucket: string;
  private readonly publicBase: string;
  private readonly timeoutMs: number;

  constructor(private readonly options: S3ObjectStorageOptions) {
    this.bucket = options.bucket;
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.client = new S3Client({
      region: options.region,
      ...(options.endpoint !== undefined ? { endpoint: options.endpoint } : {}),
      forcePathStyle: options.forcePathStyle,
      credentials: { accessKeyId: options.accessKeyId, secretAccessKey: options.secretAccessKey },
      // The SDK's default checksum trailers are unknown to several S3-compatible stores and would be
      // signed into presigned URLs; S3 needs them only where an operation requires one.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
      maxAttempts: 3,
      requestHandler: {
        connectionTimeout: Math.min(CONNECT_TIMEOUT_MS, this.timeoutMs),
        requestTimeout: this.timeoutMs,
        throwOnRequestTimeout: true,
        // A body on its way that stops coming (a stalled read of an object): a minute, which is
        // longer than an upload waits for its answer.
        socketTimeout: Math.max(IDLE_TIMEOUT_MS, this.timeoutMs),
      },
    });
    this.publicBase = (options.publicUrl ?? this.bucketUrls()[0]!).replace(/\/+$/, '');
  }

  async put(key: string, body: Buffer, contentType: string): Promise<StoredObject> {
    assertSafeKey(key);
    const res = await this.client.send(
      new PutObjectCommand({
        Bucket: this.bucket,
        Key: key,
        Body: body,
        ContentType: contentType,
        ContentLength: body.length,
        // Read through public URLs under names never written twice (avatars), as the local adapter
        // serves them; anything else is read through signed URLs, which say their own.
        ...(isPublicKey(key) ? { CacheControl: PUBLIC_OBJECT_CACHE_CONTROL } : {}),
      }),
      // The bound runs until the answer's headers, so the upload is within it: allowed at 256 kB/s.
      { requestTimeout: this.timeoutMs + Math.ceil(body.length / 256) },
    );
    const etag = res.ETag ?? `"${createHash('md5').update(body).digest('hex')}"`;
    return { size: body.length, etag, contentType };
  }

  async head(key: string): Promise<StoredObject | null> {
    assertSafeKey(key);
    try {
      const res = await this.client.send(new HeadObjectCommand({ Bucket: this.bucket, Key: key }));
      return {
        size: res.ContentLength ?? 0,
        etag: res.ETag ?? '',
        contentType: res.ContentType ?? 'application/octet-stream',
      };
    } catch (err) {
      // A HEAD answer has no body, so a missing bucket looks like a missing key here.
      if (statusOf(err) === 404) return null;
      throw err;
    }
  }

  async get(key: string): Promise<{ object: StoredObject; body: Readable } | null> {
    assertSafeKey(key);
    try {
      const res = await this.client.send(new GetObjectCommand({ Bucket: this.bucket, Key: key }));
      if (!(res.Body instanceof Readable)) throw new Error('the S3 client returned no Node.js stream');
      return {
        object: {
          size: res.ContentLength ?? 0,
          etag: res.ETag ?? '',
          contentType: res.ContentType ?? 'application/octet-stream',
        },
        body: res.Body,
      };
    } catch (err) {
      if ((err as ServiceError).name === 'NoSuchKey') return null;
      throw err;
    }
  }

  async delete(key: string): Promise<void> {
    assertSafeKey(key);
    await this.client.send(new DeleteObjectCommand({ Bucket: this.bucket, Key: key }));
  }

  async copy(from: string, to: string, ifEtag: string): Promise<StoredObject | null> {
    assertSafeKey(from);
    assertSafeKey(to);
    // As the store wrote it (some write hex in capitals, and compare case and all), quoted.
    const etag = `"${ifEtag
      .trim()
      .replace(/^W\//i, '')
      .replace(/^"(.*)"$/, '$1')}"`;
    try {
      await this.client.send(
        new CopyObjectCommand({
          Bucket: this.bucket,
          Key: to,
          // Safe keys need no escaping.
          CopySource: `${this.bucket}/${from}`,
          CopySourceIfMatch: etag,
          MetadataDirective: 'COPY',
        }),
      );
    } catch (err) {
      // 412: the source holds other bytes now; 404 NoSuchKey: it is gone (not a missing bucket).
      const name = (err as ServiceError).name;
      if (statusOf(err) === 412 || name === 'NoSuchKey' || (statusOf(err) === 404 && name !== 'NoSuchBucket'))
        return null;
      throw err;
    }
    const copy = await this.head(to);
    if (!copy) throw new Error(`the copy ${to} vanished as soon as it was written`);
    return copy;
  }

  async deletePrefix(prefix: string): Promise<number> {
    let deleted = 0;
    for await (const page of this.pages(prefix)) {
      if (page.length === 0) continue;
      const res = await this.client.send(
        new DeleteObjectsCommand({
          Bucket: this.bucket,
          Delete: { Objects: page.map((o) => ({ Key: o.key })), Quiet: true },
        }),
      );
      const failed = res.Errors ?? [];
      if (failed.length > 0)
        throw new Error(`could not delete ${failed.length} objects under ${prefix}/: ${failed[0]?.Code}`);
      deleted += page.length;
    }
    return deleted;
  }

  async listPrefix(prefix: string): Promise<ListedObject[]> {
    const listed: ListedObject[] = [];
    for await (const page of this.pages(prefix)) listed.push(...page);
    return listed;
  }

  /** The objects under `{prefix}/`, a listing page at a time. */
  private async *pages(prefix: string): AsyncGenerator<ListedObject[]> {
    assertSafeKey(prefix);
    let token: string | undefined;
    do {
      const page = await this.client.send(
        new ListObjectsV2Command({
          Bucket: this.bucket,
          Prefix: `${prefix}/`,
          ...(token !== undefined ? { ContinuationToken: token } : {}),
        }),
      );
      yield (page.Contents ?? []).flatMap((o) =>
        o.Key !== undefined
          ? [{ key: o.Key, lastModified: o.LastModified?.getTime() ?? 0, size: o.Size ?? 0 }]
          : [],
      );
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token !== undefined);
  }

  async presignPut(key: string, options: PresignPutOptions): Promise<PresignedPut> {
    assertSafeKey(key);
    assertContentType(options.contentType);
    assertPresignExpiry(options.expiresInSeconds);
    const url = await getSignedUrl(
      this.client,
      new PutObjectCommand({ Bucket: this.bucket, Key: key, ContentType: options.contentType }),
      // The presigner leaves Content-Type out of the signature unless told otherwise.
      { expiresIn: options.expiresInSeconds, signableHeaders: new Set(['content-type']) },
    );
    return { url, headers: { 'Content-Type': options.contentType }, expiresIn: options.expiresInSeconds };
  }

  async presignGet(key: string, expiresInSeconds: number): Promise<string> {
    assertSafeKey(key);
    assertPresignExpiry(expiresInSeconds);
    // The store cannot send a sandboxing CSP, so a page that could run script in its origin is
    // handed out as a download: opening the URL saves it, a client's fetch still reads the bytes.
    const download = SCRIPTABLE.test(key) ? { ResponseContentDisposition: 'attachment' } : {};
    // Kept by the reader alone, and no longer than the URL lasts (a post made private meanwhile).
    const command = new GetObjectCommand({
      Bucket: this.bucket,
      Key: key,
      ResponseCacheControl: `private, max-age=${expiresInSeconds}`,
      ...download,
    });
    return getSignedUrl(this.client, command, { expiresIn: expiresInSeconds });
  }

  publicUrl(key: string): string {
    return `${this.publicBase}/${key}`;
  }

  keyOf(url: string): string | null {
    return keyBelow(url, [...this.bucketUrls(), this.publicBase]);
  }

  /** Creates the bucket unless it exists (development and tests; production buckets are provisioned). */
  async ensureBucket(): Promise<void> {
    try {
      await this.client.send(new HeadBucketCommand({ Bucket: this.bucket }));
      return;
    } catch (err) {
      if (statusOf(err) !== 404) throw err;
    }
    try {
      await this.client.send(
        new CreateBucketCommand({
          Bucket: this.bucket,
          // us-east-1 is the one region that must not be named.
          ...(this.options.region !== 'us-east-1'
            ? {
                CreateBucketConfiguration: {
                  LocationConstraint: this.options.region as BucketLocationConstraint,
                },
              }
            : {}),
        }),
      );
    } catch (err) {
      if ((err as ServiceError).name !== 'BucketAlreadyOwnedByYou') throw err;
    }
  }

  /** True when the bucket answers with these credentials (readiness). */
  async ping(): Promise<boolean> {
    await this.client.send(new HeadBucketCommand({ Bucket: this.bucket }));
    return true;
  }

  close(): void {
    this.client.destroy();
  }

  /**
   * The bucket's addresses in both forms, the one public URLs are written with first: by path when
   * so configured or when the bucket's name has dots (it cannot be a host name under TLS), as the
   * SDK addresses it. An object's URL in either form names this bucket's object.
   */
  private bucketUrls(): string[] {
    const { endpoint, region, forcePathStyle } = this.options;
    const pathFirst = forcePathStyle || this.bucket.includes('.');
    const forms = (protocol: string, host: string, path = ''): string[] => {
      const byPath = `${protocol}//${host}${path}/${this.bucket}`;
      // An address (127.0.0.1:9000, [::1]) has no names below it: by path only.
      if (isIP(host.replace(/^\[|\]?(:\d+)?$/g, '')) !== 0) return [byPath];
      const virtual = `${protocol}//${this.bucket}.${host}${path}`;
      return pathFirst ? [byPath, virtual] : [virtual, byPath];
    };
    if (endpoint === undefined) {
      return [
        ...forms('https:', `s3.${region}.amazonaws.com`),
        ...(region === 'us-east-1' ? forms('https:', 's3.amazonaws.com') : []),
      ];
    }
    const base = new URL(endpoint);
    return forms(base.protocol, base.host, base.pathname.replace(/\/+$/, ''));
  }
}
