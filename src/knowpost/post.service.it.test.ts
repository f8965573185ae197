import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, utimesSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { freshDatabases, userRow, type FreshDatabase } from '../../test/rig/resources.js';
import { migrate, openSqlite, type Db } from '../platform/db/database.js';
import { AppError } from '../platform/errors/errors.js';
import { parseSnowflake, SnowflakeGenerator } from '../platform/ids/snowflake.js';
import { OutboxWriter } from '../platform/outbox/outbox.js';
import { createSqliteRateLimiter } from '../platform/ratelimit/create.js';
import { LocalObjectStorage } from '../platform/storage/local-object-storage.js';
import { CROSSINGS_KEPT_MS, parsePostEvent, POST_TOPIC, type PostChange } from './post-events.js';
import { isStoredImageOf, storedImageKey } from './post-keys.js';
import { PostObjectPurger } from './post-purge.js';
import { PostUploadSweeper } from './post-sweep.js';
import { PostRepository } from './post.repository.js';
import { PostService, UPLOAD_CHECK_GRACE_MS, type PostLimits } from './post.service.js';

const backends = freshDatabases({ migrated: true });

const AUTHOR = 101;
const OTHER = 202;
const WORKER_ID = 7;

/** Resolves to the error code a call failed with (or 'ok'), so assertions read as the contract does. */
async function outcome(call: Promise<unknown>): Promise<string> {
  try {
    await call;
    return 'ok';
  } catch (err) {
    if (err instanceof AppError) return `${err.status} ${err.code}`;
    throw err;
  }
}

