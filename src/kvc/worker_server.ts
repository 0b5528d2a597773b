// The instance worker's command port (kvc_worker_port): HTTP/JSON, served with the shared
// fastify setup. The controller is its only client; every call carries its own deadline on
// the controller side (see docs/controller.md for why HTTP rather than a ZeroMQ REQ/REP pair).
import type { FastifyInstance } from 'fastify';
import { createHttpServer, requireObject } from '../common/http.js';
import { parseBody } from '../common/validate.js';
import type { KvcStore } from './store.js';
import { WORKER_ROUTES as R, type WorkerReply } from '../protocol/worker_api.js';
import { WorkerOps } from './worker_ops.js';
import { requireSecret } from '../common/auth.js';

export interface WorkerIdentity {
  instanceId: string;
  workerId: number;
  modelId: string;
  chunkSize: number;
}

export async function startWorkerServer(store: KvcStore, id: WorkerIdentity, host: string, port: number): Promise<FastifyInstance> {
  const app = createHttpServer({ name: 'kvc.worker' });
  // Commands come from the controller only: signed with the deployment secret (GET /health stays open).
  requireSecret(app, { applies: (m) => m !== 'GET', name: 'kvc.worker', channel: 'worker-http', bearer: false });
  const ops = new WorkerOps(store, id.instanceId);
  app.get(R.health.path, async (): Promise<WorkerReply<'health'>> => ({
    instance_id: id.instanceId,
    worker_id: id.workerId,
    model_id: id.modelId,
    chunk_size: id.chunkSize,
    locations: store.stats(),
    moves_in_flight: ops.movesInFlight,
  }));
  app.post(R.lookup.path, async (req): Promise<WorkerReply<'lookup'>> => {
    const b = parseBody(R.lookup.request, requireObject(req.body));
    return { count: ops.lookup(b.keys, b.location) };
  });
  app.post(R.pin.path, async (req): Promise<WorkerReply<'pin'>> => {
    const b = parseBody(R.pin.request, requireObject(req.body));
    return { count: ops.pin(b.keys, b.location) };
  });
  app.post(R.unpin.path, async (req): Promise<WorkerReply<'unpin'>> => {
    const b = parseBody(R.unpin.request, requireObject(req.body));
    return { count: ops.unpin(b.keys, b.location) };
  });
  app.post(R.clear.path, async (req): Promise<WorkerReply<'clear'>> => {
    const b = parseBody(R.clear.request, requireObject(req.body));
    return ops.clear(b.location, b.include_pinned ?? false);
  });
  app.post(R.recode.path, async (req): Promise<WorkerReply<'recode'>> => {
    const b = parseBody(R.recode.request, requireObject(req.body));
    return { count: await ops.recode(b) };
  });
  app.post(R.move.path, async (req, reply): Promise<WorkerReply<'move'>> => {
    const b = parseBody(R.move.request, requireObject(req.body));
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
