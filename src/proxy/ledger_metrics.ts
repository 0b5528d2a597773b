// The hit-rate ledger as the proxy sees it (docs/ledger.md): every engine counts the prompt chunks
// it computed by reason and reports its totals in GET /health (kvc_computed_chunks); the proxy's
// health probes add the differences into kvc_proxy_computed_chunks_total{reason} and the
// statistics line. A total lower than the last one seen means the engine restarted: its new total
// is all new. Figures lag by at most one health interval.
import { Counter, type Registry } from 'prom-client';
import { MISS_REASONS, type MissReason, type ReasonCounts } from '../protocol/ledger.js';

export class LedgerMetrics {
  private readonly chunks: Counter<'reason'>;
  /** The last totals seen per backend name. */
  private readonly last = new Map<string, ReasonCounts>();
  private window: Record<MissReason, number> = LedgerMetrics.zero();
  private readonly totals: Record<MissReason, number> = LedgerMetrics.zero();

  constructor(registry: Registry) {
    this.chunks = new Counter({
      name: 'kvc_proxy_computed_chunks_total',
      help: 'Prompt chunks the engines computed, by why they were not reused (cold, evicted, not_fetched, stale_index, mismatch, partial, unexplained), from their /health (docs/ledger.md)',
      labelNames: ['reason'],
      registers: [registry],
    });
    for (const r of MISS_REASONS) this.chunks.labels(r).inc(0);
  }

  private static zero(): Record<MissReason, number> {
    return Object.fromEntries(MISS_REASONS.map((r) => [r, 0])) as Record<MissReason, number>;
  }

  /** One probe's totals from `backend`. */
  observe(backend: string, totals: ReasonCounts): void {
    const prev = this.last.get(backend) ?? {};
    for (const r of MISS_REASONS) {
      const now = totals[r] ?? 0;
      const was = prev[r] ?? 0;
      const d = now >= was ? now - was : now;
      if (d <= 0) continue;
      this.chunks.labels(r).inc(d);
      this.window[r] += d;
      this.totals[r] += d;
    }
    this.last.set(backend, { ...totals });
  }

  /** The statistics line for the interval since the last call; null when no chunk was computed in it. */
  flushLine(intervalS: number, now: Date = new Date()): string | null {
    const w = this.window;
    this.window = LedgerMetrics.zero();
    const n = MISS_REASONS.reduce((a, r) => a + w[r], 0);
    if (n === 0) return null;
    const all = MISS_REASONS.reduce((a, r) => a + this.totals[r], 0);
    const parts = MISS_REASONS.filter((r) => w[r] > 0).map((r) => `${r} ${w[r]}`).join(', ');
    return `${now.toISOString()} KV misses: ${n} prompt chunks computed in last ${intervalS}s: ${parts}; unexplained ${((100 * w.unexplained) / n).toFixed(1)}% (total ${all}, unexplained ${((100 * this.totals.unexplained) / all).toFixed(1)}%)`;
  }
}
