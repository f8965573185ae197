import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expect4xx, randomBodies, WRONG_VALUES } from './fuzz.js';
import { Client, signUp, startServer, type ProfileName, type Server, type SignedUp } from './harness.js';
import {
  callAs,
  createDraft,
  draftWithContent,
  fetchBytes,
  md5,
  PNG,
  putObject as put,
  sha256,
  type Presigned,
} from './posts.js';

/**
 * Publishing a post the way a client does: draft, presigned uploads straight to storage (the app's
 * own file routes on embedded, the S3 store on cluster), confirm, metadata, publish; and everything
 * it must refuse.
 */
const CONTENT_MAX = 2048;
const IMAGE_MAX = 4096;
describe.each<ProfileName>(['embedded', 'cluster'])('publishing posts (%s profile)', (profile) => {
  let server: Server;
  let client: Client;
  let author: SignedUp;
  let other: SignedUp;

  beforeAll(async () => {
    server = await startServer(profile, {
      ZG_POST_CONTENT_MAX_BYTES: String(CONTENT_MAX),
      ZG_POST_IMAGE_MAX_BYTES: String(IMAGE_MAX),
      ZG_BODY_LIMIT_BYTES: '16384',
    });
    client = new Client(server.baseUrl);
    [author, other] = [await signUp(server, client), await signUp(server, client)];
  });
  afterAll(async () => server?.stop());

  const as = (user: SignedUp) => ({
    call: (method: string, path: string, body?: unknown) => callAs(client, user, method, path, body),
  });
  const draft = (user: SignedUp) => createDraft(client, user);
  const presign = (user: SignedUp, body: Record<string, unknown>) =>
    as(user).call('POST', '/api/v1/storage/presign', body);

  it('takes a post from draft to published through presigned uploads', async () => {
    const id = await draft(author);

    const markdown = Buffer.from('# Title\n\nSome **markdown** body.\n');
    const content = await presign(author, {
      scene: 'knowpost_content',
      postId: id,
      contentType: 'text/markdown',
    });
    expect(content.status).toBe(200);
    expect(content.body).toMatchObject({
      objectKey: `posts/${id}/content.md`,
      headers: { 'Content-Type': 'text/markdown' },
      expiresIn: 600,
    });
    const contentPut = await put(content.body, markdown);
    expect(contentPut.status).toBe(200);
    expect(contentPut.etag?.replaceAll('"', '')).toBe(md5(markdown));

    const image = await presign(author, {
      scene: 'knowpost_image',
      postId: id,
      contentType: 'image/png',
      ext: '.png',
    });
    expect(image.status).toBe(200);
    expect(image.body.objectKey).toMatch(new RegExp(`^posts/${id}/images/\\d{8}/[0-9a-f]{8}\\.png$`));
    const imagePut = await put(image.body, PNG);
    expect(imagePut.status).toBe(200);
    expect(imagePut.etag?.replaceAll('"', '')).toBe(md5(PNG));

    const publishEarly = await as(author).call('POST', `/api/v1/knowposts/${id}/publish`);
    expect([publishEarly.status, publishEarly.body.code]).toEqual([409, 'CONTENT_REQUIRED']);

    const confirm = await as(author).call('POST', `/api/v1/knowposts/${id}/content/confirm`, {
      objectKey: content.body.objectKey,
      etag: contentPut.etag,
      size: markdown.length,
      sha256: sha256(markdown),
    });
    expect(confirm.status).toBe(204);

    const patch = await as(author).call('PATCH', `/api/v1/knowposts/${id}`, {
      title: 'A first post',
      tags: ['intro', 'markdown'],
      tagId: 1,
      imgUrls: [image.body.objectKey, 'https://images.example.com/elsewhere.png'],
      description: 'Short and sweet',
      visible: 'public',
      isTop: false,
    });
    expect(patch.status).toBe(204);
    expect((await as(author).call('PATCH', `/api/v1/knowposts/${id}/top`, { isTop: true })).status).toBe(204);
    expect(
      (await as(author).call('PATCH', `/api/v1/knowposts/${id}/visibility`, { visible: 'unlisted' })).status,
    ).toBe(204);

    expect((await as(author).call('POST', `/api/v1/knowposts/${id}/publish`)).status).toBe(204);
    // Unlisted, it is its author's alone, as a private post is.
    expect((await as(other).call('GET', `/api/v1/knowposts/detail/${id}`)).status).toBe(404);
    expect((await as(other).call('PATCH', `/api/v1/knowposts/${id}`, { title: 'mine' })).status).toBe(404);
    expect(
      (await as(author).call('PATCH', `/api/v1/knowposts/${id}/visibility`, { visible: 'public' })).status,
    ).toBe(204);
    // The upload URL still works, but what readers get is what confirm checked.
    expect((await put(content.body, Buffer.from('replaced after confirm'))).status).toBe(200);
    const detail = await as(other).call('GET', `/api/v1/knowposts/detail/${id}`);
    expect(detail.status).toBe(200);
    expect(await fetchBytes(detail.body.contentUrl as string)).toEqual({ status: 200, bytes: markdown });
    const again = await as(author).call('POST', `/api/v1/knowposts/${id}/publish`);
    expect(again.status).toBe(409);
    expect(again.body).toMatchObject({ code: 'INVALID_STATE' });
    expect(typeof again.body.requestId).toBe('string');

    // Others may see it (public) but not change it.
    expect((await as(other).call('PATCH', `/api/v1/knowposts/${id}`, { title: 'mine' })).status).toBe(403);
    expect((await as(other).call('DELETE', `/api/v1/knowposts/${id}`)).status).toBe(403);

    expect((await as(author).call('DELETE', `/api/v1/knowposts/${id}`)).status).toBe(204);
    expect((await as(author).call('PATCH', `/api/v1/knowposts/${id}`, { title: 'x' })).status).toBe(404);
    // A retried DELETE succeeds and changes nothing; someone else still cannot find the post.
    expect((await as(author).call('DELETE', `/api/v1/knowposts/${id}`)).status).toBe(204);
    expect((await as(other).call('DELETE', `/api/v1/knowposts/${id}`)).status).toBe(404);
    const afterDelete = await as(author).call('POST', `/api/v1/knowposts/${id}/publish`);
    expect([afterDelete.status, afterDelete.body.code]).toEqual([409, 'INVALID_STATE']);
    const presignDeleted = await presign(author, {
      scene: 'knowpost_image',
      postId: id,
      contentType: 'image/png',
    });
    expect([presignDeleted.status, presignDeleted.body.code]).toEqual([409, 'INVALID_STATE']);
    expect(server.logLines().filter((line) => Number(line.level) >= 50)).toEqual([]);
  });

  it('takes the upload URL and detail image URLs a client sends back as the images they name', async () => {
    const id = await draft(author);
    const image = await presign(author, { scene: 'knowpost_image', postId: id, contentType: 'image/png' });
    expect((await put(image.body, PNG)).status).toBe(200);
    // Clients of the original service show an image at its upload URL without the query.
    const address = (image.body.putUrl as string).split('?')[0]!;
    const patch = (imgUrls: string[]) => as(author).call('PATCH', `/api/v1/knowposts/${id}`, { imgUrls });
    expect((await patch([address])).status).toBe(204);
    const read = async () =>
      (await as(author).call('GET', `/api/v1/knowposts/detail/${id}`)).body.images as string[];
    const [shown] = await read();
    expect(shown).not.toBe(address);
    expect(await fetchBytes(shown!)).toEqual({ status: 200, bytes: PNG });
    // An edit sending back what the detail showed keeps showing it (no outside URL that expires).
    expect((await patch([shown!])).status).toBe(204);
    const [kept] = await read();
    expect(kept!.split('?')[0]).toBe(shown!.split('?')[0]);
    expect(await fetchBytes(kept!)).toEqual({ status: 200, bytes: PNG });
  });

  it('lets only the author presign, confirm and edit', async () => {
    const hidden = await draft(author);
    const { id: visible } = await draftWithContent(client, author);
    expect((await as(author).call('POST', `/api/v1/knowposts/${visible}/publish`)).status).toBe(204);

    const body = { scene: 'knowpost_content', contentType: 'text/markdown' };
    expect((await presign(other, { ...body, postId: visible })).status).toBe(403);
    expect((await presign(other, { ...body, postId: hidden })).status).toBe(404);
    expect((await presign(other, { ...body, postId: '123456789' })).status).toBe(404);
    expect(
      (await client.call('POST', '/api/v1/storage/presign', { body: { ...body, postId: hidden } })).status,
    ).toBe(401);
    expect((await client.call('POST', '/api/v1/knowposts/drafts')).status).toBe(401);
    expect((await client.call('POST', `/api/v1/knowposts/${hidden}/publish`)).status).toBe(401);

    const confirm = { objectKey: `posts/${hidden}/content.md`, etag: '"x"', size: 1, sha256: 'a'.repeat(64) };
    expect(
      (await as(other).call('POST', `/api/v1/knowposts/${hidden}/content/confirm`, confirm)).status,
    ).toBe(404);
    expect(
      (await as(other).call('PATCH', `/api/v1/knowposts/${hidden}/visibility`, { visible: 'public' })).status,
    ).toBe(404);
    expect((await as(other).call('POST', `/api/v1/knowposts/${hidden}/publish`)).status).toBe(404);
  });

  it('refuses keys outside the post, mismatching uploads and unknown objects at confirm', async () => {
    const id = await draft(author);
    const elsewhere = await draft(author);
    const bytes = Buffer.from('plain text body');
    const signed = (
      await presign(author, { scene: 'knowpost_content', postId: id, contentType: 'text/plain' })
    ).body as Presigned;
    expect(signed.objectKey).toBe(`posts/${id}/content.txt`);
    const uploaded = await put(signed, bytes);
    expect(uploaded.status).toBe(200);
    const good = {
      objectKey: signed.objectKey,
      etag: uploaded.etag,
      size: bytes.length,
      sha256: sha256(bytes),
    };
    const confirm = (patch: Record<string, unknown>) =>
      as(author).call('POST', `/api/v1/knowposts/${id}/content/confirm`, { ...good, ...patch });

    for (const objectKey of [
      `posts/${elsewhere}/content.txt`,
      `posts/${id}/../${elsewhere}/content.txt`,
      'avatars/x.png',
    ]) {
      const res = await confirm({ objectKey });
      expect({ objectKey, status: res.status, code: res.body.code }).toEqual({
        objectKey,
        status: 400,
        code: 'BAD_REQUEST',
      });
    }
    const missing = await confirm({ objectKey: `posts/${id}/content.md` });
    expect([missing.status, missing.body.code]).toEqual([409, 'OBJECT_NOT_UPLOADED']);
    expect((await confirm({ size: bytes.length + 1 })).status).toBe(400);
    expect((await confirm({ etag: '"00000000000000000000000000000000"' })).status).toBe(400);
    expect((await confirm({ sha256: sha256(Buffer.from('other')) })).status).toBe(400);
    expect((await confirm({ etag: uploaded.etag?.replaceAll('"', '') })).status).toBe(204);
  });

  it('refuses oversized uploads and content types outside the allow-lists', async () => {
    const id = await draft(author);
    const big = Buffer.alloc(CONTENT_MAX + 1, 'a');
    const signed = (
      await presign(author, { scene: 'knowpost_content', postId: id, contentType: 'text/markdown' })
    ).body as Presigned;
    const uploaded = await put(signed, big);
    if (uploaded.status === 200) {
      // S3 cannot cap a presigned PUT: the size is enforced at confirm, which removes the object.
      const res = await as(author).call('POST', `/api/v1/knowposts/${id}/content/confirm`, {
        objectKey: signed.objectKey,
        etag: uploaded.etag,
        size: big.length,
        sha256: sha256(big),
      });
      expect([res.status, res.body.code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
      const gone = await as(author).call('POST', `/api/v1/knowposts/${id}/content/confirm`, {
        objectKey: signed.objectKey,
        etag: uploaded.etag,
        size: big.length,
        sha256: sha256(big),
      });
      expect(gone.body.code).toBe('OBJECT_NOT_UPLOADED');
    } else {
      expect(uploaded.status).toBe(413);
    }
    expect(uploaded.status).toBe(profile === 'cluster' ? 200 : 413);

    const image = (await presign(author, { scene: 'knowpost_image', postId: id, contentType: 'image/gif' }))
      .body as Presigned;
    const bigImage = await put(image, Buffer.alloc(IMAGE_MAX + 1, 1));
    if (bigImage.status === 200) {
      const res = await as(author).call('PATCH', `/api/v1/knowposts/${id}`, { imgUrls: [image.objectKey] });
      expect(res.status).toBe(413);
    } else {
      expect(bigImage.status).toBe(413);
    }

    for (const body of [
      { scene: 'knowpost_content', contentType: 'application/x-msdownload' },
      { scene: 'knowpost_content', contentType: 'image/png' },
      { scene: 'knowpost_image', contentType: 'text/html' },
      { scene: 'knowpost_image', contentType: 'image/png', ext: '.jpg' },
      { scene: 'knowpost_content', contentType: 'text/markdown', ext: '.exe' },
      { scene: 'knowpost_avatar', contentType: 'image/png' },
    ]) {
      const res = await presign(author, { ...body, postId: id });
      expect({ body, status: res.status }).toEqual({ body, status: 400 });
    }

    // The signature covers the Content-Type: a PUT with another one stores nothing.
    const md = (
      await presign(author, { scene: 'knowpost_content', postId: id, contentType: 'text/markdown' })
    ).body as Presigned;
    if (profile === 'embedded') {
      const wrongType = await put(md, Buffer.from('<script>'), { 'Content-Type': 'text/html' });
      expect(wrongType.status).toBe(403);
    } else {
      // The test S3 server does not check signatures; the URL must still sign the header.
      expect(new URL(md.putUrl).searchParams.get('X-Amz-SignedHeaders')?.split(';')).toContain(
        'content-type',
      );
    }
  });

  it('validates metadata edits', async () => {
    const id = await draft(author);
    const patch = (body: unknown) => as(author).call('PATCH', `/api/v1/knowposts/${id}`, body);
    const cases: unknown[] = [
      {},
      { color: 'red' },
      { title: 'x'.repeat(257) },
      { description: 'x'.repeat(51) },
      { tags: Array.from({ length: 21 }, (_, i) => `t${i}`) },
      { imgUrls: Array.from({ length: 21 }, () => 'https://example.com/a.png') },
      { imgUrls: ['javascript:alert(1)'] },
      { imgUrls: [`posts/${id}/images/20250101/00000000.png`] },
      { imgUrls: ['https://example.com/' + 'a'.repeat(1024)] },
      { visible: 'friends' },
      { isTop: 'yes' },
      { title: 'a\u0000b' },
      { tags: ['ok', 'line\nbreak'] },
      { description: 'del\u007f' },
      { title: '   ' },
      { title: '\u200b\u3164' },
      { description: ' \u3000' },
      { tags: ['ok', '  '] },
      { tagId: -1 },
      { tagId: 1.5 },
      { tagId: '1.5' },
      { tagId: '-1' },
      { tagId: '' },
      { tagId: '0x10' },
      { tagId: '9'.repeat(16) },
    ];
    for (const body of cases) {
      const res = await patch(body);
      expect({ body, status: res.status, code: res.body?.code }).toEqual({
        body,
        status: 400,
        code: 'BAD_REQUEST',
      });
    }
    // Fields an edit does not take are ignored, as on every route (a client may send its whole edit
    // object); an edit of nothing but such fields is refused, naming one, rather than taken for one.
    expect((await patch({ id, title: 'ok', visibilty: 'private', content: 'x' })).status).toBe(204);
    expect((await as(author).call('GET', `/api/v1/knowposts/detail/${id}`)).body).toMatchObject({
      title: 'ok',
      visible: 'public',
    });
    expect((await patch({ visibilty: 'private' })).body).toMatchObject({
      code: 'BAD_REQUEST',
      message: expect.stringMatching(/^body\.visibilty is not a field of a post edit \(title, tagId, /),
    });
    expect((await patch({})).body).toMatchObject({
      code: 'BAD_REQUEST',
      message: expect.stringMatching(/^body must set at least one of title, tagId, /),
    });
    // Where the body has one required field, others are ignored as everywhere else.
    expect(
      (await as(author).call('PATCH', `/api/v1/knowposts/${id}/top`, { isTop: true, postId: id })).status,
    ).toBe(204);
    expect((await as(author).call('PATCH', `/api/v1/knowposts/${id}/visibility`, {})).status).toBe(400);
    expect((await patch({ title: 'x'.repeat(256), description: 'd'.repeat(50), tags: [] })).status).toBe(204);
    // A tag id may come as a number or as a string of digits; null clears it.
    for (const tagId of [7, '7', '0', null]) expect((await patch({ tagId })).status).toBe(204);

    // Any other field sent as null is left as it is; nothing but nulls is no edit at all.
    expect((await patch({ title: 'Kept', tags: ['kept'], description: 'first' })).status).toBe(204);
    const nulls = { title: null, tags: null, imgUrls: null, visible: null, isTop: null };
    expect((await patch({ ...nulls, description: 'second' })).status).toBe(204);
    const detail = await as(author).call('GET', `/api/v1/knowposts/detail/${id}`);
    expect(detail.body).toMatchObject({ title: 'Kept', tags: ['kept'], description: 'second', isTop: true });
    expect((await patch({ ...nulls, description: null })).body).toMatchObject({
      code: 'BAD_REQUEST',
      message: 'body.title is null, which leaves it as it is: the edit changes nothing',
    });
  });
});

// ---------------------------------------------------------------------------------------------
// Fuzzing: every new route answers 4xx in the contract's shape, never 5xx.

interface RouteCase {
  method: string;
  path: (postId: string) => string;
  valid: (postId: string) => Record<string, unknown>;
  /** Sent against a post of its own, since the first request that passes ends that post. */
  spare?: boolean;
}

const ROUTES: RouteCase[] = [
  {
    method: 'POST',
    path: () => '/api/v1/storage/presign',
    valid: (postId) => ({ scene: 'knowpost_image', postId, contentType: 'image/png', ext: '.png' }),
  },
  { method: 'POST', path: () => '/api/v1/knowposts/drafts', valid: () => ({}) },
  {
    method: 'POST',
    path: (id) => `/api/v1/knowposts/${id}/content/confirm`,
    valid: (id) => ({ objectKey: `posts/${id}/content.md`, etag: '"abc"', size: 3, sha256: 'a'.repeat(64) }),
  },
  {
    method: 'PATCH',
    path: (id) => `/api/v1/knowposts/${id}`,
    valid: () => ({
      title: 't',
      tagId: 1,
      tags: ['a'],
      imgUrls: ['https://example.com/a.png'],
      visible: 'public',
      isTop: false,
      description: 'd',
    }),
  },
  { method: 'POST', path: (id) => `/api/v1/knowposts/${id}/publish`, valid: () => ({}) },
  { method: 'PATCH', path: (id) => `/api/v1/knowposts/${id}/top`, valid: () => ({ isTop: true }) },
  {
    method: 'PATCH',
    path: (id) => `/api/v1/knowposts/${id}/visibility`,
    valid: () => ({ visible: 'private' }),
  },
  { method: 'DELETE', path: (id) => `/api/v1/knowposts/${id}`, valid: () => ({}), spare: true },
];

/** The common wrong values and more aimed at post ids, object keys and sizes. */
const POST_WRONG_VALUES: unknown[] = [
  ...WRONG_VALUES,
  1e308,
  [1, null],
  '\ud800',
  '99999999999999999999999',
  'posts/1/content.md',
];

const BODY_KEYS = [
  'scene',
  'postId',
  'contentType',
  'ext',
  'objectKey',
  'etag',
  'size',
  'sha256',
  'title',
  'tags',
  'imgUrls',
  'visible',
  'isTop',
];

describe.each<ProfileName>(['embedded', 'cluster'])('bad input to post routes (%s profile)', (profile) => {
  let server: Server;
  let client: Client;
  let user: SignedUp;
  let postId: string;
  let spareId: string;

  beforeAll(async () => {
    server = await startServer(profile, { ZG_BODY_LIMIT_BYTES: '16384' });
    client = new Client(server.baseUrl);
    user = await signUp(server, client);
    postId = await createDraft(client, user);
    spareId = await createDraft(client, user);
  });
  afterAll(async () => server?.stop());

  const send = (
    route: RouteCase,
    raw: string,
    contentType = 'application/json',
    path = route.path(route.spare ? spareId : postId),
  ) =>
    client.call(route.method, path, {
      raw,
      token: user.accessToken,
      headers: { 'content-type': contentType },
    });

  it('answers malformed JSON, wrong content types and oversized bodies with a 4xx', async () => {
    for (const route of ROUTES) {
      for (const raw of ['{', '{"a":', 'nul', '[1,2', '{"title":"x",}', '\u0000\u0001']) {
        expect4xx(`${route.method} ${route.path('ID')} ${JSON.stringify(raw)}`, await send(route, raw));
      }
      const oversized = await send(
        route,
        JSON.stringify({ ...route.valid(postId), pad: 'x'.repeat(20_000) }),
      );
      expect4xx(`${route.path('ID')} oversized`, oversized);
      expect(oversized.status).toBe(413);
    }
  });

  it('answers bodies of the wrong type and wrong field types with a 4xx, and ignores unknown fields', async () => {
    for (const route of ROUTES) {
      const label = `${route.method} ${route.path('ID')}`;
      for (const body of ['"string"', '42', 'null', '[]', 'true']) {
        const res = await send(route, body);
        // Routes without a body ignore it; the rest must refuse it.
        if (res.status < 400) expect(Object.keys(route.valid(postId))).toEqual([]);
        else expect4xx(`${label} body ${body}`, res);
      }
      for (const field of Object.keys(route.valid(postId))) {
        for (const wrong of POST_WRONG_VALUES) {
          const res = await send(route, JSON.stringify({ ...route.valid(postId), [field]: wrong }));
          if (res.status < 400) continue; // some odd values are legitimately accepted (e.g. an empty title)
          expect4xx(`${label} ${field}=${JSON.stringify(wrong).slice(0, 20)}`, res);
        }
        const { [field]: _dropped, ...missing } = route.valid(postId);
        expect((await send(route, JSON.stringify(missing))).status).toBeLessThan(500);
      }
      if (Object.keys(route.valid(postId)).length > 0) {
        // Ignored everywhere beside the fields a route takes.
        const res = await send(route, JSON.stringify({ ...route.valid(postId), unknownField: 1 }));
        expect({ label, message: res.body?.message }).not.toEqual({
          label,
          message: expect.stringContaining('unknownField'),
        });
      }
    }
  }, 120_000);

  it('never answers random bodies with a 5xx', async () => {
    for (const route of ROUTES) {
      for (const body of randomBodies(route.path('ID').length * 7919 + route.method.length, 60, BODY_KEYS)) {
        const res = await send(route, JSON.stringify(body) ?? 'null');
        expect({ route: route.path('ID'), body, status: res.status < 500 }).toEqual({
          route: route.path('ID'),
          body,
          status: true,
        });
        if (res.status >= 400) expect4xx(route.path('ID'), res);
      }
    }
  }, 120_000);

  it('answers bad post ids in paths with a 4xx', async () => {
    for (const route of ROUTES.filter((r) => r.path('ID').includes('ID'))) {
      for (const bad of ['abc', '-1', '0', '1.5', '99999999999999999999999', '%00', '..', '1%2F2']) {
        const res = await send(
          route,
          JSON.stringify(route.valid(postId)),
          'application/json',
          route.path(bad),
        );
        expect4xx(`${route.method} ${route.path(bad)}`, res);
      }
    }
  });
});
