// Prometheus metrics of one engine (GET /metrics), listed in docs/metrics.md. Each engine owns
// its registry, so several engines in one process (tests, benchmarks) never mix their figures.
//
// Three families: `kvc_engine_*` (requests, tokens, latencies, scheduler), `kvc_cache_*` (the
// engine's cache instance: lookups, hits, bytes and time read and written, bytes per tier,
// evictions) and `kvc_xfer_*` (KV sent to / received from other engines, measured at the
// engine's transfer seam). Durations are histograms in seconds, sizes are bytes, and what
// only grows is a counter.
import { registerRefusalCounter } from '../common/replay.js';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { MissReason, ReasonCounts } from '../protocol/ledger.js';
import type { EngineSample } from '../protocol/instance_stats.js';
import { HotHistogram, type HistogramSeries } from '../common/hot_histogram.js';
import { LmcacheMetrics, VllmMetrics } from './compat_metrics.js';

/** Step buckets: fine below 100 ms, where decode steps and their bounds live. */
const STEP_BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5];
/** Finer below 50 ms: a p99 read from them (the burst bench) compares intervals of a few ms. */
const INTERVAL_CPU_BUCKETS = [0.001, 0.002, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5];
// Up to 20 minutes: a long prompt on a CPU engine can take minutes, and must land in a bucket.
const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600, 1200];
/** Store/read of one chunk or one request's chunks: from a memory copy to a slow disk. */
const IO_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/** What the cache gauges read at scrape time (the engine's KvcStore.stats()). */
export interface TierStats {
  location: string;
  capacityBytes: number;
  usedBytes: number;
  chunks: number;
  pinned: number;
  cold: number;
  replicas: number;
}

/** The cache instance as the metrics see it (KvcStore): usage per location and evictions so far. */
export interface WatchedStore {
  stats(): TierStats[];
  readonly evictions: Readonly<Partial<Record<string, number>>>;
  readonly declined: Readonly<Partial<Record<string, number>>>;
}

export const STEP_PHASES = ['prefill', 'decode', 'mixed'] as const;
export type StepPhase = (typeof STEP_PHASES)[number];

export class EngineMetrics {
  readonly registry = new Registry();
  // requests and tokens
  readonly requests: Counter<'endpoint' | 'outcome'>;
  readonly promptTokens: Counter;
  readonly generatedTokens: Counter;
  readonly tokensLoaded: Counter;
  readonly tokensLoadedBySource: Counter<'source'>;
  readonly tokensComputed: Counter;
  readonly prefillRequests: Counter;
  readonly chunksSaved: Counter;
  readonly keeperSkippedChunks: Counter;
  // Histograms observed per token or per step are HotHistograms (common/hot_histogram.ts).
  readonly ttft: HotHistogram;
  readonly itl: HotHistogram;
  readonly e2e: HotHistogram;
  // scheduler
  readonly decodeStepInterval: HotHistogram;
  readonly decodeStepGap: HotHistogram;
  readonly decodeStepGapCpu: HotHistogram;
  readonly decodeStepIntervalCpu: HotHistogram;
  readonly importSlices: Counter;
  readonly running: Gauge;
  readonly waiting: Gauge;
  readonly kvUsage: Gauge;
  readonly kvBlocks: Gauge<'state'>;
  readonly kvResidentBytes: Gauge;
  /** Step time and tokens per phase: one series each for prefill, decode and mixed steps. */
  readonly stepSeconds: Record<StepPhase, HistogramSeries>;
  readonly stepTokens: Record<StepPhase, HistogramSeries>;
  // cache instance
  readonly cacheQueryTokens: Counter;
  readonly cacheHitTokens: Counter;
  /** The hit-rate ledger (docs/ledger.md): computed prompt chunks by reason. */
  readonly computedChunks: Counter<'reason'>;
  readonly cacheRetrievedChunks: Counter;
  readonly cacheRetrievedBytes: Counter;
  readonly cacheRetrieveSeconds: Histogram;
  readonly cacheStoredBytes: Counter;
  readonly cacheStoreSeconds: Histogram;
  readonly cacheStoreFailures: Counter;
  readonly cacheEvictedChunks: Counter<'location'>;
  // transfer
  readonly xferSentChunks: Counter;
  readonly xferSentBytes: Counter;
  readonly xferSendSeconds: Histogram<'outcome'>;
  readonly xferReceivedChunks: Counter;
  readonly xferReceivedBytes: Counter;
  readonly xferReceiveWaitSeconds: Histogram<'outcome'>;

  /** The same figures under vLLM's and LMCache's names (compat_metrics.ts). */
  readonly vllm: VllmMetrics;
  readonly lmcache: LmcacheMetrics;

