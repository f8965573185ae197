import { createHash, randomBytes } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { assertSafeKey, type ObjectStorage, type StoredObject } from './object-storage.js';

/**
 * Objects as files under a directory, each with a small JSON sidecar for its content type and
 * ETag. Writes go to a temporary file first and are renamed into place, so readers never see a
 * partial object. The app itself serves them at `{baseUrl}/{key}`.
 */
export class LocalObjectStorage implements ObjectStorage {
  constructor(
    private readonly root: string,
    private readonly baseUrl: string,
  ) {}

  async put(key: string, body: Buffer, contentType: string): Promise<StoredObject> {
    const path = this.pathOf(key);
    await mkdir(dirname(path), { recursive: true });
    const meta: StoredObject = {
      size: body.length,
      etag: `"${createHash('md5').update(body).digest('hex')}"`,
      contentType,
    };
    const tmp = `${path}.${randomBytes(6).toString('hex')}.tmp`;
    await writeFile(`${tmp}.meta`, JSON.stringify(meta));
    await writeFile(tmp, body);
    await rename(`${tmp}.meta`, `${path}.meta.json`);
    await rename(tmp, path);
    return meta;
  }

  async head(key: string): Promise<StoredObject | null> {
    const path = this.pathOf(key);
    try {
      const [meta, info] = await Promise.all([readFile(`${path}.meta.json`, 'utf8'), stat(path)]);
      const parsed = JSON.parse(meta) as StoredObject;
      return { ...parsed, size: info.size };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
      throw err;
    }
  }

  async get(key: string) {
    const object = await this.head(key);
    if (!object) return null;
    return { object, body: createReadStream(this.pathOf(key)) };
  }

  async delete(key: string): Promise<void> {
    const path = this.pathOf(key);
    await rm(path, { force: true });
    await rm(`${path}.meta.json`, { force: true });
  }

  publicUrl(key: string): string {
    return `${this.baseUrl}/${key}`;
  }

  private pathOf(key: string): string {
    assertSafeKey(key);
    if (key.endsWith('.meta.json') || key.endsWith('.tmp')) throw new Error(`unsafe object key: ${key}`);
    return join(this.root, key);
  }
}
