// The engine: an OpenAI-compatible HTTP server over the CPU Llama model, the continuous-batching
// scheduler, and (when --kv-transfer-config is given) the KvcConnectorV1 with its cache
// instance. startEngine() is what the CLI runs; tests and benchmarks call it in process too.
import { randomBytes } from 'node:crypto';
import type { FastifyReply, FastifyRequest } from 'fastify';
import { payloadBytes, sameLayout, describeLayout } from '../common/chunk.js';
import { cacheConfigFromEnv, parseConnectorConfig, type CacheConfig, type ConnectorConfig } from '../common/config.js';
import { badRequest, notFound } from '../common/errors.js';
import { createHttpServer, requireObject } from '../common/http.js';
import { seedFromEnv } from '../common/keys.js';
import { logger } from '../common/log.js';
import { parseBody } from '../common/validate.js';
import { attachController, type ControllerAttachment } from '../kvc/controller_client.js';
import { KvcStore } from '../kvc/store.js';
import { registerRemoteMetrics } from '../kvc/remote_metrics.js';
import { chatRequest, completionRequest, detokenizeRequest, messageText, tokenizeChatRequest, tokenizePromptRequest } from './api.js';
import { KvcConnectorV1 } from './connector.js';
import { runGeneration, type GenerationRequest } from './generate.js';
import { EngineMetrics } from './metrics.js';
import { PagedKvCache } from './model/kv_cache.js';
import { ChatTemplateError, type ChatMessage } from './model/tokenizer.js';
import { loadEngineModel, type EngineModel } from './runtime.js';
import { Scheduler } from './scheduler.js';
import type { KvTransferPlugin, TransferFactory } from '../common/transfer_seam.js';
import { createKvTransfer } from '../xfer/engine_plugin.js';

const log = logger('engine');

export interface EngineOptions {
  host?: string;
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
  /** Requests that may wait for admission before new ones get 503 (default 1024). */
  maxQueue?: number;
  /** Paged KV budget in bytes; default: max_num_seqs full-length sequences, capped at 4 GiB. */
  kvCacheBytes?: number;
  /** The connector JSON (string as on the command line, or parsed). Absent: no connector. */
  kvTransferConfig?: string | ConnectorConfig;
  /** Cache instance config; default: $KVC_CONFIG_FILE (only read when a connector is configured). */
  cacheConfig?: CacheConfig;
  /** xfer plugin for kv_producer / kv_consumer; default: the xfer component's createKvTransfer. */
  transfer?: TransferFactory;
  /** Add process-level metrics (CPU, memory, event loop) to /metrics; the CLI turns this on. */
  processMetrics?: boolean;
  env?: NodeJS.ProcessEnv;
}

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

const GiB = 1024 ** 3;

function newRequestId(): string {
  return randomBytes(12).toString('hex');
}