  private store: WatchedStore | null = null;

  constructor(labels: { model: string }, processMetrics = false) {
    this.registry.setDefaultLabels({ model_name: labels.model });
    const registers = [this.registry];
    registerRefusalCounter(this.registry);
    this.requests = new Counter({ name: 'kvc_engine_requests_total', help: 'Requests answered, by endpoint and outcome (ok, error, cancelled, rejected)', labelNames: ['endpoint', 'outcome'], registers });
    this.promptTokens = new Counter({ name: 'kvc_engine_prompt_tokens_total', help: 'Prompt tokens of admitted requests', registers });
    this.generatedTokens = new Counter({ name: 'kvc_engine_generation_tokens_total', help: 'Tokens generated', registers });
    this.tokensLoaded = new Counter({ name: 'kvc_engine_tokens_loaded_total', help: 'Prompt tokens whose KV was loaded (cache or transfer) instead of computed', registers });
    this.tokensLoadedBySource = new Counter({ name: 'kvc_engine_tokens_loaded_by_source_total', help: 'Prompt tokens loaded instead of computed, by source (cache, transfer)', labelNames: ['source'], registers });
    this.tokensComputed = new Counter({ name: 'kvc_engine_prompt_tokens_computed_total', help: 'Prompt tokens computed by prefill', registers });
    this.prefillRequests = new Counter({ name: 'kvc_engine_prefill_requests_total', help: 'Requests whose prefill completed on this engine', registers });
    this.chunksSaved = new Counter({ name: 'kvc_engine_chunks_saved_total', help: 'KV chunks saved into the cache instance after prefill', registers });
    this.keeperSkippedChunks = new Counter({ name: 'kvc_engine_keeper_skipped_chunks_total', help: 'Chunks a prefiller computed, sent and did not store because the proxy named the decoder their keeper (kvc_keeper)', registers });
    this.ttft = new HotHistogram({ name: 'kvc_engine_time_to_first_token_seconds', help: 'Time from request arrival to its first generated token', buckets: LATENCY_BUCKETS, registers });
    this.itl = new HotHistogram({ name: 'kvc_engine_inter_token_latency_seconds', help: 'Time between consecutive generated tokens of a request', buckets: LATENCY_BUCKETS, registers });
    this.e2e = new HotHistogram({ name: 'kvc_engine_request_latency_seconds', help: 'Time from request arrival to its last token', buckets: LATENCY_BUCKETS, registers });
    this.decodeStepInterval = new HotHistogram({
      name: 'kvc_engine_decode_step_interval_seconds',
      help: 'Time between the ends of two consecutive steps that both had decode rows: what a running sequence waits per token, including any work run between the steps (KV imports, transfers, HTTP)',
      buckets: STEP_BUCKETS,
      registers,
    });
    this.decodeStepGap = new HotHistogram({
      name: 'kvc_engine_decode_step_gap_seconds',
      help: 'Time from the end of a step with decode rows to the start of the next step while sequences are decoding: the work run between decode steps (KV imports, transfers, HTTP), bounded by import slicing',
      buckets: STEP_BUCKETS,
      registers,
    });
    this.decodeStepGapCpu = new HotHistogram({
      name: 'kvc_engine_decode_step_gap_cpu_seconds',
      help: 'CPU time the scheduler\'s thread used between the end of a step with decode rows and the start of the next one: the work run between decode steps, without the time other processes held the CPU or other threads of this process used (Linux; elsewhere the whole process)',
      buckets: STEP_BUCKETS,
      registers,
    });
    this.decodeStepIntervalCpu = new HotHistogram({
      name: 'kvc_engine_decode_step_interval_cpu_seconds',
      help: "The decode step interval in the CPU time of the scheduler's thread (the step itself plus the work run before it): what a decoding sequence waits per token on this engine's own work, without the time other processes held the CPU (Linux; elsewhere the whole process)",
      buckets: INTERVAL_CPU_BUCKETS,
      registers,
    });
    this.importSlices = new Counter({ name: 'kvc_engine_kv_import_slices_total', help: 'Slices a KV import (cache or transfer) was cut into, the engine yielding to decode steps between them', registers });

    this.running = new Gauge({ name: 'kvc_engine_num_requests_running', help: 'Sequences holding KV (prefilling or decoding)', registers });
    this.waiting = new Gauge({ name: 'kvc_engine_num_requests_waiting', help: 'Requests queued for admission', registers });
    this.kvUsage = new Gauge({ name: 'kvc_engine_kv_cache_usage_ratio', help: 'Fraction of paged KV blocks in use', registers });
    this.kvBlocks = new Gauge({ name: 'kvc_engine_kv_cache_blocks', help: 'Paged KV blocks, by state (used, total)', labelNames: ['state'], registers });
    this.kvResidentBytes = new Gauge({ name: 'kvc_engine_kv_cache_resident_bytes', help: 'Bytes of the paged KV pool touched so far: its pages are resident from first use and kept (the most blocks ever in use at once)', registers });
    const stepSeconds = new HotHistogram({ name: 'kvc_engine_step_duration_seconds', help: 'Time of one scheduler step (one model forward), by phase (prefill, decode, mixed)', labelNames: ['phase'], buckets: LATENCY_BUCKETS, registers });
    const stepTokens = new HotHistogram({ name: 'kvc_engine_step_tokens', help: 'Tokens computed in one scheduler step, by phase', labelNames: ['phase'], buckets: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192], registers });
    // Every phase's series exists from the start, at zero (a scrape before the first decode step
    // shows decode at 0 instead of no line).
    const byPhase = (h: HotHistogram<'phase'>) => Object.fromEntries(STEP_PHASES.map((phase) => [phase, h.series({ phase })])) as Record<StepPhase, HistogramSeries>;
    this.stepSeconds = byPhase(stepSeconds);
    this.stepTokens = byPhase(stepTokens);

