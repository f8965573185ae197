import { Value } from 'typebox/value';
import { describe, expect, it } from 'vitest';
import { KnowPostDetailResponse } from './detail.schema.js';
import {
  detailResponse,
  detailResponseBytes,
  feedResponse,
  feedResponseBytes,
  feedTemplate,
  fillFeedTemplate,
  type FeedEntry,
  type FeedPage,
} from './read-answers.js';
import { FeedPageResponse } from './feed.schema.js';
import type { PostView } from './post-read.model.js';
import type { AuthorRow } from './post-read.repository.js';

function post(id: string, fields: Partial<PostView> = {}): PostView {
  return {
    id,
    authorId: 7,
    status: 'published',
    visible: 'public',
    title: `title ${id}`,
    description: null,
    tags: [],
    imgUrls: [],
    contentKey: null,
    isTop: false,
    type: 'image_text',
    publishTime: 1,
    contentUrl: null,
    images: [],
    urlsExpireAt: 0,
    ...fields,
  };
}

const author: AuthorRow = {
  id: 7,
  nickname: '知光 "作者"',
  avatar: 'https://a.test/x.png',
  tagsJson: '["读书","\\u0000"]',
};

const decode = (p: FeedPage) => JSON.parse(feedResponseBytes(p).toString('utf8')) as unknown;

describe('feed page bytes', () => {
  it('say what the JSON model says, with escapes, non-ASCII text, nulls and missing parts', () => {
    const entries: FeedEntry[] = [
      {
        post: post('1', {
          title: 'quote " backslash \\ tab \t newline \n nul \u0000 emoji 🎉 lone \ud800 end',
          description: '中文描述 \u2028 line separator',
          tags: ['a', '标签', '"q"'],
          images: ['https://files.test/posts/1/images/a.png?X-Amz-Signature=abc&x=1'],
          isTop: true,
        }),
        author,
        counts: [9, 3, 2, 0, 0],
        flags: { like: true, fav: false },
      },
      { post: post('2'), author: undefined, counts: undefined, flags: { like: false, fav: true } },
    ];
    const page: FeedPage = { entries, page: 3, size: 2, hasMore: true };
    const model = feedResponse(page);
    expect(decode(page)).toEqual(model);
    expect(Value.Check(FeedPageResponse, decode(page))).toBe(true);
    expect(model.items[0]).toMatchObject({ likeCount: 3, favoriteCount: 2, liked: true, isTop: true });
    expect(model.items[1]).toMatchObject({
      authorNickname: null,
      likeCount: 0,
      faved: true,
      coverImage: null,
    });
  });

  it('answers an empty page', () => {
    const page: FeedPage = { entries: [], page: 1, size: 20, hasMore: false };
    expect(decode(page)).toEqual({ items: [], page: 1, size: 20, hasMore: false });
  });

  it('reuses the encoded part of a cached post and author, and writes counts and flags each time', () => {
    const p = post('5', { title: '同一篇' });
    const first = decode({
      entries: [{ post: p, author, counts: [0, 1, 0, 0, 0], flags: { like: false, fav: false } }],
      page: 1,
      size: 1,
      hasMore: false,
    });
    const second = decode({
      entries: [{ post: p, author, counts: [0, 2, 1, 0, 0], flags: { like: true, fav: true } }],
      page: 1,
      size: 1,
      hasMore: false,
    });
    expect(first).toMatchObject({ items: [{ title: '同一篇', likeCount: 1, liked: false }] });
    expect(second).toMatchObject({
      items: [{ title: '同一篇', likeCount: 2, favoriteCount: 1, liked: true, faved: true }],
    });
    // A reloaded post is a new object: its new fields show.
    const reloaded = { ...p, title: '改过' };
    expect(
      decode({
        entries: [{ post: reloaded, author, counts: undefined, flags: { like: false, fav: false } }],
        page: 1,
        size: 1,
        hasMore: false,
      }),
    ).toMatchObject({ items: [{ title: '改过' }] });
  });

  it('fill a page template with any flags to the same bytes as writing the page with them', () => {
    const entries: FeedEntry[] = ['11', '12', '13', '14', '15'].map((id, i) => ({
      post: post(id, {
        title: `第 ${id} 篇 "q"`,
        isTop: i === 2,
        images: i === 1 ? ['https://x.test/a.png'] : [],
      }),
      author: i === 3 ? undefined : author,
      counts: i === 4 ? undefined : [i, i * 10, i + 1, 0, 0],
      flags: { like: false, fav: false },
    }));
    const page: FeedPage = { entries, page: 2, size: 5, hasMore: false };
    const template = feedTemplate(page);
    for (let combo = 0; combo < 1024; combo += 37) {
      const flags = entries.map((_, i) => ({
        like: ((combo >> (2 * i)) & 1) === 1,
        fav: ((combo >> (2 * i + 1)) & 1) === 1,
      }));
      const expected = feedResponseBytes({
        ...page,
        entries: entries.map((e, i) => ({ ...e, flags: flags[i]! })),
      });
      expect(fillFeedTemplate(template, (i) => flags[i]!).equals(expected)).toBe(true);
    }
    const empty: FeedPage = { entries: [], page: 9, size: 20, hasMore: false };
    expect(
      fillFeedTemplate(feedTemplate(empty), () => ({ like: true, fav: true })).equals(
        feedResponseBytes(empty),
      ),
    ).toBe(true);
  });

  it('write details that say what the JSON model says, for shared posts and for drafts', () => {
    const shared: FeedEntry = {
      post: post('9', {
        title: '标题 "q" \\ \u0001',
        description: null,
        contentUrl: 'https://files.test/posts/9/content.md?X-Amz-Signature=x&a=b',
        images: ['https://files.test/posts/9/images/1.png?sig', 'https://cdn.example/x.jpg'],
        tags: ['技术'],
        isTop: true,
        publishTime: Date.UTC(2026, 11, 1, 8, 30),
      }),
      author,
      counts: [4, 2, 1, 0, 0],
      flags: { like: false, fav: true },
    };
    const draft: FeedEntry = {
      post: post('10', { status: 'draft', visible: 'private', title: null, publishTime: null }),
      author: undefined,
      counts: undefined,
      flags: { like: false, fav: false },
    };
    for (const d of [shared, draft]) {
      const decoded = JSON.parse(detailResponseBytes(d).toString('utf8')) as unknown;
      expect(decoded).toEqual(detailResponse(d));
      expect(Value.Check(KnowPostDetailResponse, decoded)).toBe(true);
    }
    expect(detailResponse(shared)).toMatchObject({
      authorId: '7',
      publishTime: '2026-12-01T08:30:00.000Z',
      likeCount: 2,
      favoriteCount: 1,
      faved: true,
      isTop: true,
    });
    expect(detailResponse(draft)).toMatchObject({ publishTime: null, authorNickname: null, likeCount: 0 });
    // Counts and flags are written per request over the parts kept for the post.
    const later = {
      ...shared,
      counts: [4, 3, 1, 0, 0] as FeedEntry['counts'],
      flags: { like: true, fav: true },
    };
    expect(JSON.parse(detailResponseBytes(later).toString('utf8'))).toMatchObject({
      likeCount: 3,
      liked: true,
    });
  });
});
