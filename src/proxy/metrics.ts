// Prometheus metrics of the proxy (GET /metrics). The end-to-end TTFT is the time from the
// client's request arriving to the first token written back to it (the first SSE event that
// carries text, not a role-only chat chunk; the whole body for a non-streamed request); the
// prefill time is the prefiller's answer.
import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import { HotHistogram } from '../common/hot_histogram.js';
import { registerRefusalCounter } from '../common/replay.js';

// The three latency histograms are observed on every request: HotHistograms
// (common/hot_histogram.ts), exported in prom-client's format through this registry.
const latencyBuckets = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];

export class ProxyMetrics {
  readonly registry = new Registry();
  readonly requests = new Counter({
    name: 'kvc_proxy_requests_total',
    help: 'Client requests by endpoint and HTTP status',
    labelNames: ['endpoint', 'status'] as const,
    registers: [this.registry],
  });
  readonly ttft = new HotHistogram({
    name: 'kvc_proxy_ttft_seconds',
    help: 'End-to-end time to first token as the client received it, of streamed requests (a non-streamed answer arrives whole)',
    labelNames: ['endpoint'] as const,
    buckets: latencyBuckets,
    registers: [this.registry],
  });
  readonly e2e = new HotHistogram({
    name: 'kvc_proxy_request_duration_seconds',
    help: 'End-to-end request duration',
    labelNames: ['endpoint'] as const,
    buckets: latencyBuckets,
    registers: [this.registry],
  });
  readonly prefill = new HotHistogram({
    name: 'kvc_proxy_prefill_seconds',
    help: 'Prefill-node TTFT: time until the prefiller answered (KV transferred)',
    labelNames: ['prefiller'] as const,
    buckets: latencyBuckets,
    registers: [this.registry],
  });
  readonly prefillFailures = new Counter({
    name: 'kvc_proxy_prefill_failures_total',
    help: 'Prefiller calls that failed (refused, 5xx, timed out) and were retried elsewhere',
    labelNames: ['prefiller'] as const,
    registers: [this.registry],
  });
  readonly xferReleases = new Counter({
    name: 'kvc_proxy_xfer_releases_total',
    help: 'Transfers a disaggregated request ended without using (client gone, failed, sent to another decoder), released on their decoder, by result: released, taken (its decode holds it), none (nothing held yet; a later transfer is refused), failed (the decoder did not answer)',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });
  /**
   * Live counts behind the two in-flight gauges, kept as plain numbers on the request path and
   * copied into the gauges when /metrics is scraped.
   */
  readonly live = { requests: 0, prefills: new Map<string, number>() };
  readonly prefillInFlight = new Gauge({
    name: 'kvc_proxy_prefill_in_flight',
    help: 'Prefill calls waiting on each prefiller',
    labelNames: ['prefiller'] as const,
    registers: [this.registry],
    collect: () => {
      for (const [name, n] of this.live.prefills) this.prefillInFlight.labels(name).set(n);
    },
  });
  readonly decoderOnly = new Counter({
    name: 'kvc_proxy_decoder_only_total',
    help: 'Requests prefilled by the decoder itself because no prefiller was available',
    registers: [this.registry],
  });
  readonly decoderFailures = new Counter({
    name: 'kvc_proxy_decoder_failures_total',
    help: 'Decoder calls that failed (answered 502 to the client)',
    labelNames: ['decoder'] as const,
    registers: [this.registry],
  });
  readonly backendUp = new Gauge({
    name: 'kvc_proxy_backend_up',
    help: '1 when the backend is considered healthy',
    labelNames: ['role', 'backend'] as const,
    registers: [this.registry],
  });
  readonly backendRoom = new Gauge({
    name: 'kvc_proxy_backend_room_free_tokens',
    help: "A backend's CPU tier room as its last /health reported it (kvc_room.free_tokens): who keeps a disaggregated prompt's chunks",
    labelNames: ['backend'] as const,
    registers: [this.registry],
  });
  readonly inFlight = new Gauge({
    name: 'kvc_proxy_requests_in_flight',
    help: 'Client requests being served',
    registers: [this.registry],
    collect: () => {
      this.inFlight.set(this.live.requests);
    },
  });
  readonly cancelled = new Counter({
    name: 'kvc_proxy_client_disconnects_total',
    help: 'Requests whose client disconnected before the end; upstream work was cancelled',
    registers: [this.registry],
  });
  readonly notices = new Counter({
    name: 'kvc_proxy_xfer_notices_total',
    help: 'xfer transfer-done notices received on the notify port',
    labelNames: ['ok'] as const,
    registers: [this.registry],
  });
  readonly transferredTokens = new Counter({
    name: 'kvc_proxy_xfer_tokens_total',
    help: 'Prompt tokens whose KV the prefillers reported transferred',
    registers: [this.registry],
  });
  readonly transferredChunks = new Counter({
    name: 'kvc_proxy_xfer_chunks_total',
    help: 'KV chunks the prefillers reported transferred',
    registers: [this.registry],
  });

  constructor() {
    collectDefaultMetrics({ register: this.registry, prefix: 'kvc_proxy_' });
    registerRefusalCounter(this.registry);
  }
}

/**
 * prom-client's `labels()` validates and hashes its arguments on every call; the proxy's label
 * sets are few and fixed (endpoints, backends, statuses), so each child is looked up once and
 * kept, off the per-request path. One or two label values, looked up in nested maps: no rest
 * array or joined key string is built per call.
 */
export function memoLabels<C>(metric: { labels(...values: string[]): C }): (a: string, b?: string) => C {
  const one = new Map<string, C>();
  const two = new Map<string, Map<string, C>>();
  return (a: string, b?: string) => {
    if (b === undefined) {
      let c = one.get(a);
      if (c === undefined) one.set(a, (c = metric.labels(a)));
      return c;
    }
    let inner = two.get(a);
    if (inner === undefined) two.set(a, (inner = new Map()));
    let c = inner.get(b);
    if (c === undefined) inner.set(b, (c = metric.labels(a, b)));
    return c;
  };
}
