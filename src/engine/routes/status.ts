// GET /v1/models (the served model, its max_model_len, kvc_model_id and kvc_kv_dtype: the id and KV dtype its chunk keys use), GET /health (and vLLM's
// /ping), GET /version and GET /metrics (Prometheus text of this engine's registry). None of them take a body.
import { DTYPE_NAMES } from '../../common/dtype.js';
import type { FastifyInstance, FastifyReply } from 'fastify';
import type { EngineHealth } from '../../protocol/engine_health.js';
import type { RouteContext } from './context.js';
import { KVC_VERSION } from '../../common/version.js';
import { PID_HEADER } from '../../protocol/process_header.js';

export async function statusRoutes(app: FastifyInstance, ctx: RouteContext): Promise<void> {
  const { modelName, maxModelLen, metrics } = ctx;
  const createdAt = Math.floor(Date.now() / 1000);

  app.get('/v1/models', async () => ({
    object: 'list',
    data: [{ id: modelName, object: 'model', created: createdAt, owned_by: 'kvc', root: ctx.model.dir, parent: null, max_model_len: maxModelLen, kvc_model_id: ctx.model.modelId, kvc_kv_dtype: DTYPE_NAMES[ctx.kv.layout.dtype] }],
  }));

  // The proxy reads kvc_instance_id here to map this address to the controller's name for it,
  // kvc_p2p to know that a prefix held elsewhere costs this engine a fetch, not a recompute, and
  // max_model_len to refuse a token-id prompt that cannot fit before any prefill.
  const health: EngineHealth = { status: 'ok', kvc_instance_id: ctx.kvcInstanceId, kvc_p2p: ctx.kvcP2p, max_model_len: maxModelLen, ...(ctx.keySettings ? { kvc_key_settings: ctx.keySettings } : {}) };
  // With a cache connector, the ledger's counters too (the proxy's view of every engine's misses).
  // And its CPU tier's room: the proxy picks from it who keeps a disaggregated prompt's chunks.
  const answer = async (_req: unknown, reply: FastifyReply) => {
    void reply.header(PID_HEADER, String(process.pid));
    if (!ctx.hasConnector) return health;
    const r = ctx.room();
    return { ...health, kvc_computed_chunks: await metrics.computedByReason(), ...(r ? { kvc_room: { free_bytes: r.freeBytes, free_tokens: r.freeTokens, capacity_tokens: r.capacityTokens, tail_age_ms: r.tailAgeMs === null ? null : Math.round(r.tailAgeMs) } } : {}) };
  };
  app.get('/health', answer);
  // vLLM's liveness aliases (SageMaker's /ping, GET and POST) and its version route.
  app.get('/ping', answer);
  app.post('/ping', answer);
  app.get('/version', async () => ({ version: KVC_VERSION }));

  app.get('/metrics', async (_req, reply) => {
    const body = await metrics.registry.metrics();
    void reply.header('content-type', metrics.registry.contentType);
    return body;
  });
}
