import type { FastifyInstance, preValidationAsyncHookHandler } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import type { AuthGuards } from '../auth/auth.guard.js';
import { principalOf } from '../auth/auth.guard.js';
import { BadRequestError } from '../platform/errors/errors.js';
import { dropNullFields, errorResponses } from '../platform/http/schemas.js';
import {
  ConfirmBody,
  DraftResponse,
  POST_PATCH_FIELDS,
  PostIdParams,
  PostPatchBody,
  PresignBody,
  PresignResponse,
  TopBody,
  VisibilityBody,
} from './post.schema.js';
import type { PostService } from './post.service.js';

export interface PostRouteDeps {
  posts: PostService;
  guards: AuthGuards;
}

/**
 * The body of a metadata edit, before validation. As on every route, fields it does not take are
 * dropped (a client may send its whole edit object, an `id` say), and a field sent as null is left
 * as it is, except `tagId`, where null clears the tag. An edit left with nothing to change is a 400
 * naming what was sent, so that a misspelt field alone is not taken for an edit.
 */
function patchFields(fields: readonly string[]): preValidationAsyncHookHandler {
  return async (request) => {
    const body: unknown = request.body;
    if (body === null || typeof body !== 'object' || Array.isArray(body)) return;
    const record = body as Record<string, unknown>;
    const sent = Object.keys(record);
    for (const key of sent) if (!fields.includes(key)) delete record[key];
    dropNullFields(request, ['tagId']);
    if (Object.keys(record).length > 0) return;
    const unknown = sent.find((key) => !fields.includes(key));
    if (unknown !== undefined)
      throw new BadRequestError(`body.${unknown} is not a field of a post edit (${fields.join(', ')})`);
    if (sent.length > 0)
      throw new BadRequestError(
        `body.${sent[0]} is null, which leaves it as it is: the edit changes nothing`,
      );
    throw new BadRequestError(`body must set at least one of ${fields.join(', ')}`);
  };
}

const NoContent = { 204: Type.Null() };

