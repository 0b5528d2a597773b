// KvcConnectorV1: moves a prompt's KV between the engine's paged cache and the cache
// instance (KvcStore) or a transfer plugin, keyed by chunk keys (src/common/keys.ts: a chunk's
// key hashes the previous chunk's key with its own token ids, so equal keys mean equal prefixes).
//
//  before prefill  the longest prefix of chunks found (received chunks first for kv_consumer,
//                  then the store) is imported into the paged KV; only the rest is computed.
//                  At least the last prompt token (and for consumers `skip_last_n_tokens`) is
//                  always recomputed: its logits give the first output token.
//  after prefill   chunks the store does not hold yet are exported from the paged KV, sealed
//                  and stored (the partial last chunk too, unless discard_partial_chunks);
//                  kv_producer also hands every chunk to the transfer plugin.
//  admission       a copy of what a peer holds (received by xfer, fetched by P2P) and the
//                  partial last chunk are stored evict-first (peer_copy_admission,
//                  partial_chunk_admission; docs/storage.md): they take free room but never
//                  push out a chunk this engine computed or reused, until a later request
//                  reads them from this cache.
//
// Every loaded chunk is verified (checksum, key, layout, token count) before it is used: a
// bad chunk ends the loaded prefix and the rest is computed, never served wrong.
import { setImmediate as yieldToLoop } from 'node:timers/promises';
import { decodeChunk } from '../common/chunk_codec.js';
import { sizeClass } from '../common/buffer_pool.js';
import { DTYPE_NAMES } from '../common/dtype.js';
import { Codec, HEADER_BYTES, chunkBytes, describeLayout, payloadPrefix, sameLayout, sealChunk, verifyChunk, type KvLayout } from '../common/chunk.js';
import type { CacheConfig, ConnectorConfig } from '../common/config.js';
import { chunkKeys, type ChunkSpan } from '../common/keys.js';
import { logger } from '../common/log.js';
import type { KvcStore } from '../kvc/store.js';
import { CopyDeclinedError, type KeyEvent } from '../kvc/types.js';
import type { KeySettings } from '../protocol/engine_health.js';
import { LedgerKeeper, type AskReasons, type PendingLedger } from './ledger.js';
import type { P2pClient } from '../kvc/p2p_client.js';
import type { PagedKvCache } from './model/kv_cache.js';
import type { EngineMetrics } from './metrics.js';
import type { KvTransferPlugin, ReceivedKv, SealedChunk, TransferRequest } from '../common/transfer_seam.js';
import { REUSED_TOKENS, transferReqId } from '../protocol/disagg_spec.js';
import { IMPORT_SLICE_MS } from './import_pacer.js';
import { keeperAt, keeperSplitOf } from '../protocol/keeper.js';

const log = logger('engine.connector');

/** Bound on reading one chunk from the store (a disk tier that hangs must not hang a request). */
const LOAD_TIMEOUT_MS = 30_000;

export interface ConnectorRequest {
  seqId: number;
  requestId: string;
  prompt: readonly number[];
  kvTransferParams: Record<string, unknown> | undefined;
  /** The request's cache_salt: part of every chunk key (src/common/keys.ts), so salted chunks are never shared. */
  cacheSalt?: string;
  /** True once the client went away; loading stops at the next await. */
  cancelled(): boolean;
  /**
   * For save(): the prompt tokens load() imported (from this cache, a peer or a transfer) rather
   * than computed here. Chunks within them that the store does not hold (a copy it declined) are
   * stored as copies, never as chunks this instance computed.
   */
  loadedTokens?: number;
  /**
   * For load(): resolves when the next chunk may be imported (the scheduler's ImportPacer: one
   * slice of import work between two steps for the whole engine). Without it, load() yields to
   * the event loop after each IMPORT_SLICE_MS of its own work.
   */
  pace?: () => Promise<void>;
  /** For load(): called once when the import ended, however it ended (hands on the rest of the slice). */
  paceDone?: () => void;
}

