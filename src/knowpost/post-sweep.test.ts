import { describe, expect, it } from 'vitest';
import type { PostRecord } from './post.repository.js';
import { PostUploadSweeper } from './post-sweep.js';

const HOUR = 3_600_000;
const NOW = 100 * HOUR;

function post(id: string, fields: Partial<PostRecord> = {}): PostRecord {
  return {
    id,
    authorId: 1,
    status: 'published',
    visible: 'public',
    contentKey: null,
    contentEtag: null,
    contentSha256: null,
    imgUrls: [],
    imgUrlsJson: '[]',
    uploadsOpenUntil: null,
    publicEpoch: 0,
    publicCrossingsJson: '[]',
    ...fields,
  };
}

describe(PostUploadSweeper.name, () => {
  it('keeps what the post refers to, young copies and unknown keys, and goes on past a post the store refuses, trying it again later', async () => {
    const legacyBody = 'posts/1/content.md';
    const legacyImage = 'posts/1/images/20250101/00000000.png';
    // Post 3's body; post 1's was confirmed before copies were made.
    const usedBody = `posts/3/body/${'d'.repeat(64)}.md`;
    const youngBody = `posts/3/body/${'e'.repeat(64)}.md`;
    const old = NOW - HOUR;
    const objects = new Map<string, number>([
      [legacyBody, old],
      [legacyImage, old],
      ['posts/1/content.txt', old],
      ['posts/1/images/20250101/00000001.png', old],
      [`posts/1/body/${'a'.repeat(64)}.md`, old],
      [`posts/1/body/${'c'.repeat(64)}.txt`, old],
      [usedBody, old],
      [`posts/1/pictures/${'b'.repeat(32)}.png`, old],
      ['posts/1/notes/x.txt', old],
      ['posts/3/images/20250101/00000002.png', old],
      [youngBody, NOW - 60_000],
    ]);
    const finished: [string, number, number | null][] = [];
    const posts = {
      objectsCheckDue: async (now: number) => {
        expect(now).toBe(NOW);
        return ['1', '2', '3'].map((id) => ({ id, due: 7 }));
      },
      finishObjectsCheck: async (id: string, due: number, next: number | null) =>
        void finished.push([id, due, next]),
      find: async (id: string) =>
        post(
          id,
          id === '1'
            ? { contentKey: legacyBody, imgUrls: [legacyImage, 'https://x.invalid/a.png'] }
            : id === '3'
              ? { contentKey: usedBody }
              : {},
        ),
    };
    const storage = {
      listPrefix: async (prefix: string) => {
        if (prefix.startsWith('posts/2')) throw new Error('AccessDenied');
        return [...objects]
          .filter(([key]) => key.startsWith(`${prefix}/`))
          .map(([key, lastModified]) => ({ key, lastModified, size: 10 }));
      },
      delete: async (key: string) => void objects.delete(key),
      deletePrefix: async () => 0,
    };
    const errors: string[] = [];
    const sut = new PostUploadSweeper(posts, storage, {
      retentionMs: HOUR,
      maxBytes: { content: 10, image: 10 },
      now: () => NOW,
      onError: (_err, id) => errors.push(id),
    });
    expect(await sut.runOnce()).toEqual({ posts: 2, objects: 6 });
    expect([...objects.keys()]).toEqual([
      legacyBody,
      legacyImage,
      usedBody,
      'posts/1/notes/x.txt',
      youngBody,
    ]);
    expect(errors).toEqual(['2']);
    expect(finished).toEqual([
      ['1', 7, null],
      ['2', 7, NOW + 600_000],
      ['3', 7, NOW - 60_000 + HOUR],
    ]);
  });

  it('checks again when the youngest unused object is old enough, and removes what reached a deleted post after its purge', async () => {
    const objects = new Map<string, number>([
      ['posts/1/content.txt', NOW - 10 * 60_000],
      ['posts/1/images/20250101/00000001.png', NOW - 20 * 60_000],
      ['posts/2/content.txt', NOW - 2 * HOUR],
      ['posts/3/images/20250101/00000001.png', NOW - 60_000],
    ]);
    const finished: [string, number | null][] = [];
    const sut = new PostUploadSweeper(
      {
        objectsCheckDue: async () => [
          { id: '1', due: 1 },
          { id: '2', due: 1 },
          { id: '3', due: 1 },
        ],
        finishObjectsCheck: async (id, _due, next) => void finished.push([id, next]),
        // Post 3 was deleted while one of its upload URLs may still deliver.
        find: async (id) =>
          post(
            id,
            id === '2'
              ? { status: 'deleted' }
              : id === '3'
                ? { status: 'deleted', uploadsOpenUntil: NOW + HOUR }
                : {},
          ),
      },
      {
        listPrefix: async (prefix) =>
          [...objects]
            .filter(([key]) => key.startsWith(`${prefix}/`))
            .map(([key, lastModified]) => ({ key, lastModified, size: 10 })),
        delete: async (key) => void objects.delete(key),
        deletePrefix: async (prefix) => {
          const keys = [...objects.keys()].filter((key) => key.startsWith(`${prefix}/`));
          for (const key of keys) objects.delete(key);
          return keys.length;
        },
      },
      { retentionMs: HOUR, maxBytes: { content: 10, image: 10 }, now: () => NOW },
    );
    expect(await sut.runOnce()).toEqual({ posts: 3, objects: 2 });
    expect([...objects.keys()]).toEqual(['posts/1/content.txt', 'posts/1/images/20250101/00000001.png']);
    expect(finished).toEqual([
      ['1', NOW - 20 * 60_000 + HOUR],
      ['2', null],
      ['3', NOW + HOUR],
    ]);
  });

  it('removes an upload too large to be confirmed or shown at once, whatever its age', async () => {
    const young = NOW - 60_000;
    const objects = new Map<string, [number, number]>([
      ['posts/1/content.md', [young, 101]],
      ['posts/1/content.txt', [young, 100]],
      ['posts/1/images/20250101/00000001.png', [young, 201]],
      ['posts/1/images/20250101/00000002.png', [young, 200]],
      // what the post uses is kept; a body copy is judged by its age alone
      ['posts/1/images/20250101/00000003.png', [young, 999]],
      [`posts/1/body/${'a'.repeat(64)}.md`, [young, 999]],
    ]);
    const finished: (number | null)[] = [];
    const sut = new PostUploadSweeper(
      {
        objectsCheckDue: async () => [{ id: '1', due: 1 }],
        finishObjectsCheck: async (_id, _due, next) => void finished.push(next),
        find: async (id) => post(id, { imgUrls: ['posts/1/images/20250101/00000003.png'] }),
      },
      {
        listPrefix: async (prefix) =>
          [...objects]
            .filter(([key]) => key.startsWith(`${prefix}/`))
            .map(([key, [lastModified, size]]) => ({ key, lastModified, size })),
        delete: async (key) => void objects.delete(key),
        deletePrefix: async () => 0,
      },
      { retentionMs: HOUR, maxBytes: { content: 100, image: 200 }, now: () => NOW },
    );
    expect(await sut.runOnce()).toEqual({ posts: 1, objects: 2 });
    expect([...objects.keys()]).toEqual([
      'posts/1/content.txt',
      'posts/1/images/20250101/00000002.png',
      'posts/1/images/20250101/00000003.png',
      `posts/1/body/${'a'.repeat(64)}.md`,
    ]);
    expect(finished).toEqual([young + HOUR]);
  });

  it('leaves a check due while an upload URL may still deliver an object, and none after', async () => {
    const finished: [string, number | null][] = [];
    // Uploads may arrive until a URL's expiry plus the retention.
    const openUntil: Record<string, number> = {
      '1': NOW + HOUR, // its last URL expired just now
      '2': NOW, // no more uploads
      '3': NOW + 2 * HOUR, // a URL still valid for an hour
      '4': NOW + HOUR - 60_000, // its last URL expired a minute ago
    };
    const sut = new PostUploadSweeper(
      {
        objectsCheckDue: async () => Object.keys(openUntil).map((id) => ({ id, due: 1 })),
        finishObjectsCheck: async (id, _due, next) => void finished.push([id, next]),
        find: async (id) => post(id, { uploadsOpenUntil: openUntil[id]! }),
      },
      {
        // post 3 holds a young upload that is due before its uploads close
        listPrefix: async (prefix) =>
          prefix === 'posts/3' ? [{ key: 'posts/3/content.md', lastModified: NOW - 60_000, size: 1 }] : [],
        delete: async () => undefined,
        deletePrefix: async () => 0,
      },
      { retentionMs: HOUR, maxBytes: { content: 10, image: 10 }, now: () => NOW },
    );
    await sut.runOnce();
    expect(finished).toEqual([
      // A minute after the last URL expired: what it let through too large goes then.
      ['1', NOW + 60_000],
      ['2', null],
      ['3', NOW - 60_000 + HOUR],
      ['4', NOW + HOUR - 60_000],
    ]);
  });
});

