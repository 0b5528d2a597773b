// The controller's HTTP API (routes: docs/controller.md; the dashboard's are in dashboard.ts). Request bodies are validated with zod through
// parseBody, so a bad field is a 400 naming it; unknown instances, locations and events are
// 404; workers that cannot be reached or do not answer in time are 503/504.
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { ERRORS, badRequest, kvcError } from '../common/errors.js';
import { createHttpServer, requireObject } from '../common/http.js';
import { parseBody } from '../common/validate.js';
import { checkFinishSchema, clearSchema, compressSchema, decompressSchema, eventsQuerySchema, healthSchema, lookupSchema, moveSchema, pinSchema, queryInstanceSchema, queryWorkerInfoSchema } from '../protocol/controller_api.js';
import { TOKEN_BODY_CONTENT_TYPE } from '../protocol/token_body.js';
import { CACHE_SALT_HEADER, PREFIX_LOOKUP_PATH, prefixLookupRequestSchema, type PrefixLookupReply } from '../protocol/prefix_lookup.js';
import { registerDashboard } from './dashboard.js';
import { ControllerMetrics } from './metrics.js';
import type { Operations } from './operations.js';
import { deploymentSecretWhere, requireSecret } from '../common/auth.js';
import { DEFAULT_BODY_LIMIT } from '../common/limits.js';
import { installTokenBodyParser, TokenBody } from './token_body_parser.js';
import { PID_HEADER } from '../protocol/process_header.js';

/** Token arrays are the bulk of every body: check them in one tight loop (zod takes ~1 ms for 8192). */
function validTokens(t: unknown): t is number[] {
  if (!Array.isArray(t)) return false;
  for (let i = 0; i < t.length; i++) if (t[i] >>> 0 !== t[i]) return false;
  return true;
}

/**
 * parseBody with a fast path for `tokens`: when they are valid, the rest of the body goes
 * through the schema with an empty token list; otherwise the schema reports the bad element.
 */
function parseWithTokens<S extends z.ZodType<{ tokens: number[] }>>(schema: S, raw: unknown): z.infer<S> {
  const b = requireObject(raw);
  if (!validTokens(b.tokens)) return parseBody(schema, b);
  const parsed = parseBody(schema, { ...b, tokens: [] });
  parsed.tokens = b.tokens;
  return parsed;
}

/**
 * The token ids of a request-path lookup: a binary body (src/protocol/token_body.ts), read into
 * pooled memory and released by `use` once it returns, or a JSON `{"tokens": [...]}` body.
 */
function withTokens<S extends z.ZodType<{ tokens: number[]; cache_salt?: string }>, R>(
  schema: S,
  req: { body: unknown; headers: Record<string, string | string[] | undefined> },
  use: (tokens: ArrayLike<number>, salt: string | undefined) => R,
): R {
  const body = req.body;
  if (!(body instanceof TokenBody)) {
    const b = parseWithTokens(schema, body);
    return use(b.tokens, b.cache_salt);
  }
  try {
    const h = req.headers[CACHE_SALT_HEADER];
    if (Array.isArray(h) || h === '') throw badRequest(`${CACHE_SALT_HEADER}: expected one non-empty cache salt`);
    return use(body.tokens, h);
  } finally {
    body.release();
  }
}

/** The routes that also take a binary token body. */
const BINARY_ROUTES = ['/lookup', PREFIX_LOOKUP_PATH] as const;

export interface HttpApiOptions {
  /** Also export the process metrics (CPU, memory, event loop) — for the `kvc controller` process. */
  processMetrics?: boolean;
}