export interface LoadResult {
  /** Prompt tokens now present in the paged KV. */
  tokens: number;
  /** Of those, the tokens that came from a transfer (the rest from the cache instance). */
  receivedTokens: number;
  source: 'cache' | 'transfer' | 'none';
  /** The hit-rate ledger of this load (null when the request was cancelled). */
  ledger: PendingLedger | null;
}

export interface ConnectorOptions {
  config: ConnectorConfig;
  cacheConfig: CacheConfig;
  store: KvcStore;
  modelId: string;
  layout: KvLayout;
  seed: bigint;
  metrics: EngineMetrics;
  transfer: KvTransferPlugin | null;
  /** enable_p2p: fetches what the local (and remote) tiers lack from other instances (docs/p2p.md). */
  p2p?: P2pClient | null;
  /** The controller's reasons for computed chunks (the ledger); null without a controller. */
  missReasons?: AskReasons | null;
  /** Bound on the transfer lookup and on reading one chunk (default LOAD_TIMEOUT_MS). */
  loadTimeoutMs?: number;
  /** CPU time of one import slice before yielding to decode steps (default IMPORT_SLICE_MS). */
  importSliceMs?: number;
}

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let t: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<T>((_, rej) => {
      t = setTimeout(() => rej(new Error(`${what} timed out after ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(t));
}


export class KvcConnectorV1 {
  readonly role: ConnectorConfig['kv_role'];
  readonly chunkSize: number;
  readonly discardPartial: boolean;
  readonly skipLastN: number;
  /** Copies of chunks a peer holds are admitted evict-first (peer_copy_admission). */
  readonly peerCopyEvictFirst: boolean;
  /** The partial last chunk is admitted evict-first (partial_chunk_admission). */
  readonly partialEvictFirst: boolean;
  readonly store: KvcStore;
  readonly transfer: KvTransferPlugin | null;
  private readonly loadTimeoutMs: number;
  private readonly importSliceMs: number;
  private readonly ledger: LedgerKeeper;

  constructor(private readonly o: ConnectorOptions) {
    this.role = o.config.kv_role;
    this.chunkSize = o.cacheConfig.chunk_size;
    const extra = o.config.kv_connector_extra_config;
    this.discardPartial = extra.discard_partial_chunks;
    this.skipLastN = extra.skip_last_n_tokens;
    // Unset: evict-first only when this engine can fetch the copy back from its holder (P2P).
    this.peerCopyEvictFirst = (extra.peer_copy_admission ?? (o.p2p ? 'evict_first' : 'recent')) === 'evict_first';
    this.partialEvictFirst = (extra.partial_chunk_admission ?? 'evict_first') === 'evict_first';
    this.store = o.store;
    this.transfer = o.transfer;
    this.loadTimeoutMs = o.loadTimeoutMs ?? LOAD_TIMEOUT_MS;
    this.importSliceMs = o.importSliceMs ?? IMPORT_SLICE_MS;
    this.ledger = new LedgerKeeper(this.chunkSize, o.missReasons ?? null, (r, n) => o.metrics.computedChunks.inc({ reason: r }, n));
    // Without a controller, the engine's own stores are its "stored before".
    if (!o.missReasons) o.store.on('admit', (e: KeyEvent) => this.ledger.stored(e.keys));
  }

  /**
   * kv_consumer: a request ended before load() ran (cancelled while queued): the reservation its
   * transfer holds would otherwise wait for the TTL, since only load() takes and frees it.
   */
  endedUnloaded(kvTransferParams: Record<string, unknown> | undefined): void {
    if (this.role !== 'kv_consumer' || !this.transfer?.ended) return;
    const reqId = transferReqId(kvTransferParams);
    if (reqId !== undefined) this.transfer.ended(reqId, true);
  }

  /**
   * kv_consumer: a request arrived (queued for admission): its transfer's reservation waits for
   * it however long the queue is, instead of being freed by the claim window.
   */
  arrived(kvTransferParams: Record<string, unknown> | undefined): void {
    if (this.role !== 'kv_consumer' || !this.transfer?.claim) return;
    const reqId = transferReqId(kvTransferParams);
    if (reqId !== undefined) this.transfer.claim(reqId);
  }

  /**
   * Its CPU tier's room for chunks it would keep (LruIndex.room), with the prompt tokens that room
   * and the whole tier hold in whole chunks (the proxy compares them with a prompt: docs/storage.md
   * "Who keeps a transferred chunk"); null without a CPU tier.
   */
  room(): { freeBytes: number; freeTokens: number; capacityTokens: number; tailAgeMs: number | null } | null {
    const cpu = this.store.cpu();
    const r = cpu?.room();
    if (!cpu || !r) return null;
    const tokens = (bytes: number) => Math.floor(bytes / sizeClass(chunkBytes(this.o.layout, this.chunkSize))) * this.chunkSize;
    return { ...r, freeTokens: tokens(r.freeBytes), capacityTokens: tokens(cpu.capacityBytes) };
  }

  /** The settings its chunk keys and chunks depend on (the controller and the proxy compare them). */
  keySettings(): KeySettings {
    return { model_id: this.o.modelId, chunk_size: this.chunkSize, seed: String(this.o.seed), kv_dtype: DTYPE_NAMES[this.o.layout.dtype] };
  }

  spans(prompt: readonly number[], salt?: string): ChunkSpan[] {
    return chunkKeys(prompt, { modelId: this.o.modelId, chunkSize: this.chunkSize, seed: this.o.seed, discardPartialChunks: this.discardPartial, salt, kvDtype: this.o.layout.dtype });
  }

  private transferRequest(req: ConnectorRequest, spans: ChunkSpan[]): TransferRequest {
    return { requestId: req.requestId, promptTokens: req.prompt, spans, kvTransferParams: req.kvTransferParams };
  }

  /**
   * Checks a chunk against what the request expects; returns its payload or null (logged), and
   * says in `why` whether it was stored with another layout (mismatch) or damaged (corrupt).
   */
  private accept(buf: Uint8Array, span: ChunkSpan, from: string, why?: { v?: 'mismatch' | 'corrupt' }): Uint8Array | null {
    try {
      const h = verifyChunk(buf, span.key);
      if (!sameLayout(h, this.o.layout)) {
        log.warn(`chunk ${span.key} from ${from} has layout ${describeLayout(h)}, this engine uses ${describeLayout(this.o.layout)}; computing instead`);
        if (why) why.v = 'mismatch';
        return null;
      }
      if (h.numTokens !== span.end - span.start) {
        log.warn(`chunk ${span.key} from ${from} holds ${h.numTokens} tokens, expected ${span.end - span.start}; computing instead`);
        if (why) why.v = 'mismatch';
        return null;
      }
      // A tier may hold the chunk encoded (chunk_codec.ts): the paged KV takes the engine's dtype.
      return h.codec === Codec.naive ? buf.subarray(HEADER_BYTES) : decodeChunk(buf, h).subarray(HEADER_BYTES);
    } catch (e) {
      log.warn(`chunk ${span.key} from ${from} rejected: ${(e as Error).message}; computing instead`);
      if (from === 'cache') this.dropCorrupt(span.key);
      if (why) why.v = 'corrupt';
      return null;
    }
  }

  /** Removes a chunk that failed verification from every location, so it is never read again. */
  private dropCorrupt(key: string): void {
    for (const loc of this.store.locations()) {
      if (!this.store.has(key, loc)) continue;
      this.store.remove(key, loc).catch((e: unknown) => log.warn(`could not drop corrupt chunk ${key} from ${loc}: ${(e as Error).message}`));
    }
  }

  /**
   * The prompt's chunk keys its puts never evict (PutOptions.keep): all of them, or with a split
   * (kvc_keeper_split) only the part this side keeps, so that storing that part may evict copies
   * of the other side's part (it keeps them).
   */
  private keptKeys(req: ConnectorRequest, spans: readonly ChunkSpan[]): Set<string> {
    if (keeperSplitOf(req.kvTransferParams) === null) return new Set(spans.map((s) => s.key));
    const me = this.role === 'kv_consumer' ? 'decoder' : 'prefiller';
    return new Set(spans.filter((s) => keeperAt(req.kvTransferParams, s.start) === me).map((s) => s.key));
  }

  /** A prompt's partial last chunk (fewer tokens than a chunk): reused only by the same prompt again. */
  private partial(span: { start: number; end: number }): boolean {
    return span.end - span.start < this.chunkSize;
  }

  /** Stores a received, verified chunk (the store copies it before put() resolves); a failure is logged, save() retries it. */
  private async keepReceived(req: ConnectorRequest, span: ChunkSpan, chunk: Uint8Array, keep: ReadonlySet<string>): Promise<void> {
    const m = this.o.metrics;
    const key = span.key;
    const t0 = performance.now();
    // The prefiller that sent it keeps its own copy (with P2P, fetchable again), unless the proxy
    // named this decoder the keeper (kvc_keeper): then the prefiller stores none, and this copy
    // is kept like a chunk computed here. An over-long prompt is split (kvc_keeper_split): each
    // side stores only its part, since a copy of the other part here would only take the room
    // this side's part needs.
    const keeper = keeperAt(req.kvTransferParams, span.start);
    if (keeper === 'prefiller' && keeperSplitOf(req.kvTransferParams) !== null) return;
    const keeps = keeper === 'decoder';
    const evictFirst = (!keeps && this.peerCopyEvictFirst) || (this.partialEvictFirst && this.partial(span));
    try {
      await withTimeout(this.store.put(key, chunk, undefined, { evictFirst, keep }), this.loadTimeoutMs, `storing received chunk ${key}`);
      m.chunksSaved.inc();
      m.cacheStoredBytes.inc(chunk.byteLength);
      m.cacheStoreSeconds.observe((performance.now() - t0) / 1000);
    } catch (e) {
      // A declined copy is the tier keeping what it may not give up (the prefiller keeps its own).
      if (e instanceof CopyDeclinedError) log.debug(`request ${req.requestId}: received chunk ${key} not kept: ${e.message}`);
      else {
        m.cacheStoreFailures.inc();
        log.warn(`request ${req.requestId}: received chunk ${key} not stored: ${(e as Error).message}`);
      }
    }
  }

  /**
   * Imports the longest usable prefix of the prompt's KV into `kv` for `req.seqId` (which must
   * already hold room for the prompt). Never throws for a missing or bad chunk: it stops there.
   */
  async load(req: ConnectorRequest, kv: PagedKvCache): Promise<LoadResult> {
    const spans = this.spans(req.prompt, req.cacheSalt);
    // What this prompt stores or fetches never evicts its own other chunks (PutOptions.keep).
    const ownKeys = this.keptKeys(req, spans);
    // Positions that may be imported: all but the recomputed tail.
    const recompute = Math.max(1, this.role === 'kv_consumer' ? this.skipLastN : 0);
    const maxLoad = req.prompt.length - recompute;
    let received: ReceivedKv | null = null;
    // A consumer always asks, even when nothing can be imported (a prompt shorter than
    // skip_last_n_tokens + 1): that claims and then releases the request's reservation.
    const m = this.o.metrics;
    if (this.role === 'kv_consumer' && this.transfer?.received) {
      // A plugin that throws synchronously is treated like a lookup that failed.
      const lookup = Promise.resolve().then(() => this.transfer!.received!(this.transferRequest(req, spans)));
      const t0 = performance.now();
      try {
        received = await withTimeout(lookup, this.loadTimeoutMs, 'transfer lookup');
        m.xferReceiveWaitSeconds.observe({ outcome: received ? 'received' : 'none' }, (performance.now() - t0) / 1000);
      } catch (e) {
        m.xferReceiveWaitSeconds.observe({ outcome: 'failed' }, (performance.now() - t0) / 1000);
        log.warn(`request ${req.requestId}: transfer lookup failed (${(e as Error).message}); computing the prompt`);
        // Timed out: the lookup may still resolve later, holding chunks and the request's
        // reservation. Nothing will use them; release them as soon as they are handed out.
        lookup.then(
          (late) => late?.release(),
          () => undefined,
        );
      }
    }
    let loaded = 0;
    let fromTransfer = 0;
    let sliceStart = performance.now();
    // What came from where, counted into the metrics only for chunks actually imported.
    let cacheChunks = 0, cacheBytes = 0, cacheMs = 0, xferChunks = 0, xferBytes = 0;
    /** The span whose chunk was found but refused, if the load stopped there (the ledger). */
    let rejected: { index: number; why: 'mismatch' | 'corrupt' | 'stale' } | null = null;
    const canQuery = this.store.locations().length > 0 || this.store.remote !== null || !!this.o.p2p;
    const p2p = this.o.p2p ?? null;
    try {
      // Chunks read through the remote tier and then fetched from peers (P2P), once, at the
      // first local miss: both are verified and promoted into the CPU tier, then used like hits.
      let fetched: Map<string, Uint8Array> | null = null;
      for (let i = 0; i < spans.length; i++) {
        const span = spans[i]!;
        if (span.start >= maxLoad || req.cancelled()) break;
        // Let the scheduler run a decode step for the sequences already running between slices
        // of this work (the awaits below are microtasks: without this, a long prefix is imported
        // in one block).
        if (req.pace) {
          await req.pace();
          if (req.cancelled()) break;
        } else if (performance.now() - sliceStart >= this.importSliceMs) {
          this.o.metrics.importSlices.inc();
          await yieldToLoop();
          sliceStart = performance.now();
          if (req.cancelled()) break;
        }
        let payload: Uint8Array | null = null;
        let source: 'cache' | 'transfer' = 'cache';
        let bytes = 0;
        if (received) {
          const buf = await withTimeout(Promise.resolve(received.get(span.key)), this.loadTimeoutMs, `receiving chunk ${span.key}`);
          if (buf) {
            payload = this.accept(buf, span, 'transfer');
            source = 'transfer';
            bytes = buf.byteLength;
            // Keep the verified chunk as it arrived, now, inside this import slice: otherwise
            // save() exports and re-seals the whole received prompt from the paged KV in the
            // step that computes its last token, which every decoding sequence waits for.
            if (payload && canQuery && !this.store.has(span.key)) await this.keepReceived(req, span, buf, ownKeys);
          }
        }
        if (!payload) {
          // The CPU tier can be read in place: the import below copies synchronously. Chunks
          // fetched for this request are used as fetched: reading them from the CPU tier would
          // count as a reuse and lift a copy admitted evict-first out of the cold end.
          const t0 = performance.now();
          const peeked = fetched?.get(span.key) ?? this.store.cpu()?.peek(span.key) ?? null;
          let buf = peeked ?? (this.store.has(span.key) ? await withTimeout(this.store.get(span.key), this.loadTimeoutMs, `reading chunk ${span.key}`) : null);
          if (!buf && (this.store.remote || p2p) && fetched === null) {
            const want = spans.slice(i).filter((s) => s.start < maxLoad).map((s) => s.key);
            fetched = new Map();
            if (this.store.remote) fetched = await withTimeout(this.store.readThrough(want), this.loadTimeoutMs, 'reading through the remote tier');
            // P2P asks for what follows the remote tier's run (itself bounded by p2p_timeout_ms).
            let have = 0;
            while (have < want.length && fetched.has(want[have]!)) have++;
            if (p2p && have < want.length && !req.cancelled()) {
              for (const [k, v] of await p2p.fetch(want.slice(have), { evictFirst: this.peerCopyEvictFirst, keep: ownKeys })) fetched.set(k, v);
            }
          }
          buf ??= fetched?.get(span.key) ?? null;
          // Its own index said held, and the read found nothing: a stale index (the ledger).
          if (!buf && !peeked && this.store.has(span.key)) rejected = { index: i, why: 'stale' };
          if (buf) {
            const why: { v?: 'mismatch' | 'corrupt' } = {};
            payload = this.accept(buf, span, 'cache', why);
            if (!payload && why.v) rejected = { index: i, why: why.v };
            source = 'cache';
            bytes = buf.byteLength;
            cacheMs += performance.now() - t0;
          }
        }
        if (!payload || req.cancelled()) break;
        const n = span.end - span.start;
        const keep = Math.min(n, maxLoad - span.start);
        kv.importRange(req.seqId, span.start, payloadPrefix(this.o.layout, payload, n, keep), keep);
        loaded = span.start + keep;
        if (source === 'transfer') {
          fromTransfer += keep;
          xferChunks++;
          xferBytes += bytes;
        } else {
          cacheChunks++;
          cacheBytes += bytes;
        }
      }
    } catch (e) {
      log.warn(`request ${req.requestId}: loading KV stopped after ${loaded} tokens: ${(e as Error).message}`);
    } finally {
      received?.release();
      req.paceDone?.();
    }
    if (loaded > 0) this.store.touchPrefix(spans.filter((s) => s.start < loaded).map((s) => s.key));
    if (!req.cancelled()) {
      if (canQuery) {
        m.cacheQueryTokens.inc(req.prompt.length);
        m.lmcache.retrieveRequests.inc();
      }
      if (loaded > 0) {
        m.tokensLoaded.inc(loaded);
        if (fromTransfer) m.tokensLoadedBySource.inc({ source: 'transfer' }, fromTransfer);
        if (loaded - fromTransfer) {
          m.tokensLoadedBySource.inc({ source: 'cache' }, loaded - fromTransfer);
          m.cacheHitTokens.inc(loaded - fromTransfer);
        }
      }
      if (cacheChunks) {
        m.cacheRetrievedChunks.inc(cacheChunks);
        m.cacheRetrievedBytes.inc(cacheBytes);
        m.cacheRetrieveSeconds.observe(cacheMs / 1000);
        m.lmcache.timeToRetrieve.observe(cacheMs / 1000);
      }
      if (xferChunks) {
        m.xferReceivedChunks.inc(xferChunks);
        m.xferReceivedBytes.inc(xferBytes);
      }
    }
    const ledger = req.cancelled() ? null : this.ledger.settle(spans, req.prompt.length, loaded, fromTransfer, rejected, (k) => this.store.has(k));
    return { tokens: loaded, receivedTokens: fromTransfer, source: loaded === 0 ? 'none' : fromTransfer > 0 ? 'transfer' : 'cache', ledger };
  }

  /**
   * Called right after the prompt's last token was computed, while the sequence still holds
   * its KV: exports what must be stored or sent (synchronously), then stores and sends in the
   * background. The promise resolves to the kv_transfer_params to answer with (if any); it
   * never rejects.
   */
  save(req: ConnectorRequest, kv: PagedKvCache): Promise<Record<string, unknown> | undefined> {
    const spans = this.spans(req.prompt, req.cacheSalt);
    const ownKeys = this.keptKeys(req, spans);
    const canStore = this.store.locations().length > 0 || this.store.remote !== null;
    const wantSend = this.role === 'kv_producer' && !!this.transfer?.send && req.kvTransferParams?.disagg_spec !== undefined;
    const sealed: SealedChunk[] = [];
    const toStore: SealedChunk[] = [];
    const split = keeperSplitOf(req.kvTransferParams);
    try {
      for (const span of spans) {
        const stored = canStore && this.store.has(span.key);
        if (stored && !wantSend) continue;
        if (!canStore && !wantSend) break;
        const n = span.end - span.start;
        const buf = new Uint8Array(chunkBytes(this.o.layout, n));
        kv.exportRange(req.seqId, span.start, span.end, buf.subarray(HEADER_BYTES));
        const c: SealedChunk = { key: span.key, start: span.start, end: span.end, chunk: sealChunk(buf, this.o.layout, n, span.key) };
        if (wantSend) sealed.push(c);
        // A decoder given part of an over-long prompt (kvc_keeper_split) stores only its part.
        if (canStore && !stored && !(this.role === 'kv_consumer' && split !== null && keeperAt(req.kvTransferParams, c.start) !== 'decoder')) toStore.push(c);
      }
    } catch (e) {
      log.warn(`request ${req.requestId}: exporting KV failed: ${(e as Error).message}`);
      return Promise.resolve(undefined);
    }
    const m = this.o.metrics;
    if (toStore.length) m.lmcache.storeRequests.inc();
    const store = async (chunks: readonly SealedChunk[]): Promise<void> => {
      for (const c of chunks) {
        const t0 = performance.now();
        try {
          // The partial last chunk goes in evict-first (partial_chunk_admission); so does a chunk
          // imported rather than computed here, with peer_copy_admission evict_first: it is a copy
          // of what a peer keeps, one the tier declined when it arrived (see load()), and storing
          // it as this instance's own would let it displace the chunks the tier keeps for the
          // deployment.
          // (A decoder named the keeper keeps what it received as its own: see keepReceived().)
          const imported = c.end <= (req.loadedTokens ?? 0) && !(this.role === 'kv_consumer' && keeperAt(req.kvTransferParams, c.start) === 'decoder');
          await this.store.put(c.key, c.chunk, undefined, { evictFirst: (imported && this.peerCopyEvictFirst) || (this.partialEvictFirst && this.partial(c)), keep: ownKeys });
          m.chunksSaved.inc();
          m.cacheStoredBytes.inc(c.chunk.byteLength);
          m.cacheStoreSeconds.observe((performance.now() - t0) / 1000);
          m.lmcache.storedTokens.inc(c.end - c.start);
        } catch (e) {
          // A declined copy or partial chunk: the tier had no room it may take (counted by the store).
          if (e instanceof CopyDeclinedError) log.debug(`request ${req.requestId}: chunk ${c.key} not kept: ${e.message}`);
          else {
            m.cacheStoreFailures.inc();
            log.warn(`request ${req.requestId}: chunk ${c.key} not stored: ${(e as Error).message}`);
          }
        }
      }
      // Stored in prompt order, the head is the oldest: make it the newest, so this prompt is
      // evicted from its tail (the head keeps serving every prompt that shares it). Chunks
      // admitted evict-first stay at the cold end (LruIndex.touchHeadLast skips them).
      if (canStore) this.store.touchPrefix(spans.map((s) => s.key));
    };
    let sending: Promise<Record<string, unknown> | undefined> = Promise.resolve(undefined);
    if (wantSend) {
      m.xferSentChunks.inc(sealed.length);
      m.xferSentBytes.inc(sealed.reduce((a, c) => a + c.chunk.byteLength, 0));
      const t0 = performance.now();
      // A plugin that throws synchronously is treated like a send that failed.
      sending = Promise.resolve()
        .then(() => this.transfer!.send!(this.transferRequest(req, spans), sealed))
        .then(
          (r) => {
            m.xferSendSeconds.observe({ outcome: 'ok' }, (performance.now() - t0) / 1000);
            // What of it this prefiller reused rather than computed: the decoder reports it as cached.
            return { ...r, [REUSED_TOKENS]: req.loadedTokens ?? 0 };
          },
          (e: unknown) => {
            m.xferSendSeconds.observe({ outcome: 'failed' }, (performance.now() - t0) / 1000);
            log.warn(`request ${req.requestId}: KV transfer failed (${(e as Error).message}); the decoder will compute the prompt`);
            return undefined;
          },
        );
    }
    // The decoder keeps this prompt, or the part of it past kvc_keeper_split (src/protocol/keeper.ts):
    // once it has those chunks, a second copy here would only take room from chunks nobody else
    // holds. A failed transfer leaves the decoder without them, so then they are stored here as usual.
    const decoderKeeps = wantSend ? toStore.filter((c) => keeperAt(req.kvTransferParams, c.start) === 'decoder') : [];
    const storing = decoderKeeps.length
      ? sending.then((params) => {
          if (params === undefined) return store(toStore);
          m.keeperSkippedChunks.inc(decoderKeeps.length);
          const skipped = new Set(decoderKeeps);
          return store(toStore.filter((c) => !skipped.has(c)));
        })
      : store(toStore);
    return Promise.all([storing, sending]).then(([, params]) => params);
  }
}
