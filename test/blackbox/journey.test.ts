import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  Client,
  eventually,
  signUp,
  startServer,
  type ProfileName,
  type Server,
  type SignedUp,
} from './harness.js';
import { callAs, fetchBytes, md5, PNG, putObject, sha256, type Presigned } from './posts.js';

/**
 * One post's whole life as two clients see it, with the server's default settings: an author writes
 * and publishes it through presigned uploads, a reader finds it, likes it and reads it, and both see
 * the like and the view within the promised 1.5 s.
 */
const MARKDOWN = Buffer.from(
  [
    '# Exact like counters with Redis bitmaps',
    '',
    'Like counts must be exact and fast. This post shows how sharded bitmaps record who liked what,',
    'and how the counts are rebuilt from those facts after a failure.',
    '',
    '## Why',
    '',
    'The old design lost counts whenever the message broker was down.',
    '',
  ].join('\n'),
);
const SHOWN_WITHIN_MS = 1500;

describe.each<ProfileName>(['embedded', 'cluster'])('a post from draft to likes (%s profile)', (profile) => {
  let server: Server;
  let client: Client;

  beforeAll(async () => {
    server = await startServer(profile);
    client = new Client(server.baseUrl);
  });
  afterAll(async () => server?.stop());

  /** Asserts the status (showing the body when it differs) and returns the body. */
  async function expectOk(answer: ReturnType<Client['call']>, status = 200): Promise<any> {
    const res = await answer;
    expect(res.status, JSON.stringify(res.body)).toBe(status);
    return res.body;
  }

  it('is written, published, found, liked and counted', async () => {
    const author = await signUp(server, client);
    /** A write that answers 204 No Content. */
    const write = (user: SignedUp, method: string, path: string, body?: unknown) =>
      expectOk(callAs(client, user, method, path, body), 204);

    // Draft, then both uploads straight to storage through the URLs the server signs.
    const { id } = await expectOk(callAs(client, author, 'POST', '/api/v1/knowposts/drafts'));
    const content: Presigned = await expectOk(
      callAs(client, author, 'POST', '/api/v1/storage/presign', {
        scene: 'knowpost_content',
        postId: id,
        contentType: 'text/markdown',
      }),
    );
    const image: Presigned = await expectOk(
      callAs(client, author, 'POST', '/api/v1/storage/presign', {
        scene: 'knowpost_image',
        postId: id,
        contentType: 'image/png',
        ext: '.png',
      }),
    );
    expect(content.objectKey).toBe(`posts/${id}/content.md`);
    expect(image.objectKey).toMatch(new RegExp(`^posts/${id}/images/\\d{8}/[0-9a-f]{8}\\.png$`));
    const contentPut = await putObject(content, MARKDOWN);
    const imagePut = await putObject(image, PNG);
    expect([contentPut.status, imagePut.status]).toEqual([200, 200]);
    expect(contentPut.etag?.replaceAll('"', '')).toBe(md5(MARKDOWN));
    expect(imagePut.etag?.replaceAll('"', '')).toBe(md5(PNG));

    await write(author, 'POST', `/api/v1/knowposts/${id}/content/confirm`, {
      objectKey: content.objectKey,
      etag: contentPut.etag,
      size: MARKDOWN.length,
      sha256: sha256(MARKDOWN),
    });
    await write(author, 'PATCH', `/api/v1/knowposts/${id}`, {
      title: 'Exact like counters',
      tags: ['redis', 'counters'],
      imgUrls: [image.objectKey],
      visible: 'public',
    });

    // No AI key is configured, so the offline summariser answers.
    const { description } = await expectOk(
      callAs(client, author, 'POST', '/api/v1/knowposts/description/suggest', {
        content: MARKDOWN.toString('utf8'),
      }),
    );
    expect(typeof description).toBe('string');
    expect([...description].length).toBeGreaterThan(0);
    expect([...description].length).toBeLessThanOrEqual(50);
    // It is deterministic and picks its words from the post.
    expect(MARKDOWN.toString('utf8')).toContain(description);
    await write(author, 'PATCH', `/api/v1/knowposts/${id}`, { description });
    await write(author, 'POST', `/api/v1/knowposts/${id}/publish`);

    // Found first in the public feed and in the author's own list.
    const feed = await expectOk(client.call('GET', '/api/v1/knowposts/feed'));
    expect(feed.items[0]).toMatchObject({ id, title: 'Exact like counters', description, likeCount: 0 });
    const mine = await expectOk(callAs(client, author, 'GET', '/api/v1/knowposts/mine'));
    expect(mine.items[0]).toMatchObject({ id, title: 'Exact like counters', description });

    // The detail names the post and hands out URLs that serve exactly the uploaded bytes.
    let detailReads = 0;
    const detail = (user?: SignedUp) => {
      detailReads++;
      return expectOk(
        client.call('GET', `/api/v1/knowposts/detail/${id}`, user ? { token: user.accessToken } : {}),
      );
    };
    const shown = await detail();
    expect(shown).toMatchObject({
      id,
      title: 'Exact like counters',
      description,
      tags: ['redis', 'counters'],
      authorId: String(author.userId),
      visible: 'public',
      likeCount: 0,
      liked: false,
    });
    expect(await fetchBytes(shown.contentUrl)).toEqual({ status: 200, bytes: MARKDOWN });
    expect(shown.images).toHaveLength(1);
    expect(await fetchBytes(shown.images[0])).toEqual({ status: 200, bytes: PNG });

    // A second user likes it and reads it; both show within 1.5 s of the like's answer.
    const reader = await signUp(server, client);
    const liked = await expectOk(
      callAs(client, reader, 'POST', '/api/v1/action/like', { entityType: 'knowpost', entityId: id }),
    );
    const likedAt = Date.now();
    expect(liked).toEqual({ changed: true, liked: true });
    const readsBeforeReader = detailReads;
    await detail(reader);

    const counts = () => expectOk(client.call('GET', `/api/v1/counter/knowpost/${id}`));
    const feedItem = async (user: SignedUp) =>
      (await expectOk(callAs(client, user, 'GET', '/api/v1/knowposts/feed'))).items.find(
        (item: { id: string }) => item.id === id,
      );
    const seen = await eventually(
      async () => {
        // Counts first: every detail read below adds a view of its own.
        const read = (await counts()).counts.read as number;
        return { read, detail: await detail(reader), item: await feedItem(reader) };
      },
      (v) =>
        v.read > readsBeforeReader &&
        v.detail.likeCount === 1 &&
        v.detail.liked === true &&
        v.item?.likeCount === 1 &&
        v.item?.liked === true,
      SHOWN_WITHIN_MS - (Date.now() - likedAt),
    );
    const elapsed = Date.now() - likedAt;
    expect(seen.detail).toMatchObject({ likeCount: 1, liked: true });
    expect(seen.item).toMatchObject({ likeCount: 1, liked: true });
    expect(seen.read).toBeGreaterThan(readsBeforeReader);
    expect(elapsed).toBeLessThanOrEqual(SHOWN_WITHIN_MS);

    // The author sees the count without the reader's flag; every detail read counts once.
    expect(await detail(author)).toMatchObject({ likeCount: 1, liked: false });
    expect(await feedItem(author)).toMatchObject({ likeCount: 1, liked: false });
    const total = await eventually(
      async () => (await counts()).counts.read as number,
      (read) => read === detailReads,
      5000,
    );
    expect(total).toBe(detailReads);
  });
});