describe.each(backends)(`${PostService.name} on %s`, (_name, open) => {
  let backend: FreshDatabase;
  let limiterDb: Db;
  let root: string;
  let storage: LocalObjectStorage;
  let changes: PostChange[];
  let now: number;
  // One generator for the shared database: tests reset the clock, the generator never repeats an id.
  const ids = new SnowflakeGenerator(WORKER_ID, () => now);

  beforeAll(async () => {
    backend = await open();
    limiterDb = openSqlite(':memory:');
    await migrate(limiterDb);
  });
  afterAll(async () => {
    await limiterDb?.close();
    await backend?.close();
  });
  beforeEach(() => {
    root = mkdtempSync(join(tmpdir(), 'zg-posts-'));
    storage = new LocalObjectStorage(root, 'http://files.invalid/files');
    changes = [];
    now = Date.UTC(2025, 5, 1, 12);
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  const serviceOptions = (limits: Partial<PostLimits> = {}) => ({
    posts: new PostRepository(backend.db),
    storage,
    limiter: createSqliteRateLimiter(limiterDb, {
      prefix: `t${randomBytes(4).toString('hex')}:`,
      now: () => now,
    }),
    outbox: new OutboxWriter(() => now),
    ids,
    limits: {
      contentMaxBytes: 64 * 1024,
      imageMaxBytes: 16 * 1024,
      presignExpiresSeconds: 600,
      ...limits,
    },
    onChange: [(change: PostChange) => void changes.push(change)],
    now: () => now,
  });
  const newService = (limits: Partial<PostLimits> = {}) => new PostService(serviceOptions(limits));

  const row = (id: string) =>
    backend.db.kysely.selectFrom('knowposts').selectAll().where('id', '=', id).executeTakeFirstOrThrow();
  /** What the post's row stores for its images. */
  const imagesOf = async (id: string) => JSON.parse((await row(id)).img_urls_json) as string[];

  const outboxFor = async (id: string) =>
    (await backend.db.kysely.selectFrom('outbox').selectAll().orderBy('id').execute())
      .filter((r) => r.topic === POST_TOPIC && parsePostEvent(r.payload)?.postId === id)
      .map((r) => ({ key: r.msg_key, event: parsePostEvent(r.payload) }));

  /** Presigns an upload to the author's post and stores `bytes` under its key, as a client's PUT would. */
  async function uploadObject(
    sut: PostService,
    postId: string,
    scene: 'knowpost_content' | 'knowpost_image',
    contentType: string,
    bytes: Buffer | string,
  ) {
    const presigned = await sut.presign(AUTHOR, { scene, postId, contentType });
    const stored = await storage.put(
      presigned.objectKey,
      Buffer.from(bytes),
      presigned.headers['Content-Type'],
    );
    return { objectKey: presigned.objectKey, etag: stored.etag, putUrl: presigned.putUrl };
  }

  /** Uploads a body the way a client would and returns what confirm needs. */
  async function upload(sut: PostService, postId: string, text = `# Post ${postId}\n\nhello`) {
    const bytes = Buffer.from(text);
    const { objectKey, etag } = await uploadObject(sut, postId, 'knowpost_content', 'text/markdown', bytes);
    return {
      objectKey,
      etag,
      size: bytes.length,
      sha256: createHash('sha256').update(bytes).digest('hex'),
    };
  }

  async function publishedPost(sut: PostService, author = AUTHOR): Promise<string> {
    const id = await sut.createDraft(author);
    const body = await upload(sut, id);
    await sut.confirmContent(author, id, body);
    await sut.publish(author, id);
    return id;
  }

  it('creates drafts with snowflake ids carrying the worker id', async () => {
    const sut = newService();
    const a = await sut.createDraft(AUTHOR);
    const b = await sut.createDraft(AUTHOR);
    expect(a).toMatch(/^\d+$/);
    expect(BigInt(b)).toBeGreaterThan(BigInt(a));
    expect(parseSnowflake(a).workerId).toBe(WORKER_ID);
    expect(await row(a)).toMatchObject({ author_id: AUTHOR, status: 'draft', visible: 'public' });
    expect(changes).toEqual([
      { id: a, authorId: AUTHOR, kind: 'created', draft: true, unlisted: true },
      { id: b, authorId: AUTHOR, kind: 'created', draft: true, unlisted: true },
    ]);
  });

  it('caps open drafts and rate-limits new ones per user', async () => {
    const capped = newService({ maxOpenDrafts: 2 });
    const author = 9001;
    await capped.createDraft(author);
    await capped.createDraft(author);
    expect(await outcome(capped.createDraft(author))).toBe('409 DRAFT_LIMIT');
    expect(await outcome(capped.createDraft(author + 1))).toBe('ok');

    const limited = newService({ draftsPerHour: 1 });
    expect(await outcome(limited.createDraft(9100))).toBe('ok');
    expect(await outcome(limited.createDraft(9100))).toBe('429 RATE_LIMITED');
  });

  it('holds the cap on open drafts against drafts created at once', async () => {
    const capped = newService({ maxOpenDrafts: 3 });
    const author = 9003;
    await backend.db.kysely
      .insertInto('users')
      .values(userRow({ id: author }))
      .execute();
    const outcomes = await Promise.all(Array.from({ length: 10 }, () => outcome(capped.createDraft(author))));
    expect(outcomes.sort()).toEqual([...Array<string>(7).fill('409 DRAFT_LIMIT'), 'ok', 'ok', 'ok']);
  });

  it('presigns keys under the post for its author only', async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    const content = await sut.presign(AUTHOR, {
      scene: 'knowpost_content',
      postId: id,
      contentType: 'text/markdown',
    });
    expect(content.objectKey).toBe(`posts/${id}/content.md`);
    expect(content.headers).toEqual({ 'Content-Type': 'text/markdown' });
    expect(content.expiresIn).toBe(600);
    expect(content.putUrl).toContain(`/upload/posts/${id}/content.md?`);
    const image = await sut.presign(AUTHOR, {
      scene: 'knowpost_image',
      postId: id,
      contentType: 'image/png',
      ext: '.PNG',
    });
    expect(image.objectKey).toMatch(new RegExp(`^posts/${id}/images/20250601/[0-9a-f]{8}\\.png$`));
    const text = await sut.presign(AUTHOR, {
      scene: 'knowpost_content',
      postId: id,
      contentType: 'text/plain; charset=utf-8',
      ext: '.txt',
    });
    expect(text.objectKey).toBe(`posts/${id}/content.txt`);

    const bad = (contentType: string, ext?: string, scene = 'knowpost_content' as const) =>
      outcome(sut.presign(AUTHOR, { scene, postId: id, contentType, ...(ext ? { ext } : {}) }));
    expect(await bad('text/markdown', '.txt')).toBe('400 BAD_REQUEST');
    expect(await bad('image/png')).toBe('400 BAD_REQUEST');
    expect(await bad('text/markdown', '.exe')).toBe('400 BAD_REQUEST');
    expect(await bad('application/x-sh')).toBe('400 BAD_REQUEST');
    expect(await bad('text/markdown\r\nX-Evil: 1')).toBe('400 BAD_REQUEST');

    expect(
      await outcome(sut.presign(OTHER, { scene: 'knowpost_content', postId: id, contentType: 'text/plain' })),
    ).toBe('404 NOT_FOUND');
    expect(
      await outcome(
        sut.presign(AUTHOR, { scene: 'knowpost_content', postId: '123', contentType: 'text/plain' }),
      ),
    ).toBe('404 NOT_FOUND');
    const published = await publishedPost(sut);
    expect(
      await outcome(
        sut.presign(OTHER, { scene: 'knowpost_image', postId: published, contentType: 'image/gif' }),
      ),
    ).toBe('403 FORBIDDEN');
    await sut.delete(AUTHOR, id);
    expect(
      await outcome(
        sut.presign(AUTHOR, { scene: 'knowpost_content', postId: id, contentType: 'text/plain' }),
      ),
    ).toBe('409 INVALID_STATE');
  });

  it('rate-limits presigning per user, per minute and per day', async () => {
    const sut = newService({ presignPerMinute: 2, presignPerDay: 3 });
    const id = await sut.createDraft(AUTHOR);
    const presign = () =>
      outcome(sut.presign(AUTHOR, { scene: 'knowpost_image', postId: id, contentType: 'image/png' }));
    expect([await presign(), await presign(), await presign()]).toEqual(['ok', 'ok', '429 RATE_LIMITED']);
    now += 60_000;
    expect([await presign(), await presign()]).toEqual(['ok', '429 RATE_LIMITED']);
    now += 60_000;
    expect(await presign()).toBe('429 RATE_LIMITED');
    now += 86_400_000;
    expect(await presign()).toBe('ok');
  });

  it('rate-limits confirms and image edits per user, per minute, refused ones included', async () => {
    const sut = newService({ storesPerMinute: 3 });
    const id = await sut.createDraft(AUTHOR);
    const good = await upload(sut, id);
    const wrong = { ...good, sha256: 'f'.repeat(64) };
    expect(await outcome(sut.confirmContent(AUTHOR, id, wrong))).toBe('400 BAD_REQUEST');
    expect(await outcome(sut.update(AUTHOR, id, { imgUrls: ['https://x.invalid/1.png'] }))).toBe('ok');
    expect(await outcome(sut.confirmContent(AUTHOR, id, wrong))).toBe('400 BAD_REQUEST');
    expect(await outcome(sut.confirmContent(AUTHOR, id, good))).toBe('429 RATE_LIMITED');
    expect(await outcome(sut.update(AUTHOR, id, { imgUrls: [] }))).toBe('429 RATE_LIMITED');
    // Other edits are not held.
    expect(await outcome(sut.update(AUTHOR, id, { title: 'kept' }))).toBe('ok');
    now += 60_000;
    expect(await outcome(sut.confirmContent(AUTHOR, id, good))).toBe('ok');
  });

  it('rate-limits edits of a post per user, per minute, pinning and visibility included', async () => {
    const sut = newService({ editsPerMinute: 3 });
    const id = await sut.createDraft(AUTHOR);
    expect(await outcome(sut.update(AUTHOR, id, { title: 'one' }))).toBe('ok');
    expect(await outcome(sut.setVisibility(AUTHOR, id, 'private'))).toBe('ok');
    expect(await outcome(sut.setTop(AUTHOR, id, true))).toBe('ok');
    expect(await outcome(sut.setVisibility(AUTHOR, id, 'public'))).toBe('429 RATE_LIMITED');
    expect(await outcome(sut.update(AUTHOR, id, { title: 'two' }))).toBe('429 RATE_LIMITED');
    expect((await row(id)).title).toBe('one');
    now += 60_000;
    expect(await outcome(sut.update(AUTHOR, id, { title: 'two' }))).toBe('ok');
  });

  it('confirms a body only when key, size, etag and sha256 all match the stored object', async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    const other = await sut.createDraft(AUTHOR);
    const good = await upload(sut, id);
    const confirm = (patch: Partial<typeof good>) =>
      outcome(sut.confirmContent(AUTHOR, id, { ...good, ...patch }));

    for (const objectKey of [
      `posts/${other}/content.md`,
      `posts/${id}/images/20250601/abcdef12.png`,
      `posts/${id}/content.exe`,
      `posts/${id}/content.md/../content.md`,
      `posts/${id}/sub/content.md`,
      'content.md',
    ]) {
      expect({ objectKey, outcome: await confirm({ objectKey }) }).toEqual({
        objectKey,
        outcome: '400 BAD_REQUEST',
      });
    }
    expect(await confirm({ objectKey: `posts/${id}/content.txt` })).toBe('409 OBJECT_NOT_UPLOADED');
    expect(await confirm({ size: good.size + 1 })).toBe('400 BAD_REQUEST');
    expect(await confirm({ etag: '"0123456789abcdef0123456789abcdef"' })).toBe('400 BAD_REQUEST');
    expect(await confirm({ sha256: 'a'.repeat(64) })).toBe('400 BAD_REQUEST');
    expect(await outcome(sut.confirmContent(OTHER, id, good))).toBe('404 NOT_FOUND');
    expect((await row(id)).content_key).toBeNull();
    expect(changes.filter((c) => c.kind === 'updated')).toEqual([]);

    // ETags compare without quotes or case; sha256 in either case.
    await sut.confirmContent(AUTHOR, id, {
      ...good,
      etag: good.etag.replaceAll('"', '').toUpperCase(),
      sha256: good.sha256.toUpperCase(),
    });
    const confirmed = (await row(id)).content_key!;
    expect(confirmed).toMatch(new RegExp(`^posts/${id}/body/[0-9a-f]{64}\\.md$`));
    // A name of its own, not the bytes' (another confirm of the same bytes gets another).
    expect(confirmed).not.toContain(good.sha256);
    expect(await row(id)).toMatchObject({
      content_etag: good.etag.replaceAll('"', ''),
      content_size: good.size,
      content_sha256: good.sha256,
    });
    expect(changes.at(-1)).toEqual({ id, authorId: AUTHOR, kind: 'updated', draft: true, unlisted: true });
    // Readers get a copy of the bytes checked; the upload is gone.
    expect(await storage.head(confirmed)).toMatchObject({ size: good.size, contentType: 'text/markdown' });
    expect(await storage.head(good.objectKey)).toBeNull();

    // A retried confirm of the same body succeeds and changes nothing (it tells the caches again, in
    // case the first one failed before it could).
    changes.length = 0;
    expect(await confirm({})).toBe('ok');
    expect(changes).toEqual([{ id, authorId: AUTHOR, kind: 'updated', draft: true, unlisted: true }]);
    expect((await row(id)).content_key).toBe(confirmed);
    // Another body confirmed without being uploaded is not.
    expect(await confirm({ sha256: 'b'.repeat(64) })).toBe('409 OBJECT_NOT_UPLOADED');
  });

  it('serves only what confirm checked, whatever is PUT through the upload URL afterwards', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    const before = await row(id);
    const served = async () => {
      const got = await storage.get((await row(id)).content_key!);
      return Buffer.concat(await got!.body.toArray()).toString('utf8');
    };
    const original = await served();
    // The presigned URL is still valid: the author writes something else (bigger than allowed, too).
    await storage.put(`posts/${id}/content.md`, Buffer.from('x'.repeat(100_000)), 'text/markdown');
    expect(await served()).toBe(original);
    expect(await row(id)).toMatchObject({
      content_key: before.content_key,
      content_sha256: before.content_sha256,
    });
  });

  it('keeps what is PUT through an upload URL while a confirm or an image edit copies the upload', async () => {
    const id = await newService().createDraft(AUTHOR);
    const body = await upload(newService(), id);
    const image = (await uploadObject(newService(), id, 'knowpost_image', 'image/png', 'png 1')).objectKey;
    // Right after each copy, the client PUTs other bytes through the same, still valid, URL.
    const later = new Map([
      [body.objectKey, '# Second version'],
      [image, 'png 2'],
    ]);
    class Overwritten extends LocalObjectStorage {
      override async copy(from: string, to: string, ifEtag: string) {
        const copied = await super.copy(from, to, ifEtag);
        const bytes = later.get(from);
        later.delete(from);
        if (bytes !== undefined) await storage.put(from, Buffer.from(bytes), 'application/octet-stream');
        return copied;
      }
    }
    const sut = new PostService({
      ...serviceOptions(),
      storage: new Overwritten(root, 'http://files.invalid/files'),
    });
    await sut.confirmContent(AUTHOR, id, body);
    await sut.update(AUTHOR, id, { imgUrls: [image] });
    // The later bytes are still there to be confirmed or named; what was copied and served is the first.
    const text = async (key: string) =>
      Buffer.concat(await (await storage.get(key))!.body.toArray()).toString();
    expect(await text(body.objectKey)).toBe('# Second version');
    expect(await text(image)).toBe('png 2');
    expect(await text((await row(id)).content_key!)).toBe(`# Post ${id}\n\nhello`);
    expect(await text((await imagesOf(id))[0]!)).toBe('png 1');
    const second = Buffer.from('# Second version');
    await sut.confirmContent(AUTHOR, id, {
      objectKey: body.objectKey,
      etag: (await storage.head(body.objectKey))!.etag,
      size: second.length,
      sha256: createHash('sha256').update(second).digest('hex'),
    });
    expect(await text((await row(id)).content_key!)).toBe('# Second version');
    // Once copied, an upload that still holds what was copied goes.
    expect(await storage.head(body.objectKey)).toBeNull();
  });

  it('answers 204 to both of two overlapping confirms of the same body (a retried request)', async () => {
    const id = await newService().createDraft(AUTHOR);
    const body = await upload(newService(), id);
    // The second request reads the post before the first one commits and looks for the upload only
    // once the first one has deleted it.
    let firstDone!: () => void;
    const first = new Promise<void>((resolve) => (firstDone = resolve));
    let atHead!: () => void;
    const secondRead = new Promise<void>((resolve) => (atHead = resolve));
    let waited = false;
    const gated: typeof storage = Object.create(storage) as typeof storage;
    gated.head = async (key) => {
      if (key === body.objectKey && !waited) {
        waited = true;
        atHead();
        await first;
      }
      return storage.head(key);
    };
    const b = outcome(
      new PostService({ ...serviceOptions(), storage: gated }).confirmContent(AUTHOR, id, body),
    );
    // The second has read the post (it is at the upload) before the first one starts.
    await secondRead;
    const a = outcome(newService().confirmContent(AUTHOR, id, body));
    expect(await a).toBe('ok');
    firstDone();
    expect(await b).toBe('ok');
    expect(waited).toBe(true);
    expect(await storage.head(body.objectKey)).toBeNull();
    // One copy stays, the one the post shows.
    const copies = (await storage.listPrefix(`posts/${id}/body`)).map((o) => o.key);
    expect(copies).toEqual([(await row(id)).content_key]);
    expect(copies[0]).toMatch(new RegExp(`/body/[0-9a-f]{64}\\.md$`));
  });

  it('keeps its copy when the row took it though the write then failed to answer', async () => {
    const repo = new PostRepository(backend.db);
    const lost: typeof repo = Object.create(repo) as typeof repo;
    // The body is stored in a transaction (with an event when the post is published).
    lost.transaction = async (work) => {
      await repo.transaction(work);
      throw new Error('connection lost after commit');
    };
    const sut = new PostService({ ...serviceOptions(), posts: lost });
    const id = await sut.createDraft(AUTHOR);
    const body = await upload(sut, id);
    await expect(sut.confirmContent(AUTHOR, id, body)).rejects.toThrow(/connection lost/);
    const shown = (await row(id)).content_key!;
    expect(await storage.head(shown)).not.toBeNull();
    // The retry succeeds and keeps it.
    await newService().confirmContent(AUTHOR, id, body);
    expect((await row(id)).content_key).toBe(shown);
  });

  it('keeps its copy when the write failed to answer and the row cannot be read either', async () => {
    const repo = new PostRepository(backend.db);
    const down: typeof repo = Object.create(repo) as typeof repo;
    let reads = 0;
    down.transaction = async (work) => {
      await repo.transaction(work);
      throw new Error('connection lost after commit');
    };
    down.find = async (id, db) => {
      // The first reads are the confirm's own checks (and the write's, in its transaction); the one
      // after the failed write fails too.
      if (db === undefined && ++reads > 1) throw new Error('database unreachable');
      return repo.find(id, db);
    };
    const sut = new PostService({ ...serviceOptions(), posts: down });
    const id = await sut.createDraft(AUTHOR);
    const body = await upload(sut, id);
    // The check the presign asked for has run already (the confirm comes late).
    await backend.db.kysely
      .updateTable('knowposts')
      .set({ objects_check_at: null })
      .where('id', '=', id)
      .execute();
    reads = 0;
    await expect(sut.confirmContent(AUTHOR, id, body)).rejects.toThrow(/connection lost/);
    const shown = (await row(id)).content_key!;
    expect(await storage.head(shown)).not.toBeNull();
    // The sweep is asked to look, in case the row did not take it after all.
    expect(Number((await row(id)).objects_check_at)).toBeGreaterThan(0);
    await newService().publish(AUTHOR, id);
    expect((await row(id)).status).toBe('published');
  });

  it('keeps the body a confirm shows when an earlier confirm deletes the one it replaced (same bytes again)', async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    const textA = '# A';
    await sut.confirmContent(AUTHOR, id, await upload(sut, id, textA));
    // The first request replaces A with B and is held just before it deletes A's copy.
    let reached!: () => void;
    const atDelete = new Promise<void>((resolve) => (reached = resolve));
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const slow: typeof storage = Object.create(storage) as typeof storage;
    slow.delete = async (key) => {
      if (key.includes('/body/')) {
        reached();
        await held;
      }
      return storage.delete(key);
    };
    const first = outcome(
      new PostService({ ...serviceOptions(), storage: slow }).confirmContent(
        AUTHOR,
        id,
        await upload(sut, id, '# B'),
      ),
    );
    await atDelete;
    // Meanwhile another tab confirms A again, and its request completes.
    await sut.confirmContent(AUTHOR, id, await upload(sut, id, textA));
    release();
    expect(await first).toBe('ok');
    const shown = (await row(id)).content_key!;
    const got = await storage.get(shown);
    expect(got && Buffer.concat(await got.body.toArray()).toString('utf8')).toBe(textA);
    expect((await storage.listPrefix(`posts/${id}/body`)).map((o) => o.key)).toEqual([shown]);
  });

  it('tells caches when the body of a published post changes', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    changes.length = 0;
    await sut.confirmContent(AUTHOR, id, await upload(sut, id, 'a new body'));
    expect(changes).toEqual([{ id, authorId: AUTHOR, kind: 'updated', draft: false, unlisted: false }]);
  });

  it('tells caches of a publish or delete that failed for want of the database, which may have committed', async () => {
    const repo = new PostRepository(backend.db);
    const lost: typeof repo = Object.create(repo) as typeof repo;
    let failure: Error = Object.assign(new Error('Connection lost: The server closed the connection.'), {
      code: 'PROTOCOL_CONNECTION_LOST',
    });
    lost.transaction = async (work) => {
      await repo.transaction(work);
      throw failure;
    };
    const sut = new PostService({ ...serviceOptions(), posts: lost });
    const uncertain = (id: string) => ({
      id,
      authorId: AUTHOR,
      kind: 'visibility',
      draft: false,
      unlisted: false,
    });

    const draft = await sut.createDraft(AUTHOR);
    await newService().confirmContent(AUTHOR, draft, await upload(sut, draft));
    changes.length = 0;
    await expect(sut.publish(AUTHOR, draft)).rejects.toThrow(/Connection lost/);
    expect(changes).toEqual([uncertain(draft)]);
    expect((await row(draft)).status).toBe('published');

    changes.length = 0;
    await expect(sut.delete(AUTHOR, draft)).rejects.toThrow(/Connection lost/);
    expect(changes).toEqual([uncertain(draft)]);

    // A failure that is no outage (a bug) is no doubt about the database: nothing is told.
    const other = await publishedPost(newService());
    failure = new Error('some bug');
    changes.length = 0;
    await expect(sut.delete(AUTHOR, other)).rejects.toThrow(/some bug/);
    expect(changes).toEqual([]);
  });

  it('tells caches of an edit to a post nobody else may read as unlisted, unless it became public meanwhile', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    await sut.setVisibility(AUTHOR, id, 'private');
    changes.length = 0;
    await sut.update(AUTHOR, id, { title: 'still private' });
    await sut.setTop(AUTHOR, id, true);
    expect(changes).toEqual([
      { id, authorId: AUTHOR, kind: 'updated', draft: false, unlisted: true },
      { id, authorId: AUTHOR, kind: 'top', draft: false, unlisted: true },
    ]);
    // Public before or after: listed.
    for (const visible of ['public', 'private'] as const) {
      await sut.setVisibility(AUTHOR, id, visible);
      expect(changes.at(-1)).toEqual({
        id,
        authorId: AUTHOR,
        kind: 'visibility',
        draft: false,
        unlisted: false,
      });
    }

    // Read as private, made public by another request before this edit's check after it: listed.
    const posts = new PostRepository(backend.db);
    const find = posts.find.bind(posts);
    let reads = 0;
    posts.find = async (...args: Parameters<typeof find>) => {
      const found = await find(...args);
      if (++reads === 1)
        await backend.db.kysely
          .updateTable('knowposts')
          .set({ visible: 'public' })
          .where('id', '=', id)
          .execute();
      return found;
    };
    const racing = new PostService({ ...serviceOptions(), posts });
    await racing.update(AUTHOR, id, { title: 'public now' });
    expect(reads).toBe(3);
    expect(changes.at(-1)).toEqual({ id, authorId: AUTHOR, kind: 'updated', draft: false, unlisted: false });
  });

  it('moves a body confirmed at its upload key before a presign hands that key out again', async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    const bytes = Buffer.from('# confirmed the old way');
    const legacy = `posts/${id}/content.md`;
    const stored = await storage.put(legacy, bytes, 'text/markdown');
    const sha = createHash('sha256').update(bytes).digest('hex');
    await backend.db.kysely
      .updateTable('knowposts')
      .set({ content_key: legacy, content_etag: stored.etag.replaceAll('"', ''), content_sha256: sha })
      .where('id', '=', id)
      .execute();
    await sut.publish(AUTHOR, id);
    changes.length = 0;
    const events = (await outboxFor(id)).length;

    // Another extension's key is not the body's: nothing moves.
    await sut.presign(AUTHOR, { scene: 'knowpost_content', postId: id, contentType: 'text/plain' });
    expect((await row(id)).content_key).toBe(legacy);
    const presigned = await sut.presign(AUTHOR, {
      scene: 'knowpost_content',
      postId: id,
      contentType: 'text/markdown',
    });
    expect(presigned.objectKey).toBe(legacy);
    const moved = (await row(id)).content_key!;
    expect(moved).toMatch(new RegExp(`^posts/${id}/body/[0-9a-f]{64}\\.md$`));
    expect(changes).toEqual([{ id, authorId: AUTHOR, kind: 'updated', draft: false, unlisted: false }]);
    // Other processes' caches hear of it even if this announcement is lost: a `changed` event.
    const written = await outboxFor(id);
    expect(written.slice(events).map((r) => r.event?.type)).toEqual(['changed']);
    await storage.put(legacy, Buffer.from('replaced'), 'text/markdown');
    expect(Buffer.concat(await (await storage.get(moved))!.body.toArray())).toEqual(bytes);
  });

  it('refuses to confirm an upload replaced while it was read', async () => {
    const replacing: typeof storage = Object.create(storage) as typeof storage;
    // The upload changes after its bytes were checked and before they are copied.
    replacing.copy = async (from, to, ifEtag) => {
      await storage.put(from, Buffer.from('something else'), 'text/markdown');
      return storage.copy(from, to, ifEtag);
    };
    const sut = new PostService({ ...serviceOptions(), storage: replacing });
    const id = await sut.createDraft(AUTHOR);
    const body = await upload(sut, id);
    expect(await outcome(sut.confirmContent(AUTHOR, id, body))).toBe('409 OBJECT_CHANGED');
    expect((await row(id)).content_key).toBeNull();
    expect(await storage.listPrefix(`posts/${id}/body`)).toEqual([]);
  });

  it('deletes an oversized body at confirm and answers 413', async () => {
    const sut = newService({ contentMaxBytes: 1024 });
    const id = await sut.createDraft(AUTHOR);
    const body = await upload(sut, id, 'x'.repeat(1025));
    expect(await outcome(sut.confirmContent(AUTHOR, id, body))).toBe('413 PAYLOAD_TOO_LARGE');
    expect(await storage.head(body.objectKey)).toBeNull();
    expect((await row(id)).content_key).toBeNull();
  });

  it('replaces the body of another extension and removes the old object', async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    await sut.confirmContent(AUTHOR, id, await upload(sut, id));
    const bytes = Buffer.from('<p>hi</p>');
    const presigned = await uploadObject(sut, id, 'knowpost_content', 'text/html', bytes);
    const first = (await row(id)).content_key!;
    expect(first).toMatch(/\/body\/[0-9a-f]{64}\.md$/);
    await sut.confirmContent(AUTHOR, id, {
      objectKey: presigned.objectKey,
      etag: presigned.etag,
      size: bytes.length,
      sha256: createHash('sha256').update(bytes).digest('hex'),
    });
    expect((await row(id)).content_key).toMatch(new RegExp(`^posts/${id}/body/[0-9a-f]{64}\\.html$`));
    expect(await storage.head(first)).toBeNull();
    expect(await storage.head(presigned.objectKey)).toBeNull();
  });

  it('publishes a draft once, with its body, and writes one outbox row per transition', async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    expect(await outcome(sut.publish(AUTHOR, id))).toBe('409 CONTENT_REQUIRED');
    expect(await outboxFor(id)).toEqual([]);
    await sut.confirmContent(AUTHOR, id, await upload(sut, id));
    expect(await outcome(sut.publish(OTHER, id))).toBe('404 NOT_FOUND');

    now += 5_000;
    await sut.publish(AUTHOR, id);
    expect(await row(id)).toMatchObject({ status: 'published', publish_time: now });
    expect(await outcome(sut.publish(AUTHOR, id))).toBe('409 INVALID_STATE');
    expect(await outboxFor(id)).toEqual([
      {
        key: String(AUTHOR),
        event: {
          eventId: `knowpost:${id}:entered:1`,
          type: 'published',
          postId: id,
          authorId: AUTHOR,
          ts: now,
        },
      },
    ]);
    expect(changes.filter((c) => c.kind === 'published')).toEqual([
      { id, authorId: AUTHOR, kind: 'published', draft: false, unlisted: false },
    ]);

    // Someone else may see it now, but not change it.
    expect(await outcome(sut.publish(OTHER, id))).toBe('403 FORBIDDEN');
    expect(await outcome(sut.update(OTHER, id, { title: 'mine' }))).toBe('403 FORBIDDEN');
    expect(await outcome(sut.delete(OTHER, id))).toBe('403 FORBIDDEN');

    await sut.delete(AUTHOR, id);
    expect((await row(id)).status).toBe('deleted');
    expect((await outboxFor(id)).map((r) => r.event?.type)).toEqual(['published', 'unpublished']);
    expect(changes.at(-1)).toEqual({ id, authorId: AUTHOR, kind: 'deleted', draft: false, unlisted: false });

    // Deleted stays deleted: publish says why, deleting again (a retried request) succeeds without
    // a second event, everything else no longer finds it.
    const announced = changes.length;
    expect(await outcome(sut.publish(AUTHOR, id))).toBe('409 INVALID_STATE');
    await sut.delete(AUTHOR, id);
    expect(changes.length).toBe(announced);
    expect(await outcome(sut.delete(OTHER, id))).toBe('404 NOT_FOUND');
    expect(await outcome(sut.update(AUTHOR, id, { title: 't' }))).toBe('404 NOT_FOUND');
    expect(await outcome(sut.setTop(AUTHOR, id, true))).toBe('404 NOT_FOUND');
    expect(await outcome(sut.setVisibility(AUTHOR, id, 'private'))).toBe('404 NOT_FOUND');
    expect(
      await outcome(sut.confirmContent(AUTHOR, id, await upload(sut, await sut.createDraft(AUTHOR)))),
    ).toBe('404 NOT_FOUND');
    expect(await outcome(sut.publish(OTHER, id))).toBe('404 NOT_FOUND');
    expect((await outboxFor(id)).length).toBe(2);
  });

  it('removes the stored objects of deleted posts once their upload URLs have expired', async () => {
    const sut = newService();
    const repo = new PostRepository(backend.db);
    const purger = new PostObjectPurger(repo, storage, { graceMs: 600_000, now: () => now });
    const live = await publishedPost(sut);
    const gone = await publishedPost(sut);
    const draft = await sut.createDraft(AUTHOR);
    await sut.confirmContent(AUTHOR, draft, await upload(sut, draft));
    const image = await uploadObject(sut, gone, 'knowpost_image', 'image/png', 'png');
    await sut.update(AUTHOR, gone, { imgUrls: [image.objectKey] });
    const keysOf = async (id: string) => {
      const r = await row(id);
      return [r.content_key!, ...(JSON.parse(r.img_urls_json) as string[])];
    };
    const goneKeys = [...(await keysOf(gone)), ...(await keysOf(draft))];
    expect(goneKeys).toHaveLength(3);
    await sut.delete(AUTHOR, gone);
    await sut.delete(AUTHOR, draft);
    // An upload URL handed out before the deletion is still good for a while.
    const late = `posts/${gone}/images/20250601/0badc0de.png`;
    now += 60_000;
    await storage.put(late, Buffer.from('late'), 'image/png');

    await purger.runOnce();
    for (const key of [...goneKeys, late]) expect(await storage.head(key)).not.toBeNull();
    expect((await row(gone)).objects_purged_at).toBeNull();
    now += 600_000;
    // Posts other tests deleted in the same database go too.
    const round = await purger.runOnce();
    expect(round.posts).toBeGreaterThanOrEqual(2);
    expect(round.objects).toBeGreaterThanOrEqual(4);
    for (const key of [...goneKeys, late])
      expect({ key, head: await storage.head(key) }).toEqual({ key, head: null });
    for (const key of await keysOf(live)) expect(await storage.head(key)).not.toBeNull();
    expect((await row(gone)).objects_purged_at).toBe(now);
    expect((await row(live)).objects_purged_at).toBeNull();
    expect(await purger.runOnce()).toEqual({ posts: 0, objects: 0 });

    // A PUT that started in time may finish after the purge: the purge left a check due for when
    // no upload can arrive any more, which removes it.
    const openUntil = Number((await row(gone)).uploads_open_until);
    expect(openUntil).toBeGreaterThan(now);
    expect(Number((await row(gone)).objects_check_at)).toBe(openUntil);
    const later = `posts/${gone}/images/20250601/1a7e0000.png`;
    await storage.put(later, Buffer.from('later'), 'image/png');
    const sweeper = new PostUploadSweeper(repo, storage, {
      retentionMs: 3_600_000,
      maxBytes: { content: 64 * 1024, image: 16 * 1024 },
      now: () => now,
    });
    now = openUntil;
    await sweeper.runOnce();
    expect(await storage.head(later)).toBeNull();
    expect((await row(gone)).objects_check_at).toBeNull();
  });

  it('deletes a draft without an outbox row', async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    await sut.confirmContent(AUTHOR, id, await upload(sut, id));
    await sut.delete(AUTHOR, id);
    expect((await row(id)).status).toBe('deleted');
    expect(changes.at(-1)).toEqual({ id, authorId: AUTHOR, kind: 'deleted', draft: true, unlisted: true });
    expect(await outboxFor(id)).toEqual([]);
    expect(await outcome(sut.publish(AUTHOR, id))).toBe('409 INVALID_STATE');
    expect(await outboxFor(id)).toEqual([]);
  });

  it('lets exactly one of two concurrent publishes win', async () => {
    const sut = newService();
    for (let round = 0; round < 5; round++) {
      const id = await sut.createDraft(AUTHOR);
      await sut.confirmContent(AUTHOR, id, await upload(sut, id));
      const results = await Promise.all([outcome(sut.publish(AUTHOR, id)), outcome(sut.publish(AUTHOR, id))]);
      expect(results.sort()).toEqual(['409 INVALID_STATE', 'ok']);
      expect((await outboxFor(id)).map((r) => r.event?.type)).toEqual(['published']);
    }
  });

  it('keeps transitions and outbox rows in step when publish and delete race', async () => {
    const sut = newService();
    for (let round = 0; round < 6; round++) {
      const id = await sut.createDraft(AUTHOR);
      await sut.confirmContent(AUTHOR, id, await upload(sut, id));
      const [published, deleted] = await Promise.all([
        outcome(sut.publish(AUTHOR, id)),
        outcome(sut.delete(AUTHOR, id)),
      ]);
      expect(deleted).toBe('ok');
      expect((await row(id)).status).toBe('deleted');
      const types = (await outboxFor(id)).map((r) => r.event?.type);
      // Published first: counted up and down again; deleted first: never counted.
      expect(types).toEqual(published === 'ok' ? ['published', 'unpublished'] : []);
      if (published !== 'ok') expect(published).toBe('409 INVALID_STATE');
    }
  });

  it('edits metadata, checks image entries and announces what changed', async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    const presigned = await uploadObject(sut, id, 'knowpost_image', 'image/png', 'png');
    changes.length = 0;

    await sut.update(AUTHOR, id, {
      title: 'Hello',
      tags: ['a', 'b'],
      tagId: 3,
      imgUrls: [presigned.objectKey, 'https://cdn.example.com/x.png'],
      description: 'short',
      visible: 'private',
      isTop: true,
    });
    // The upload is stored as a copy no presigned URL can write.
    const stored = (await imagesOf(id))[0]!;
    expect(stored).toMatch(new RegExp(`^posts/${id}/pictures/[0-9a-f]{32}\\.png$`));
    expect(isStoredImageOf(id, presigned.objectKey, stored)).toBe(true);
    expect(await row(id)).toMatchObject({
      title: 'Hello',
      tags_json: '["a","b"]',
      tag_id: 3,
      img_urls_json: JSON.stringify([stored, 'https://cdn.example.com/x.png']),
      description: 'short',
      visible: 'private',
      is_top: 1,
    });
    expect(changes.map((c) => [c.kind, c.draft])).toEqual([
      ['updated', true],
      ['visibility', true],
      ['top', true],
    ]);

    changes.length = 0;
    await sut.setTop(AUTHOR, id, false);
    await sut.setVisibility(AUTHOR, id, 'unlisted');
    await sut.update(AUTHOR, id, { tagId: null });
    expect(await row(id)).toMatchObject({ is_top: 0, visible: 'unlisted', tag_id: null, title: 'Hello' });
    expect(changes.map((c) => c.kind)).toEqual(['top', 'visibility', 'updated']);

    const imgs = (imgUrls: string[]) => outcome(sut.update(AUTHOR, id, { imgUrls }));
    expect(await imgs([`posts/${id}/images/20250601/00000000.png`])).toBe('400 BAD_REQUEST');
    const other = await sut.createDraft(AUTHOR);
    expect(await imgs([presigned.objectKey.replace(id, other)])).toBe('400 BAD_REQUEST');
    expect(await imgs(['javascript:alert(1)'])).toBe('400 BAD_REQUEST');
    expect(await imgs(['ftp://example.com/a.png'])).toBe('400 BAD_REQUEST');
    expect(await imgs([`posts/${id}/content.md`])).toBe('400 BAD_REQUEST');
    expect(await outcome(sut.update(AUTHOR, id, {}))).toBe('400 BAD_REQUEST');
    expect(JSON.parse((await row(id)).img_urls_json)).toEqual([stored, 'https://cdn.example.com/x.png']);
    expect(await imgs([`posts/${id}/pictures/${'0'.repeat(32)}.png`])).toBe('400 BAD_REQUEST');

    // A PUT through the still valid upload URL changes nothing read until a patch refers to it again.
    await storage.put(presigned.objectKey, Buffer.from('other png'), 'image/png');
    const read = async (key: string) =>
      Buffer.concat(await (await storage.get(key))!.body.toArray()).toString();
    expect(await read(stored)).toBe('png');
    // The stored copy may be sent back as it is; the upload key is copied again.
    await sut.update(AUTHOR, id, { imgUrls: [stored, presigned.objectKey] });
    const again = await imagesOf(id);
    expect(again[0]).toBe(stored);
    expect(again[1]).not.toBe(stored);
    expect(await read(again[1]!)).toBe('other png');
  });

  it("takes URLs of the post's own objects for their keys (upload URLs, signed image URLs sent back) and refuses other posts'", async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    const presigned = await uploadObject(sut, id, 'knowpost_image', 'image/png', 'png');
    const elsewhere = 'https://cdn.example.com/x.png';
    // What clients of the original service send: the upload URL without its query.
    await sut.update(AUTHOR, id, { imgUrls: [presigned.putUrl.split('?')[0]!, elsewhere] });
    const stored = (await imagesOf(id))[0]!;
    expect(isStoredImageOf(id, presigned.objectKey, stored)).toBe(true);
    expect(await imagesOf(id)).toEqual([stored, elsewhere]);
    expect(await storage.head(presigned.objectKey)).toBeNull();

    // An edit sending back the signed URLs a detail answer gave keeps the copy, not the URL.
    const shown = await storage.presignGet(stored, 60);
    await sut.update(AUTHOR, id, { imgUrls: [shown, elsewhere] });
    expect(await imagesOf(id)).toEqual([stored, elsewhere]);
    await sut.update(AUTHOR, id, { title: 'edited', imgUrls: [shown.split('?')[0]!] });
    expect(await imagesOf(id)).toEqual([stored]);
    expect(await storage.head(stored)).not.toBeNull();

    // Objects of another post are not this post's to show: without a signature, or once it
    // expired, such a URL shows nothing, so it is refused rather than kept as an outside address.
    const other = await sut.createDraft(AUTHOR);
    const foreign = (
      await sut.presign(AUTHOR, { scene: 'knowpost_image', postId: other, contentType: 'image/png' })
    ).putUrl;
    for (const url of [foreign, foreign.split('?')[0]!])
      expect(await outcome(sut.update(AUTHOR, id, { imgUrls: [elsewhere, url] }))).toBe('400 BAD_REQUEST');
    expect(await imagesOf(id)).toEqual([stored]);
    // One an earlier release kept as an outside address may be sent back as the post shows it.
    const kept = foreign.split('?')[0]!;
    await backend.db.kysely
      .updateTable('knowposts')
      .set({ img_urls_json: JSON.stringify([stored, kept]) })
      .where('id', '=', id)
      .execute();
    await sut.update(AUTHOR, id, { title: 'kept', imgUrls: [stored, kept] });
    expect(await imagesOf(id)).toEqual([stored, kept]);
    // A URL of this post's objects that is no image is refused like its key.
    const body = (
      await sut.presign(AUTHOR, { scene: 'knowpost_content', postId: id, contentType: 'text/markdown' })
    ).putUrl;
    expect(await outcome(sut.update(AUTHOR, id, { imgUrls: [body] }))).toBe('400 BAD_REQUEST');
  });

  it('writes an outbox row with every visibility change, numbered entries and exits of the public posts, and a changed event for another edit', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    const publishedAt = now;
    await sut.update(AUTHOR, id, { title: 'Only a title', isTop: true });
    expect((await outboxFor(id)).at(-1)?.event?.type).toBe('changed');
    const before = (await outboxFor(id)).length;

    now += 1_000;
    await sut.setVisibility(AUTHOR, id, 'private');
    await sut.setVisibility(AUTHOR, id, 'followers');
    await sut.update(AUTHOR, id, { title: 'And back', visible: 'public' });
    await sut.setVisibility(AUTHOR, id, 'public');
    const written = (await outboxFor(id)).slice(before);
    expect(written.map((r) => [r.key, r.event?.type, r.event?.authorId, r.event?.ts])).toEqual([
      [String(AUTHOR), 'unpublished', AUTHOR, now],
      [String(AUTHOR), 'changed', AUTHOR, now],
      [String(AUTHOR), 'published', AUTHOR, now],
      [String(AUTHOR), 'changed', AUTHOR, now],
    ]);
    expect(written.map((r) => r.event?.eventId).slice(0, 3)).toEqual([
      `knowpost:${id}:left:1`,
      expect.stringMatching(new RegExp(`^knowpost:${id}:changed:`)),
      `knowpost:${id}:entered:2`,
    ]);
    expect(new Set(written.map((r) => r.event?.eventId)).size).toBe(4);
    // The post keeps its crossings, with their times, for rebuilds of its author's count.
    expect(await row(id)).toMatchObject({
      public_epoch: 2,
      public_crossings: JSON.stringify([
        [1, 1, publishedAt],
        [1, -1, now],
        [2, 1, now],
      ]),
    });
    // Changes to a published post are announced as such (the caches drop it).
    expect(changes.filter((c) => c.kind === 'visibility').map((c) => c.draft)).toEqual([
      false,
      false,
      false,
      false,
    ]);

    // Nor for a draft (no cache holds one).
    const draft = await sut.createDraft(AUTHOR);
    await sut.setVisibility(AUTHOR, draft, 'private');
    expect(await outboxFor(draft)).toEqual([]);

    // A change that does not happen writes nothing; deleting the public post is its second exit.
    expect(await outcome(sut.setVisibility(OTHER, id, 'private'))).toBe('403 FORBIDDEN');
    await sut.delete(AUTHOR, id);
    expect(await outcome(sut.setVisibility(AUTHOR, id, 'private'))).toBe('404 NOT_FOUND');
    expect((await outboxFor(id)).slice(before + 4).map((r) => r.event?.eventId)).toEqual([
      `knowpost:${id}:left:2`,
    ]);
  });

  it('writes a changed event with a new body or new pictures of a published post, whose old ones are deleted next, and with any edit of a public one', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    const before = (await outboxFor(id)).length;
    await sut.confirmContent(AUTHOR, id, await upload(sut, id, '# Second version'));
    const image = (await uploadObject(sut, id, 'knowpost_image', 'image/png', 'png 1')).objectKey;
    await sut.update(AUTHOR, id, { imgUrls: [image] });
    // Other edits: for the caches of other processes, when this one could not tell them itself.
    await sut.update(AUTHOR, id, { title: 'Only the title' });
    await sut.setTop(AUTHOR, id, true);
    expect((await outboxFor(id)).slice(before).map((r) => r.event?.type)).toEqual([
      'changed',
      'changed',
      'changed',
      'changed',
    ]);
    // A private post is in no cache: its title edit tells nobody.
    await sut.setVisibility(AUTHOR, id, 'private');
    const hidden = (await outboxFor(id)).length;
    await sut.update(AUTHOR, id, { title: 'Private now' });
    expect((await outboxFor(id)).length).toBe(hidden);
    // A draft is in no cache: nothing to tell.
    const draft = await sut.createDraft(AUTHOR);
    await sut.confirmContent(AUTHOR, draft, await upload(sut, draft));
    await sut.confirmContent(AUTHOR, draft, await upload(sut, draft, '# Again'));
    const picture = (await uploadObject(sut, draft, 'knowpost_image', 'image/png', 'png 2')).objectKey;
    await sut.update(AUTHOR, draft, { imgUrls: [picture] });
    expect(await outboxFor(draft)).toEqual([]);
  });

  it('writes the changed event for a body confirmed over a draft that was published meanwhile', async () => {
    const id = await newService().createDraft(AUTHOR);
    await newService().confirmContent(AUTHOR, id, await upload(newService(), id));
    const body = await upload(newService(), id, '# Second version');
    let published = false;
    class PublishedMidway extends LocalObjectStorage {
      override async copy(from: string, to: string, ifEtag: string) {
        const copied = await super.copy(from, to, ifEtag);
        if (!published) {
          published = true;
          await newService().publish(AUTHOR, id);
        }
        return copied;
      }
    }
    const sut = new PostService({
      ...serviceOptions(),
      storage: new PublishedMidway(root, 'http://files.invalid/files'),
    });
    const before = (await outboxFor(id)).length;
    await sut.confirmContent(AUTHOR, id, body);
    expect(published).toBe(true);
    expect((await outboxFor(id)).slice(before).map((r) => r.event?.type)).toEqual(['published', 'changed']);
  });

  it('counts no entry for a post published or deleted while not public', async () => {
    const sut = newService();
    const id = await sut.createDraft(AUTHOR);
    await sut.setVisibility(AUTHOR, id, 'private');
    const before = (await outboxFor(id)).length;
    await sut.confirmContent(AUTHOR, id, await upload(sut, id));
    await sut.publish(AUTHOR, id);
    await sut.delete(AUTHOR, id);
    expect((await outboxFor(id)).slice(before).map((r) => r.event?.type)).toEqual(['changed', 'changed']);
    expect(await row(id)).toMatchObject({ public_epoch: 0, public_crossings: '[]' });
  });

  it('keeps the crossings of the last eight days', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    now += 1;
    await sut.setVisibility(AUTHOR, id, 'private');
    now += CROSSINGS_KEPT_MS;
    await sut.setVisibility(AUTHOR, id, 'public');
    expect(JSON.parse((await row(id)).public_crossings)).toEqual([
      [1, -1, now - CROSSINGS_KEPT_MS],
      [2, 1, now],
    ]);
    now += 1;
    await sut.setVisibility(AUTHOR, id, 'private');
    expect(JSON.parse((await row(id)).public_crossings)).toEqual([
      [2, 1, now - 1],
      [2, -1, now],
    ]);
  });

  it('refuses and deletes an oversized image', async () => {
    const sut = newService({ imageMaxBytes: 1024 });
    const id = await sut.createDraft(AUTHOR);
    const presigned = await uploadObject(sut, id, 'knowpost_image', 'image/jpeg', Buffer.alloc(2048));
    expect(await outcome(sut.update(AUTHOR, id, { imgUrls: [presigned.objectKey] }))).toBe(
      '413 PAYLOAD_TOO_LARGE',
    );
    expect(await storage.head(presigned.objectKey)).toBeNull();
    expect((await row(id)).img_urls_json).toBe('[]');
  });

  it('makes no copy for a refused image edit, and deletes those made before a copy failed', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    const images = [
      await uploadObject(sut, id, 'knowpost_image', 'image/png', 'png 1'),
      await uploadObject(sut, id, 'knowpost_image', 'image/png', 'png 2'),
    ].map((p) => p.objectKey);
    const neverSent = (
      await sut.presign(AUTHOR, { scene: 'knowpost_image', postId: id, contentType: 'image/png' })
    ).objectKey;
    const copies = async () => (await storage.listPrefix(`posts/${id}/pictures`)).map((o) => o.key);
    expect(await outcome(sut.update(AUTHOR, id, { imgUrls: [...images, neverSent] }))).toBe(
      '400 BAD_REQUEST',
    );
    expect(await copies()).toEqual([]);
    // The second upload changes while the first is copied: the first's copy goes too.
    class Changing extends LocalObjectStorage {
      override async copy(from: string, to: string, etag: string) {
        return from === images[1] ? null : super.copy(from, to, etag);
      }
    }
    const changing = new PostService({
      ...serviceOptions(),
      storage: new Changing(root, 'http://files.invalid/files'),
    });
    expect(await outcome(changing.update(AUTHOR, id, { imgUrls: images }))).toBe('409 OBJECT_CHANGED');
    expect(await copies()).toEqual([]);
    expect(await imagesOf(id)).toEqual([]);
    // The uploads stay for a patch that succeeds.
    await sut.update(AUTHOR, id, { imgUrls: images });
    expect((await copies()).sort()).toEqual([...(await imagesOf(id))].sort());
  });

  it('hides other authors’ drafts and non-public posts behind 404', async () => {
    const sut = newService();
    const draft = await sut.createDraft(AUTHOR);
    const hidden = await publishedPost(sut);
    await sut.setVisibility(AUTHOR, hidden, 'private');
    for (const id of [draft, hidden, '9999999999']) {
      expect(await outcome(sut.update(OTHER, id, { title: 'x' }))).toBe('404 NOT_FOUND');
      expect(await outcome(sut.setTop(OTHER, id, true))).toBe('404 NOT_FOUND');
      expect(await outcome(sut.delete(OTHER, id))).toBe('404 NOT_FOUND');
      expect(await outcome(sut.publish(OTHER, id))).toBe('404 NOT_FOUND');
    }
    expect((await row(hidden)).title).toBeNull();
  });

  it('works through a backlog of checks a batch after another in one round, each check once', async () => {
    const sut = newService();
    const repo = new PostRepository(backend.db);
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push(await publishedPost(sut));
    // As the upgrade that added checks left every post: due long ago, at one and the same time.
    await backend.db.kysely
      .updateTable('knowposts')
      .set({ objects_check_at: 0 })
      .where('id', 'in', ids)
      .execute();
    const stuck = ids[2]!;
    const found = new Map<string, number>();
    const sweeper = new PostUploadSweeper(
      {
        objectsCheckDue: (at, limit, after) => repo.objectsCheckDue(at, limit, after),
        find: (id) => {
          found.set(id, (found.get(id) ?? 0) + 1);
          return repo.find(id);
        },
        // One check stays due, as when it was moved meanwhile: the next round's, not this one's again.
        finishObjectsCheck: (id, due, next, openUntil) =>
          id === stuck ? Promise.resolve() : repo.finishObjectsCheck(id, due, next, openUntil),
      },
      storage,
      { retentionMs: 3_600_000, maxBytes: { content: 1024, image: 1024 }, batch: 2, now: () => now },
    );
    // (Other tests' posts may be due as well.)
    expect((await sweeper.runOnce()).posts).toBeGreaterThanOrEqual(5);
    expect(ids.map((id) => found.get(id))).toEqual([3, 3, 3, 3, 3]);
    // Each finished check is no longer due (another is left for when its upload URL expires).
    for (const id of ids) {
      const next = (await row(id)).objects_check_at;
      if (id === stuck) expect(next).toBe(0);
      else expect(next === null || next > now).toBe(true);
    }
  });

  it('removes uploads never confirmed or used, and images a post no longer shows', async () => {
    // Objects carry the store's real write times.
    now = Date.now();
    const start = now;
    const hour = 3_600_000;
    const sut = newService({ uploadRetentionMs: hour });
    const repo = new PostRepository(backend.db);
    const sweeper = new PostUploadSweeper(repo, storage, {
      retentionMs: hour,
      maxBytes: { content: 64 * 1024, image: 16 * 1024 },
      now: () => now,
    });
    const id = await publishedPost(sut);
    const uploaded = async (
      scene: 'knowpost_content' | 'knowpost_image',
      contentType: string,
      text: string,
    ) => (await uploadObject(sut, id, scene, contentType, text)).objectKey;
    const exists = async (key: string) => (await storage.head(key)) !== null;
    const unconfirmed = await uploaded('knowpost_content', 'text/plain', 'never confirmed');
    const unused = await uploaded('knowpost_image', 'image/png', 'never used');
    const shown = await uploaded('knowpost_image', 'image/png', 'shown');
    const dropped = await uploaded('knowpost_image', 'image/png', 'dropped');
    await sut.update(AUTHOR, id, { imgUrls: [shown, dropped] });
    const [shownCopy, droppedCopy] = await imagesOf(id);
    // A patch deletes the uploads it copied, and later the images it no longer shows.
    expect(await exists(shown)).toBe(false);
    expect(await exists(dropped)).toBe(false);
    // An upload key sent again after its upload went names the post's copy of it.
    await sut.update(AUTHOR, id, { imgUrls: [shown] });
    expect(await imagesOf(id)).toEqual([shownCopy]);
    expect(await exists(droppedCopy!)).toBe(false);
    // Left behind, as a racing patch or a failed delete would leave it.
    const stray = storedImageKey(id, `posts/${id}/images/20250601/0badc0de.png`);
    await storage.put(stray, Buffer.from('x'), 'image/png');
    const body = (await row(id)).content_key!;

    // Too large to be confirmed: an S3 upload URL cannot refuse it, the first check removes it.
    const oversize = `posts/${id}/content.md`;
    await storage.put(oversize, Buffer.alloc(64 * 1024 + 1), 'text/markdown');

    // Checked 5 minutes after the patches (which may leave copies behind), earlier than the upload
    // URLs asked for: the oversize upload goes, the rest stays until it is older than the retention.
    const due = start + 5 * 60_000;
    expect((await row(id)).objects_check_at).toBe(due);
    now = due - 1;
    await sweeper.runOnce();
    expect(await exists(oversize)).toBe(true);
    now = due;
    await sweeper.runOnce();
    expect(await exists(oversize)).toBe(false);
    for (const key of [unconfirmed, unused, stray]) expect(await exists(key)).toBe(true);
    // That check leaves the one the URLs asked for, a minute after the last one expired.
    const afterUrls = start + 600_000 + UPLOAD_CHECK_GRACE_MS;
    expect((await row(id)).objects_check_at).toBe(afterUrls);
    now = afterUrls;
    await sweeper.runOnce();
    for (const key of [unconfirmed, unused, stray]) expect(await exists(key)).toBe(true);
    // Looked at again when the oldest is old enough (written since `start`, by this machine's clock).
    const retained = (await row(id)).objects_check_at!;
    expect(retained).toBeGreaterThan(start + hour - 2000);
    expect(retained).toBeLessThanOrEqual(Date.now() + hour + 1);
    now = retained + 60_000;
    // A young upload (its URL handed out since) is kept and looked at again when it is old enough.
    const presigned = now;
    const young = await uploaded('knowpost_image', 'image/png', 'young');
    // Written now by the sweeper's clock (ahead of the file system's here), in fractional seconds.
    const written = now + 0.25;
    utimesSync(join(root, young), written / 1000, written / 1000);
    // The check due already stays due: an upload URL never puts one off (asked for every ten
    // minutes, URLs would put it off for ever).
    expect((await row(id)).objects_check_at).toBe(retained);
    const round = await sweeper.runOnce();
    // Posts other tests left in the same database may be due too.
    expect(round.objects).toBeGreaterThanOrEqual(3);
    for (const key of [unconfirmed, unused, stray])
      expect({ key, exists: await exists(key) }).toEqual({ key, exists: false });
    for (const key of [body, shownCopy!, young])
      expect({ key, exists: await exists(key) }).toEqual({ key, exists: true });
    // It leaves the next one due a minute after the URL expires, as the URL would have.
    const scheduled = presigned + 600_000 + UPLOAD_CHECK_GRACE_MS;
    expect((await row(id)).objects_check_at).toBe(scheduled);
    now = scheduled;
    await sweeper.runOnce();
    expect(await exists(young)).toBe(true);
    const next = (await row(id)).objects_check_at!;
    expect(next).toBe(Math.ceil(written + hour));
    now = next;
    await sweeper.runOnce();
    expect(await exists(young)).toBe(false);
    expect(await exists(body)).toBe(true);
    // A PUT that started before its URL expired may still land: one more check, when it would be
    // older than the retention, and then none.
    const closing = presigned + 600_000 + hour;
    expect((await row(id)).uploads_open_until).toBe(closing);
    expect((await row(id)).objects_check_at).toBe(closing);
    const late = `posts/${id}/images/20250601/1a7e1a7e.png`;
    await storage.put(late, Buffer.from('late'), 'image/png');
    utimesSync(join(root, late), (closing - hour) / 1000, (closing - hour) / 1000);
    now = closing;
    await sweeper.runOnce();
    expect(await exists(late)).toBe(false);
    expect((await row(id)).objects_check_at).toBeNull();

    // A check moved while one ran stands.
    await repo.openUploads(id, now + 5, 0);
    await repo.openUploads(id, now, 0);
    expect((await row(id)).objects_check_at).toBe(now);
    await backend.db.kysely
      .updateTable('knowposts')
      .set({ objects_check_at: now + 5 })
      .where('id', '=', id)
      .execute();
    await repo.finishObjectsCheck(id, now, null);
    expect((await row(id)).objects_check_at).toBe(now + 5);
  });

  it('never puts a post’s objects check off for another upload URL', async () => {
    now = 1_000_000;
    const sut = newService();
    const id = await publishedPost(sut);
    const presign = () =>
      sut.presign(AUTHOR, { scene: 'knowpost_image', postId: id, contentType: 'image/png' });
    await presign();
    const first = now + 600_000 + UPLOAD_CHECK_GRACE_MS;
    expect((await row(id)).objects_check_at).toBe(first);
    // A URL every ten minutes (the first one's PUT may have stored anything): the check stays due
    // a minute after the first URL expired.
    for (let i = 0; i < 3; i++) {
      now += 600_000;
      await presign();
      expect((await row(id)).objects_check_at).toBe(first);
    }
  });

  it('keeps a check due when an upload URL is handed out while it runs', async () => {
    now = 2_000_000;
    const sut = newService({ uploadRetentionMs: 3_600_000 });
    const id = await publishedPost(sut);
    await backend.db.kysely
      .updateTable('knowposts')
      .set({ objects_check_at: now, uploads_open_until: null })
      .where('id', '=', id)
      .execute();
    const repo = new PostRepository(backend.db);
    const presign = () =>
      sut.presign(AUTHOR, { scene: 'knowpost_image', postId: id, contentType: 'image/png' });
    // The URL is handed out after the check read the post, before it ends.
    const racing = Object.assign(Object.create(repo) as PostRepository, {
      finishObjectsCheck: async (...args: Parameters<PostRepository['finishObjectsCheck']>) => {
        if (args[0] === id) await presign();
        return repo.finishObjectsCheck(...args);
      },
    });
    const options = { retentionMs: 3_600_000, maxBytes: { content: 1024, image: 1024 }, now: () => now };
    await new PostUploadSweeper(racing, storage, options).runOnce();
    expect((await row(id)).objects_check_at).toBe(now);
    // Run again, it leaves the next check due a minute after that URL expires.
    await new PostUploadSweeper(repo, storage, options).runOnce();
    expect((await row(id)).objects_check_at).toBe(now + 600_000 + UPLOAD_CHECK_GRACE_MS);
  });

  it('asks for a check of the post’s objects after a slow patch has made its copies', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    const image = (await uploadObject(sut, id, 'knowpost_image', 'image/png', 'slow')).objectKey;
    class Slow extends LocalObjectStorage {
      override async copy(from: string, to: string, ifEtag: string) {
        now += 3_600_000; // the copy takes an hour
        return super.copy(from, to, ifEtag);
      }
    }
    const slow = new PostService({
      ...serviceOptions(),
      storage: new Slow(root, 'http://files.invalid/files'),
    });
    const started = now;
    await slow.update(AUTHOR, id, { imgUrls: [image] });
    // The check the upload URL asked for stays due (no later than the patch's own first ask)...
    expect((await row(id)).objects_check_at).toBeLessThanOrEqual(started + 5 * 60_000);
    // ...and, run, leaves the next one due 5 minutes after the copies were made.
    const sweeper = new PostUploadSweeper(new PostRepository(backend.db), storage, {
      retentionMs: 24 * 3_600_000, // the service's default
      maxBytes: { content: 1024, image: 1024 },
      now: () => now,
    });
    await sweeper.runOnce();
    expect((await row(id)).objects_check_at).toBe(now + 5 * 60_000);
  });

  it('never puts a due objects check off for edits of the images, however often', async () => {
    now = 3_000_000;
    const sut = newService();
    const id = await publishedPost(sut);
    const { objectKey } = await uploadObject(sut, id, 'knowpost_image', 'image/png', 'kept');
    const due = (await row(id)).objects_check_at!;
    // An edit of the images every 4 minutes, refused or not: the check is never moved later.
    let latest = due;
    for (let i = 0; i < 5; i++) {
      now += 4 * 60_000;
      await sut.update(AUTHOR, id, { imgUrls: [] });
      await expect(sut.update(AUTHOR, id, { imgUrls: ['x'] })).rejects.toMatchObject({ status: 400 });
      const at = (await row(id)).objects_check_at!;
      expect(at).toBeLessThanOrEqual(latest);
      latest = at;
    }
    await sut.update(AUTHOR, id, { imgUrls: [objectKey] });
    expect((await row(id)).objects_check_at).toBeLessThanOrEqual(latest);
    expect(latest).toBeLessThan(now);
  });

  it('judges an edit of images again when another overlapped it, so every image shown exists', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    const exists = async (key: string) => (await storage.head(key)) !== null;
    const upload = async (text: string) =>
      (await uploadObject(sut, id, 'knowpost_image', 'image/png', text)).objectKey;
    /**
     * Runs `edit` on a service whose copies of `key` wait until another edit has finished: one to
     * `other` at the first copy, or one to a new URL at every copy when `other` is `'every'`.
     */
    async function overlapped(key: string, edit: string[], other: string[] | 'every') {
      const others: Promise<string>[] = [];
      class Pausing extends LocalObjectStorage {
        override async copy(from: string, to: string, ifEtag: string) {
          if (from === key && (other === 'every' || others.length === 0)) {
            const imgUrls = other === 'every' ? [`https://x.invalid/${others.length}.png`] : other;
            others.push(outcome(sut.update(AUTHOR, id, { imgUrls })));
            await others.at(-1);
          }
          return super.copy(from, to, ifEtag);
        }
      }
      const paused = new PostService({
        ...serviceOptions(),
        storage: new Pausing(root, 'http://files.invalid/files'),
      });
      const result = await outcome(paused.update(AUTHOR, id, { imgUrls: edit }));
      return [result, ...(await Promise.all(others))];
    }

    await sut.update(AUTHOR, id, { imgUrls: [await upload('first')] });
    const [first] = await imagesOf(id);
    // The other edit drops the first image; this one may not bring its deleted copy back.
    const second = await upload('second');
    expect(await overlapped(second, [first!, second], [])).toEqual(['400 BAD_REQUEST', 'ok']);
    expect(await imagesOf(id)).toEqual([]);
    expect(await exists(first!)).toBe(false);

    // Judged again, this one wins, and the other's image, no longer shown, goes.
    const third = await upload('third');
    const fourth = await upload('fourth');
    expect(await overlapped(third, [third], [fourth])).toEqual(['ok', 'ok']);
    const shown = await imagesOf(id);
    expect(shown).toHaveLength(1);
    expect(isStoredImageOf(id, third, shown[0]!)).toBe(true);
    expect(await exists(shown[0]!)).toBe(true);
    for (const gone of [third, fourth])
      expect({ gone, exists: await exists(gone) }).toEqual({ gone, exists: false });
    const copies = (await storage.listPrefix(`posts/${id}/pictures`)).map((o) => o.key);
    expect(copies.filter((key) => isStoredImageOf(id, fourth, key))).toEqual([]);

    // Overlapped at every try, it gives up after three and changes nothing.
    const fifth = await upload('fifth');
    expect(await overlapped(fifth, [fifth], 'every')).toEqual(['409 POST_CHANGED', 'ok', 'ok', 'ok']);
    expect(await imagesOf(id)).toEqual(['https://x.invalid/2.png']);
  });

  it('keeps the copy it shows when a patch names an upload again that still holds the same bytes', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    const image = await uploadObject(sut, id, 'knowpost_image', 'image/png', 'png');
    // The upload outlives the first patch (its delete failed), and the request is sent again.
    class Keeping extends LocalObjectStorage {
      override async delete(key: string) {
        if (key === image.objectKey) return;
        return super.delete(key);
      }
    }
    const keeping = new PostService({
      ...serviceOptions(),
      storage: new Keeping(root, 'http://files.invalid/files'),
    });
    await keeping.update(AUTHOR, id, { imgUrls: [image.objectKey] });
    const [first] = await imagesOf(id);
    await keeping.update(AUTHOR, id, { imgUrls: [image.objectKey] });
    expect(await imagesOf(id)).toEqual([first]);
    // Other bytes through the same upload URL are a new copy.
    await storage.put(image.objectKey, Buffer.from('other png'), 'image/png');
    await keeping.update(AUTHOR, id, { imgUrls: [image.objectKey] });
    const [second] = await imagesOf(id);
    expect(second).not.toBe(first);
    expect(await storage.head(first!)).toBeNull();
  });

  it('never deletes a copy an overlapping patch has just made of the same upload again', async () => {
    const sut = newService();
    const id = await publishedPost(sut);
    const image = await uploadObject(sut, id, 'knowpost_image', 'image/png', 'png');
    await sut.update(AUTHOR, id, { imgUrls: [image.objectKey] });
    // The same bytes PUT again through the still valid upload URL.
    await storage.put(image.objectKey, Buffer.from('png'), 'image/png');
    // A patch dropping the image has stored its list and is about to delete the copy it dropped;
    // meanwhile another patch names the upload again and stores a copy of it.
    let other: Promise<string> | undefined;
    class Pausing extends LocalObjectStorage {
      override async delete(key: string) {
        if (key.includes('/pictures/') && other === undefined) {
          other = outcome(sut.update(AUTHOR, id, { imgUrls: [image.objectKey] }));
          await other;
        }
        return super.delete(key);
      }
    }
    const dropping = new PostService({
      ...serviceOptions(),
      storage: new Pausing(root, 'http://files.invalid/files'),
    });
    expect(await outcome(dropping.update(AUTHOR, id, { imgUrls: [] }))).toBe('ok');
    expect(await other).toBe('ok');
    const shown = await imagesOf(id);
    expect(shown).toHaveLength(1);
    expect({ shown, exists: (await storage.head(shown[0]!)) !== null }).toEqual({ shown, exists: true });
  });

  it('keeps going when a change listener fails', async () => {
    const warned: unknown[] = [];
    const sut = new PostService({
      posts: new PostRepository(backend.db),
      storage,
      limiter: createSqliteRateLimiter(limiterDb, { prefix: 'listener:' }),
      outbox: new OutboxWriter(),
      ids,
      limits: { contentMaxBytes: 1024, imageMaxBytes: 1024, presignExpiresSeconds: 60 },
      onChange: [
        () => {
          throw new Error('cache down');
        },
        (change) => void changes.push(change),
      ],
      log: { warn: (obj: unknown) => void warned.push(obj) },
    });
    const id = await sut.createDraft(AUTHOR);
    expect(changes).toEqual([{ id, authorId: AUTHOR, kind: 'created', draft: true, unlisted: true }]);
    expect(warned).toHaveLength(1);
  });
});
