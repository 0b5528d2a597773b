// Engine configuration: the options of startEngine() (what `kvc engine` flags become) resolved
// into validated settings. Everything that can be checked without the model is checked here,
// before the model is loaded, so a bad flag or cache YAML fails at once; the two limits that
// depend on the model (max_model_len, the paged KV budget) are resolved by resolveModelLimits().
// Every error names the option (as its command-line flag when it has one) and the value found.
import { payloadBytes, type KvLayout } from '../common/chunk.js';
import { cacheConfigFromEnv, GiB, parseConnectorConfig, validateCacheConfig, type CacheConfig, type ConnectorConfig } from '../common/config.js';
import { logger } from '../common/log.js';
import type { TransferFactory } from '../common/transfer_seam.js';
import { createKvTransfer } from '../xfer/engine_plugin.js';
import type { ModelConfig } from './model/config.js';
import { loadApiKey } from '../common/auth.js';
import { checkModelSpec } from './model_spec.js';
import { STEP_TARGET_MS } from './scheduler.js';
import { DTYPES_ACCEPTED, parseDtype, kvCacheDtypeOf, SETTINGS } from '../common/flags.js';
import { DType, isEightBit } from '../common/dtype.js';
import { checkBindHost, resolveAdvertiseHost } from '../common/address.js';

const log = logger('engine');

/** Largest default paged KV budget (an explicit kvCacheBytes may exceed it). */
const DEFAULT_KV_BUDGET_CAP = 4 * GiB;

export interface EngineOptions {
  /** The address the HTTP server binds (default 127.0.0.1; 0.0.0.0: every interface). */
  host?: string;
  /**
   * The address this engine is reached at, which it hands out (its URL, and its cache
   * instance's registration when bound to 0.0.0.0 or when given); default: `host`, or the
   * machine's hostname when `host` is 0.0.0.0 / ::.
   */
  advertiseHost?: string;
  /** 0 (default) picks a free port. */
  port?: number;
  /** `builtin:tiny` (default) or a Hugging Face checkpoint directory. */
  model?: string;
  /** The name clients use in `model`; default: the --model value. */
  servedModelName?: string;
  /** Default: the model's max_position_embeddings. */
  maxModelLen?: number;
  /** Sequences computed concurrently (default 16). */
  maxNumSeqs?: number;
  /** Tokens per engine step (prefill chunks + decode rows), default 512. */
  maxNumBatchedTokens?: number;
  /** Wall time an engine step's prompt tokens should take at most, ms (default STEP_TARGET_MS; 0: tokens-only budget). */
  stepTargetMs?: number;
  /** Requests that may wait for admission before new ones get 503 (default 1024). */
  maxQueue?: number;
  /** Paged KV budget in bytes; default: max_num_seqs full-length sequences, capped at 4 GiB. */
  kvCacheBytes?: number;
  /** The connector JSON (string as on the command line, or parsed). Absent: no connector. */
  kvTransferConfig?: string | ConnectorConfig;
  /** Cache instance config, only with kvTransferConfig; default: $KVC_CONFIG_FILE (read only when a connector is configured). */
  cacheConfig?: CacheConfig;
  /** xfer plugin, only with kv_role kv_producer / kv_consumer; default: the xfer component's createKvTransfer. */
  transfer?: TransferFactory;
  /**
   * --dtype: the data type the model computes in. This CPU engine computes in float32 (weights
   * stored as bf16/f16 are widened on load): `auto`, `float32` and `float` are accepted; a
   * half-precision type is refused rather than silently computed in float32.
   */
  dtype?: string;
  /**
   * --kv-cache-dtype: the element type of the paged KV cache and of every chunk (auto = float16).
   * Default float32.
   */
  kvCacheDtype?: string;
  /**
   * --enable-prefix-caching: KV of earlier prompts is reused. The engine keeps no KV of finished
   * requests itself; reuse comes from a cache instance. Without kvTransferConfig this attaches a
   * kv_both connector with the cache YAML of $KVC_CONFIG_FILE (or the defaults: a CPU tier).
   * With a connector, its cache instance already reuses prefixes. Default false.
   */
  enablePrefixCaching?: boolean;
  /**
   * --enable-p2p: the cache instance fetches prefixes it lacks from other instances (sets the
   * cache YAML's enable_p2p; needs a connector and the controller). Default: the YAML's value.
   */
  enableP2p?: boolean;
  /** Add process-level metrics (CPU, memory, event loop) to /metrics; the CLI turns this on. */
  processMetrics?: boolean;
  /** One log line per finished request (default true; `--disable-log-requests` turns it off). */
  logRequests?: boolean;
  /** The periodic statistics line (default true; `--disable-log-stats` turns it off). */
  logStats?: boolean;
  /** The chat template's text (--chat-template), used instead of the checkpoint's. */
  chatTemplate?: string;
  /** Clients must send `Authorization: Bearer <key>` on /v1/*, /tokenize, /detokenize (default: $KVC_API_KEY; null: open). */
  apiKey?: string | null;
  env?: NodeJS.ProcessEnv;
}

