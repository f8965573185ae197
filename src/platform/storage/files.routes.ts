import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { NotFoundError } from '../errors/errors.js';
import { assertSafeKey, type ObjectStorage } from './object-storage.js';

/** Prefixes of objects anyone may read straight from the app (local storage only). */
const PUBLIC_PREFIXES = ['avatars/'];

const DEFAULT_AVATAR_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 96 96"><rect width="96" height="96" rx="48" fill="#e8eef7"/>' +
  '<circle cx="48" cy="38" r="16" fill="#9fb3cf"/><path d="M18 82c4-17 16-26 30-26s26 9 30 26" fill="#9fb3cf"/></svg>';

export const DEFAULT_AVATAR_PATH = '/assets/default-avatar.svg';

export function filesRoutes(storage: ObjectStorage) {
  return async (root: FastifyInstance): Promise<void> => {
    const app = root.withTypeProvider<TypeBoxTypeProvider>();
    app.get(DEFAULT_AVATAR_PATH, { schema: { hide: true } }, async (_request, reply) =>
      reply
        .header('content-type', 'image/svg+xml')
        .header('cache-control', 'public, max-age=86400')
        .send(DEFAULT_AVATAR_SVG),
    );

    app.get(
      '/files/*',
      { schema: { hide: true, params: Type.Object({ '*': Type.String() }) } },
      async (request, reply) => {
        const key = request.params['*'];
        if (!PUBLIC_PREFIXES.some((p) => key.startsWith(p))) throw new NotFoundError();
        try {
          assertSafeKey(key);
        } catch {
          throw new NotFoundError();
        }
        const found = await storage.get(key);
        if (!found) throw new NotFoundError();
        return reply
          .header('content-type', found.object.contentType)
          .header('content-length', String(found.object.size))
          .header('etag', found.object.etag)
          .header('cache-control', 'public, max-age=31536000, immutable')
          .header('x-content-type-options', 'nosniff')
          .send(found.body);
      },
    );
  };
}
