// Counts every answered request in kvc_engine_requests_total{endpoint,outcome}. Generation
// requests count themselves (generate.ts knows whether they were cancelled or failed after the
// headers were sent, which the status code cannot tell) and set `outcomeCounted`; the
// onResponse hook counts all the others by status code. The flag is declared with
// decorateRequest so that every request object has it from the start.
import type { FastifyInstance } from 'fastify';
import type { EngineMetrics } from './metrics.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** Set once the request's outcome has been counted (see src/engine/request_outcome.ts). */
    outcomeCounted: boolean;
  }
}

export function countRequestOutcomes(app: FastifyInstance, metrics: EngineMetrics): void {
  app.decorateRequest('outcomeCounted', false);
  app.addHook('onResponse', async (req, reply) => {
    if (req.outcomeCounted) return;
    const endpoint = req.routeOptions.url ?? 'unknown';
    // 503 (queue full, shutting down) is a refusal, not a failure of the engine.
    const outcome = reply.statusCode < 400 ? 'ok' : reply.statusCode < 500 || reply.statusCode === 503 ? 'rejected' : 'error';
    metrics.requests.inc({ endpoint, outcome });
  });
}