/** Drafts, body confirmation, metadata, publishing and deletion of posts; all for their author only. */
export function postRoutes(deps: PostRouteDeps) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['knowposts'];
    const security = [{ bearerAuth: [] }];
    const base = '/api/v1/knowposts';

    app.post(
      `${base}/drafts`,
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          summary: 'Start a draft',
          description:
            'At most 60 new drafts per user per hour (429 past that) and 100 open drafts at once ' +
            '(409 DRAFT_LIMIT; published and deleted posts do not count).',
          response: { 200: DraftResponse, ...errorResponses(401, 409, 429) },
        },
      },
      async (request) => ({ id: await deps.posts.createDraft(principalOf(request).userId) }),
    );

    app.post(
      `${base}/:id/content/confirm`,
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          summary: 'Record the uploaded body',
          description:
            'The object must exist (409 OBJECT_NOT_UPLOADED otherwise) and match size, ETag and SHA-256; ' +
            'an object over the size limit is deleted (413). Readers get a copy of the bytes checked ' +
            '(posts/{id}/body/{64 random hex}{ext}); the upload is deleted unless other bytes were PUT meanwhile, so a later PUT through the upload URL ' +
            'changes nothing served until it is confirmed. 409 OBJECT_CHANGED: the object was replaced ' +
            'while being confirmed; 409 POST_CHANGED: other confirms kept changing the body meanwhile. ' +
            'Confirming the same body again answers 204, also while the first request is still running. ' +
            'At most 60 confirms and image edits per user per minute, refused ones included (429 past that).',
          params: PostIdParams,
          body: ConfirmBody,
          response: { ...NoContent, ...errorResponses(400, 401, 403, 404, 409, 413, 429) },
        },
      },
      async (request, reply) => {
        await deps.posts.confirmContent(principalOf(request).userId, request.params.id, request.body);
        return reply.status(204).send(null);
      },
    );

    app.patch(
      `${base}/:id`,
      {
        preValidation: patchFields(POST_PATCH_FIELDS),
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          summary: 'Edit metadata',
          description:
            'A field sent as null is left as it is, except tagId, where null clears the tag; fields ' +
            'that are not among these are ignored, and an edit left with nothing to change (only ' +
            'unknown or null fields, or none) is a 400 naming what was sent. A title, description or ' +
            'tag that shows nothing (only spaces or invisible characters) is a 400; an empty title or ' +
            'description clears it. ' +
            '`imgUrls` entries are image keys of this post (from presign, under posts/{id}/images/) or ' +
            "absolute http(s) URLs. A URL of this post's own objects stands for its key: the upload URL " +
            'with or without its query, or an image URL from a detail answer (signed, possibly expired); ' +
            "a URL of another post's objects is a 400. " +
            'An uploaded image must exist and be within the image size limit (413 ' +
            'and deleted otherwise); readers get a copy of it made at the patch (posts/{id}/pictures/), so ' +
            'a later PUT through the upload URL shows only once a patch names the key again. The upload ' +
            'is then deleted, and so are copies of images the post no longer shows; an upload key sent ' +
            'again names the copy made of it. 409 OBJECT_CHANGED: an image was replaced while it was ' +
            'being checked. An edit of imgUrls that overlaps another is judged again against what that ' +
            'one stored; 409 POST_CHANGED after three such losses. At most 120 edits per user per minute, ' +
            'pinning and visibility changes included (429 past that); an edit of imgUrls also counts ' +
            'against the limit of 60 confirms and image edits per user per minute.',
          params: PostIdParams,
          body: PostPatchBody,
          response: { ...NoContent, ...errorResponses(400, 401, 403, 404, 409, 413, 429) },
        },
      },
      async (request, reply) => {
        const { tagId, ...rest } = request.body;
        const fields = tagId === undefined ? rest : { ...rest, tagId: tagId === null ? null : Number(tagId) };
        await deps.posts.update(principalOf(request).userId, request.params.id, fields);
        return reply.status(204).send(null);
      },
    );

    app.post(
      `${base}/:id/publish`,
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          summary: 'Publish a draft',
          description:
            'Only a draft publishes (else 409 INVALID_STATE); its body must be confirmed (else 409 CONTENT_REQUIRED).',
          params: PostIdParams,
          response: { ...NoContent, ...errorResponses(400, 401, 403, 404, 409) },
        },
      },
      async (request, reply) => {
        await deps.posts.publish(principalOf(request).userId, request.params.id);
        return reply.status(204).send(null);
      },
    );

    app.patch(
      `${base}/:id/top`,
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          summary: 'Pin or unpin',
          description: 'Counts against the limit of 120 post edits per user per minute (429 past that).',
          params: PostIdParams,
          body: TopBody,
          response: { ...NoContent, ...errorResponses(400, 401, 403, 404, 429) },
        },
      },
      async (request, reply) => {
        await deps.posts.setTop(principalOf(request).userId, request.params.id, request.body.isTop);
        return reply.status(204).send(null);
      },
    );

    app.patch(
      `${base}/:id/visibility`,
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          summary: 'Change who may see the post',
          description: 'Counts against the limit of 120 post edits per user per minute (429 past that).',
          params: PostIdParams,
          body: VisibilityBody,
          response: { ...NoContent, ...errorResponses(400, 401, 403, 404, 429) },
        },
      },
      async (request, reply) => {
        await deps.posts.setVisibility(principalOf(request).userId, request.params.id, request.body.visible);
        return reply.status(204).send(null);
      },
    );

    app.delete(
      `${base}/:id`,
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          summary: 'Delete (soft)',
          description:
            'Only the author. Deleting a post the author already deleted is 204 and changes nothing, ' +
            'so a retried request succeeds.',
          params: PostIdParams,
          response: { ...NoContent, ...errorResponses(400, 401, 403, 404, 409) },
        },
      },
      async (request, reply) => {
        await deps.posts.delete(principalOf(request).userId, request.params.id);
        return reply.status(204).send(null);
      },
    );
  };
}

/** `POST /api/v1/storage/presign`: a signed PUT URL for a post's body or one of its images. */
export function presignRoutes(deps: PostRouteDeps) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    app.post(
      '/api/v1/storage/presign',
      {
        onRequest: deps.guards.required,
        schema: {
          tags: ['storage'],
          security: [{ bearerAuth: [] }],
          summary: 'Presign an upload for a post',
          description:
            'PUT the bytes to putUrl with exactly the returned headers; the ETag response header is what ' +
            'content/confirm expects. Bodies: .md .markdown .txt .html .json (text/markdown, text/plain, ' +
            'text/html, application/json); images: .jpg .jpeg .png .webp .gif (image/jpeg, image/png, ' +
            'image/webp, image/gif); ext may omit its dot (png is .png) and must match contentType, ' +
            'which is matched in any case, may carry a charset, and is signed and returned as written. A ' +
            'deleted post is 409 INVALID_STATE. At most 60 presigns per user per minute and 500 per ' +
            'day (429 past that). A minute after the URL expires (and no sooner than five minutes after ' +
            'the presign), an upload larger than the limit of its ' +
            'kind is removed; one that is neither confirmed nor named in a patch is removed once it is ' +
            'older than ZG_UPLOAD_RETENTION_HOURS (24 by default).',
          body: PresignBody,
          response: { 200: PresignResponse, ...errorResponses(400, 401, 403, 404, 409, 429) },
        },
      },
      async (request) => deps.posts.presign(principalOf(request).userId, request.body),
    );
  };
}
