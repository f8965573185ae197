import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { STATUS_CODES } from 'node:http';
import { isIP, Server, type Socket } from 'node:net';
import Fastify, {
  LogController,
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
  type FastifyServerOptions,
  type FastifySchemaCompiler,
} from 'fastify';
import cors from '@fastify/cors';
import multipart from '@fastify/multipart';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import { Ajv } from 'ajv';
import addFormats from 'ajv-formats';
import type { Logger } from 'pino';
import type { Metrics } from '../metrics/metrics.js';
import { damped } from '../logging/damper.js';
import { installErrorHandling } from './error-handler.js';
import { ErrorSchema, READINESS_ROUTE, TEXT_FORMATS } from './schemas.js';

export interface HttpServerOptions {
  logger: Logger;
  metrics: Metrics;
  bodyLimitBytes: number;
  uploadLimitBytes: number;
  /** Which proxies may name the client in X-Forwarded-For; `false` takes the socket's peer. */
  trustProxy?: boolean | number | string;
  /** Origins whose pages may read the answers (`true`: any). */
  corsOrigins?: true | string[];
  version: string;
  /** Serve the OpenAPI document and its UI (`/openapi.json`, `/docs`): processes that serve the API. */
  docs: boolean;
  /** How long a request may take to arrive whole, headers and body (`REQUEST_TIMEOUT_MS`). */
  requestTimeoutMs?: number;
  /** How often Node checks requests against that time (30 s by default; tests shorten it). */
  timeoutCheckIntervalMs?: number;
}

/**
 * How long a request may take to arrive whole: an upload of 10 MiB (an image through the embedded
 * profile's upload route) at 20 kB/s fits. Past it the connection is closed without an answer (the
 * request's own response is under way), so a client that stops sending mid-body holds no socket for
 * ever; headers that take too long (Node's 60 s) get the 408. Node checks every 30 s, so it can take
 * that much longer.
 */
export const REQUEST_TIMEOUT_MS = 600_000;

const REQUEST_ID = /^[A-Za-z0-9._-]{1,64}$/;

function newAjv(coerceTypes: false | 'array'): Ajv {
  const ajv = new Ajv({
    removeAdditional: 'all',
    coerceTypes,
    useDefaults: true,
    allErrors: false,
    strict: false,
  });
  addFormats.default(ajv);
  for (const [name, format] of Object.entries(TEXT_FORMATS)) {
    ajv.addFormat(name, { type: 'string', validate: format.validate });
  }
  return ajv;
}

const INTEGER_TEXT = /^-?\d+$/;
const NUMBER_TEXT = /^-?\d+(?:\.\d+)?$/;

type TextValidator = ReturnType<FastifySchemaCompiler<unknown>>;

/** The properties of an object schema that are numbers (alone or among `anyOf`), by kind. */
function numericProperties(schema: unknown): Map<string, 'integer' | 'number'> {
  const found = new Map<string, 'integer' | 'number'>();
  const properties = (schema as { properties?: Record<string, unknown> } | null)?.properties ?? {};
  for (const [name, property] of Object.entries(properties)) {
    const p = property as { type?: unknown; anyOf?: { type?: unknown }[] };
    const types = [p.type, ...(p.anyOf ?? []).map((option) => option.type)];
    // Text is a valid value of its own where a string is allowed.
    if (types.includes('string')) continue;
    if (types.includes('integer')) found.set(name, 'integer');
    else if (types.includes('number')) found.set(name, 'number');
  }
  return found;
}

/**
 * Coercion turns any text `Number()` reads into a number: `0x10`, `1e3`, ` 10`, `+5`. A query or
 * path number must be written in plain decimal digits instead; anything else fails validation as
 * a value of the wrong type would.
 */
