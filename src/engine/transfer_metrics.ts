// Prometheus view of the transfer plugin's receive accounting (kv_consumer): how every transfer
// ended and what is still reserved, read from the plugin at scrape time (the transfer contract,
// docs/xfer.md: every transfer ends done, failed or abandoned, and its room is released).
import { Counter, Gauge, type Registry } from 'prom-client';
import type { TransferStats } from '../common/transfer_seam.js';

export function registerTransferMetrics(registry: Registry, stats: () => TransferStats): void {
  const registers = [registry];
  /** A counter whose value per label is read from the plugin at scrape time. */
  const countedBy = <K extends string>(name: string, help: string, label: string, values: readonly K[], read: () => Record<K, number>) =>
    new Counter({
      name,
      help,
      labelNames: [label],
      registers,
      collect() {
        const v = read();
        this.reset();
        for (const k of values) this.inc({ [label]: k }, v[k]);
      },
    });
  countedBy('kvc_xfer_transfers_total', 'Transfers received (one per request reservation), by how they ended (done, failed, abandoned)', 'outcome', ['done', 'failed', 'abandoned'], () => stats().transfers);
  countedBy(
    'kvc_xfer_reservations_ended_total',
    'Reservations freed, by how: taken (its request imported what arrived), released (its request ended without it: client gone, failed, sent elsewhere), expired (no request claimed it within 10 s of its transfer ending, or within the 120 s TTL)',
    'how',
    ['taken', 'released', 'expired'],
    () => stats().reservationsEnded,
  );
  new Gauge({ name: 'kvc_xfer_transfers_in_flight', help: 'Transfers whose reservation was granted and that have not ended yet', registers, collect() { this.set(stats().transfers.inFlight); } });
  new Gauge({ name: 'kvc_xfer_reservations', help: 'Reservations the receiver holds (in flight, or ended and not yet taken by their request)', registers, collect() { this.set(stats().reservations); } });
  new Gauge({ name: 'kvc_xfer_reserved_bytes', help: 'Receive buffer bytes reserved (size-class accounted)', registers, collect() { this.set(stats().reservedBytes); } });
  new Gauge({
    name: 'kvc_xfer_buffer_held_bytes',
    help: 'Memory the receive buffer holds: slots used at least once, in arenas still held (resident until an idle receiver trims them; bounded by about twice xfer_buffer_size)',
    registers,
    collect() {
      this.set(stats().heldBytes);
    },
  });
}
