// Shared fastify setup for every HTTP server in the stack (engine, controller, proxy):
// errors in the OpenAI shape {"error": {"message", "type", "code"}} with codes from the catalog
// in errors.ts, malformed JSON → 400, oversized body → 413, unknown route → 404, and never a
// 500 for something a client sent.
import Fastify, { type FastifyInstance, type FastifyError } from 'fastify';
import { ERRORS, KvcError, asKvcError, kvcError } from './errors.js';
import { logger } from './log.js';

export interface HttpServerOptions {
  name: string;
  /** Largest accepted request body, bytes. */
  bodyLimit?: number;
}

export function createHttpServer(opts: HttpServerOptions): FastifyInstance {
  const log = logger(opts.name);
  const app = Fastify({
    logger: false,
    bodyLimit: opts.bodyLimit ?? 16 * 1024 * 1024,
    // Clients of an inference server keep connections open for long streams.
    keepAliveTimeout: 65_000,
    forceCloseConnections: true,
  });

  app.setErrorHandler((err: FastifyError | KvcError, _req, reply) => {
    let e: KvcError;
    if (err instanceof KvcError) e = err;
    else if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') e = kvcError(ERRORS.body_too_large, `request body exceeds ${opts.bodyLimit ?? 16 * 1024 * 1024} bytes`);
    else if (err.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') e = kvcError(ERRORS.invalid_content_type, 'unsupported Content-Type; send application/json');
    else if (err.code === 'FST_ERR_CTP_EMPTY_JSON_BODY') e = kvcError(ERRORS.invalid_json, 'request body is empty; expected a JSON object');
    else if (err.statusCode === 400 || err instanceof SyntaxError) e = kvcError(ERRORS.invalid_json, `malformed JSON body: ${err.message}`);
    else if (typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500) {
      // Any other client error fastify detects keeps its status and fastify's own code
      // (FST_ERR_…), which says more than a generic catalog code would.
      e = new KvcError(err.statusCode, 'invalid_request_error', err.message, err.code ?? null);
    } else {
      e = asKvcError(err);
      log.error(`unhandled error: ${err.stack ?? err.message}`);
    }
    if (!reply.sent && !reply.raw.headersSent) void reply.code(e.status).send(e.toJSON());
  });

  app.setNotFoundHandler((req, reply) => {
    const e = kvcError(ERRORS.route_not_found, `no route ${req.method} ${req.url}`);
    void reply.code(e.status).send(e.toJSON());
  });

  return app;
}

/** Body must be a JSON object (not an array, string or null). */
export function requireObject(body: unknown): Record<string, unknown> {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw kvcError(ERRORS.invalid_json, 'request body must be a JSON object');
  }
  return body as Record<string, unknown>;
}
