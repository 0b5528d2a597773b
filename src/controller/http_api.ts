// The controller's HTTP API (DESIGN §5). Request bodies are validated with zod through
// parseBody, so a bad field is a 400 naming it; unknown instances, locations and events are
// 404; workers that cannot be reached or do not answer in time are 503/504.
import type { FastifyInstance } from 'fastify';
import { Gauge, Registry as PromRegistry } from 'prom-client';
import { z } from 'zod';
import { notFound } from '../common/errors.js';
import { createHttpServer, requireObject } from '../common/http.js';
import { parseBody, tokenIds } from '../common/validate.js';
import type { Operations } from './operations.js';

const str = (what: string) => z.string(`expected a string (${what})`).min(1, `expected a non-empty string (${what})`);
const position = z
  .array(z.string('expected a string'), 'expected a position [instance_id, location] of two strings')
  .length(2, 'expected a position [instance_id, location] of exactly two strings')
  .transform((a) => [a[0]!, a[1]!] as [string, string]);

export const moveSchema = z.object({
  old_position: position,
  new_position: position,
  tokens: tokenIds.default([]),
  copy: z.boolean('expected true or false').default(false),
});
export const pinSchema = z.object({ tokens: tokenIds, instance_id: str('instance id'), location: str('location name') });
const lookupSchema = z.object({ tokens: tokenIds });
const clearSchema = z.object({ instance_id: str('instance id'), location: str('location name') });
const healthSchema = z.object({ instance_id: str('instance id') });
const checkFinishSchema = z.object({ event_id: str('event id') });
const queryInstanceSchema = z.object({ ip: str('ip address') });

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

function metrics(ops: Operations): PromRegistry {
  const reg = new PromRegistry();
  const r = ops.registry;
  const gauge = (name: string, help: string, read: () => number) =>
    new Gauge({ name, help, registers: [reg], collect() { this.set(read()); } });
  gauge('kvc_controller_instances', 'Registered cache instances', () => r.instances.size);
  gauge('kvc_controller_workers', 'Registered cache workers', () => r.workers().length);
  gauge('kvc_controller_index_keys', 'Distinct chunk keys in the global index', () => r.index.size);
  gauge('kvc_controller_admitted_keys_total', 'Admitted keys reported by instances', () => r.stats.admitted);
  gauge('kvc_controller_evicted_keys_total', 'Evicted keys reported by instances', () => r.stats.evicted);
  gauge('kvc_controller_synced_keys_total', 'Keys received in full syncs', () => r.stats.synced);
  gauge('kvc_controller_registrations_total', 'Worker registrations (including re-registrations)', () => r.stats.registrations);
  gauge('kvc_controller_reaped_workers_total', 'Workers reaped for missing heartbeats', () => r.stats.reaped);
  gauge('kvc_controller_bad_messages_total', 'Malformed monitor messages dropped', () => r.stats.badMessages);
  new Gauge({
    name: 'kvc_controller_events',
    help: 'Controller operations by status',
    labelNames: ['status'],
    registers: [reg],
    collect() {
      for (const [status, n] of Object.entries(ops.events.counts)) this.set({ status }, n);
    },
  });
  return reg;
}

export function buildHttpApi(ops: Operations): FastifyInstance {
  const app = createHttpServer({ name: 'controller.http' });
  const prom = metrics(ops);
  const body = (b: unknown) => requireObject(b);

  app.post('/move', async (req) => ops.move(parseWithTokens(moveSchema, req.body)));
  app.post('/pin', async (req) => ops.pin(parseWithTokens(pinSchema, req.body)));
  app.post('/unpin', async (req) => ops.unpin(parseWithTokens(pinSchema, req.body)));
  app.post('/lookup', async (req) => ops.lookup(parseWithTokens(lookupSchema, req.body).tokens));
  app.post('/clear', async (req) => ops.clear(parseBody(clearSchema, body(req.body))));
  app.post('/health', async (req) => ops.health(parseBody(healthSchema, body(req.body)).instance_id));
  app.post('/query_instance', async (req) => ops.queryInstance(parseBody(queryInstanceSchema, body(req.body)).ip));
  app.post('/check_finish', async (req) => {
    const { event_id } = parseBody(checkFinishSchema, body(req.body));
    const ev = ops.events.get(event_id);
    if (!ev) throw notFound(`event_id: unknown event "${event_id}"`, 'unknown_event');
    return { event_id, status: ev.status, num_tokens: ev.num_tokens, error: ev.error };
  });
  app.get('/events/:event_id', async (req) => {
    const { event_id } = req.params as { event_id: string };
    const ev = ops.events.get(event_id);
    if (!ev) throw notFound(`event_id: unknown event "${event_id}"`, 'unknown_event');
    return ev;
  });
  app.get('/instances', async () => ({ instances: ops.describeInstances() }));
  app.get('/healthz', async () => ({ status: 'ok', instances: ops.registry.instances.size, index_keys: ops.registry.index.size }));
  app.get('/metrics', async (_req, reply) => {
    void reply.header('content-type', prom.contentType);
    return prom.metrics();
  });
  return app;
}
