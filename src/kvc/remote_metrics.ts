// Prometheus view of the remote tier's counters (kvc_remote_*), added to the registry of the
// process that owns the store (the engine's /metrics). The tier keeps plain numbers, so the
// store works without prom-client; these collectors read them at scrape time.
import { Counter, Gauge, type Registry } from 'prom-client';
import type { RemoteStats, RemoteTier } from './remote_tier.js';

type Numeric = { [K in keyof RemoteStats]: RemoteStats[K] extends number ? K : never }[keyof RemoteStats];

/** A counter whose value is the tier's running total, read at scrape time. */
function total(registry: Registry, tier: RemoteTier, name: string, help: string, labelName: string | null, series: [string | null, Numeric][]): void {
  new Counter({
    name,
    help,
    labelNames: labelName ? [labelName] : [],
    registers: [registry],
    collect() {
      const s = tier.stats();
      this.reset();
      for (const [label, field] of series) {
        if (label && labelName) this.inc({ [labelName]: label }, s[field]);
        else this.inc(s[field]);
      }
    },
  });
}

export function registerRemoteMetrics(registry: Registry, tier: RemoteTier): void {
  total(registry, tier, 'kvc_remote_puts_total', 'Chunks handed to the remote tier, by outcome (written, dropped_queue_full, dropped_unavailable, skipped_known, error)', 'outcome', [
    ['written', 'putsWritten'],
    ['dropped_queue_full', 'putsDroppedQueueFull'],
    ['dropped_unavailable', 'putsDroppedUnavailable'],
    ['skipped_known', 'putsSkippedKnown'],
    ['error', 'putErrors'],
  ]);
  total(registry, tier, 'kvc_remote_gets_total', 'Chunk reads from the remote tier, by outcome (hit, miss, error, corrupt, skipped)', 'outcome', [
    ['hit', 'hits'],
    ['miss', 'misses'],
    ['error', 'getErrors'],
    ['corrupt', 'corrupt'],
    ['skipped', 'getsSkipped'],
  ]);
  total(registry, tier, 'kvc_remote_bytes_total', 'Chunk bytes moved to and from the remote tier, by direction (put, get)', 'direction', [
    ['put', 'putBytes'],
    ['get', 'getBytes'],
  ]);
  total(registry, tier, 'kvc_remote_reconnects_total', 'Times the remote tier client reconnected', null, [[null, 'reconnects']]);
  total(registry, tier, 'kvc_remote_connection_errors_total', 'Connection errors of the remote tier client', null, [[null, 'connectionErrors']]);
  new Gauge({
    name: 'kvc_remote_connected',
    help: '1 while the remote tier client is connected, else 0',
    registers: [registry],
    collect() {
      this.set(tier.connected ? 1 : 0);
    },
  });
  new Gauge({
    name: 'kvc_remote_write_queue_bytes',
    help: 'Bytes of chunks queued or in flight to the remote tier',
    registers: [registry],
    collect() {
      this.set(tier.stats().queueBytes);
    },
  });
}