/** The options resolved and checked, before the model is loaded. */
export interface EngineSettings {
  env: NodeJS.ProcessEnv;
  /** The client API key, or null (docs/security.md). */
  apiKey: string | null;
  host: string;
  /** The advertised address (resolved: never a wildcard). */
  advertiseHost: string;
  /** Whether --advertise-host was given (it then also names the cache instance's address). */
  advertiseExplicit: boolean;
  port: number;
  /** What --model names (`builtin:tiny`, a directory, or a `.gguf` file). */
  modelSpec: string;
  /** The name clients send in `model`. */
  modelName: string;
  /** The requested max_model_len (checked against the model by resolveModelLimits). */
  maxModelLen: number | undefined;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  stepTargetMs: number;
  maxQueue: number;
  kvCacheBytes: number | undefined;
  /** The KV element type (--kv-cache-dtype resolved: auto = f16). */
  kvDtype: DType;
  /** Null: no connector (and no cache instance). */
  connectorConfig: ConnectorConfig | null;
  /** Set exactly when connectorConfig is. */
  cacheConfig: CacheConfig | null;
  transfer: TransferFactory;
  processMetrics: boolean;
  /** Whether one log line is written per request (false with --disable-log-requests). */
  logRequests: boolean;
  logStats: boolean;
  /** True when --enable-prefix-caching attached the kv_both connector itself. */
  prefixCachingConnector: boolean;
  /** --chat-template's text, or null: the checkpoint's template (or none). */
  chatTemplate: string | null;
}

export { DTYPES_ACCEPTED };

/** The limits that depend on the loaded model. */
export interface ModelLimits {
  maxModelLen: number;
  kvCacheBytes: number;
}

