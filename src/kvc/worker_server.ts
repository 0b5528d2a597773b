// The instance worker's command port (kvc_worker_port): HTTP/JSON, served with the shared
// fastify setup. The controller is its only client; every call carries its own deadline on
// the controller side (see docs/controller.md for why HTTP rather than a ZeroMQ REQ/REP pair).
import type { FastifyInstance } from 'fastify';
import { z } from 'zod';
import { createHttpServer, requireObject } from '../common/http.js';
import { parseBody } from '../common/validate.js';
import type { KvcStore } from './store.js';
import { LOCATIONS } from './types.js';
import { WorkerOps } from './worker_ops.js';

const keys = z.array(z.string().regex(/^[0-9a-f]{16}$/, 'expected a 16-digit hex chunk key'));
const location = z.enum(LOCATIONS, `expected one of ${LOCATIONS.join(', ')}`);
const keysAt = z.object({ keys, location });
const moveSchema = z.object({
  event_id: z.string().optional(),
  keys,
  location,
  copy: z.boolean(),
  target: z.object({ location: z.string().min(1), instance_id: z.string().optional(), distributed_url: z.string().nullable().optional() }),
  deadline_ms: z.number().int().min(1).max(24 * 3600 * 1000),
});

export interface WorkerIdentity {
  instanceId: string;
  workerId: number;
  modelId: string;
  chunkSize: number;
}

export async function startWorkerServer(store: KvcStore, id: WorkerIdentity, host: string, port: number): Promise<FastifyInstance> {
  const app = createHttpServer({ name: 'kvc.worker' });
  const ops = new WorkerOps(store, id.instanceId);
  app.get('/health', async () => ({
    instance_id: id.instanceId,
    worker_id: id.workerId,
    model_id: id.modelId,
    chunk_size: id.chunkSize,
    locations: store.stats(),
    moves_in_flight: ops.movesInFlight,
  }));
  app.post('/lookup', async (req) => {
    const b = parseBody(keysAt, requireObject(req.body));
    return { count: ops.lookup(b.keys, b.location) };
  });
  app.post('/pin', async (req) => {
    const b = parseBody(keysAt, requireObject(req.body));
    return { count: ops.pin(b.keys, b.location, false) };
  });
  app.post('/unpin', async (req) => {
    const b = parseBody(keysAt, requireObject(req.body));
    return { count: ops.pin(b.keys, b.location, true) };
  });
  app.post('/clear', async (req) => {
    const b = parseBody(z.object({ location }), requireObject(req.body));
    return { removed: await ops.clear(b.location) };
  });
  app.post('/move', async (req, reply) => {
    const b = parseBody(moveSchema, requireObject(req.body));
    // The controller gives up on a move by dropping its request (its deadline): the move is then
    // cancelled, and above all its source is not deleted afterwards (the event already says failed).
    const cancel = new AbortController();
    const onClose = () => {
      if (!reply.raw.writableFinished) cancel.abort();
    };
    reply.raw.once('close', onClose);
    try {
      return { moved: await ops.move(b, cancel.signal) };
    } finally {
      reply.raw.off('close', onClose);
    }
  });
  await app.listen({ host, port });
  return app;
}
