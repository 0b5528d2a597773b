// The engine's metrics under the names dashboards already query (docs/metrics.md "vLLM and
// LMCache names"): `vllm:*` as vLLM's OpenAI server exports them, with vLLM's bucket bounds, and
// `lmcache:*` as LMCache's Prometheus logger does. They are views of the engine's own figures:
// counters and gauges read the `kvc_*` metric they mirror at scrape time (one source, never two
// counts of the same thing); the per-request histograms that have no `kvc_*` twin are observed by
// the scheduler at the same points. The `kvc_*` names stay.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { HotHistogram } from '../common/hot_histogram.js';

// vLLM's bounds (vllm/v1/metrics/loggers.py): latencies reach 2,560 s (TTFT) and 7,680 s
// (request phases), so a CPU request of minutes is still in a bucket, not only in +Inf.
const VLLM_TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560];
const VLLM_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];
const VLLM_REQUEST_BUCKETS = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680];
// LMCache's bounds for its retrieve time.
const LMCACHE_TIME_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10];

/** vLLM's finish reasons of vllm:request_success_total (kvc's FinishReason values are the same words). */
export const FINISH_REASONS = ['stop', 'length', 'abort', 'error'] as const;

/** The sum of a metric's current values (every label set, or those matching `labels`). */
async function total(m: Counter | Gauge, labels?: Record<string, string>): Promise<number> {
  const v = (await m.get()).values;
  return v.filter((x) => !labels || Object.entries(labels).every(([k, want]) => x.labels[k] === want)).reduce((a, x) => a + x.value, 0);
}

/** A counter that shows `source`'s total (optionally of some labels): it adds what is new at each scrape. */
function mirrorCounter(registry: Registry, name: string, help: string, source: Counter, labels?: Record<string, string>): Counter {
  let seen = 0;
  return new Counter({
    name,
    help,
    registers: [registry],
    async collect() {
      const now = await total(source, labels);
      if (now > seen) this.inc(now - seen);
      seen = Math.max(seen, now);
    },
  });
}

/** A gauge that shows `read()` at each scrape. */
function mirrorGauge(registry: Registry, name: string, help: string, read: () => number | Promise<number>): Gauge {
  return new Gauge({
    name,
    help,
    registers: [registry],
    async collect() {
      this.set(await read());
    },
  });
}

/** The kvc metrics the compatible names are views of. */
export interface CompatSources {
  promptTokens: Counter;
  generatedTokens: Counter;
  running: Gauge;
  waiting: Gauge;
  kvUsage: Gauge;
  cacheQueryTokens: Counter;
  cacheHitTokens: Counter;
  /** Bytes per location of the cache instance (kvc_cache_bytes{location}). */
  tierBytes: (location: string) => number;
  cacheEvictedChunks: Counter<'location'>;
}

export class VllmMetrics {
  readonly ttft: HotHistogram;
  readonly itl: HotHistogram;
  readonly e2e: HotHistogram;
  readonly queue: HotHistogram;
  readonly prefill: HotHistogram;
  readonly decode: HotHistogram;
  readonly inference: HotHistogram;
  readonly success: Counter<'finished_reason'>;