function positiveInt(name: string, v: number | undefined, fallback: number): number {
  const n = v ?? fallback;
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name}: expected a positive integer, found ${n}`);
  return n;
}

function nonEmpty(name: string, v: string | undefined, fallback: string): string {
  const s = v ?? fallback;
  if (typeof s !== 'string' || s.length === 0) throw new Error(`${name}: expected a non-empty string, found ${JSON.stringify(s)}`);
  return s;
}

/** Options → settings; throws an Error naming the option on the first bad one. */
export function resolveEngineSettings(opts: EngineOptions): EngineSettings {
  const env = opts.env ?? process.env;
  const modelSpec = nonEmpty('--model', opts.model, SETTINGS.model.default!);
  checkModelSpec(modelSpec);
  parseDtype(opts.dtype ?? SETTINGS.dtype.default!);
  const kvDtype = kvCacheDtypeOf(opts.kvCacheDtype ?? SETTINGS.kvCacheDtype.default!);
  const modelName = nonEmpty('--served-model-name', opts.servedModelName, modelSpec);
  const host = checkBindHost('--host', nonEmpty('--host', opts.host, SETTINGS.host.default!));
  const advertiseHost = resolveAdvertiseHost('--advertise-host', opts.advertiseHost, host);
  const port = opts.port ?? 0;
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--port: expected an integer between 0 and 65535, found ${port}`);

  // The connector JSON and the cache YAML first: they are what an operator most often gets wrong.
  // An in-process ConnectorConfig or CacheConfig object goes through the same validation as the
  // command line's JSON and the YAML file, so both paths accept and refuse the same values.
  let connectorConfig: ConnectorConfig | null = null;
  const prefixCachingConnector = opts.enablePrefixCaching === true && opts.kvTransferConfig === undefined;
  if (prefixCachingConnector) {
    connectorConfig = parseConnectorConfig('{"kv_connector":"KvcConnectorV1","kv_role":"kv_both"}', '--enable-prefix-caching').config;
  } else if (opts.kvTransferConfig !== undefined) {
    const json = typeof opts.kvTransferConfig === 'string' ? opts.kvTransferConfig : JSON.stringify(opts.kvTransferConfig);
    const loaded = parseConnectorConfig(json, '--kv-transfer-config');
    for (const w of loaded.warnings) log.warn(w);
    for (const n of loaded.notes) log.info(n);
    connectorConfig = loaded.config;
  }
  let cacheConfig: CacheConfig | null = null;
  if (connectorConfig) {
    // --enable-p2p sets enable_p2p before validation, so keys that need it (p2p_timeout_ms) are
    // accepted and a configuration without the controller is refused naming the flag.
    const overrides = opts.enableP2p ? { enable_p2p: true } : undefined;
    let loaded;
    try {
      loaded = opts.cacheConfig ? validateCacheConfig({ ...opts.cacheConfig, ...overrides }, 'cacheConfig') : cacheConfigFromEnv(env, overrides);
    } catch (e) {
      if (opts.enableP2p && /"enable_p2p"/.test((e as Error).message)) throw new Error(`--enable-p2p: ${(e as Error).message}`);
      throw e;
    }
    for (const w of loaded.warnings) log.warn(w);
    for (const n of loaded.notes) log.info(n);
    cacheConfig = loaded.config;
    if (isEightBit(kvDtype)) {
      // 8-bit KV chunks are already 8 bits an element: a codec would add error and save nothing.
      for (const k of ['local_cpu_serde', 'local_disk_serde', 'remote_serde'] as const) {
        const c = cacheConfig[k];
        if (c !== undefined && c !== null && c !== 'naive') throw new Error(`${k}: "${c}" with --kv-cache-dtype ${opts.kvCacheDtype ?? SETTINGS.kvCacheDtype.default}: 8-bit KV chunks are stored as the engine holds them; use "naive" (or a 16/32-bit --kv-cache-dtype)`);
      }
    }
  } else if (opts.enableP2p) {
    throw new Error('--enable-p2p: needs a cache instance (--kv-transfer-config or --enable-prefix-caching) with the controller (enable_controller in $KVC_CONFIG_FILE)');
  } else if (opts.cacheConfig) {
    // The cache instance only exists for the connector: say so rather than drop the setting.
    throw new Error('cacheConfig: given without kvTransferConfig (--kv-transfer-config); the cache instance is used only by the connector');
  }
  if (opts.transfer && connectorConfig?.kv_role !== 'kv_producer' && connectorConfig?.kv_role !== 'kv_consumer') {
    throw new Error(`transfer: a transfer plugin is used only with kv_role kv_producer or kv_consumer (found ${connectorConfig ? connectorConfig.kv_role : 'no --kv-transfer-config'})`);
  }

  const maxNumSeqs = positiveInt('--max-num-seqs', opts.maxNumSeqs, SETTINGS.maxNumSeqs.default!);
  const maxNumBatchedTokens = positiveInt('--max-num-batched-tokens', opts.maxNumBatchedTokens, SETTINGS.maxNumBatchedTokens.default!);
  if (maxNumBatchedTokens < maxNumSeqs) {
    // Every running sequence's decode row takes one token of a step's budget: with fewer tokens
    // than sequences, decode rows alone would overrun the budget and starve prefills.
    throw new Error(
      `--max-num-batched-tokens (${maxNumBatchedTokens}) must be >= --max-num-seqs (${maxNumSeqs}): each running sequence's decode row takes one token of every step's budget`,
    );
  }
  const stepTargetMs = opts.stepTargetMs ?? STEP_TARGET_MS;
  if (!Number.isInteger(stepTargetMs) || stepTargetMs < 0 || stepTargetMs > 60_000) {
    throw new Error(`--step-target-ms: expected an integer number of milliseconds from 0 (off) to 60000, found ${stepTargetMs}`);
  }
  const maxQueue = positiveInt('--max-queue-len', opts.maxQueue, SETTINGS.maxQueueLen.default!);
  if (opts.maxModelLen !== undefined && (!Number.isInteger(opts.maxModelLen) || opts.maxModelLen < 2)) {
    throw new Error(`--max-model-len: expected an integer >= 2, found ${opts.maxModelLen}`);
  }
  if (opts.kvCacheBytes !== undefined && (!Number.isFinite(opts.kvCacheBytes) || opts.kvCacheBytes <= 0)) {
    throw new Error(`kvCacheBytes (--kv-cache-memory in GiB): expected a number of bytes > 0, found ${opts.kvCacheBytes}`);
  }

  return {
    env,
    apiKey: opts.apiKey === undefined ? loadApiKey(undefined, env) : opts.apiKey,
    host,
    advertiseHost,
    advertiseExplicit: opts.advertiseHost !== undefined,
    port,
    modelSpec,
    modelName,
    maxModelLen: opts.maxModelLen,
    maxNumSeqs,
    maxNumBatchedTokens,
    stepTargetMs,
    maxQueue,
    kvCacheBytes: opts.kvCacheBytes,
    kvDtype,
    connectorConfig,
    cacheConfig,
    transfer: opts.transfer ?? createKvTransfer,
    processMetrics: opts.processMetrics ?? false,
    logRequests: opts.logRequests ?? true,
    logStats: opts.logStats ?? true,
    chatTemplate: opts.chatTemplate ?? null,
    prefixCachingConnector,
  };
}

/**
 * max_model_len (default: the model's max_position_embeddings, never beyond it) and the paged KV
 * budget (default: max_num_seqs full-length sequences plus one block of slack each, at most 4 GiB).
 */
export function resolveModelLimits(s: EngineSettings, cfg: ModelConfig, layout: KvLayout): ModelLimits {
  const maxModelLen = s.maxModelLen ?? cfg.maxPositionEmbeddings;
  if (!Number.isInteger(maxModelLen) || maxModelLen < 2) throw new Error(`--max-model-len: expected an integer >= 2, found ${maxModelLen}`);
  if (maxModelLen > cfg.maxPositionEmbeddings) {
    throw new Error(`--max-model-len ${maxModelLen} exceeds the model's max_position_embeddings (${cfg.maxPositionEmbeddings})`);
  }
  const tokenBytes = payloadBytes(layout, 1);
  const kvCacheBytes = s.kvCacheBytes ?? Math.min(DEFAULT_KV_BUDGET_CAP, s.maxNumSeqs * (maxModelLen + 16) * tokenBytes);
  return { maxModelLen, kvCacheBytes };
}
