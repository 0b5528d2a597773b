// The seam between the engine's connector and a KV transfer library (the xfer component in
// src/xfer implements it; the engine wires it in src/engine). It lives in common so that
// neither side imports the other's internals. The engine knows nothing about sockets or reservations: for `kv_consumer` it
// asks the plugin for the chunks received for a request before prefill; for `kv_producer`
// it hands the plugin the prompt's sealed chunks after prefill and answers the request only
// when the plugin's promise settles. Chunks always travel as the single-buffer format of
// src/common/chunk.ts; the engine verifies every chunk (checksum, key, layout) before use.
import type { CacheConfig, ConnectorConfig } from './config.js';
import type { KvLayout } from './chunk.js';
import type { ChunkSpan } from './keys.js';

export type KvRole = ConnectorConfig['kv_role'];

/**
 * Slowest rate a transfer's deadline allows for (bytes per second): a transfer of B bytes (xfer
 * prefill→decode, or a P2P fetch) must end within its configured floor + B / this. 16 MiB/s is far
 * below any link kvc runs on, so only a stalled or dead peer reaches it (docs/xfer.md).
 */
export const TRANSFER_MIN_RATE = 16 * 1024 * 1024;

/** The deadline (ms from its start) of a transfer of `bytes` with floor `floorMs`. */
export function transferDeadlineMs(floorMs: number, bytes: number): number {
  return floorMs + Math.ceil((bytes * 1000) / TRANSFER_MIN_RATE);
}

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

/** A receiving plugin's accounting (kv_consumer), exported as kvc_xfer_* metrics by the engine. */
export interface TransferStats {
  /** Reservations held (in flight, or ended and not yet taken by their request). */
  reservations: number;
  reservedBytes: number;
  /**
   * Memory the receive buffer holds: slots handed out at least once, in arenas still held. Their
   * pages stay resident until an idle receiver trims them, so this is a high-water mark of the
   * transfers received at once, bounded by xfer_buffer_size (about twice it at most).
   */
  heldBytes: number;
  /** Transfers by how they ended (done, failed, abandoned), and those not ended yet. */
  transfers: { done: number; failed: number; abandoned: number; inFlight: number };
  /** Reservations freed, by how: taken (by their request), released (their request ended without them), expired (the TTL). */
  reservationsEnded: { taken: number; released: number; expired: number };
}

/** What ending a request did to its reservation (KvTransferPlugin.ended). */
export type EndedReservation = 'released' | 'taken' | 'none';

export interface KvTransferPlugin {
  /** kv_consumer: the receiver's accounting, read at each metrics scrape. */
  stats?(): TransferStats;
  /**
   * kv_consumer: chunks received for this request, looked up before its prefill.
   * Resolve null when nothing was received (the engine then computes the prompt itself).
   */
  received?(req: TransferRequest): Promise<ReceivedKv | null>;
  /**
   * kv_consumer: the request whose transfer id is `reqId` ended without (further) use of its
   * transfer (its client left, it failed, or it went elsewhere): free its reservation now unless
   * a request took it, and refuse a transfer for it that arrives later.
   */
  ended?(reqId: string, own?: boolean): EndedReservation;
  /**
   * kv_consumer: the request whose transfer id is `reqId` reached the engine: its reservation
   * waits for it (freed when it ends, by `ended(reqId, true)` or once it imported).
   */
  claim?(reqId: string): void;
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
  /** kv_consumer: whether the engine's own cache holds a chunk (such chunks are not transferred again). */
  heldLocally?: (key: string) => boolean;
}

export type TransferFactory = (ctx: TransferContext) => Promise<KvTransferPlugin>;