  constructor(registry: Registry, s: CompatSources) {
    const registers = [registry];
    mirrorGauge(registry, 'vllm:num_requests_running', 'Requests holding KV, prefilling or decoding (kvc_engine_num_requests_running)', () => total(s.running));
    mirrorGauge(registry, 'vllm:num_requests_waiting', 'Requests waiting for admission (kvc_engine_num_requests_waiting)', () => total(s.waiting));
    mirrorGauge(registry, 'vllm:kv_cache_usage_perc', 'Fraction of the paged KV in use, 1 = 100% (kvc_engine_kv_cache_usage_ratio)', () => total(s.kvUsage));
    mirrorCounter(registry, 'vllm:prompt_tokens_total', 'Prompt tokens of admitted requests (kvc_engine_prompt_tokens_total)', s.promptTokens);
    mirrorCounter(registry, 'vllm:generation_tokens_total', 'Tokens generated (kvc_engine_generation_tokens_total)', s.generatedTokens);
    // The engine's prefix cache is its cache instance (it keeps no KV of finished requests itself).
    mirrorCounter(registry, 'vllm:prefix_cache_queries_total', 'Prompt tokens looked up in the prefix cache, the cache instance (kvc_cache_query_tokens_total)', s.cacheQueryTokens);
    mirrorCounter(registry, 'vllm:prefix_cache_hits_total', 'Prompt tokens found in the prefix cache, the cache instance (kvc_cache_hit_tokens_total)', s.cacheHitTokens);
    this.success = new Counter({ name: 'vllm:request_success_total', help: 'Requests finished, by finish reason (stop, length, abort, error)', labelNames: ['finished_reason'], registers });
    for (const r of FINISH_REASONS) this.success.inc({ finished_reason: r }, 0);
    const hist = (name: string, help: string, buckets: number[]) => new HotHistogram({ name, help, buckets, registers });
    this.ttft = hist('vllm:time_to_first_token_seconds', 'Time from request arrival to its first generated token', VLLM_TTFT_BUCKETS);
    this.itl = hist('vllm:inter_token_latency_seconds', 'Time between consecutive generated tokens of a request', VLLM_ITL_BUCKETS);
    this.e2e = hist('vllm:e2e_request_latency_seconds', 'Time from request arrival to its end (requests that generated a token)', VLLM_REQUEST_BUCKETS);
    this.queue = hist('vllm:request_queue_time_seconds', 'Time a request waited for admission (arrival to admission)', VLLM_REQUEST_BUCKETS);
    this.prefill = hist('vllm:request_prefill_time_seconds', 'Time from admission to the first token (KV loading and prompt computation)', VLLM_REQUEST_BUCKETS);
    this.decode = hist('vllm:request_decode_time_seconds', 'Time from the first token to the last', VLLM_REQUEST_BUCKETS);
    this.inference = hist('vllm:request_inference_time_seconds', 'Time from admission to the last token (prefill and decode)', VLLM_REQUEST_BUCKETS);
  }

  /** One finished sequence's phases (performance.now() times, ms; 0 = never reached). */
  finished(reason: string, t: { arrival: number; admitted: number; firstToken: number; lastToken: number; now: number }): void {
    this.success.inc({ finished_reason: reason });
    if (t.admitted) this.queue.observe((t.admitted - t.arrival) / 1000);
    if (!t.firstToken) return;
    this.e2e.observe((t.now - t.arrival) / 1000);
    if (t.admitted) {
      this.prefill.observe((t.firstToken - t.admitted) / 1000);
      this.inference.observe((t.lastToken - t.admitted) / 1000);
    }
    this.decode.observe((t.lastToken - t.firstToken) / 1000);
  }
}

export class LmcacheMetrics {
  readonly retrieveRequests: Counter;
  readonly storeRequests: Counter;
  readonly storedTokens: Counter;
  readonly timeToRetrieve: Histogram;

  constructor(registry: Registry, s: CompatSources) {
    const registers = [registry];
    this.retrieveRequests = new Counter({ name: 'lmcache:num_retrieve_requests_total', help: 'Requests that looked their prompt up in the cache instance', registers });
    this.storeRequests = new Counter({ name: 'lmcache:num_store_requests_total', help: 'Requests whose prompt chunks were stored into the cache instance', registers });
    this.storedTokens = new Counter({ name: 'lmcache:num_stored_tokens_total', help: 'Tokens of the chunks stored into the cache instance', registers });
    mirrorCounter(registry, 'lmcache:num_requested_tokens_total', 'Prompt tokens looked up in the cache instance (kvc_cache_query_tokens_total)', s.cacheQueryTokens);
    mirrorCounter(registry, 'lmcache:num_hit_tokens_total', 'Prompt tokens loaded from the cache instance (kvc_cache_hit_tokens_total)', s.cacheHitTokens);
    mirrorCounter(registry, 'lmcache:num_prompt_tokens_total', 'Prompt tokens of admitted requests (kvc_engine_prompt_tokens_total)', s.promptTokens);
    mirrorCounter(registry, 'lmcache:local_cpu_evict_keys_count_total', 'Chunks evicted from LocalCPUBackend (kvc_cache_evicted_chunks_total{location="LocalCPUBackend"})', s.cacheEvictedChunks as Counter, { location: 'LocalCPUBackend' });
    mirrorGauge(registry, 'lmcache:local_cache_usage', 'Bytes in LocalCPUBackend (kvc_cache_bytes{location="LocalCPUBackend"})', () => s.tierBytes('LocalCPUBackend'));
    mirrorGauge(registry, 'lmcache:local_storage_usage', 'Bytes in LocalDiskBackend (kvc_cache_bytes{location="LocalDiskBackend"})', () => s.tierBytes('LocalDiskBackend'));
    this.timeToRetrieve = new Histogram({ name: 'lmcache:time_to_retrieve', help: 'Time a request spent reading its chunks from the cache instance, seconds', buckets: LMCACHE_TIME_BUCKETS, registers });
  }
}
