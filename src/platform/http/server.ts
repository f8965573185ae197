import { randomUUID } from 'node:crypto';
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify';
import cors from '@fastify/cors';
import multipart from '@fastify/multipart';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import addFormats from 'ajv-formats';
import type { Logger } from 'pino';
import type { Metrics } from '../metrics/metrics.js';
import { installErrorHandling } from './error-handler.js';

export interface HttpServerOptions {
  logger: Logger;
  metrics: Metrics;
  bodyLimitBytes: number;
  uploadLimitBytes: number;
  version: string;
}

const REQUEST_ID = /^[A-Za-z0-9._-]{1,64}$/;

/** Fastify with the plumbing every route relies on; features register their routes on it. */
export async function createHttpServer(options: HttpServerOptions): Promise<FastifyInstance> {
  const app = Fastify({
    loggerInstance: options.logger as FastifyBaseLogger,
    disableRequestLogging: true,
    bodyLimit: options.bodyLimitBytes,
    trustProxy: true,
    genReqId: (req) => {
      const incoming = req.headers['x-request-id'];
      return typeof incoming === 'string' && REQUEST_ID.test(incoming) ? incoming : randomUUID();
    },
    ajv: {
      customOptions: { removeAdditional: 'all', coerceTypes: 'array', useDefaults: true, allErrors: false },
      // ajv-formats types its options more narrowly than Fastify's plugin slot; the call is the documented one.
      plugins: [addFormats.default as never],
    },
  });

  installErrorHandling(app);
  app.addHook('onRequest', async (request, reply) => {
    void reply.header('x-request-id', request.id);
  });
  app.addHook('onResponse', async (request, reply) => {
    const route = request.routeOptions.url ?? 'unmatched';
    options.metrics.httpDuration.observe(
      { method: request.method, route, status: String(reply.statusCode) },
      reply.elapsedTime / 1000,
    );
    if (reply.statusCode >= 500) request.log.warn({ route, status: reply.statusCode }, 'request failed');
  });

  await app.register(cors, { origin: true, methods: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS'], exposedHeaders: ['X-Next-Cursor', 'X-Request-Id'] });
  await app.register(multipart, { limits: { fileSize: options.uploadLimitBytes, files: 1, fields: 10 } });
  await app.register(swagger, {
    openapi: {
      openapi: '3.0.3',
      info: { title: 'Zhiguang API', version: options.version, description: 'Knowledge-sharing community: accounts, posts, likes, favourites, follows and feeds.' },
      components: { securitySchemes: { bearerAuth: { type: 'http', scheme: 'bearer', bearerFormat: 'JWT' } } },
    },
  });
  await app.register(swaggerUi, { routePrefix: '/docs' });
  return app;
}
