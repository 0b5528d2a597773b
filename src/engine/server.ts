// The engine process: an OpenAI-compatible HTTP server over the CPU Llama model, the
// continuous-batching scheduler, and (when --kv-transfer-config is given) the KvcConnectorV1
// with its cache instance. startEngine() is what the CLI runs; tests and benchmarks call it in
// process too. It only composes the parts:
//   settings.ts          options → validated settings (fails before the model is loaded)
//   wiring.ts            model, paged KV, metrics, store, xfer plugin, controller, connector,
//                        scheduler, with a start/close lifecycle
//   request_outcome.ts   kvc_engine_requests_total for every answered request
//   routes/*.ts          one file per route group, its request schema beside it
import type { FastifyInstance } from 'fastify';
import type { CacheConfig, ConnectorConfig } from '../common/config.js';
import { createHttpServer } from '../common/http.js';
import type { ControllerAttachment } from '../kvc/controller_client.js';
import type { KvcStore } from '../kvc/store.js';
import { xferReleaseRoute } from './routes/xfer_release.js';
import type { KvcConnectorV1 } from './connector.js';
import type { EngineMetrics } from './metrics.js';
import type { PagedKvCache } from './model/kv_cache.js';
import { countRequestOutcomes } from './request_outcome.js';
import { completionRoutes } from './routes/completions.js';
import type { RouteContext } from './routes/context.js';
import { statusRoutes } from './routes/status.js';
import { tokenizeRoutes } from './routes/tokenize.js';
import type { EngineModel } from './runtime.js';
import type { Scheduler } from './scheduler.js';
import { resolveEngineSettings, type EngineOptions, type EngineSettings } from './settings.js';
import { EngineWiring } from './wiring.js';
import { requireBearer } from '../common/auth.js';
import { urlHost } from '../common/address.js';

export type { EngineOptions } from './settings.js';

export interface Engine {
  url: string;
  host: string;
  port: number;
  modelName: string;
  modelId: string;
  maxModelLen: number;
  /** The cache instance (null without a connector). */
  store: KvcStore | null;
  connector: KvcConnectorV1 | null;
  cacheConfig: CacheConfig | null;
  connectorConfig: ConnectorConfig | null;
  /** The controller attachment (cache YAML enable_controller), else null. */
  controller: ControllerAttachment | null;
  metrics: EngineMetrics;
  scheduler: Scheduler;
  kv: PagedKvCache;
  model: EngineModel;
  close(): Promise<void>;
}

/** The HTTP side: error shapes (common/http.ts), request counting, the three route groups. */
function buildApp(s: EngineSettings, w: EngineWiring): FastifyInstance {
  const app = createHttpServer({ name: 'engine' });
  // The OpenAI endpoints need the client API key when one is set; /health and /metrics stay open.
  requireBearer(app, { key: s.apiKey, applies: (_m, p) => p.startsWith('/v1/') || p === '/tokenize' || p === '/detokenize', what: 'API key', name: 'engine' });
  countRequestOutcomes(app, w.metrics);
  const ctx: RouteContext = { modelName: s.modelName, maxModelLen: w.maxModelLen, model: w.model, kv: w.kv, scheduler: w.scheduler, metrics: w.metrics,
    kvcInstanceId: w.controller && s.cacheConfig ? s.cacheConfig.kvc_instance_id : null,
    kvcP2p: !!(w.controller && w.connector && s.cacheConfig?.enable_p2p),
    kvProducer: w.connector?.role === 'kv_producer',
    hasConnector: !!w.connector,
    keySettings: w.connector?.keySettings() ?? null,
    room: () => w.connector?.room() ?? null };
  void app.register(completionRoutes, ctx);
  void app.register(tokenizeRoutes, ctx);
  void app.register(statusRoutes, ctx);
  xferReleaseRoute(app, w.transfer);
  return app;
}

export async function startEngine(opts: EngineOptions = {}): Promise<Engine> {
  const s = resolveEngineSettings(opts);
  const wiring = await EngineWiring.start(s);
  const app = buildApp(s, wiring);

  let closing: Promise<void> | null = null;
  // Requests are aborted first (streams end with an error event), then the HTTP server stops,
  // then the parts are released: nothing can reach the store or the plugin once it is closed.
  const close = () =>
    (closing ??= (async () => {
      await wiring.drain();
      await app.close();
      await wiring.close();
    })());

  try {
    await app.listen({ host: s.host, port: s.port });
  } catch (e) {
    await close();
    throw e;
  }
  const addr = app.server.address();
  const port = typeof addr === 'object' && addr ? addr.port : s.port;
  // The URL others reach this engine at: the advertised address, not a 0.0.0.0 bind.
  const url = `http://${urlHost(s.advertiseHost)}:${port}`;

  return {
    url,
    host: s.host,
    port,
    modelName: s.modelName,
    modelId: wiring.model.modelId,
    maxModelLen: wiring.maxModelLen,
    store: wiring.store,
    connector: wiring.connector,
    cacheConfig: s.cacheConfig,
    connectorConfig: s.connectorConfig,
    controller: wiring.controller,
    metrics: wiring.metrics,
    scheduler: wiring.scheduler,
    kv: wiring.kv,
    model: wiring.model,
    close,
  };
}
