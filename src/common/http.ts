// Shared fastify setup for every HTTP server in the stack (engine, controller, proxy, cache
// workers): errors in the OpenAI shape {"error": {"message", "type", "param", "code"}} with codes from the
// catalog in errors.ts, malformed JSON → 400, oversized body → 413, nesting deeper than
// the JSON depth limit → 400, unknown route → 404, fastify's and Node's own protocol errors
// (bad URL encoding, oversized headers, slow requests) in the same shape, a cap on connections
// per client address, and never a 500 for something a client sent. Limits: src/common/limits.ts.
import type { Socket } from 'node:net';
import Fastify, { type FastifyInstance, type FastifyError } from 'fastify';
import { ERRORS, KvcError, asKvcError, kvcError } from './errors.js';
import {
  DEFAULT_BODY_LIMIT,
  DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
  DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
  DEFAULT_MAX_JSON_DEPTH,
  DEFAULT_REQUEST_TIMEOUT_MS,
  jsonDeeperThan,
} from './limits.js';
import { logger } from './log.js';

export interface HttpServerOptions {
  name: string;
  /** Largest accepted request body, bytes. */
  bodyLimit?: number;
  /** Deepest accepted nesting of a JSON body. */
  maxJsonDepth?: number;
  /** Time allowed to receive one whole request, ms. */
  requestTimeoutMs?: number;
  /** Open connections allowed from one client address. */
  maxConnectionsPerClient?: number;
  /** The body types the server parses, as named in the 400 for any other (default: application/json). */
  contentTypes?: readonly string[];
}

/** A complete HTTP/1.1 error response in the OpenAI shape, for places with only a socket. */
function rawErrorResponse(e: KvcError, reason: string): string {
  const body = JSON.stringify(e.toJSON());
  return `HTTP/1.1 ${e.status} ${reason}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
}

export function createHttpServer(opts: HttpServerOptions): FastifyInstance {
  const log = logger(opts.name);
  const bodyLimit = opts.bodyLimit ?? DEFAULT_BODY_LIMIT;
  const maxDepth = opts.maxJsonDepth ?? DEFAULT_MAX_JSON_DEPTH;
  const app = Fastify({
    logger: false,
    bodyLimit,
    // Clients of an inference server keep connections open for long streams; an idle one goes.
    keepAliveTimeout: DEFAULT_KEEP_ALIVE_TIMEOUT_MS,
    requestTimeout: opts.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
    forceCloseConnections: true,
    // A URL fastify cannot decode (e.g. `/%ff%fe`): the same 400 shape as everything else.
    frameworkErrors: (err, _req, reply) => {
      const msg = err.message.length > 200 ? err.message.slice(0, 200) + '…' : err.message;
      const e = kvcError(ERRORS.invalid_url, `bad request URL: ${msg}`);
      void (reply as unknown as { code(n: number): { send(b: unknown): unknown } }).code(400).send(e.toJSON());
    },
    // Errors of the HTTP parser itself (oversized headers, garbage, request timeout): no
    // request object exists, answer on the socket when it is still writable.
    clientErrorHandler: (err: Error & { code?: string }, socket: Socket) => {
      if (err.code === 'ECONNRESET' || !socket.writable) {
        socket.destroy();
        return;
      }
      let e: KvcError;
      let reason = 'Bad Request';
      if (err.code === 'HPE_HEADER_OVERFLOW') {
        e = kvcError(ERRORS.headers_too_large, 'request headers (or URL) exceed the size limit');
        reason = 'Request Header Fields Too Large';
      } else if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
        e = kvcError(ERRORS.request_timeout, 'the request was not received in time');
        reason = 'Request Timeout';
      } else {
        e = kvcError(ERRORS.bad_http, `malformed HTTP request: ${err.code ?? err.message}`);
      }
      socket.end(rawErrorResponse(e, reason));
    },
  });

  installJsonParser(app, bodyLimit, maxDepth);

  // Connections per client address: one client cannot take every file descriptor.
  const maxPerClient = opts.maxConnectionsPerClient ?? DEFAULT_MAX_CONNECTIONS_PER_CLIENT;
  const perClient = new Map<string, number>();
  app.server.on('connection', (socket: Socket) => {
    const addr = socket.remoteAddress ?? '?';
    const n = (perClient.get(addr) ?? 0) + 1;
    if (n > maxPerClient) {
      log.warn(`refused a connection from ${addr}: ${maxPerClient} connections open from that address`);
      socket.end(rawErrorResponse(kvcError(ERRORS.too_many_connections, `too many connections from ${addr} (limit ${maxPerClient})`), 'Too Many Requests'));
      return;
    }
    perClient.set(addr, n);
    socket.once('close', () => {
      const left = (perClient.get(addr) ?? 1) - 1;
      if (left <= 0) perClient.delete(addr);
      else perClient.set(addr, left);
    });
  });

  app.setErrorHandler((err: FastifyError | KvcError, _req, reply) => {
    let e: KvcError;
    if (err instanceof KvcError) e = err;
    else if (err.code === 'FST_ERR_CTP_BODY_TOO_LARGE') e = kvcError(ERRORS.body_too_large, `request body exceeds ${bodyLimit} bytes`);
    else if (err.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') e = kvcError(ERRORS.invalid_content_type, `unsupported Content-Type; send ${(opts.contentTypes ?? ['application/json']).join(' or ')}`);
    else if (err.code === 'FST_ERR_CTP_EMPTY_JSON_BODY') e = kvcError(ERRORS.invalid_json, 'request body is empty; expected a JSON object');
    else if (err.statusCode === 400 || err instanceof SyntaxError) e = kvcError(ERRORS.invalid_json, `malformed JSON body: ${err.message}`);
    else if (err instanceof RangeError && /call stack/i.test(err.message)) {
      // Defence in depth behind the depth limit: a body that still overflows the stack is the client's.
      e = kvcError(ERRORS.json_too_deep, 'request body is nested too deeply');
    } else if (typeof err.statusCode === 'number' && err.statusCode >= 400 && err.statusCode < 500) {
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
    const e = kvcError(ERRORS.route_not_found, `no route ${req.method} ${req.url.length > 200 ? req.url.slice(0, 200) + '…' : req.url}`);
    void reply.code(e.status).send(e.toJSON());
  });

  return app;
}

/**
 * The JSON body parser of every server (installed by createHttpServer): refuse deep nesting before parsing, so nothing
 * recursive behind the parser (validators, JSON.stringify of a forwarded body) can overflow the
 * stack, then fastify's secure JSON parser.
 */
export function installJsonParser(app: FastifyInstance, bodyLimit: number, maxDepth: number): void {
  const defaultJson = app.getDefaultJsonParser('error', 'ignore');
  app.removeContentTypeParser('application/json');
  app.addContentTypeParser('application/json', { parseAs: 'string', bodyLimit }, (req, body, done) => {
    const text = body as string;
    if (jsonDeeperThan(text, maxDepth)) {
      done(kvcError(ERRORS.json_too_deep, `malformed JSON body: nesting deeper than ${maxDepth} levels`), undefined);
      return;
    }
    defaultJson(req, text, done);
  });
}

/** Body must be a JSON object (not an array, string or null). */
export function requireObject(body: unknown): Record<string, unknown> {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    throw kvcError(ERRORS.invalid_json, 'request body must be a JSON object');
  }
  return body as Record<string, unknown>;
}
