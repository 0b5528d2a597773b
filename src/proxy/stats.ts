// TTFT statistics of the prefill node: the proxy records, per prefiller, how long the
// prefiller took to answer (its answer is the first token, after the KV transfer) and prints
// every 5 s the number of requests and the average, median and 99th percentile in
// milliseconds. In 1P1D there is one line; in XPYD one line per prefiller.
//
// This is the PREFILL NODE's time, not what a client sees: the end-to-end TTFT (prefill +
// decoder start + first streamed token) is the proxy's `kvc_proxy_ttft_seconds`
// metric. Every line says which time it is.
//
// Each line starts with its timestamp, covers the requests finished since the previous print
// (so it reflects current load) and also gives the running total. A node with no request in the
// interval prints nothing, so an idle proxy is quiet. Requests that found no prefiller get their
// own "decoder-only" line, recorded with the decoder's time to its first token (flow.ts).
// The lines are printed to stdout by the server, whatever KVC_LOG_LEVEL says.

export interface Summary {
  count: number;
  avg: number;
  median: number;
  p99: number;
}

/** Nearest-rank percentile of an ascending array (q in 0..100). */
export function percentile(sorted: number[], q: number): number {
  if (sorted.length === 0) return NaN;
  const rank = Math.ceil((q / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))]!;
}

export function summarize(samples: number[]): Summary {
  if (samples.length === 0) return { count: 0, avg: NaN, median: NaN, p99: NaN };
  const s = [...samples].sort((a, b) => a - b);
  const avg = s.reduce((a, b) => a + b, 0) / s.length;
  const mid = s.length >> 1;
  const median = s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
  return { count: s.length, avg, median, p99: percentile(s, 99) };
}

const ms = (v: number) => (Number.isNaN(v) ? '-' : v.toFixed(1));

export class TtftStats {
  private window = new Map<string, number[]>();
  private totals = new Map<string, number>();

  /** `nodes` are the prefillers, listed from the start; other names ("decoder-only") appear when first recorded. */
  constructor(readonly nodes: string[]) {
    for (const n of nodes) {
      this.window.set(n, []);
      this.totals.set(n, 0);
    }
  }

  record(node: string, ttftMs: number): void {
    if (!this.window.has(node)) {
      this.window.set(node, []);
      this.totals.set(node, 0);
    }
    this.window.get(node)!.push(ttftMs);
    this.totals.set(node, this.totals.get(node)! + 1);
  }

  /**
   * The stats lines for the interval since the last call, stamped `now`; empties the window.
   * Nodes without a request in the interval give no line (an idle proxy prints nothing).
   */
  flush(intervalS: number, now: Date = new Date()): string[] {
    const lines: string[] = [];
    for (const [node, samples] of this.window) {
      if (samples.length === 0) continue;
      const s = summarize(samples);
      lines.push(`${now.toISOString()} ${formatStatsLine(node, s, this.totals.get(node)!, intervalS)}`);
      samples.length = 0;
    }
    return lines;
  }
}

/** Which time a node's line measures: the prefiller's own answer, or the decoder's first token. */
export function ttftBasis(node: string): string {
  if (node === 'decoder-only') return "decoder's time to first token; no prefiller was available, the decoder prefilled";
  if (node === 'decoder-local') return "decoder's time to first token; routed to prefill on the decoder, no KV transfer";
  return "prefill node's time, KV transfer included; end-to-end TTFT is in /metrics";
}

export function formatStatsLine(node: string, s: Summary, total: number, intervalS: number): string {
  return (
    `TTFT ${node}: ${s.count} requests in last ${intervalS}s (total ${total}), ` +
    `avg ${ms(s.avg)} ms, median ${ms(s.median)} ms, p99 ${ms(s.p99)} ms (${ttftBasis(node)})`
  );
}
