// Prometheus metrics of one engine. Each engine owns its registry, so several engines in
// one process (tests, benchmarks) never mix their figures.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

/** Step buckets: fine below 100 ms, where decode steps and their bounds live. */
const STEP_BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5];
const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60];

export class EngineMetrics {
  readonly registry = new Registry();
  readonly requests: Counter<'endpoint' | 'outcome'>;
  readonly promptTokens: Counter;
  readonly generatedTokens: Counter;
  readonly tokensLoaded: Counter;
  readonly tokensLoadedBySource: Counter<'source'>;
  readonly tokensComputed: Counter;
  readonly prefillRequests: Counter;
  readonly chunksSaved: Counter;
  readonly ttft: Histogram;
  readonly itl: Histogram;
  readonly e2e: Histogram;
  readonly stepDuration: Histogram;
  readonly decodeStepInterval: Histogram;
  readonly decodeStepGap: Histogram;
  readonly decodeStepGapCpu: Histogram;
  readonly importSlices: Counter;
  readonly running: Gauge;
  readonly waiting: Gauge;
  readonly kvUsage: Gauge;
  readonly kvBlocks: Gauge<'state'>;

  constructor(labels: { model: string }, processMetrics = false) {
    this.registry.setDefaultLabels({ model_name: labels.model });
    const registers = [this.registry];
    this.requests = new Counter({ name: 'kvc_engine_requests_total', help: 'Requests answered, by endpoint and outcome (ok, error, cancelled, rejected)', labelNames: ['endpoint', 'outcome'], registers });
    this.promptTokens = new Counter({ name: 'kvc_engine_prompt_tokens_total', help: 'Prompt tokens of admitted requests', registers });
    this.generatedTokens = new Counter({ name: 'kvc_engine_generation_tokens_total', help: 'Tokens generated', registers });
    this.tokensLoaded = new Counter({ name: 'kvc_engine_tokens_loaded_total', help: 'Prompt tokens whose KV was loaded (cache or transfer) instead of computed', registers });
    this.tokensLoadedBySource = new Counter({ name: 'kvc_engine_tokens_loaded_by_source_total', help: 'Prompt tokens loaded instead of computed, by source (cache, transfer)', labelNames: ['source'], registers });
    this.tokensComputed = new Counter({ name: 'kvc_engine_prompt_tokens_computed_total', help: 'Prompt tokens computed by prefill', registers });
    this.prefillRequests = new Counter({ name: 'kvc_engine_prefill_requests_total', help: 'Requests whose prefill completed on this engine', registers });
    this.chunksSaved = new Counter({ name: 'kvc_engine_chunks_saved_total', help: 'KV chunks saved into the cache instance after prefill', registers });
    this.ttft = new Histogram({ name: 'kvc_engine_time_to_first_token_seconds', help: 'Time from request arrival to its first generated token', buckets: LATENCY_BUCKETS, registers });
    this.itl = new Histogram({ name: 'kvc_engine_inter_token_latency_seconds', help: 'Time between consecutive generated tokens of a request', buckets: LATENCY_BUCKETS, registers });
    this.e2e = new Histogram({ name: 'kvc_engine_request_latency_seconds', help: 'Time from request arrival to its last token', buckets: LATENCY_BUCKETS, registers });
    this.stepDuration = new Histogram({ name: 'kvc_engine_step_duration_seconds', help: 'Time of one engine step (one model forward over decode rows and prefill chunks)', buckets: STEP_BUCKETS, registers });
    this.decodeStepInterval = new Histogram({
      name: 'kvc_engine_decode_step_interval_seconds',
      help: 'Time between the ends of two consecutive steps that both had decode rows: what a running sequence waits per token, including any work run between the steps (KV imports, transfers, HTTP)',
      buckets: STEP_BUCKETS,
      registers,
    });
    this.decodeStepGap = new Histogram({
      name: 'kvc_engine_decode_step_gap_seconds',
      help: 'Time from the end of a step with decode rows to the start of the next step while sequences are decoding: the work run between decode steps (KV imports, transfers, HTTP), bounded by import slicing',
      buckets: STEP_BUCKETS,
      registers,
    });
    this.decodeStepGapCpu = new Histogram({
      name: 'kvc_engine_decode_step_gap_cpu_seconds',
      help: 'CPU time this process used between the end of a step with decode rows and the start of the next one: the work run between decode steps, without the time other processes held the CPU',
      buckets: STEP_BUCKETS,
      registers,
    });
    this.importSlices = new Counter({ name: 'kvc_engine_kv_import_slices_total', help: 'Slices a KV import (cache or transfer) was cut into, the engine yielding to decode steps between them', registers });
    this.running = new Gauge({ name: 'kvc_engine_num_requests_running', help: 'Sequences holding KV (prefilling or decoding)', registers });
    this.waiting = new Gauge({ name: 'kvc_engine_num_requests_waiting', help: 'Requests queued for admission', registers });
    this.kvUsage = new Gauge({ name: 'kvc_engine_kv_cache_usage_ratio', help: 'Fraction of paged KV blocks in use', registers });
    this.kvBlocks = new Gauge({ name: 'kvc_engine_kv_cache_blocks', help: 'Paged KV blocks, by state (used, total)', labelNames: ['state'], registers });
    if (processMetrics) collectDefaultMetrics({ register: this.registry, prefix: 'kvc_engine_' });
  }
}
