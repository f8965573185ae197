import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, signUp, startServer, type ProfileName, type Server } from './harness.js';

const PNG = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==',
  'base64',
);

describe.each<ProfileName>(['embedded', 'cluster'])('profiles (%s profile)', (profile) => {
  let server: Server;
  let client: Client;

  beforeAll(async () => {
    server = await startServer(profile, { ZG_AVATAR_MAX_BYTES: '65536' });
    client = new Client(server.baseUrl);
  });
  afterAll(async () => server?.stop());

  it('edits a profile and shows the public view without phone or e-mail', async () => {
    const alice = await signUp(server, client);
    const bob = await signUp(server, client);
    const zgId = `alice_${Date.now().toString(36)}`;
    const patch = await client.call('PATCH', '/api/v1/profile', {
      token: alice.accessToken,
      body: {
        nickname: ' Alice ',
        bio: 'reads a lot',
        gender: 'FEMALE',
        birthday: '1999-02-03',
        zgId,
        school: 'Tongji',
        // Tags are trimmed, and one given twice is kept once.
        tagJson: '[" go ","rust","go"]',
        unknownField: 1,
      },
    });
    expect(patch.status).toBe(200);
    expect(patch.body).toMatchObject({
      id: alice.userId,
      nickname: 'Alice',
      bio: 'reads a lot',
      gender: 'FEMALE',
      birthday: '1999-02-03',
      zgId,
      school: 'Tongji',
      tagJson: '["go","rust"]',
      email: alice.identifier,
    });
    expect(patch.body.unknownField).toBeUndefined();

    const publicView = await client.call('GET', `/api/v1/profile/${alice.userId}`, {
      token: bob.accessToken,
    });
    expect(publicView.status).toBe(200);
    expect(publicView.body).toMatchObject({
      id: alice.userId,
      nickname: 'Alice',
      zgId,
    });
    // The public profile leaves the private fields out, as the relation lists do.
    expect(publicView.body).not.toHaveProperty('phone');
    expect(publicView.body).not.toHaveProperty('email');
    const anonymous = await client.call('GET', `/api/v1/profile/${alice.userId}`);
    expect(anonymous.body).toMatchObject({ nickname: 'Alice' });
    expect(anonymous.body).not.toHaveProperty('phone');
    expect(anonymous.body).not.toHaveProperty('email');
    // One Unicode form: two spellings of a tag are one tag; a tag's length is in characters; an
    // empty school takes it off.
    const respelt = await client.call('PATCH', '/api/v1/profile', {
      token: alice.accessToken,
      body: { tagJson: JSON.stringify(['Cafe\u0301', 'Caf\u00e9', '😀'.repeat(32)]), school: ' ' },
    });
    expect(respelt.status).toBe(200);
    expect(respelt.body).toMatchObject({
      tagJson: JSON.stringify(['Caf\u00e9', '😀'.repeat(32)]),
      school: null,
    });
    const own = await client.call('GET', `/api/v1/profile/${alice.userId}`, { token: alice.accessToken });
    expect(own.body.email).toBe(alice.identifier);
    expect(own.body).toHaveProperty('phone', null);
    expect((await client.call('GET', '/api/v1/auth/me', { token: alice.accessToken })).body.zhId).toBe(zgId);

    const taken = await client.call('PATCH', '/api/v1/profile', { token: bob.accessToken, body: { zgId } });
    expect(taken.status).toBe(409);
    expect(taken.body.code).toBe('ZGID_EXISTS');
    // A handle in another case is the same handle.
    const upper = zgId.toUpperCase();
    const cased = await client.call('PATCH', '/api/v1/profile', {
      token: bob.accessToken,
      body: { zgId: upper },
    });
    expect(cased.status).toBe(409);
    const recased = await client.call('PATCH', '/api/v1/profile', {
      token: alice.accessToken,
      body: { zgId: upper },
    });
    expect([recased.status, recased.body.zgId]).toEqual([200, upper]);
  });

  it('refuses invalid profile edits and changes nothing', async () => {
    const user = await signUp(server, client);
    const before = (await client.call('GET', '/api/v1/auth/me', { token: user.accessToken })).body;
    const future = new Date(Date.now() + 86_400_000 * 3).toISOString().slice(0, 10);
    const bad = [
      {},
      { nickname: '' },
      { nickname: 'x'.repeat(65) },
      { bio: 'x'.repeat(513) },
      { gender: 'ROBOT' },
      { birthday: future },
      { birthday: '2001-02-30' },
      { zgId: 'ab' },
      { zgId: 'has space' },
      { school: 'x'.repeat(129) },
      { tagJson: 'not json' },
      { tagJson: '{"a":1}' },
      { nickname: 42 },
      { nickname: 'a\u0000b' },
      { nickname: 'two\nlines' },
      { school: 'bell\u0007' },
      { bio: 'escape \u001b[31mred' },
      { nickname: null, bio: null },
      // Names and tags that show nothing, or read backwards.
      { nickname: '\u200b' },
      { nickname: '\u3164' },
      { nickname: '\u0301\u0301' },
      // 64 characters, which are 192 once in NFC: longer than a nickname may be.
      { nickname: '\ufb2c'.repeat(64) },
      { school: '\u200b' },
      { tagJson: `["${'😀'.repeat(33)}"]` },
      { nickname: 'two\u2028lines' },
      { nickname: 'abc\u202eevil' },
      { nickname: 'abc\u202devil' },
      { tagJson: '["\\u0000"]' },
      { tagJson: '["   "]' },
      { tagJson: '["a\\u202e"]' },
      { tagJson: '[1]' },
    ];
    for (const body of bad) {
      const res = await client.call('PATCH', '/api/v1/profile', { token: user.accessToken, body });
      expect({ body, status: res.status, code: res.body.code }).toEqual({
        body,
        status: 400,
        code: 'BAD_REQUEST',
      });
    }
    expect((await client.call('PATCH', '/api/v1/profile', { body: { nickname: 'x' } })).status).toBe(401);
    expect((await client.call('GET', '/api/v1/auth/me', { token: user.accessToken })).body).toEqual(before);
    expect((await client.call('GET', '/api/v1/profile/999999999')).status).toBe(404);
    expect((await client.call('GET', '/api/v1/profile/abc')).status).toBe(400);
    const named = await client.call('PATCH', '/api/v1/profile', {
      token: user.accessToken,
      body: { nickname: 'a\u0000b' },
    });
    expect(named.body.message).toBe(
      'body.nickname must not contain control characters, unpaired surrogates or more than 4 combining marks in a row',
    );
    // Nor broken UTF-16 (kept as U+FFFD it would be another name than sent), nor a pile of marks.
    for (const nickname of ['a\ud800b', `a${'\u0301'.repeat(60)}`]) {
      const refused = await client.call('PATCH', '/api/v1/profile', {
        token: user.accessToken,
        body: { nickname },
      });
      expect([refused.status, refused.body.code]).toEqual([400, 'BAD_REQUEST']);
    }
    const tagged = await client.call('PATCH', '/api/v1/profile', {
      token: user.accessToken,
      body: { tagJson: JSON.stringify(['x\ud800']) },
    });
    expect(tagged.status).toBe(400);
    // A bio may have line breaks and tabs.
    const bio = 'first line\n\tsecond line\r\n';
    const edited = await client.call('PATCH', '/api/v1/profile', { token: user.accessToken, body: { bio } });
    expect([edited.status, edited.body.bio]).toEqual([200, bio]);
    // A field sent as null is left as it is.
    const nulls = await client.call('PATCH', '/api/v1/profile', {
      token: user.accessToken,
      body: { nickname: 'Renamed', bio: null, school: null, gender: null, birthday: null, zgId: null },
    });
    expect([nulls.status, nulls.body.nickname, nulls.body.bio]).toEqual([200, 'Renamed', bio]);
    // An empty birthday takes it off the profile.
    const dated = await client.call('PATCH', '/api/v1/profile', {
      token: user.accessToken,
      body: { birthday: '2000-01-02' },
    });
    expect(dated.body.birthday).toBe('2000-01-02');
    const undated = await client.call('PATCH', '/api/v1/profile', {
      token: user.accessToken,
      body: { birthday: '' },
    });
    expect([undated.status, undated.body.birthday]).toEqual([200, null]);
  });

  it('publishes an avatar photo without where and when it was taken', async () => {
    const user = await signUp(server, client);
    const secret = 'GPSLatitude 31.2304 N camera serial 0xC0FFEE';
    const segment = (marker: number, payload: Buffer) => {
      const head = Buffer.from([0xff, marker, 0, 0]);
      head.writeUInt16BE(payload.length + 2, 2);
      return Buffer.concat([head, payload]);
    };
    const photo = Buffer.concat([
      Buffer.from([0xff, 0xd8]),
      segment(0xe0, Buffer.from('JFIF\0\x01\x01\0\0\x01\0\x01\0\0', 'latin1')),
      segment(0xe1, Buffer.from(`Exif\0\0${secret}`, 'latin1')),
      segment(0xfe, Buffer.from(secret, 'latin1')),
      segment(0xdb, Buffer.alloc(65, 1)),
      segment(0xda, Buffer.from([1, 1, 0, 0, 0x3f, 0])),
      Buffer.from([0x12, 0x34, 0xff, 0xd9]),
      Buffer.from(`MotionPhoto ${secret}`, 'latin1'),
    ]);
    const form = new FormData();
    form.append('file', new Blob([photo], { type: 'image/jpeg' }), 'photo.jpg');
    const res = await client.call('POST', '/api/v1/profile/avatar', { token: user.accessToken, raw: form });
    expect(res.status).toBe(200);
    const served = Buffer.from(await (await fetch(res.body.avatar)).arrayBuffer());
    expect(served.toString('latin1')).not.toContain('GPSLatitude');
    expect(served.subarray(served.length - 4)).toEqual(Buffer.from([0x12, 0x34, 0xff, 0xd9]));
    // A file whose structure does not hold together is refused.
    const broken = new FormData();
    broken.append('file', new Blob([photo.subarray(0, 12)], { type: 'image/jpeg' }), 'broken.jpg');
    const refused = await client.call('POST', '/api/v1/profile/avatar', {
      token: user.accessToken,
      raw: broken,
    });
    expect([refused.status, refused.body.code]).toEqual([400, 'BAD_REQUEST']);
  });

  it('uploads an avatar and serves it back', async () => {
    const user = await signUp(server, client);
    const form = new FormData();
    form.append('file', new Blob([PNG], { type: 'image/png' }), 'me.png');
    const res = await client.call('POST', '/api/v1/profile/avatar', { token: user.accessToken, raw: form });
    expect(res.status).toBe(200);
    expect(res.body.avatar).toMatch(new RegExp(`/avatars/${user.userId}/[0-9a-f]{16}\\.png$`));
    // Embedded serves files itself, at its public URL; cluster from the bucket.
    if (profile === 'embedded') expect(res.body.avatar.startsWith(`${server.baseUrl}/files/`)).toBe(true);
    const image = await fetch(res.body.avatar);
    expect(image.status).toBe(200);
    expect(image.headers.get('content-type')).toBe('image/png');
    expect(Buffer.from(await image.arrayBuffer()).equals(PNG)).toBe(true);

    // A new avatar replaces the stored one, and the old object goes.
    const again = await client.call('POST', '/api/v1/profile/avatar', { token: user.accessToken, raw: form });
    expect(again.status).toBe(200);
    expect(again.body.avatar).not.toBe(res.body.avatar);
    expect((await fetch(again.body.avatar)).status).toBe(200);
    expect([403, 404]).toContain((await fetch(res.body.avatar)).status);

    // A client that does not know the file's type names none in particular: the bytes decide.
    const untyped = new FormData();
    untyped.append('file', new Blob([PNG], { type: 'application/octet-stream' }), 'me');
    const sniffed = await client.call('POST', '/api/v1/profile/avatar', {
      token: user.accessToken,
      raw: untyped,
    });
    expect(sniffed.status).toBe(200);
    expect((await fetch(sniffed.body.avatar)).headers.get('content-type')).toBe('image/png');
    // Nor does one that sends the part with no Content-Type at all (multipart reads that as text/plain).
    const boundary = 'zg-avatar-untyped';
    const bare = Buffer.concat([
      Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="me"\r\n\r\n`),
      PNG,
      Buffer.from(`\r\n--${boundary}--\r\n`),
    ]);
    const unnamed = await client.call('POST', '/api/v1/profile/avatar', {
      token: user.accessToken,
      raw: bare,
      headers: { 'content-type': `multipart/form-data; boundary=${boundary}` },
    });
    expect([unnamed.status, unnamed.body.code]).toEqual([200, undefined]);
    expect((await fetch(unnamed.body.avatar)).headers.get('content-type')).toBe('image/png');

    // A PNG saved under a .jpg name is declared as a JPEG by the browser: the bytes decide here too.
    const misnamed = new FormData();
    misnamed.append('file', new Blob([PNG], { type: 'image/jpeg' }), 'me.jpg');
    const renamed = await client.call('POST', '/api/v1/profile/avatar', {
      token: user.accessToken,
      raw: misnamed,
    });
    expect(renamed.status).toBe(200);
    expect(renamed.body.avatar).toMatch(/\.png$/);
    expect((await fetch(renamed.body.avatar)).headers.get('content-type')).toBe('image/png');
  });

  it('limits avatar uploads per user', async () => {
    const user = await signUp(server, client);
    const statuses: number[] = [];
    for (let i = 0; i < 21; i++) {
      const form = new FormData();
      form.append('file', new Blob([PNG], { type: 'image/png' }), 'me.png');
      statuses.push(
        (await client.call('POST', '/api/v1/profile/avatar', { token: user.accessToken, raw: form })).status,
      );
    }
    expect(statuses.slice(0, 20).every((s) => s === 200)).toBe(true);
    expect(statuses[20]).toBe(429);
  });

  it('refuses avatars that are not images, too large, or missing', async () => {
    const user = await signUp(server, client);
    const upload = async (bytes: Buffer, type: string, field = 'file') => {
      const form = new FormData();
      form.append(field, new Blob([bytes], { type }), 'x.bin');
      return client.call('POST', '/api/v1/profile/avatar', { token: user.accessToken, raw: form });
    };
    const text = await upload(Buffer.from('hello'), 'image/png');
    expect([text.status, text.body.code]).toEqual([400, 'BAD_REQUEST']);
    expect((await upload(Buffer.from('hello'), 'application/octet-stream')).status).toBe(400);
    expect((await upload(PNG, 'text/html')).status).toBe(400);
    const big = await upload(Buffer.concat([PNG, Buffer.alloc(70_000)]), 'image/png');
    expect([big.status, big.body.code]).toEqual([413, 'PAYLOAD_TOO_LARGE']);
    const wrongField = await upload(PNG, 'image/png', 'picture');
    expect(wrongField.status).toBe(400);
    const json = await client.call('POST', '/api/v1/profile/avatar', {
      token: user.accessToken,
      body: { file: 'x' },
    });
    expect(json.status).toBeGreaterThanOrEqual(400);
    expect(json.status).toBeLessThan(500);
    const anonymous = await client.call('POST', '/api/v1/profile/avatar', { raw: new FormData() });
    expect(anonymous.status).toBe(401);

    // Bodies the multipart parser cannot read: garbage, no boundary, a part cut off.
    const cutOff = `--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\nContent-Type: image/png\r\n\r\n${PNG.toString('latin1')}`;
    for (const [contentType, raw] of [
      ['multipart/form-data; boundary=xyz', 'garbage'],
      ['multipart/form-data', '--xyz\r\n'],
      ['multipart/form-data; boundary=xyz', cutOff],
    ] as const) {
      const res = await client.call('POST', '/api/v1/profile/avatar', {
        token: user.accessToken,
        raw: Buffer.from(raw, 'latin1'),
        headers: { 'content-type': contentType },
      });
      expect([res.status, res.body.code], `${contentType} ${raw.slice(0, 20)}`).toEqual([400, 'BAD_REQUEST']);
    }
    const me = await client.call('GET', '/api/v1/auth/me', { token: user.accessToken });
    expect(me.body.avatar).not.toMatch(/\/avatars\//);
  });
});
