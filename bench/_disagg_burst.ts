// `npm run bench -- disagg --burst [N@T]`: the burst workload of the disaggregation bench. Streams
// run (short requests, open loop, as in the main bench) while N long prompts arrive within T ms
// (default 6@1000: six 1,500–3,000-token prompts within one second, as a batch job or a
// reconnecting client sends them). Three deployments in one run, each started with `kvc up` at its
// defaults (what the issue measured: round-robin routing, every prompt prefilled on a prefiller):
// 1P1D (--prefillers 1 --decoders 1), 2P2D (--prefillers 2 --decoders 2) and colocated
// (--prefillers 0 --decoders 2). For each: an idle
// window (the streams alone) and a burst window (the same streams, same seed, plus the burst),
// and the ratio of the client-side ITL p99 of the burst window to the idle one. The deployment's
// own view of the burst window (decoder step intervals, event-loop lag, prefills by place) says
// where a stall came from. Plot: bench-results/disagg/burst_itl.svg. Last line:
// {"bench":"disagg-burst","burst":{"n":…,"within_ms":…},"1P1D":{…},"2P2D":{…},"colocated":{…}}
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { writeBarsSvg } from './_plot.js';

/** What the burst mode borrows from bench/disagg.ts (one deployment and window machinery for both). */
export interface BurstParts {
  up(args: string[], logRoot: string): Promise<{ url: string; decoder: string; engines: string[]; stop(): Promise<void> }>;
  warm(url: string): Promise<void>;
  settle(engines: string[]): Promise<void>;
  /** The short requests of a window of `seconds` from `seed` (no long prompts). */
  shortPlan(seconds: number, seed: number): { atMs: number; kind: 'short' | 'long'; prompt: number[]; maxTokens: number }[];
  /** N long prompts (token ids, seeded). */
  longPrompts(n: number, seed: number): number[][];
  longTokens: number;
  window(url: string, plan: { atMs: number; kind: 'short' | 'long'; prompt: number[]; maxTokens: number }[], seconds: number): Promise<{ kind: 'short' | 'long'; ok: boolean; ttftMs: number | null; gaps: { ms: number }[] }[]>;
  pct(xs: number[], p: number): number;
  /** The decoder's own view of a window (metrics text before and after). */
  scrape(url: string): Promise<string>;
}

const WINDOW_S = 12;
/** When the burst starts within its window (s): streams are running by then. */
const BURST_AT_S = 2;
const SEED = 5;
const CONFIGS: [string, string[]][] = [
  ['1P1D', ['--prefillers', '1', '--decoders', '1']],
  ['2P2D', ['--prefillers', '2', '--decoders', '2']],
  ['colocated', ['--prefillers', '0', '--decoders', '2']],
];

/** `N@T` (prompts @ milliseconds), checked: a clear error naming the flag. */
export function parseBurst(arg: string | undefined): { n: number; withinMs: number } {
  if (arg === undefined || arg.startsWith('--')) return { n: 6, withinMs: 1000 };
  const m = /^(\d+)@(\d+)$/.exec(arg);
  const n = Number(m?.[1]);
  const withinMs = Number(m?.[2]);
  if (!m || n < 1 || n > 64 || withinMs > 60_000) throw new Error(`--burst: expected N@T (N long prompts, 1..64, within T ms, 0..60000), e.g. 6@1000; found ${JSON.stringify(arg)}`);
  return { n, withinMs };
}

const r1 = (x: number) => Math.round(x * 10) / 10;