function plainDecimalNumbers(schema: unknown, validate: TextValidator): TextValidator {
  const numeric = numericProperties(schema);
  if (numeric.size === 0) return validate;
  const strict: TextValidator = (data: unknown) => {
    if (data !== null && typeof data === 'object') {
      for (const [name, kind] of numeric) {
        const raw = (data as Record<string, unknown>)[name];
        const texts = Array.isArray(raw) ? raw : [raw];
        const pattern = kind === 'integer' ? INTEGER_TEXT : NUMBER_TEXT;
        if (texts.some((t) => typeof t === 'string' && !pattern.test(t))) {
          strict.errors = [
            {
              instancePath: `/${name}`,
              schemaPath: `#/properties/${name}/type`,
              keyword: 'type',
              params: { type: kind },
              message: `must be ${kind}`,
            },
          ];
          return false;
        }
      }
    }
    const valid = validate(data);
    strict.errors = validate.errors ?? null;
    return valid;
  };
  return strict;
}

/**
 * A request without a body has none, whatever its Content-Type says: clients commonly send
 * `Content-Type: application/json` (or a form type) on every call, also on those that take no body
 * (create a draft, publish, follow). A route that needs a body still refuses a missing one through
 * its schema; a non-empty form or plain-text body is 415.
 */
function acceptEmptyBodies(app: FastifyInstance): void {
  const json = app.getDefaultJsonParser('error', 'error');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) => {
    if (body === '') return done(null, undefined);
    void json(request, body as string, (err, parsed) => {
      if (err && parsesAsJson(body as string)) {
        // Valid JSON that the prototype-poisoning check refused: say so, not "not valid JSON".
        const refused = new Error('body must not contain the keys __proto__ or constructor.prototype');
        return done(Object.assign(refused, { statusCode: 400 }), undefined);
      }
      done(err, parsed);
    });
  });
  const refuse =
    (what: string) =>
    (_request: unknown, body: string | Buffer, done: (err: Error | null, body?: unknown) => void) => {
      if (body === '') return done(null, undefined);
      const error = new Error(
        `${what} bodies are not accepted; send JSON with Content-Type: application/json`,
      );
      done(Object.assign(error, { statusCode: 415 }), undefined);
    };
  app.addContentTypeParser('application/x-www-form-urlencoded', { parseAs: 'string' }, refuse('Form'));
  app.removeContentTypeParser('text/plain');
  app.addContentTypeParser('text/plain', { parseAs: 'string' }, refuse('Plain-text'));
}

function parsesAsJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

/**
 * An optional query parameter sent empty (`?page=&size=`, as clients that always send every
 * parameter do) counts as not sent, so it takes its default: added, per route, to the routes whose
 * query has optional parameters. A required one sent empty is still refused.
 */
function emptyOptionalQueryIsAbsent(app: FastifyInstance): void {
  app.addHook('onRoute', (route) => {
    const query = route.schema?.querystring as { properties?: object; required?: string[] } | undefined;
    if (!query?.properties) return;
    const required = new Set(query.required ?? []);
    const optional = Object.keys(query.properties).filter((name) => !required.has(name));
    if (optional.length === 0) return;
    const dropEmpty = (request: FastifyRequest, _reply: FastifyReply, done: () => void) => {
      const values = request.query as Record<string, unknown>;
      for (const name of optional) if (values[name] === '') delete values[name];
      done();
    };
    const before = route.preValidation;
    route.preValidation = before === undefined ? [dropEmpty] : [dropEmpty, ...[before].flat()];
  });
}

/**
 * The answers any route may give, in the contract's error shape, added to the documented answers
 * of every route that has a schema (a route's own entry wins): 500, and 503 (a backing service out
 * of reach, or the server shutting down); with a body, 413 (larger than the body limit) and 415 (a
 * content type the route does not take).
 */
function documentCommonErrors(app: FastifyInstance): void {
  app.addHook('onRoute', (route) => {
    const schema = route.schema as { response?: Record<string, unknown>; hide?: boolean } | undefined;
    if (!schema || schema.hide) return;
    const response = (schema.response ??= {});
    const methods = [route.method].flat();
    const statuses = methods.some((m) => ['POST', 'PUT', 'PATCH'].includes(m))
      ? [413, 415, 500, 503]
      : [500, 503];
    for (const status of statuses) response[String(status)] ??= ErrorSchema;
  });
}