export async function startEngine(opts: EngineOptions = {}): Promise<Engine> {
  const env = opts.env ?? process.env;
  const modelSpec = opts.model ?? 'builtin:tiny';
  const modelName = opts.servedModelName ?? modelSpec;
  // Configuration first: a bad flag or YAML fails before the model is loaded.
  let connectorConfig: ConnectorConfig | null = null;
  if (opts.kvTransferConfig !== undefined) {
    if (typeof opts.kvTransferConfig === 'string') {
      const loaded = parseConnectorConfig(opts.kvTransferConfig);
      for (const w of loaded.warnings) log.warn(w);
      connectorConfig = loaded.config;
    } else connectorConfig = opts.kvTransferConfig;
  }
  let cacheConfig: CacheConfig | null = null;
  if (connectorConfig) {
    if (opts.cacheConfig) cacheConfig = opts.cacheConfig;
    else {
      const loaded = cacheConfigFromEnv(env);
      for (const w of loaded.warnings) log.warn(w);
      cacheConfig = loaded.config;
    }
  }

  const maxNumSeqs = opts.maxNumSeqs ?? 16;
  if (!Number.isInteger(maxNumSeqs) || maxNumSeqs < 1) throw new Error(`--max-num-seqs: expected a positive integer, found ${maxNumSeqs}`);
  const maxNumBatchedTokens = opts.maxNumBatchedTokens ?? 512;
  if (!Number.isInteger(maxNumBatchedTokens) || maxNumBatchedTokens < 1) throw new Error(`--max-num-batched-tokens: expected a positive integer, found ${maxNumBatchedTokens}`);
  if (maxNumBatchedTokens < maxNumSeqs) {
    // Every running sequence's decode row takes one token of a step's budget: with fewer tokens
    // than sequences, decode rows alone would overrun the budget and starve prefills.
    throw new Error(
      `--max-num-batched-tokens (${maxNumBatchedTokens}) must be >= --max-num-seqs (${maxNumSeqs}): each running sequence's decode row takes one token of every step's budget`,
    );
  }

  const t0 = performance.now();
  const m = await loadEngineModel(modelSpec, env);
  const cfg = m.config;
  log.info(`model ${modelSpec} loaded in ${Math.round(performance.now() - t0)} ms (${cfg.numLayers} layers, dim ${cfg.dim}, ${cfg.numHeads} heads / ${cfg.numKvHeads} KV heads, vocab ${cfg.vocabSize})`);

  const maxModelLen = opts.maxModelLen ?? cfg.maxPositionEmbeddings;
  if (!Number.isInteger(maxModelLen) || maxModelLen < 2) throw new Error(`--max-model-len: expected an integer >= 2, found ${maxModelLen}`);
  if (maxModelLen > cfg.maxPositionEmbeddings) {
    throw new Error(`--max-model-len ${maxModelLen} exceeds the model's max_position_embeddings (${cfg.maxPositionEmbeddings})`);
  }
  const tokenBytes = payloadBytes(m.layout, 1);
  const kvBytes = opts.kvCacheBytes ?? Math.min(4 * GiB, maxNumSeqs * (maxModelLen + 16) * tokenBytes);
  const kv = new PagedKvCache({ numLayers: cfg.numLayers, numKvHeads: cfg.numKvHeads, headDim: cfg.headDim }, kvBytes);
  if (!sameLayout(kv.layout, m.layout)) throw new Error(`paged KV layout ${describeLayout(kv.layout)} differs from the model's ${describeLayout(m.layout)}`);
  if (kv.capacityTokens < maxModelLen) log.warn(`KV budget holds ${kv.capacityTokens} tokens, less than max_model_len ${maxModelLen}: longer requests are refused`);

  const metrics = new EngineMetrics({ model: modelName }, opts.processMetrics ?? false);

  let store: KvcStore | null = null;
  let connector: KvcConnectorV1 | null = null;
  let transfer: KvTransferPlugin | null = null;
  let controller: ControllerAttachment | null = null;
  try {
    if (connectorConfig && cacheConfig) {
      store = await KvcStore.create(cacheConfig, { modelId: m.modelId });
      if (store.remote) registerRemoteMetrics(metrics.registry, store.remote);
      const seed = seedFromEnv(env);
      if (connectorConfig.kv_role !== 'kv_both') {
        const factory = opts.transfer ?? createKvTransfer;
        if (!cacheConfig.enable_xfer) {
          log.warn(`kv_role ${connectorConfig.kv_role} without enable_xfer in the cache config: no KV is transferred, prompts are computed here`);
        } else {
          transfer = await factory({ role: connectorConfig.kv_role, cacheConfig, connectorConfig, layout: m.layout, modelId: m.modelId, chunkSize: cacheConfig.chunk_size, seed });
        }
      }
      if (cacheConfig.enable_controller) {
        // Registers this cache instance with the controller (monitor port) and serves its worker
        // and peer ports, so the controller can look up, move, copy, pin and clear our chunks.
        controller = await attachController(store, cacheConfig, { modelId: m.modelId, chunkSize: cacheConfig.chunk_size, seed, layout: m.layout });
        log.info(`cache instance ${cacheConfig.kvc_instance_id} attached to controller ${cacheConfig.controller_url} (worker port ${controller.workerPort})`);
      }
      connector = new KvcConnectorV1({ config: connectorConfig, cacheConfig, store, modelId: m.modelId, layout: m.layout, seed, metrics, transfer });
      log.info(
        `connector KvcConnectorV1 role=${connectorConfig.kv_role} chunk_size=${cacheConfig.chunk_size} locations=${store.locations().join(',') || 'none'}${store.remote ? ` remote=${store.remote.endpoint.display}` : ''}` +
          ` discard_partial_chunks=${connector.discardPartial} seed=${seed}${transfer ? ' xfer=on' : ''}`,
      );
    }
  } catch (e) {
    // Start-up failed half way: release what was opened (ports, buffers) before reporting.
    await controller?.close().catch(() => undefined);
    await transfer?.close().catch(() => undefined);
    await store?.close().catch(() => undefined);
    throw e;
  }

  const scheduler = new Scheduler({ model: m, kv, metrics, connector, maxNumSeqs, maxNumBatchedTokens, maxQueue: opts.maxQueue ?? 1024 });
  const tok = m.tokenizer;
  const eosIds = new Set<number>(cfg.eosTokenIds);
  if (tok.eosTokenId !== null) eosIds.add(tok.eosTokenId);

  const app = createHttpServer({ name: 'engine' });

  app.addHook('onResponse', async (req, reply) => {
    if ((req as FastifyRequest & { kvcCounted?: boolean }).kvcCounted) return;
    const endpoint = req.routeOptions.url ?? 'unknown';
    const outcome = reply.statusCode < 400 ? 'ok' : reply.statusCode < 500 || reply.statusCode === 503 ? 'rejected' : 'error';
    metrics.requests.inc({ endpoint, outcome });
  });

  const checkModel = (name: string | undefined) => {
    if (name !== undefined && name !== modelName) throw notFound(`The model \`${name}\` does not exist. This engine serves \`${modelName}\`.`, 'model_not_found');
  };
  const checkIds = (ids: number[], field: string) => {
    for (let i = 0; i < ids.length; i++) {
      if (ids[i]! >= cfg.vocabSize) throw badRequest(`field \`${field}[${i}]\`: token id ${ids[i]} is out of range for a vocabulary of ${cfg.vocabSize}`);
    }
  };
  /**
   * Refuses text whose character count alone proves it has at least `limit` tokens, before
   * spending the CPU on tokenizing it (tokenizer.minTokens is a sound lower bound, or 0).
   */
  const boundText = (text: string, field: string, limit: number, what: string) => {
    const min = tok.minTokens(text);
    if (min >= limit) {
      throw badRequest(
        `field \`${field}\`: ${text.length} characters are at least ${min} tokens; ${what} (this model's maximum context length is ${maxModelLen} tokens)`,
        'context_length_exceeded',
      );
    }
  };
  /** Chat messages → prompt ids; refuses a rendered prompt that certainly reaches `limit` tokens. */
  const encodeChat = (messages: { role: string; content?: unknown }[], limit: number, what: string): number[] => {
    const msgs: ChatMessage[] = messages.map((mm) => ({ role: mm.role, content: messageText(mm as Parameters<typeof messageText>[0]) }));
    let text: string;
    try {
      text = tok.applyChatTemplate(msgs);
    } catch (e) {
      if (e instanceof ChatTemplateError) throw badRequest(`field \`messages\`: ${e.message.replace(/^messages: /, '')}`);
      throw e;
    }
    boundText(text, 'messages', limit, what);
    return tok.encodeChatText(text);
  };
  /** Generation needs prompt < max_model_len; /tokenize only refuses what is beyond max_model_len. */
  const GEN_LIMIT = 'leaving no room to generate';
  const TOK_LIMIT = 'more than the model can take';
  /**
   * Length rules shared by both generation endpoints; returns max_tokens to use. Without an
   * explicit max_tokens, `defaultMax` is further capped by what the paged KV can hold for this
   * prompt (prompt + max_tokens - 1 positions), so a default never asks for more than exists.
   */
  const plan = (prompt: number[], field: string, maxTokens: number | null | undefined, maxField: string, defaultMax: number): number => {
    if (prompt.length === 0) throw badRequest(`field \`${field}\`: the prompt is empty (0 tokens)`);
    if (prompt.length >= maxModelLen) {
      throw badRequest(`field \`${field}\`: the prompt has ${prompt.length} tokens; this model's maximum context length is ${maxModelLen} tokens, ${GEN_LIMIT}`, 'context_length_exceeded');
    }
    if (prompt.length > kv.capacityTokens) {
      throw badRequest(`field \`${field}\`: the prompt has ${prompt.length} tokens; this engine's KV cache holds ${kv.capacityTokens} tokens`, 'kv_capacity_exceeded');
    }
    const mt = maxTokens ?? Math.min(defaultMax, kv.capacityTokens + 1 - prompt.length);
    if (prompt.length + mt > maxModelLen) {
      throw badRequest(
        `field \`${maxField}\`: ${mt} tokens requested with a ${prompt.length}-token prompt; this model's maximum context length is ${maxModelLen} tokens`,
        'context_length_exceeded',
      );
    }
    if (prompt.length + mt - 1 > kv.capacityTokens) {
      throw badRequest(`field \`${maxField}\`: prompt + ${mt} tokens need more KV than this engine has (${kv.capacityTokens} tokens)`, 'kv_capacity_exceeded');
    }
    return mt;
  };
  const sampling = (b: { temperature?: number | null; top_p?: number | null; top_k?: number | null; seed?: number | null }) => ({
    temperature: b.temperature ?? 1,
    topP: b.top_p ?? 1,
    topK: b.top_k ?? -1,
    seed: b.seed ?? null,
  });
  const stopIds = (b: { ignore_eos?: boolean | null; stop_token_ids?: number[] | null }) => {
    const s = new Set<number>(b.ignore_eos ? [] : eosIds);
    for (const id of b.stop_token_ids ?? []) s.add(id);
    return s;
  };
  const stopStrings = (stop: string | string[] | null | undefined) => (stop === null || stop === undefined ? [] : typeof stop === 'string' ? [stop] : stop).filter((x) => x.length > 0);
  const requestIdOf = (req: FastifyRequest) => {
    const h = req.headers['x-request-id'];
    return typeof h === 'string' && /^[\w.:-]{1,128}$/.test(h) ? h : newRequestId();
  };
  const ctx = { scheduler, tokenizer: tok, metrics };

  app.post('/v1/completions', async (req: FastifyRequest, reply: FastifyReply) => {
    const b = parseBody(completionRequest, requireObject(req.body));
    checkModel(b.model);
    const p = Array.isArray(b.prompt) && b.prompt.length === 1 && (typeof b.prompt[0] === 'string' || Array.isArray(b.prompt[0])) ? b.prompt[0]! : b.prompt;
    let prompt: number[];
    if (typeof p === 'string') {
      boundText(p, 'prompt', maxModelLen, GEN_LIMIT);
      prompt = tok.encode(p);
    } else {
      prompt = p as number[];
      checkIds(prompt, 'prompt');
    }
    const maxTokens = plan(prompt, 'prompt', b.max_tokens, 'max_tokens', Math.min(16, maxModelLen - prompt.length));
    const g: GenerationRequest = {
      kind: 'completion',
      endpoint: '/v1/completions',
      requestId: requestIdOf(req),
      modelName,
      prompt,
      maxTokens,
      sampling: sampling(b),
      stop: stopStrings(b.stop),
      stopTokenIds: stopIds(b),
      kvTransferParams: b.kv_transfer_params ?? undefined,
      stream: b.stream ?? false,
      includeUsage: b.stream_options?.include_usage ?? false,
    };
    await runGeneration(ctx, g, req, reply);
    return reply;
  });

  app.post('/v1/chat/completions', async (req: FastifyRequest, reply: FastifyReply) => {
    const b = parseBody(chatRequest, requireObject(req.body));
    checkModel(b.model);
    const prompt = encodeChat(b.messages, maxModelLen, GEN_LIMIT);
    const field = b.max_completion_tokens != null ? 'max_completion_tokens' : 'max_tokens';
    const maxTokens = plan(prompt, 'messages', b.max_completion_tokens ?? b.max_tokens, field, maxModelLen - prompt.length);
    const g: GenerationRequest = {
      kind: 'chat',
      endpoint: '/v1/chat/completions',
      requestId: requestIdOf(req),
      modelName,
      prompt,
      maxTokens,
      sampling: sampling(b),
      stop: stopStrings(b.stop),
      stopTokenIds: stopIds(b),
      kvTransferParams: b.kv_transfer_params ?? undefined,
      stream: b.stream ?? false,
      includeUsage: b.stream_options?.include_usage ?? false,
    };
    await runGeneration(ctx, g, req, reply);
    return reply;
  });

  app.post('/tokenize', async (req) => {
    const body = requireObject(req.body);
    let tokens: number[];
    if ('messages' in body) {
      const b = parseBody(tokenizeChatRequest, body);
      checkModel(b.model);
      tokens = encodeChat(b.messages, maxModelLen + 1, TOK_LIMIT);
    } else {
      const b = parseBody(tokenizePromptRequest, body);
      checkModel(b.model);
      boundText(b.prompt, 'prompt', maxModelLen + 1, TOK_LIMIT);
      tokens = tok.encode(b.prompt, b.add_special_tokens === false ? { addBos: false } : {});
    }
    return { tokens, count: tokens.length, max_model_len: maxModelLen };
  });

  app.post('/detokenize', async (req) => {
    const b = parseBody(detokenizeRequest, requireObject(req.body));
    checkModel(b.model);
    checkIds(b.tokens, 'tokens');
    return { prompt: tok.decode(b.tokens) };
  });

  const createdAt = Math.floor(Date.now() / 1000);
  app.get('/v1/models', async () => ({
    object: 'list',
    data: [{ id: modelName, object: 'model', created: createdAt, owned_by: 'kvc', root: m.dir, parent: null, max_model_len: maxModelLen }],
  }));

  app.get('/health', async () => ({ status: 'ok' }));

  app.get('/metrics', async (_req, reply) => {
    const body = await metrics.registry.metrics();
    void reply.header('content-type', metrics.registry.contentType);
    return body;
  });

  let closing: Promise<void> | null = null;
  const close = () =>
    (closing ??= (async () => {
      await scheduler.close();
      await app.close();
      if (controller) await controller.close().catch((e: unknown) => log.warn(`detaching from the controller: ${(e as Error).message}`));
      if (transfer) await transfer.close().catch((e: unknown) => log.warn(`closing xfer: ${(e as Error).message}`));
      if (store) await store.close();
    })());

  const host = opts.host ?? '127.0.0.1';
  try {
    await app.listen({ host, port: opts.port ?? 0 });
  } catch (e) {
    await close();
    throw e;
  }
  const addr = app.server.address();
  const port = typeof addr === 'object' && addr ? addr.port : (opts.port ?? 0);
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;

  return {
    url,
    host,
    port,
    modelName,
    modelId: m.modelId,
    maxModelLen,
    store,
    connector,
    cacheConfig,
    connectorConfig,
    controller,
    metrics,
    scheduler,
    kv,
    model: m,
    close,
  };
}
