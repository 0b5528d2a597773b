// The seam between the engine's connector and a KV transfer library (the xfer component,
// DESIGN §6). The engine knows nothing about sockets or reservations: for `kv_consumer` it
// asks the plugin for the chunks received for a request before prefill; for `kv_producer`
// it hands the plugin the prompt's sealed chunks after prefill and answers the request only
// when the plugin's promise settles. Chunks always travel as the single-buffer format of
// src/common/chunk.ts; the engine verifies every chunk (checksum, key, layout) before use.
import type { CacheConfig, ConnectorConfig } from '../common/config.js';
import type { KvLayout } from '../common/chunk.js';
import type { ChunkSpan } from '../common/keys.js';
import type { KvcStore } from '../kvc/store.js';

export type KvRole = ConnectorConfig['kv_role'];

/** What the plugin learns about one request. */
export interface TransferRequest {
  /** The engine's request id (also the OpenAI response id suffix). */
  requestId: string;
  promptTokens: readonly number[];
  /** Chunk spans of the prompt with their keys (connector chunk size, seed, model id). */
  spans: readonly ChunkSpan[];
  /** `kv_transfer_params` of the HTTP request as sent by the client (e.g. the proxy's `disagg_spec`). */
  kvTransferParams: Record<string, unknown> | undefined;
}

/** One chunk of a prompt, sealed (header + payload), ready to send. */
export interface SealedChunk {
  key: string;
  start: number;
  end: number;
  chunk: Uint8Array;
}

/** The chunks a consumer received for one request. */
export interface ReceivedKv {
  /** The sealed chunk for `key`, or null when it was not received. */
  get(key: string): Uint8Array | null | Promise<Uint8Array | null>;
  /** Called exactly once, when the engine has imported what it needs or gave up (cancel, error). */
  release(): void;
}

export interface KvTransferPlugin {
  /**
   * kv_consumer: chunks received for this request, looked up before its prefill.
   * Resolve null when nothing was received (the engine then computes the prompt itself).
   */
  received?(req: TransferRequest): Promise<ReceivedKv | null>;
  /**
   * kv_producer: called after the prefill with every chunk of the prompt. The HTTP answer is
   * held until this settles. The resolved object (if any) is merged into the response's
   * `kv_transfer_params`. A rejection is logged and the request is still answered: the
   * decoder then computes the prompt itself.
   */
  send?(req: TransferRequest, chunks: SealedChunk[]): Promise<Record<string, unknown> | void>;
  close(): Promise<void>;
}

/** Everything a plugin needs to start inside an engine. */
export interface TransferContext {
  role: KvRole;
  cacheConfig: CacheConfig;
  connectorConfig: ConnectorConfig;
  layout: KvLayout;
  modelId: string;
  chunkSize: number;
  seed: bigint;
  store: KvcStore;
}

export type TransferFactory = (ctx: TransferContext) => Promise<KvTransferPlugin>;

/**
 * Where the engine looks for the xfer plugin when none is passed to startEngine():
 * a module exporting `createKvTransfer: TransferFactory`. Resolved relative to this file.
 */
export const XFER_PLUGIN_MODULE = '../xfer/engine_plugin.js';

/** Loads the xfer plugin factory from XFER_PLUGIN_MODULE; null when that module does not exist. */
export async function loadDefaultTransferFactory(): Promise<TransferFactory | null> {
  const spec = new URL(XFER_PLUGIN_MODULE, import.meta.url).href;
  let mod: { createKvTransfer?: unknown };
  try {
    mod = (await import(spec)) as { createKvTransfer?: unknown };
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ERR_MODULE_NOT_FOUND' && String((e as Error).message).includes('engine_plugin')) return null;
    throw e;
  }
  if (typeof mod.createKvTransfer !== 'function') throw new Error(`${XFER_PLUGIN_MODULE} does not export a createKvTransfer function`);
  return mod.createKvTransfer as TransferFactory;
}
