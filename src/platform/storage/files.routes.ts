import type { IncomingMessage } from 'node:http';
import type { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { ForbiddenError, NotFoundError, PayloadTooLargeError } from '../errors/errors.js';
import { LocalObjectStorage } from './local-object-storage.js';
import {
  isPublicKey,
  isSafeKey,
  PUBLIC_OBJECT_CACHE_CONTROL,
  type ObjectStorage,
  type StoredObject,
} from './object-storage.js';

/** Prefixes of objects anyone may read straight from the app (local storage only). */

const DEFAULT_AVATAR_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 96 96"><rect width="96" height="96" rx="48" fill="#e8eef7"/>' +
  '<circle cx="48" cy="38" r="16" fill="#9fb3cf"/><path d="M18 82c4-17 16-26 30-26s26 9 30 26" fill="#9fb3cf"/></svg>';

export const DEFAULT_AVATAR_PATH = '/assets/default-avatar.svg';

// Uploaded bytes are served from the API's own origin: a stored HTML or SVG file must not run scripts
// there when opened directly.
const SANDBOX = "default-src 'none'; style-src 'unsafe-inline'; sandbox";

const KeyParams = Type.Object({ '*': Type.String() });
const QueryValue = Type.Optional(Type.String());

/** A query parameter given more than once is not one a signer produced. */
function single(value: unknown): string | undefined {
  return typeof value === 'string' ? value : undefined;
}

function sendObject(
  reply: FastifyReply,
  found: { object: StoredObject; body: Readable },
  cacheControl: string,
) {
  return reply
    .header('content-type', found.object.contentType)
    .header('content-length', String(found.object.size))
    .header('etag', found.object.etag)
    .header('cache-control', cacheControl)
    .header('x-content-type-options', 'nosniff')
    .header('content-security-policy', SANDBOX)
    .send(found.body);
}

/**
 * Files the app serves itself. Public prefixes are readable by anyone. With local storage, URLs
 * signed by `LocalObjectStorage` also work here: `GET /files/{key}?exp&sig` reads any key and
 * `PUT /files/upload/{key}?ct&max&exp&sig` stores the request body as that key, S3-style (raw bytes,
 * exact Content-Type, 200 with the quoted MD5 as `ETag`). A bad or expired signature is 403, a body
 * over the signed limit 413 with nothing kept.
 */
export function filesRoutes(storage: ObjectStorage) {
  const local = storage instanceof LocalObjectStorage ? storage : undefined;
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
      {
        schema: {
          hide: true,
          params: KeyParams,
          querystring: Type.Object({ exp: QueryValue, sig: QueryValue }),
        },
      },
      async (request, reply) => {
        const key = request.params['*'];
        const { exp, sig } = request.query;
        if (local && (exp !== undefined || sig !== undefined)) {
          if (!isSafeKey(key))
            throw new ForbiddenError('The URL signature is not valid', 'SIGNATURE_INVALID');
          const check = local.verifyDownload(key, { exp: single(exp), sig: single(sig) });
          if (check.status === 'invalid')
            throw new ForbiddenError('The URL signature is not valid', 'SIGNATURE_INVALID');
          if (check.status === 'expired') throw new ForbiddenError('The URL has expired', 'URL_EXPIRED');
          const found = await local.get(key);
          if (!found) throw new NotFoundError();
          return sendObject(reply, found, `private, max-age=${local.secondsLeft(check.expiresAt)}`);
        }
        if (!isPublicKey(key) || !isSafeKey(key)) throw new NotFoundError();
        const found = await storage.get(key);
        if (!found) throw new NotFoundError();
        return sendObject(reply, found, PUBLIC_OBJECT_CACHE_CONTROL);
      },
    );

    if (!local) return;
    await app.register(async (scope) => {
      // The body is the object, whatever its type: no parser may read it, the handler streams it.
      scope.removeAllContentTypeParsers();
      scope.addContentTypeParser('*', (_request, _payload, done) => done(null));
      scope.withTypeProvider<TypeBoxTypeProvider>().put(
        '/files/upload/*',
        {
          schema: {
            hide: true,
            params: KeyParams,
            querystring: Type.Object({ ct: QueryValue, max: QueryValue, exp: QueryValue, sig: QueryValue }),
          },
        },
        async (request, reply) => {
          const key = request.params['*'];
          const raw = request.raw;
          try {
            if (!isSafeKey(key))
              throw new ForbiddenError('The URL signature is not valid', 'SIGNATURE_INVALID');
            const q = request.query;
            const check = local.verifyUpload(
              key,
              { ct: single(q.ct), max: single(q.max), exp: single(q.exp), sig: single(q.sig) },
              single(request.headers['content-type']),
            );
            if (check.status === 'invalid')
              throw new ForbiddenError('The URL signature or Content-Type is not valid', 'SIGNATURE_INVALID');
            if (check.status === 'expired') throw new ForbiddenError('The URL has expired', 'URL_EXPIRED');
            const declared = request.headers['content-length'];
            if (declared !== undefined && Number(declared) > check.maxBytes)
              throw new PayloadTooLargeError(`The upload exceeds its limit of ${check.maxBytes} bytes`);
            const stored = await local.write(key, raw, check.contentType, check.maxBytes, check.expiresAt);
            const exposed = reply.getHeader('access-control-expose-headers');
            if (typeof exposed === 'string')
              void reply.header('access-control-expose-headers', `${exposed}, ETag`);
            return reply.status(200).header('etag', stored.etag).send();
          } catch (err) {
            // Answered before the body was read: a lingering close. The answer says
            // `Connection: close`; once it is out the connection is half-closed, and what the client
            // still sends is read and dropped, for a few seconds and up to a bound, then it goes. A
            // client that sends its whole body before reading still gets the answer (closing with
            // the body unread would reset the connection and lose it), and a refused client cannot
            // keep the connection with an endless body.
            if (!raw.readableEnded) lingerAfterRefusal(raw, reply);
            throw err;
          }
        },
      );
    });
  };
}

/** How long, and how much of, a refused upload's body is read and dropped before its connection goes. */
const LINGER_MS = 5_000;
const LINGER_MAX_BYTES = 16 * 1024 * 1024;

function lingerAfterRefusal(raw: IncomingMessage, reply: FastifyReply): void {
  void reply.header('connection', 'close');
  const socket = raw.socket;
  const deadline = setTimeout(() => socket.destroy(), LINGER_MS);
  deadline.unref();
  socket.once('close', () => clearTimeout(deadline));
  // Node ends the socket of a `Connection: close` answer with `destroySoon`, which would destroy it
  // as soon as the answer is written, body unread: end it instead (a FIN), and let the deadline or
  // the bound destroy it.
  socket.destroySoon = function (this: typeof socket) {
    this.end();
  };
  let dropped = 0;
  raw.on('data', (chunk: Buffer) => {
    dropped += chunk.length;
    if (dropped > LINGER_MAX_BYTES) socket.destroy();
  });
  raw.resume();
}