describe('a sweep meeting a store out of reach', () => {
  it('leaves the other checks for the next round', async () => {
    const finished: [string, number | null][] = [];
    const sut = new PostUploadSweeper(
      {
        objectsCheckDue: async () => ['1', '2', '3'].map((id) => ({ id, due: 1 })),
        finishObjectsCheck: async (id, _due, next) => void finished.push([id, next]),
        find: async (id) => post(id),
      },
      {
        listPrefix: async () => {
          throw Object.assign(new Error('connect ETIMEDOUT'), { code: 'ETIMEDOUT' });
        },
        delete: async () => undefined,
        deletePrefix: async () => 0,
      },
      { retentionMs: HOUR, maxBytes: { content: 100, image: 200 }, now: () => NOW },
    );
    expect(await sut.runOnce()).toEqual({ posts: 0, objects: 0 });
    expect(finished).toEqual([['1', NOW + 600_000]]);
  });
});

describe('a sweep stopped half-way', () => {
  it('checks no further post once its signal is aborted, leaving those checks due', async () => {
    const stop = new AbortController();
    const finished: string[] = [];
    const sut = new PostUploadSweeper(
      {
        objectsCheckDue: async () => ['1', '2', '3'].map((id) => ({ id, due: 1 })),
        finishObjectsCheck: async (id) => {
          finished.push(id);
          stop.abort(); // the worker is told to stop while the first check ends
        },
        find: async (id) => post(id),
      },
      { listPrefix: async () => [], delete: async () => undefined, deletePrefix: async () => 0 },
      { retentionMs: HOUR, maxBytes: { content: 100, image: 200 }, now: () => NOW },
    );
    expect(await sut.runOnce(stop.signal)).toEqual({ posts: 1, objects: 0 });
    expect(finished).toEqual(['1']);
  });
});