function metricMax(text: string, name: string): number {
  let max = 0;
  for (const m of text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? ([\\d.e+-]+)$`, 'gm'))) max = Math.max(max, Number(m[1]));
  return max;
}

export async function burstBench(parts: BurstParts, burst: { n: number; withinMs: number }, outDir: string, logRoot: string): Promise<void> {
  const shorts = parts.shortPlan(WINDOW_S, SEED);
  const longs = parts.longPrompts(burst.n, SEED).map((prompt, i) => ({
    atMs: BURST_AT_S * 1000 + (burst.n > 1 ? (i * burst.withinMs) / (burst.n - 1) : 0),
    kind: 'long' as const,
    prompt,
    maxTokens: parts.longTokens,
  }));
  const burstPlan = [...shorts, ...longs].sort((a, b) => a.atMs - b.atMs);
  console.log(
    `disagg burst workload: ${shorts.length} short streams over ${WINDOW_S} s (same seeded requests in both windows); burst window adds ${burst.n} long prompts ` +
      `(${longs.map((l) => l.prompt.length).join(', ')} tokens) within ${burst.withinMs} ms from ${BURST_AT_S} s. Configurations at kvc up defaults: ${CONFIGS.map(([n, a]) => `${n} (${a.join(' ')})`).join('; ')}`,
  );
  const out: Record<string, { idle_itl_p99_ms: number; burst_itl_p99_ms: number; ratio: number; burst_itl_max_ms: number; failed: number; long_ttft_p50_ms: number; decoder_lag_max_ms: number }> = {};
  for (const [name, args] of CONFIGS) {
    const dep = await parts.up(args, logRoot);
    try {
      await parts.warm(dep.url);
      await parts.settle(dep.engines);
      const idle = await parts.window(dep.url, shorts, WINDOW_S);
      await parts.settle(dep.engines);
      await parts.scrape(dep.decoder); // resets the event-loop lag max (per collection)
      const hit = await parts.window(dep.url, burstPlan, WINDOW_S);
      const after = await parts.scrape(dep.decoder);
      const gaps = (ds: typeof idle) => ds.filter((d) => d.kind === 'short').flatMap((d) => d.gaps.map((g) => g.ms));
      const i99 = parts.pct(gaps(idle), 99);
      const b99 = parts.pct(gaps(hit), 99);
      const ttfts = hit.filter((d) => d.kind === 'long' && d.ttftMs !== null).map((d) => d.ttftMs!);
      out[name] = {
        idle_itl_p99_ms: r1(i99),
        burst_itl_p99_ms: r1(b99),
        ratio: Math.round((b99 / i99) * 100) / 100,
        burst_itl_max_ms: r1(Math.max(0, ...gaps(hit))),
        failed: [...idle, ...hit].filter((d) => !d.ok).length,
        long_ttft_p50_ms: r1(parts.pct(ttfts, 50)),
        decoder_lag_max_ms: r1(metricMax(after, 'kvc_engine_nodejs_eventloop_lag_max_seconds') * 1000),
      };
      console.log(`  ${name}: ITL p99 idle ${out[name]!.idle_itl_p99_ms} ms, burst ${out[name]!.burst_itl_p99_ms} ms: ${out[name]!.ratio} x idle; ${JSON.stringify(out[name])}`);
    } finally {
      await dep.stop();
    }
  }
  const rows = Object.entries(out).flatMap(([config, r]) => [
    { panel: 'ITL p99 (ms)', series: `${config} idle`, value: r.idle_itl_p99_ms },
    { panel: 'ITL p99 (ms)', series: `${config} burst`, value: r.burst_itl_p99_ms },
    { panel: 'burst ÷ idle', series: config, value: r.ratio },
  ]);
  const svg = await writeBarsSvg(join(outDir, 'burst_itl.svg'), `ITL p99 seen by streaming clients, ${burst.n} long prompts within ${burst.withinMs} ms`, rows, 'value');
  writeFileSync(join(outDir, 'burst_results.json'), JSON.stringify({ burst, results: out }, null, 2));
  const co = out.colocated?.burst_itl_p99_ms ?? NaN;
  for (const name of ['1P1D', '2P2D']) {
    const r = out[name];
    if (r) console.log(`targets ${name}: burst ITL p99 ${r.burst_itl_p99_ms} ms <= 1.5 x idle (${r1(1.5 * r.idle_itl_p99_ms)}): ${r.ratio <= 1.5}; <= 0.2 x colocated (${r1(0.2 * co)}): ${r.burst_itl_p99_ms <= 0.2 * co}`);
  }
  console.log(`plot: ${svg}`);
  console.log(JSON.stringify({ bench: 'disagg-burst', burst: { n: burst.n, within_ms: burst.withinMs }, ...out }));
}