/**
 * Each connection's peer as it was when the connection was accepted. A socket that the client has
 * reset no longer knows its peer, and neither does a request read from it before the reset.
 */
const peers = new WeakMap<object, string>();

/**
 * The address that sent a request: the one Fastify resolved (through trusted proxies), or else the
 * connection's peer, also once the connection is gone; null only for a connection this server did
 * not accept (an injected request without an address).
 */
export function clientAddress(request: FastifyRequest): string | null {
  const resolved = bareAddress(request.ip);
  if (resolved !== null) return resolved;
  const socket = request.socket;
  const peer = socket.remoteAddress ?? peers.get(socket) ?? null;
  // A trusted proxy forwarded something that is no address (untrusted, Fastify's address is the
  // peer's): every client it forwards would share the proxy's, and the limits per address become
  // limits for the whole site. Said once per server.
  if (
    typeof request.ip === 'string' &&
    request.ip !== peer &&
    request.headers['x-forwarded-for'] !== undefined &&
    !unreadableForwardSeen.has(request.server)
  ) {
    unreadableForwardSeen.add(request.server);
    request.log.warn(
      { forwarded: request.ip.slice(0, 100) },
      'a trusted proxy forwarded a client address that cannot be read (X-Forwarded-For): its clients are ' +
        "taken for the proxy, and share its limits per address; have it send the client's address alone",
    );
  }
  return peer;
}
const unreadableForwardSeen = new WeakSet<FastifyInstance>();

/**
 * An address as proxies forward it: alone, or with a port (`198.51.100.7:5555`, `[2001:db8::1]:443`),
 * or bracketed (`[2001:db8::1]`); null when it is none of these.
 */
export function bareAddress(text: string): string | null {
  if (isIP(text) !== 0) return text;
  const bracketed = /^\[([^\]]+)\](?::\d{1,5})?$/.exec(text);
  if (bracketed && isIP(bracketed[1]!) === 6) return bracketed[1]!;
  const withPort = /^([\d.]+):\d{1,5}$/.exec(text);
  if (withPort && isIP(withPort[1]!) === 4) return withPort[1]!;
  return null;
}

const CLIENT_ERRORS: Record<string, [number, string, string]> = {
  HPE_HEADER_OVERFLOW: [431, 'HEADERS_TOO_LARGE', 'Request headers are too large'],
  ERR_HTTP_REQUEST_TIMEOUT: [408, 'REQUEST_TIMEOUT', 'The request took too long to arrive'],
};

