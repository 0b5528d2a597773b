// Prometheus counters of P2P pulls (docs/metrics.md), registered on the engine's /metrics
// registry beside the cache's own counters.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { P2pFailure } from './p2p_fetch.js';
import type { ConnHow } from './p2p_pool.js';

/** How a P2P fetch ended (label `outcome` of kvc_p2p_fetches_total). */
export type P2pOutcome = 'hit' | 'partial' | 'failed' | 'no_holder';

export class P2pMetrics {
  readonly fetches: Counter<'outcome'>;
  readonly chunks: Counter;
  readonly bytes: Counter;
  readonly failures: Counter<'reason'>;
  readonly seconds: Histogram<'outcome'>;
  readonly inFlight: Gauge;
  readonly connections: Counter<'how'>;
  readonly idleConnections: Gauge;

  constructor(registry: Registry) {
    const registers = [registry];
    this.fetches = new Counter({ name: 'kvc_p2p_fetches_total', help: 'P2P fetches after a local miss, by outcome (hit: every chunk a holder named arrived; partial: some did; failed: none did; no_holder: no other instance holds the next chunk)', labelNames: ['outcome'], registers });
    this.chunks = new Counter({ name: 'kvc_p2p_chunks_total', help: 'Chunks received from peers by P2P fetches, verified and promoted into the CPU tier', registers });
    this.bytes = new Counter({ name: 'kvc_p2p_bytes_total', help: 'Bytes of chunks received from peers by P2P fetches', registers });
    this.failures = new Counter({ name: 'kvc_p2p_failures_total', help: 'P2P fetch attempts that ended early, by reason (controller, connect, closed, corrupt, timeout, refused)', labelNames: ['reason'], registers });
    this.seconds = new Histogram({ name: 'kvc_p2p_fetch_seconds', help: 'Time of a P2P fetch from the holder query to the last chunk, by outcome', labelNames: ['outcome'], buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10], registers });
    this.inFlight = new Gauge({ name: 'kvc_p2p_fetches_in_flight', help: 'P2P fetches under way', registers });
    this.connections = new Counter({ name: 'kvc_p2p_connections_total', help: 'Connections P2P fetches started on, by how (new: opened for the fetch; reused: an idle one kept from an earlier fetch to that holder; stale: a kept one found dead when used, the fetch then started again on a new one)', labelNames: ['how'], registers });
    this.idleConnections = new Gauge({ name: 'kvc_p2p_idle_connections', help: 'Connections to holders kept open between P2P fetches', registers });
    for (const h of ['new', 'reused', 'stale'] as const satisfies readonly ConnHow[]) this.connections.inc({ how: h }, 0);
    for (const o of ['hit', 'partial', 'failed', 'no_holder'] as const) this.fetches.inc({ outcome: o }, 0);
    for (const r of ['controller', 'connect', 'closed', 'corrupt', 'timeout', 'refused'] as const satisfies readonly P2pFailure[]) this.failures.inc({ reason: r }, 0);
  }
}
