import { describe, expect, it } from 'vitest';
import type { PostReadRow } from './post-read.repository.js';
import { isListed, mayRead, PostUrlSigner } from './post-read.model.js';

const ID = '7200000000000000001';
const row = (over: Partial<PostReadRow> = {}): PostReadRow => ({
  id: ID,
  authorId: 10,
  status: 'published',
  visible: 'public',
  title: 't',
  description: null,
  tags: [],
  imgUrls: [],
  contentKey: `posts/${ID}/content.md`,
  isTop: false,
  type: 'image_text',
  publishTime: 1,
  ...over,
});

describe('who may read a post', () => {
  const cases: [Partial<PostReadRow>, { anyone: boolean; author: boolean; listed: boolean }][] = [
    [{}, { anyone: true, author: true, listed: true }],
    [{ visible: 'unlisted' }, { anyone: false, author: true, listed: false }],
    [{ visible: 'private' }, { anyone: false, author: true, listed: false }],
    [{ visible: 'followers' }, { anyone: false, author: true, listed: false }],
    [{ visible: 'school' }, { anyone: false, author: true, listed: false }],
    [{ status: 'draft' }, { anyone: false, author: true, listed: false }],
    [{ status: 'deleted' }, { anyone: false, author: false, listed: false }],
    [
      { status: 'deleted', visible: 'private' },
      { anyone: false, author: false, listed: false },
    ],
  ];
  it.each(cases)('%o', (over, expected) => {
    const post = row(over);
    expect({
      anyone: mayRead(post, null) && mayRead(post, 11),
      author: mayRead(post, 10),
      listed: isListed(post),
    }).toEqual(expected);
  });
});

describe(PostUrlSigner.name, () => {
  const setup = () => {
    let now = 1_000_000;
    const signed: string[] = [];
    const storage = {
      presignGet: async (key: string, ttl: number) => {
        signed.push(key);
        return `https://files.test/${key}?ttl=${ttl}&at=${now}`;
      },
    };
    return { sut: new PostUrlSigner(storage, 3600, () => now), signed, advance: (ms: number) => (now += ms) };
  };

  it('signs the body and the post’s own image keys, keeps absolute URLs and drops anything else', async () => {
    const { sut } = setup();
    const image = `posts/${ID}/images/20250101/0123abcd.png`;
    const view = await sut.sign(
      row({
        imgUrls: [
          image,
          'https://cdn.example.test/x.jpg',
          `posts/999/images/20250101/0123abcd.png`,
          '../etc/passwd',
        ],
      }),
    );
    expect(view.contentUrl).toBe(`https://files.test/posts/${ID}/content.md?ttl=3600&at=1000000`);
    expect(view.images).toEqual([
      `https://files.test/${image}?ttl=3600&at=1000000`,
      'https://cdn.example.test/x.jpg',
    ]);
    expect(view.urlsExpireAt).toBe(1_000_000 + 3_600_000);
    expect(view.imgUrls).toHaveLength(4);
  });

  it('leaves the body URL empty for a missing or foreign content key', async () => {
    const { sut } = setup();
    expect((await sut.sign(row({ contentKey: null }))).contentUrl).toBeNull();
    expect((await sut.sign(row({ contentKey: 'posts/1/content.md' }))).contentUrl).toBeNull();
  });

  it('signs again only once half of the URLs’ validity is used up', async () => {
    const { sut, signed, advance } = setup();
    const view = await sut.sign(row());
    advance(1_799_000);
    expect(await sut.refresh(view)).toBe(view);
    advance(2_000);
    const fresh = await sut.refresh(view);
    expect(fresh.contentUrl).not.toBe(view.contentUrl);
    expect(fresh.urlsExpireAt).toBe(1_000_000 + 1_801_000 + 3_600_000);
    expect(signed).toHaveLength(2);
  });
});