export async function buildHttpApi(ops: Operations, o: HttpApiOptions = {}): Promise<FastifyInstance> {
  const app = createHttpServer({ name: 'controller.http', contentTypes: ['application/json', `${TOKEN_BODY_CONTENT_TYPE} (${BINARY_ROUTES.join(', ')})`] });
  installTokenBodyParser(app, BINARY_ROUTES, DEFAULT_BODY_LIMIT);
  // fastify's default text/plain parser would hand a string to handlers that expect an object;
  // the controller takes JSON (and binary token ids), so any other type is a 400 naming both.
  app.removeContentTypeParser('text/plain');
  // Mutations need the deployment secret, signed or as a bearer (operators, the dashboard,
  // LMCache-style scripts); reads stay open (docs/security.md).
  const MUTATIONS = new Set(['/move', '/pin', '/unpin', '/clear', '/compress', '/decompress']);
  requireSecret(app, { applies: (m, p) => m === 'POST' && MUTATIONS.has(p), name: 'controller', channel: 'controller-http', bearer: true, where: deploymentSecretWhere });
  const metrics = new ControllerMetrics(ops, o.processMetrics ?? false);
  ops.events.onComplete = (ev) => metrics.operationCompleted(ev);
  metrics.instrument(app);
  await registerDashboard(app, ops);
  const body = (b: unknown) => requireObject(b);

  app.post('/move', async (req) => ops.move(parseWithTokens(moveSchema, req.body)));
  app.post('/compress', async (req) => ops.recode(parseWithTokens(compressSchema, req.body), 'compress'));
  app.post('/decompress', async (req) => ops.recode(parseWithTokens(decompressSchema, req.body), 'decompress'));
  app.post('/pin', async (req) => ops.pin(parseWithTokens(pinSchema, req.body)));
  app.post('/unpin', async (req) => ops.unpin(parseWithTokens(pinSchema, req.body)));
  // The request path: synchronous handlers (no promise per request), and the binary token body
  // read into pooled memory (docs/controller.md "Lookup path").
  app.post('/lookup', (req, reply) => {
    void reply.send(withTokens(lookupSchema, req, (t, salt) => ops.lookup(t, salt)));
  });
  // The kv-aware router's one call per request: every instance's cached prefix at once.
  app.post(PREFIX_LOOKUP_PATH, (req, reply) => {
    const r: PrefixLookupReply = withTokens(prefixLookupRequestSchema, req, (t, salt) => ops.prefixByInstance(t, salt));
    void reply.send(r);
  });
  app.post('/clear', async (req) => ops.clear(parseBody(clearSchema, body(req.body))));
  app.post('/health', async (req) => ops.health(parseBody(healthSchema, body(req.body)).instance_id));
  app.post('/query_instance', async (req) => {
    const q = parseBody(queryInstanceSchema, body(req.body));
    return ops.queryInstance(q.ip, q.event_id);
  });
  app.post('/query_worker_info', async (req) => {
    const q = parseBody(queryWorkerInfoSchema, body(req.body));
    return ops.queryWorkerInfo(q.instance_id, q.worker_ids);
  });
  app.post('/check_finish', async (req) => {
    const { event_id } = parseBody(checkFinishSchema, body(req.body));
    const ev = ops.events.get(event_id);
    if (!ev) throw kvcError(ERRORS.unknown_event, `event_id: unknown event "${event_id}"`);
    return { event_id, status: ev.status, num_tokens: ev.num_tokens, error: ev.error };
  });
  app.get('/events/:event_id', async (req) => {
    const { event_id } = req.params as { event_id: string };
    const ev = ops.events.get(event_id);
    if (!ev) throw kvcError(ERRORS.unknown_event, `event_id: unknown event "${event_id}"`);
    return ev;
  });
  app.get('/instances', async () => ({ instances: ops.describeInstances() }));
  // The key settings every instance must share, and the registrations refused for differing
  // (docs/controller.md "Registration"); the proxy compares its engines with it at start.
  app.get('/deployment', async () => ({
    ...ops.registry.deploymentSettings(),
    groups: ops.registry.groups(),
    refused: [...ops.registry.refused].map(([instance, r]) => ({ instance, message: r.message, at: r.at / 1000 })),
  }));
  app.get('/events', async (req) => {
    const { limit } = parseBody(eventsQuerySchema, requireObject(req.query ?? {}));
    return { events: ops.events.recent(limit), counts: ops.events.counts };
  });
  app.get('/healthz', async (_req, reply) => {
    void reply.header(PID_HEADER, String(process.pid));
    return { status: 'ok', instances: ops.registry.instances.size, index_keys: ops.registry.index.size };
  });
  app.get('/metrics', async (_req, reply) => {
    void reply.header('content-type', metrics.registry.contentType);
    return metrics.registry.metrics();
  });
  return app;
}