    this.cacheQueryTokens = new Counter({ name: 'kvc_cache_query_tokens_total', help: 'Prompt tokens looked up in the cache instance', registers });
    this.computedChunks = new Counter({ name: 'kvc_engine_computed_chunks_total', help: 'Prompt chunks this engine computed, by why they were not reused (cold, evicted, not_fetched, stale_index, mismatch, partial, unexplained; docs/ledger.md)', labelNames: ['reason'], registers });
    this.cacheHitTokens = new Counter({ name: 'kvc_cache_hit_tokens_total', help: 'Prompt tokens whose KV was loaded from the cache instance', registers });
    this.cacheRetrievedChunks = new Counter({ name: 'kvc_cache_retrieved_chunks_total', help: 'Chunks read from the cache instance and used', registers });
    this.cacheRetrievedBytes = new Counter({ name: 'kvc_cache_retrieved_bytes_total', help: 'Bytes of the chunks read from the cache instance (headers included)', registers });
    this.cacheRetrieveSeconds = new Histogram({ name: 'kvc_cache_retrieve_duration_seconds', help: 'Time a request spent reading its chunks from the cache instance (requests that read at least one)', buckets: IO_BUCKETS, registers });
    this.cacheStoredBytes = new Counter({ name: 'kvc_cache_stored_bytes_total', help: 'Bytes of the chunks stored into the cache instance (headers included)', registers });
    this.cacheStoreSeconds = new Histogram({ name: 'kvc_cache_store_duration_seconds', help: 'Time to store one chunk into the cache instance (every tier it is written to)', buckets: IO_BUCKETS, registers });
    this.cacheStoreFailures = new Counter({ name: 'kvc_cache_store_failures_total', help: 'Chunks that could not be stored (e.g. every remaining chunk pinned)', registers });
    // The store counts evictions and declined copies itself (every put may evict or decline);
    // each counter adds what is new at each scrape, which keeps it monotonic without a call per
    // chunk.
    const watched = () => this.store;
    const storeCounter = (name: string, help: string, read: (st: WatchedStore) => Readonly<Partial<Record<string, number>>>) => {
      const seen = new Map<string, number>();
      return new Counter({
        name,
        help,
        labelNames: ['location'],
        registers,
        collect() {
          const st = watched();
          if (!st) return;
          const counts = read(st);
          for (const t of st.stats()) {
            const n = counts[t.location] ?? 0;
            const before = seen.get(t.location) ?? 0;
            this.inc({ location: t.location }, Math.max(0, n - before));
            seen.set(t.location, Math.max(n, before));
          }
        },
      });
    };
    this.cacheEvictedChunks = storeCounter('kvc_cache_evicted_chunks_total', 'Chunks that left a location of the cache instance to make room, by location', (st) => st.evictions);
    storeCounter(
      'kvc_cache_declined_copies_total',
      'Evict-first chunks (copies a peer keeps, partial chunks) not admitted to a location because the room they needed was held by chunks they may not displace, by location',
      (st) => st.declined,
    );
    const tiers = () => this.store?.stats() ?? [];
    const tierGauge = (name: string, help: string, read: (t: TierStats) => number) =>
      new Gauge({ name, help, labelNames: ['location'], registers, collect() { for (const t of tiers()) this.set({ location: t.location }, read(t)); } });
    tierGauge('kvc_cache_bytes', 'Bytes stored per location of the cache instance (headers included)', (t) => t.usedBytes);
    tierGauge('kvc_cache_capacity_bytes', 'Capacity per location of the cache instance', (t) => t.capacityBytes);
    tierGauge('kvc_cache_chunks', 'Chunks stored per location of the cache instance', (t) => t.chunks);
    tierGauge('kvc_cache_pinned_chunks', 'Pinned chunks per location of the cache instance', (t) => t.pinned);
    // The eviction order's segments (docs/storage.md): what a tier holds as copies it may lose
    // first, against the chunks it keeps (kvc_cache_chunks minus both).
    tierGauge('kvc_cache_cold_chunks', 'Chunks per location admitted evict-first and not read since (evicted first)', (t) => t.cold);
    tierGauge('kvc_cache_replica_chunks', 'Chunks per location that the controller says another instance keeps first (evicted after the cold ones)', (t) => t.replicas);

