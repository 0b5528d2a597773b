// The engine's parts and their lifecycle: the model, the paged KV cache, the metrics, and with a
// connector the cache instance (KvcStore), the xfer plugin (through the transfer seam of
// src/common/transfer_seam.ts), the controller attachment and the connector; then the scheduler
// that drives them. EngineWiring.start() acquires them in that order and records how to release
// each one; close() releases them in the reverse order, and a start-up that fails half way
// releases what it had acquired (ports, worker threads, buffers) before the error is reported.
import { urlHost } from '../common/address.js';
import { describeLayout, sameLayout } from '../common/chunk.js';
import { seedFromEnv } from '../common/keys.js';
import { logger } from '../common/log.js';
import type { KvTransferPlugin } from '../common/transfer_seam.js';
import { attachController, type ControllerAttachment } from '../kvc/controller_client.js';
import { KvcStore } from '../kvc/store.js';
import { registerRemoteMetrics } from '../kvc/remote_metrics.js';
import { P2pClient } from '../kvc/p2p_client.js';
import { P2pMetrics } from '../kvc/p2p_metrics.js';
import { P2P_DEFAULTS } from '../common/config.js';
import { KvcConnectorV1 } from './connector.js';
import { EngineMetrics } from './metrics.js';
import { registerTransferMetrics } from './transfer_metrics.js';
import { PagedKvCache } from './model/kv_cache.js';
import { loadEngineModel, type EngineModel } from './runtime.js';
import { finishedRequest, logRequest } from './request_log.js';
import { Scheduler } from './scheduler.js';
import { EngineStatsLog } from './stats_log.js';
import { resolveModelLimits, type EngineSettings } from './settings.js';

const log = logger('engine');

/** One acquired part: how to release it, and whether a failure to release must be reported. */
interface Release {
  /** What the warning says was being done ("closing xfer"). */
  what: string;
  release(): Promise<void> | void;
  /** A failure here may lose data (the store's disk tier): close() rethrows it after releasing the rest. */
  mustSucceed: boolean;
}

/** The parts acquired so far, released last-acquired first. */
class ReleaseStack {
  private readonly stack: Release[] = [];

  push(r: Release): void {
    this.stack.push(r);
  }

  /** Releases everything; returns the first failure of a mustSucceed part (the rest are logged). */
  async releaseAll(): Promise<unknown> {
    let firstFatal: unknown;
    for (let r = this.stack.pop(); r; r = this.stack.pop()) {
      try {
        await r.release();
      } catch (e) {
        log.warn(`${r.what}: ${(e as Error).message}`);
        if (r.mustSucceed && firstFatal === undefined) firstFatal = e;
      }
    }
    return firstFatal;
  }
}

export class EngineWiring {
  readonly model: EngineModel;
  readonly maxModelLen: number;
  readonly kv: PagedKvCache;
  readonly metrics: EngineMetrics;
  /** The cache instance (null without a connector). */
  readonly store: KvcStore | null;
  readonly transfer: KvTransferPlugin | null;
  /** The controller attachment (cache YAML enable_controller), else null. */
  readonly controller: ControllerAttachment | null;
  readonly connector: KvcConnectorV1 | null;
  readonly scheduler: Scheduler;
  private closing: Promise<void> | null = null;

  private constructor(
    parts: Omit<EngineWiring, 'drain' | 'close'>,
    private readonly releases: ReleaseStack,
  ) {
    this.model = parts.model;
    this.maxModelLen = parts.maxModelLen;
    this.kv = parts.kv;
    this.metrics = parts.metrics;
    this.store = parts.store;
    this.transfer = parts.transfer;
    this.controller = parts.controller;
    this.connector = parts.connector;
    this.scheduler = parts.scheduler;
  }

