import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { AppError, BadRequestError, PayloadTooLargeError } from '../platform/errors/errors.js';
import { dropNullFields, errorResponses } from '../platform/http/schemas.js';
import type { AuthGuards } from '../auth/auth.guard.js';
import { principalOf } from '../auth/auth.guard.js';
import { ProfilePatchBody, ProfileResponse, UserIdParams } from './profile.schema.js';
import type { ProfileService } from './profile.service.js';
import { toProfile } from './user.presenter.js';

export interface ProfileRouteDeps {
  profiles: ProfileService;
  guards: AuthGuards;
  avatarMaxBytes: number;
}

export function profileRoutes(deps: ProfileRouteDeps) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    const tags = ['profile'];
    const security = [{ bearerAuth: [] }];

    app.patch(
      '/api/v1/profile',
      {
        onRequest: deps.guards.required,
        preValidation: async (request) => dropNullFields(request),
        schema: {
          tags,
          security,
          description:
            'Changes the fields given; a field sent as null is left as it is. At least one profile field ' +
            'is needed (400 otherwise; unknown and null fields are dropped and do not count). A zgId ' +
            'another user holds, in any case, is 409 ZGID_EXISTS.',
          body: ProfilePatchBody,
          response: { 200: ProfileResponse, ...errorResponses(400, 401, 404, 409) },
        },
      },
      async (request) =>
        toProfile(await deps.profiles.update(principalOf(request).userId, request.body), true),
    );

    app.post(
      '/api/v1/profile/avatar',
      {
        onRequest: deps.guards.required,
        schema: {
          tags,
          security,
          consumes: ['multipart/form-data'],
          description:
            'multipart/form-data with one field `file`: a PNG, JPEG, GIF or WebP image of at most ' +
            "ZG_AVATAR_MAX_BYTES (5 MiB by default; 413 over that), judged by its bytes: the part's " +
            'Content-Type must be some image/* type, application/octet-stream, binary/octet-stream, text/plain ' +
            '(what a part without one reads as) or none. ' +
            'Up to 20 uploads per user per hour (429 past that); the avatar replaced is deleted (409 when ' +
            'other uploads of the same user kept replacing it meanwhile). ' +
            'What a photo records of where and how it was taken (EXIF, XMP, IPTC, comments, data after a ' +
            "JPEG's end or a GIF's trailer; a JPEG's EXIF orientation stays) is removed before it is published; a file whose structure does not hold " +
            'together, or that is made of more pieces than any picture has, is a 400, and so is one whose ' +
            'headers give it more than 16384 pixels a side or 64 Mi pixels in all (no browser of a viewer ' +
            'should have to decode it).',
          response: { 200: ProfileResponse, ...errorResponses(400, 401, 409, 413, 429) },
        },
      },
      async (request) => {
        if (!request.isMultipart())
          throw new BadRequestError('expected multipart/form-data with a file field');
        await deps.profiles.admitAvatarUpload(principalOf(request).userId);
        const { file, bytes } = await readAvatar(request, deps.avatarMaxBytes);
        if (file.file.truncated) throw new PayloadTooLargeError('The avatar is too large');
        return toProfile(
          await deps.profiles.setAvatar(principalOf(request).userId, bytes, file.mimetype),
          true,
        );
      },
    );

    app.get(
      '/api/v1/profile/:userId',
      {
        onRequest: deps.guards.optional,
        schema: {
          tags,
          // A token is optional: sent, it adds the caller's own view.
          security: [{}, { bearerAuth: [] }],
          description:
            "A user's profile. The caller's own carries phone and email (null when not set); " +
            "anyone else's, the public profile, leaves both out.",
          params: UserIdParams,
          response: { 200: ProfileResponse, ...errorResponses(400, 401, 404) },
        },
      },
      async (request) => {
        const user = await deps.profiles.get(request.params.userId);
        return toProfile(user, request.principal?.userId === user.id);
      },
    );
  };
}

/**
 * The one `file` part of an avatar upload. A body the multipart parser cannot read is the client's
 * mistake (400), as is a file over the limit (413); neither is a failure of ours.
 */
async function readAvatar(request: FastifyRequest, maxBytes: number) {
  try {
    const file = await request.file({ limits: { fileSize: maxBytes, files: 1 } });
    if (!file || file.fieldname !== 'file') {
      // The part's bytes are let go, so the request ends (and frees its connection) with the answer.
      file?.file.resume();
      throw new BadRequestError('file is required');
    }
    return { file, bytes: await file.toBuffer() };
  } catch (err) {
    if (err instanceof AppError) throw err;
    if ((err as { statusCode?: unknown }).statusCode === 413) {
      throw new PayloadTooLargeError('The avatar is too large');
    }
    throw new BadRequestError(`malformed multipart body: ${(err as Error).message}`);
  }
}