/** Answers a request the HTTP parser refused with the contract's error body, and closes its socket. */
function answerClientError(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const [status, code, message] = CLIENT_ERRORS[err.code ?? ''] ?? [
    400,
    'BAD_REQUEST',
    'Malformed HTTP request',
  ];
  const requestId = randomUUID();
  const body = JSON.stringify({ code, message, requestId });
  // A response still on its way on this socket (pipelined requests, or bytes past a body's length)
  // would be read as answered by this one, or have it land inside its body: just end the connection.
  const answering = (socket as Socket & { _httpMessage?: unknown })._httpMessage;
  if (socket.writable && !answering) {
    socket.write(
      `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nx-request-id: ${requestId}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy(err);
}

/** Fastify with the plumbing every route relies on; features register their routes on it. */
export async function createHttpServer(options: HttpServerOptions): Promise<FastifyInstance> {
  // Typed as Fastify's base logger so the instance keeps Fastify's default generics.
  const loggerInstance: FastifyBaseLogger = options.logger;
  const trust = options.trustProxy ?? false;
  // A hop count trusts that many proxies nearest to the server.
  const trustProxy: FastifyServerOptions['trustProxy'] =
    typeof trust === 'number' ? (_address: string, hop: number) => hop < trust : trust;
  const app = Fastify({
    loggerInstance,
    // Request lines would cost more than a like; failures are logged by the error handler and the hook below.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: options.bodyLimitBytes,
    trustProxy,
    // Errors Fastify meets before routing (a malformed percent-encoding in the URL) in the contract's shape.
    frameworkErrors: (error, request, reply) => {
      void (reply as FastifyReply)
        .code(400)
        .header('x-request-id', request.id)
        .header('x-content-type-options', 'nosniff')
        .header('cache-control', 'no-store')
        .send({ code: 'BAD_REQUEST', message: `Malformed request: ${error.message}`, requestId: request.id });
    },
    // Requests Node's parser refuses before Fastify sees them (headers too large, a malformed
    // request line or framing): in the contract's shape too, on the socket, which is then closed.
    clientErrorHandler: answerClientError,
    // Answered below instead, in the contract's shape.
    return503OnClosing: false,
    // Node takes it only when the server is made (set later, it is not enforced), so both ways.
    requestTimeout: options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS,
    http: {
      requestTimeout: options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS,
      ...(options.timeoutCheckIntervalMs !== undefined && {
        connectionsCheckingInterval: options.timeoutCheckIntervalMs,
      }),
    },
    genReqId: (req) => {
      const incoming = req.headers['x-request-id'];
      return typeof incoming === 'string' && REQUEST_ID.test(incoming) ? incoming : randomUUID();
    },
  });

  // Query strings and path parameters arrive as text and are coerced to their schema types; a JSON
  // body is never coerced, so `{"nickname": 42}` is the 400 the contract asks for, not "42".
  const validators = {
    body: newAjv(false),
    text: newAjv('array'),
  };
  app.setValidatorCompiler(({ schema, httpPart }) =>
    httpPart === 'body'
      ? validators.body.compile(schema)
      : plainDecimalNumbers(schema, validators.text.compile(schema)),
  );

  app.server.on('connection', (socket: { remoteAddress?: string }) => {
    if (socket.remoteAddress) peers.set(socket, socket.remoteAddress);
  });
  acceptEmptyBodies(app);
  emptyOptionalQueryIsAbsent(app);
  installErrorHandling(app);
  // Once closing, requests still arriving on open connections are turned away: the client should
  // retry on another process (the listener is closed; requests in flight finish).
  app.addHook('preClose', async () => {
    closingServers.add(app);
  });
  // Answers given while closing end their connection, so none keeps the close waiting.
  app.addHook('onSend', async (_request, reply) => {
    if (closingServers.has(app)) void reply.header('connection', 'close');
  });
  // Behind a proxy that is not trusted every client has the proxy's address, and the limits per
  // address become limits for the whole site: said once, when the first forwarded request comes.
  let untrustedForwardSeen = trust !== false;
  app.addHook('onRequest', (request, reply, done) => {
    // No answer is for a cache to keep unless its route says so (objects, the JWKS): answers differ
    // by caller (an owner's profile has their phone number) and change (a post made private).
    void reply
      .header('x-request-id', request.id)
      .header('x-content-type-options', 'nosniff')
      .header('cache-control', 'no-store');
    if (!untrustedForwardSeen && request.headers['x-forwarded-for'] !== undefined) {
      untrustedForwardSeen = true;
      request.log.warn(
        'a request came through a proxy (X-Forwarded-For) that is not trusted: every client it forwards ' +
          'shares its address, and so the limits per address; set ZG_TRUST_PROXY if it is yours',
      );
    }
    done();
  });
  // After the headers above and before the refusal below, so that every answer carries them.
  await app.register(cors, {
    // A list answers only its own origins; other pages' browsers then refuse to read the answers.
    origin: options.corsOrigins ?? true,
    methods: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'],
    // An OPTIONS without the preflight headers is answered like a preflight, not with a bare-text 400.
    strictPreflight: false,
    exposedHeaders: ['X-Next-Cursor', 'X-Request-Id'],
  });
  app.addHook('onRequest', (request, reply, done) => {
    if (!closingServers.has(app)) return done();
    void reply
      .code(503)
      .header('connection', 'close')
      .header('retry-after', '1')
      .send({
        code: 'UNAVAILABLE',
        message: 'This server is shutting down; try again',
        requestId: request.id,
        // The readiness route's answer has its state too (its schema wants it): draining.
        ...(request.routeOptions.url === READINESS_ROUTE ? { status: 'draining', checks: {} } : {}),
      });
  });
  // 503s come in floods while a dependency is out: at most a line a second, with the count.
  const unavailable = damped();
  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched';
    const status = reply.statusCode;
    options.metrics.httpDuration.observe(
      { method: request.method, route, status: String(status) },
      reply.elapsedTime / 1000,
    );
    // `/readyz` answers 503 by design while not ready; its own handler logs when that changes.
    if (status === 503) {
      if (route !== READINESS_ROUTE)
        unavailable((heldBack) => request.log.warn({ route, status, heldBack }, 'request failed'));
    } else if (status >= 500) request.log.warn({ route, status }, 'request failed');
  });

  documentCommonErrors(app);
  await app.register(multipart, { limits: { fileSize: options.uploadLimitBytes, files: 1, fields: 10 } });
  if (!options.docs) return app;
  await app.register(swagger, {
    // A multipart route validates no body (the parts are read by the handler): its one file part is
    // described here, for the document only, so that the UI offers a file picker.
    transform: ({ schema, url }) => {
      const described = schema as { consumes?: string[]; body?: unknown } | undefined;
      if (!described?.consumes?.includes('multipart/form-data') || described.body !== undefined)
        return { schema, url };
      const file = {
        type: 'object',
        required: ['file'],
        properties: { file: { type: 'string', format: 'binary' } },
      };
      return { schema: { ...schema, body: file }, url };
    },
    openapi: {
      openapi: '3.0.3',
      info: {
        title: 'Zhiguang API',
        version: options.version,
        description: 'Knowledge-sharing community: accounts, posts, likes, favourites, follows and feeds.',
      },
      components: {
        securitySchemes: { bearerAuth: { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' } },
      },
    },
  });
  await app.register(swaggerUi, { routePrefix: '/docs' });
  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());
  return app;
}

/** Servers closing: their answers end their connections, and requests arriving are answered 503. */
const closingServers = new WeakSet<FastifyInstance>();

/** How long a closing server, no longer listening, keeps its open connections before it closes idle ones. */
const CLOSE_NOTICE_MS = 250;

/**
 * Closes the server. It stops listening (a new connection is refused: nothing of it reached the
 * server) and, for a moment (`CLOSE_NOTICE_MS`), keeps its open connections, every answer saying
 * the connection closes after it and requests still arriving answered 503: a client whose next
 * request was on its way on a kept-alive connection gets an answer, where a connection closed under
 * it would leave it not knowing whether a POST was done. Then it closes idle connections; requests in flight are answered, for `graceMs` at most; then their
 * connections are cut, so a client that stops sending mid-request, or a request stuck on a
 * dependency, cannot hold up the rest of a shutdown (flushing buffered views and events, leaving
 * consumer groups).
 */
export async function closeWithin(app: FastifyInstance, graceMs: number): Promise<void> {
  closingServers.add(app);
  const noticeMs = Math.min(CLOSE_NOTICE_MS, Math.floor(graceMs / 4));
  if (noticeMs > 0 && app.server.listening) {
    // New connections are refused from now on (nothing of theirs reached the server), but open ones
    // stay open: the HTTP server's own close would end the idle ones at once.
    Server.prototype.close.call(app.server);
    await sleep(noticeMs);
    graceMs -= noticeMs;
  }
  const closed = app.close();
  let timer: NodeJS.Timeout | undefined;
  const late = await Promise.race([
    closed.then(() => false),
    new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(true), graceMs))),
  ]);
  clearTimeout(timer);
  if (!late) return;
  app.log.warn({ graceMs }, 'requests still open at shutdown; closing their connections');
  app.server.closeAllConnections();
  await closed;
}
