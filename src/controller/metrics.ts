// Prometheus metrics of the controller (GET /metrics), listed in docs/metrics.md.
//
// Types follow what a value is: what only grows is a Counter (Prometheus' rate() then works and
// a restart is recognised as a reset), what goes up and down is a Gauge, durations are
// Histograms in seconds. The registry keeps its own plain-number statistics on the monitor hot
// path (no prom-client call per key); the counters read them at scrape time and add the
// difference, which keeps them monotonic.
import type { FastifyInstance } from 'fastify';
import { Counter, Gauge, Histogram, Registry as PromRegistry, collectDefaultMetrics } from 'prom-client';
import { registerRefusalCounter } from '../common/replay.js';
import type { EventKind, EventRecord } from './events.js';
import type { Operations } from './operations.js';

/** Seconds: from a sub-millisecond lookup to a multi-minute move. */
// 1.5 and 2 ms: the request-path lookups' p99 target is 2 ms (docs/controller.md "Benchmark").
const HTTP_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0015, 0.002, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
const OPERATION_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

export class ControllerMetrics {
  readonly registry = new PromRegistry();
  private readonly operations: Counter<'kind' | 'status'>;
  private readonly operationSeconds: Histogram<'kind' | 'status'>;
  private readonly httpSeconds: Histogram<'method' | 'route' | 'code'>;

  constructor(ops: Operations, processMetrics = false) {
    const registers = [this.registry];
    registerRefusalCounter(this.registry);
    const r = ops.registry;
    const gauge = (name: string, help: string, read: () => number) =>
      new Gauge({ name, help, registers, collect() { this.set(read()); } });
    const counter = (name: string, help: string, read: () => number) => {
      let seen = 0;
      return new Counter({
        name,
        help,
        registers,
        collect() {
          const v = read();
          if (v > seen) this.inc(v - seen);
          seen = v;
        },
      });
    };
    gauge('kvc_controller_instances', 'Registered cache instances', () => r.instances.size);
    gauge('kvc_controller_workers', 'Registered cache workers', () => r.workers().length);
    gauge('kvc_controller_index_keys', 'Distinct chunk keys in the global index', () => r.index.size);
    gauge('kvc_controller_index_copies', 'Copies in the global index: every chunk once per instance location holding it (minus kvc_controller_index_keys: the duplicates)', () => r.index.entries);
    counter('kvc_controller_admitted_keys_total', 'Chunk admissions reported by instances', () => r.stats.admitted);
    counter('kvc_controller_evicted_keys_total', 'Chunk evictions and removals reported by instances', () => r.stats.evicted);
    counter('kvc_controller_synced_keys_total', 'Keys received in full syncs', () => r.stats.synced);
    counter('kvc_controller_registrations_total', 'Worker registrations (including re-registrations)', () => r.stats.registrations);
    counter('kvc_controller_refused_registrations_total', "Registrations refused because the instance's model id, chunk size, hash seed or KV dtype differs from the deployment's", () => r.stats.refusedSettings);
    {
      const seen: Record<string, number> = {};
      new Counter({
        name: 'kvc_controller_miss_reasons_total',
        help: 'Computed chunks the controller named a reason for (the ledger, docs/ledger.md), by reason (cold, evicted, not_fetched, stale_index)',
        labelNames: ['reason'],
        registers,
        collect() {
          for (const [reason, v] of Object.entries(r.stats.missReasons)) {
            this.labels(reason).inc(Math.max(0, v - (seen[reason] ?? 0)));
            seen[reason] = v;
          }
        },
      });
    }
    counter('kvc_controller_reaped_workers_total', 'Workers reaped for missing heartbeats', () => r.stats.reaped);
    counter('kvc_controller_bad_messages_total', 'Malformed monitor messages dropped', () => r.stats.badMessages);
    counter('kvc_controller_replica_hints_held_elsewhere_total', 'Replica hints sent: an instance admitted a chunk another instance holds (it evicts that copy first)', () => r.stats.replicaHeldElsewhere);
    counter('kvc_controller_replica_hints_last_copy_total', 'Replica hints sent: evictions or a worker leaving the index left a chunk on one instance only, or its first copy left and the oldest remaining holder keeps it (that instance evicts it by recency again)', () => r.stats.replicaLastCopy);
    counter('kvc_controller_replica_hints_dropped_total', 'Replica hints dropped because too many waited for one instance', () => r.stats.replicaHintsDropped);
    counter('kvc_controller_p2p_lookups_total', 'P2P holder queries answered (an instance asking who holds the chunks it missed)', () => r.stats.p2pLookups);
    new Gauge({
      name: 'kvc_controller_operations_in_progress',
      help: 'Operations (move, copy, pin, unpin, clear) not yet completed, by status (pending, running)',
      labelNames: ['status'],
      registers,
      collect() {
        this.set({ status: 'pending' }, ops.events.counts.pending);
        this.set({ status: 'running' }, ops.events.counts.running);
      },
    });
    this.operations = new Counter({
      name: 'kvc_controller_operations_total',
      help: 'Completed operations, by kind (move, copy, pin, unpin, clear) and status (finished, failed)',
      labelNames: ['kind', 'status'],
      registers,
    });
    this.operationSeconds = new Histogram({
      name: 'kvc_controller_operation_duration_seconds',
      help: 'Time from an operation\'s creation to its completion, by kind and status',
      labelNames: ['kind', 'status'],
      buckets: OPERATION_BUCKETS,
      registers,
    });
    this.httpSeconds = new Histogram({
      name: 'kvc_controller_http_request_duration_seconds',
      help: 'Time to answer an HTTP request, by method, route and status code',
      labelNames: ['method', 'route', 'code'],
      buckets: HTTP_BUCKETS,
      registers,
    });
    // Start every (kind, status) series at 0 so that rate() sees the first completion.
    for (const kind of ['move', 'copy', 'pin', 'unpin', 'clear'] satisfies EventKind[]) {
      for (const status of ['finished', 'failed']) this.operations.inc({ kind, status }, 0);
    }
    if (processMetrics) collectDefaultMetrics({ register: this.registry, prefix: 'kvc_controller_' });
  }

  /** Called by the event log when an operation finishes or fails. */
  operationCompleted(ev: EventRecord): void {
    this.operations.inc({ kind: ev.kind, status: ev.status });
    if (ev.duration_ms !== null) this.operationSeconds.observe({ kind: ev.kind, status: ev.status }, ev.duration_ms / 1000);
  }

  /** Times every answered request of `app` by its route pattern (not its URL: ids would explode the labels). */
  instrument(app: FastifyInstance): void {
    // A callback hook, not an async one: no promise per request on the lookup path.
    app.addHook('onResponse', (req, reply, done) => {
      const route = req.routeOptions.url ?? 'unmatched';
      this.httpSeconds.observe({ method: req.method, route, code: String(reply.statusCode) }, reply.elapsedTime / 1000);
      done();
    });
  }
}