    this.xferSentChunks = new Counter({ name: 'kvc_xfer_sent_chunks_total', help: 'Chunks handed to the transfer library to send to a decoder (kv_producer)', registers });
    this.xferSentBytes = new Counter({ name: 'kvc_xfer_sent_bytes_total', help: 'Bytes of the chunks handed to the transfer library (headers included)', registers });
    this.xferSendSeconds = new Histogram({ name: 'kvc_xfer_send_duration_seconds', help: 'Time from handing a request\'s chunks to the transfer library until it reported them delivered, by outcome (ok, failed)', labelNames: ['outcome'], buckets: LATENCY_BUCKETS, registers });
    this.xferReceivedChunks = new Counter({ name: 'kvc_xfer_received_chunks_total', help: 'Received chunks imported instead of computed (kv_consumer)', registers });
    this.xferReceivedBytes = new Counter({ name: 'kvc_xfer_received_bytes_total', help: 'Bytes of the received chunks imported (headers included)', registers });
    this.xferReceiveWaitSeconds = new Histogram({ name: 'kvc_xfer_receive_wait_seconds', help: 'Time a request waited for the transfer library\'s answer before prefill, by outcome (received, none, failed)', labelNames: ['outcome'], buckets: LATENCY_BUCKETS, registers });
    const sources = {
      promptTokens: this.promptTokens,
      generatedTokens: this.generatedTokens,
      running: this.running,
      waiting: this.waiting,
      kvUsage: this.kvUsage,
      cacheQueryTokens: this.cacheQueryTokens,
      cacheHitTokens: this.cacheHitTokens,
      tierBytes: (location: string) => this.store?.stats().find((t) => t.location === location)?.usedBytes ?? 0,
      cacheEvictedChunks: this.cacheEvictedChunks,
    };
    this.vllm = new VllmMetrics(this.registry, sources);
    this.lmcache = new LmcacheMetrics(this.registry, sources);
    if (processMetrics) collectDefaultMetrics({ register: this.registry, prefix: 'kvc_engine_' });
  }

  /** Makes the per-location cache gauges and the eviction counter read `store` at each scrape. */
  watchStore(store: WatchedStore): void {
    this.store = store;
  }

  /**
   * The figures an engine reports to the controller with each heartbeat (and its periodic log
   * line reads): read from the same metric objects /metrics exports.
   */
  async sample(): Promise<EngineSample> {
    const total = async (m: Counter | Gauge, labels?: Record<string, string>) => {
      const v = (await m.get()).values;
      return v.filter((x) => !labels || Object.entries(labels).every(([k, want]) => x.labels[k] === want)).reduce((a, x) => a + x.value, 0);
    };
    const h = (await this.ttft.get()).values;
    return {
      prompt_tokens: await total(this.promptTokens),
      query_tokens: await total(this.cacheQueryTokens),
      cached_tokens: await total(this.cacheHitTokens),
      transferred_tokens: await total(this.tokensLoadedBySource, { source: 'transfer' }),
      generation_tokens: await total(this.generatedTokens),
      ttft_sum_seconds: h.find((x) => x.metricName?.endsWith('_sum'))?.value ?? 0,
      ttft_count: h.find((x) => x.metricName?.endsWith('_count'))?.value ?? 0,
      requests_running: await total(this.running),
      requests_waiting: await total(this.waiting),
      kv_usage_ratio: await total(this.kvUsage),
      computed_chunks: await this.computedByReason(),
    };
  }

  /** kvc_engine_computed_chunks_total by reason (the ledger's counters; reasons with none left out). */
  async computedByReason(): Promise<ReasonCounts> {
    const out: ReasonCounts = {};
    for (const v of (await this.computedChunks.get()).values) {
      const r = v.labels.reason as MissReason;
      if (v.value > 0) out[r] = (out[r] ?? 0) + v.value;
    }
    return out;
  }
}
