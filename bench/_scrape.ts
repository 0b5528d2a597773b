// Prometheus text scraping and percentiles shared by the deployment benchmarks (routing, trace).

export async function scrape(url: string): Promise<string> {
  return (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(10_000) })).text();
}

/** Sum of every sample of `name` (any labels) whose label text passes `filter`. */
export function sum(text: string, name: string, filter: (labels: string) => boolean = () => true): number {
  let s = 0;
  for (const l of text.split('\n')) {
    if (!l.startsWith(name)) continue;
    const rest = l.slice(name.length);
    if (rest[0] !== ' ' && rest[0] !== '{') continue;
    const labels = rest[0] === '{' ? rest.slice(1, rest.indexOf('}')) : '';
    if (filter(labels)) s += Number(l.split(' ').pop());
  }
  return s;
}

export const labelValue = (labels: string, name: string): string | null => new RegExp(`${name}="([^"]*)"`).exec(labels)?.[1] ?? null;

/** Samples of `metric` summed by the value of one label. */
export function byLabel(text: string, metric: string, label: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const l of text.split('\n')) {
    if (!l.startsWith(`${metric}{`)) continue;
    const v = labelValue(l.slice(metric.length + 1, l.indexOf('}')), label);
    if (v !== null) out.set(v, (out.get(v) ?? 0) + Number(l.split(' ').pop()));
  }
  return out;
}

/** The q-th percentile (nearest rank) of an ascending list. */
export function pct(sorted: readonly number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((q / 100) * sorted.length) - 1))]!;
}
