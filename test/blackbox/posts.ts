import { createHash } from 'node:crypto';
import { expect } from 'vitest';
import type { Client, SignedUp } from './harness.js';

/**
 * Writing posts the way a client does, for tests that need posts to exist: draft, presigned uploads
 * straight to storage, confirm, metadata, publish. Each step checks that the server accepted it.
 */
export const PNG = Buffer.concat([Buffer.from('89504e470d0a1a0a', 'hex'), Buffer.alloc(200, 7)]);

export const sha256 = (bytes: Buffer) => createHash('sha256').update(bytes).digest('hex');
export const md5 = (bytes: Buffer) => createHash('md5').update(bytes).digest('hex');

/** The answer of `POST /api/v1/storage/presign`. */
export interface Presigned {
  objectKey: string;
  putUrl: string;
  headers: Record<string, string>;
  expiresIn: number;
}

export interface PresignRequest {
  scene: 'knowpost_content' | 'knowpost_image';
  postId: string;
  contentType: string;
  ext?: string;
}

type Answer = Awaited<ReturnType<Client['call']>>;

function expectStatus(res: Answer, status: number, what: string): Answer {
  expect(res.status, `${what}: ${JSON.stringify(res.body)}`).toBe(status);
  return res;
}

/** Calls a route as `user` (a JSON body when one is given). */
export function callAs(client: Client, user: SignedUp, method: string, path: string, body?: unknown) {
  return client.call(method, path, { token: user.accessToken, ...(body !== undefined ? { body } : {}) });
}

/** PUTs `bytes` to a presigned URL with plain fetch and the headers it came with; reads the ETag. */
export async function putObject(presigned: Presigned, bytes: Buffer, headers = presigned.headers) {
  const res = await fetch(presigned.putUrl, { method: 'PUT', headers, body: bytes });
  await res.arrayBuffer();
  return { status: res.status, etag: res.headers.get('etag') };
}

export async function fetchBytes(url: string): Promise<{ status: number; bytes: Buffer }> {
  const res = await fetch(url);
  return { status: res.status, bytes: Buffer.from(await res.arrayBuffer()) };
}

export async function createDraft(client: Client, user: SignedUp): Promise<string> {
  const res = expectStatus(await callAs(client, user, 'POST', '/api/v1/knowposts/drafts'), 200, 'draft');
  expect(res.body.id).toMatch(/^[1-9]\d{0,18}$/);
  return res.body.id as string;
}

export interface Uploaded {
  objectKey: string;
  etag: string | null;
}

/** Presigns an upload to one of the user's posts and PUTs the bytes there. */
export async function upload(
  client: Client,
  user: SignedUp,
  request: PresignRequest,
  bytes: Buffer,
): Promise<Uploaded> {
  const signed = expectStatus(
    await callAs(client, user, 'POST', '/api/v1/storage/presign', request),
    200,
    'presign',
  ).body as Presigned;
  const put = await putObject(signed, bytes);
  expect(put.status, `PUT ${signed.objectKey}`).toBe(200);
  return { objectKey: signed.objectKey, etag: put.etag };
}

export async function confirmContent(
  client: Client,
  user: SignedUp,
  postId: string,
  uploaded: Uploaded,
  bytes: Buffer,
): Promise<void> {
  const res = await callAs(client, user, 'POST', `/api/v1/knowposts/${postId}/content/confirm`, {
    objectKey: uploaded.objectKey,
    etag: uploaded.etag,
    size: bytes.length,
    sha256: sha256(bytes),
  });
  expectStatus(res, 204, 'confirm');
}

/** A draft with a confirmed markdown body (by default one naming the post). */
export async function draftWithContent(
  client: Client,
  user: SignedUp,
  text?: string,
): Promise<{ id: string; content: Buffer }> {
  const id = await createDraft(client, user);
  const content = Buffer.from(text ?? `# Post ${id}\n\nbody of ${id}\n`);
  const uploaded = await upload(
    client,
    user,
    { scene: 'knowpost_content', postId: id, contentType: 'text/markdown' },
    content,
  );
  await confirmContent(client, user, id, uploaded, content);
  return { id, content };
}

export interface NewPost {
  title?: string;
  tags?: string[];
  description?: string;
  visible?: string;
  /** How many PNG images to upload; they come first in `imgUrls`. */
  images?: number;
  /** Absolute image URLs, after the uploaded ones. */
  externalImages?: string[];
  isTop?: boolean;
  /** False leaves the post a draft (with its body and metadata). */
  publish?: boolean;
}

/** A post written through the public write routes: body, images, metadata, then publish. */
export async function writePost(
  client: Client,
  user: SignedUp,
  spec: NewPost = {},
): Promise<{ id: string; content: Buffer }> {
  const { id, content } = await draftWithContent(client, user);
  const imgUrls: string[] = [];
  for (let i = 0; i < (spec.images ?? 0); i++) {
    const image = await upload(
      client,
      user,
      { scene: 'knowpost_image', postId: id, contentType: 'image/png' },
      PNG,
    );
    imgUrls.push(image.objectKey);
  }
  imgUrls.push(...(spec.externalImages ?? []));
  const patch = await callAs(client, user, 'PATCH', `/api/v1/knowposts/${id}`, {
    title: spec.title ?? `post ${id}`,
    tags: spec.tags ?? ['t'],
    imgUrls,
    description: spec.description ?? 'about it',
    visible: spec.visible ?? 'public',
    ...(spec.isTop !== undefined ? { isTop: spec.isTop } : {}),
  });
  expectStatus(patch, 204, 'metadata');
  if (spec.publish !== false) await publish(client, user, id);
  return { id, content };
}

export async function publish(client: Client, user: SignedUp, postId: string): Promise<void> {
  expectStatus(await callAs(client, user, 'POST', `/api/v1/knowposts/${postId}/publish`), 204, 'publish');
}