  static async start(s: EngineSettings): Promise<EngineWiring> {
    const releases = new ReleaseStack();
    try {
      const t0 = performance.now();
      const model = await loadEngineModel(s.modelSpec, s.env, s.chatTemplate);
      // The kernel's worker thread; forward() still works single-threaded after this.
      releases.push({ what: "stopping the model's kernel worker", release: () => model.llama.close(), mustSucceed: false });
      // Long text prompts are tokenized on a worker thread while sequences decode (tokenize_thread.ts).
      await model.tokenizer.startEncodeThread();
      releases.push({ what: "stopping the tokenizer's worker", release: () => model.tokenizer.stopEncodeThread(), mustSucceed: false });
      const cfg = model.config;
      log.info(
        `model ${s.modelSpec} loaded in ${Math.round(performance.now() - t0)} ms (${cfg.numLayers} layers, dim ${cfg.dim}, ${cfg.numHeads} heads / ${cfg.numKvHeads} KV heads, vocab ${cfg.vocabSize})`,
      );

      // The KV layout every chunk of this engine has: the model's shape in the --kv-cache-dtype.
      const layout = { ...model.layout, dtype: s.kvDtype };
      const { maxModelLen, kvCacheBytes } = resolveModelLimits(s, cfg, layout);
      const kv = new PagedKvCache({ numLayers: cfg.numLayers, numKvHeads: cfg.numKvHeads, headDim: cfg.headDim, dtype: s.kvDtype }, kvCacheBytes);
      if (!sameLayout(kv.layout, layout)) throw new Error(`paged KV layout ${describeLayout(kv.layout)} differs from the model's ${describeLayout(layout)}`);
      log.info(`paged KV: ${describeLayout(layout)}, ${kv.totalBlocks} blocks of ${kv.blockBytes} bytes (${kv.capacityTokens} tokens)`);
      if (kv.capacityTokens < maxModelLen) log.warn(`KV budget holds ${kv.capacityTokens} tokens, less than max_model_len ${maxModelLen}: longer requests are refused`);

      const metrics = new EngineMetrics({ model: s.modelName }, s.processMetrics);

      let store: KvcStore | null = null;
      let transfer: KvTransferPlugin | null = null;
      let controller: ControllerAttachment | null = null;
      let connector: KvcConnectorV1 | null = null;
      const { connectorConfig, cacheConfig } = s;
      if (connectorConfig && cacheConfig) {
        const opened = await KvcStore.create(cacheConfig, { modelId: model.modelId });
        store = opened;
        releases.push({ what: 'closing the cache store', release: () => opened.close(), mustSucceed: true });
        metrics.watchStore(opened);
        if (opened.remote) registerRemoteMetrics(metrics.registry, opened.remote);
        const seed = seedFromEnv(s.env);
        if (connectorConfig.kv_role !== 'kv_both') {
          if (!cacheConfig.enable_xfer) {
            log.warn(`kv_role ${connectorConfig.kv_role} without enable_xfer in the cache config: no KV is transferred, prompts are computed here`);
          } else {
            // A decoder that already holds a prefix in its cache receives only the chunks it lacks.
            const heldLocally = connectorConfig.kv_role === 'kv_consumer' && opened.locations().length > 0 ? (key: string) => opened.has(key) : undefined;
            const plugin = await s.transfer({ role: connectorConfig.kv_role, cacheConfig, connectorConfig, layout, modelId: model.modelId, chunkSize: cacheConfig.chunk_size, seed, ...(heldLocally ? { heldLocally } : {}) });
            transfer = plugin;
            if (plugin.stats) registerTransferMetrics(metrics.registry, () => plugin.stats!());
            releases.push({ what: 'closing xfer', release: () => plugin.close(), mustSucceed: false });
          }
        }
        if (cacheConfig.enable_controller) {
          // Registers this cache instance with the controller (monitor port) and serves its worker
          // and peer ports, so the controller can look up, move, copy, pin and clear our chunks.
          // Each heartbeat also carries the engine's counters, for the controller's dashboard.
          const attached = await attachController(opened, cacheConfig, { modelId: model.modelId, chunkSize: cacheConfig.chunk_size, seed, layout, engineSample: () => metrics.sample(),
            engineAddress: { bindHost: s.host, advertiseHost: s.advertiseHost, advertiseExplicit: s.advertiseExplicit },
            // (An ephemeral --port 0 is not known yet: the dashboard then takes token ids only.)
            ...(s.port > 0 ? { engineUrl: `http://${urlHost(s.advertiseHost)}:${s.port}` } : {}) });
          controller = attached;
          releases.push({ what: 'detaching from the controller', release: () => attached.close(), mustSucceed: false });
          log.info(`cache instance ${cacheConfig.kvc_instance_id} attached to controller ${cacheConfig.controller_url} (worker port ${attached.workerPort}, registered at ${attached.advertiseHost})`);
        }
        let p2p: P2pClient | null = null;
        if (cacheConfig.enable_p2p) {
          // The config check guarantees the controller attachment (enable_p2p needs it).
          if (!controller) throw new Error('cache config: key "enable_p2p": needs the controller (enable_controller: true)');
          const ctl = controller;
          p2p = new P2pClient({
            store: opened,
            instanceId: cacheConfig.kvc_instance_id,
            layout,
            chunkSize: cacheConfig.chunk_size,
            timeoutMs: cacheConfig.p2p_timeout_ms ?? P2P_DEFAULTS.p2p_timeout_ms,
            askHolders: (keys, ms) => ctl.askHolders(keys, ms),
            metrics: new P2pMetrics(metrics.registry),
          });
          const client = p2p;
          releases.push({ what: 'closing the P2P connections to holders', release: async () => client.close(), mustSucceed: false });
          log.info(`P2P on: chunks this instance lacks are fetched from the instances the controller names (time bound ${cacheConfig.p2p_timeout_ms ?? P2P_DEFAULTS.p2p_timeout_ms} ms)`);
        }
        const ctl = controller;
        const missReasons = ctl ? (keys: readonly string[], ms: number) => ctl.askMissReasons(keys, ms) : null;
        connector = new KvcConnectorV1({ config: connectorConfig, cacheConfig, store: opened, modelId: model.modelId, layout, seed, metrics, transfer, p2p, missReasons });
        log.info(
          `connector KvcConnectorV1 role=${connectorConfig.kv_role} chunk_size=${cacheConfig.chunk_size} locations=${opened.locations().join(',') || 'none'}${opened.remote ? ` remote=${opened.remote.endpoint.display}` : ''}${p2p ? ' p2p=on' : ''}` +
            ` discard_partial_chunks=${connector.discardPartial} seed=${seed}${transfer ? ' xfer=on' : ''}`,
        );
      }

      const scheduler = new Scheduler({
        model, kv, metrics, connector, maxNumSeqs: s.maxNumSeqs, maxNumBatchedTokens: s.maxNumBatchedTokens, stepTargetMs: s.stepTargetMs, maxQueue: s.maxQueue,
        onFinished: s.logRequests ? (seq) => logRequest(finishedRequest(seq)) : undefined,
      });
      releases.push({ what: 'stopping the scheduler', release: () => scheduler.close(), mustSucceed: false });
      if (s.logStats) {
        const statsLog = new EngineStatsLog(metrics);
        releases.push({ what: 'stopping the statistics line', release: () => statsLog.stop(), mustSucceed: false });
      }
      return new EngineWiring({ model, maxModelLen, kv, metrics, store, transfer, controller, connector, scheduler }, releases);
    } catch (e) {
      await releases.releaseAll();
      throw e;
    }
  }

  /**
   * Stops admitting requests and aborts the queued and running ones (streams get their error
   * event and `data: [DONE]`). The engine calls this before closing its HTTP server, which
   * would otherwise wait for those answers or cut them off.
   */
  drain(): Promise<void> {
    return this.scheduler.close();
  }

  /** Releases every part, last acquired first; idempotent. Rejects when the store failed to close. */
  close(): Promise<void> {
    return (this.closing ??= (async () => {
      const fatal = await this.releases.releaseAll();
      if (fatal !== undefined) throw fatal;
    })());
  }
}
