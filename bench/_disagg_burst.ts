// `npm run bench -- disagg --burst [N@T]`: the burst workload of the disaggregation bench. Four
// streaming clients run for the whole window, each sending its requests back to back (48 prompt
// tokens as token ids, 128 tokens streamed), client k from k × 250 ms, so the same four streams are
// running whenever the burst arrives, in every configuration; at 2 s, N long prompts arrive within
// T ms (default 6@1000: six texts of 1,500–3,000 words, about as many tokens, within one second, as
// a batch job or a reconnecting client sends them). The streams go on until the last long prompt
// has ended (at least 8 s), and the clients' figures are taken over the burst's span, from its
// first prompt's arrival to its last prompt's end: the whole of what the burst does to the streams
// and only that, however long each configuration takes to serve it. Three deployments in one run,
// each started with `kvc up` at its defaults (round-robin routing, every prompt prefilled on a
// prefiller): 1P1D (--prefillers 1 --decoders 1), 2P2D (--prefillers 2 --decoders 2) and
// colocated (--prefillers 0 --decoders 2). For each: a burst window and an idle window (the same
// streams, same seeded prompts, as long, measured over the same span, without the burst). Per window, what the streaming
// clients saw (ITL p50/p90/p99/p99.9/max over every gap of every stream, how many gaps exceeded
// 25/50/100 ms, short TTFT p99) and what the decoders did (summed over every decoder): the decode
// step interval p99 in the CPU time of the scheduler's thread, which the machine's load does not
// stretch, and in wall time; the longest event-loop delay; GC time; sequences per decode step; the
// share of the window the first decoder waited for a CPU; and where the CPU time went (every
// process's CPU share, the share its main thread waited for a CPU, each CPU's busy share;
// bench/_disagg_cpu.ts). Ratios burst ÷ idle of the client ITL p99 and of the decoders' CPU
// interval p99. Plot: bench-results/disagg/burst_itl.svg; every stream's gaps in burst_gaps.json.
// Last line:
// {"bench":"disagg-burst","burst":{"n":…,"within_ms":…},"1P1D":{…},"2P2D":{…},"colocated":{…}}
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { loadavg } from 'node:os';
import { writeBarsSvg } from './_plot.js';
import { histogram, schedstat } from './_disagg_deployment.js';
import { execFileSync } from 'node:child_process';
import { cpuSnapshot, cpusAllowed, cpuWindow, type ProcRef } from './_disagg_cpu.js';
import { seededRandom } from '../harness/numeric.js';
import { formatCpuList, machineCpus } from '../src/common/cpu_set.js';

/** What the burst mode borrows from bench/disagg.ts (one deployment and window machinery for both). */
export interface BurstParts {
  up(args: string[], logRoot: string): Promise<{ url: string; decoder: string; decoderPid: number | null; engines: string[]; decoders: string[]; procs: ProcRef[]; stop(): Promise<void> }>;
  warm(url: string): Promise<void>;
  settle(engines: string[]): Promise<void>;
  /** N long prompts (token ids, seeded). */
  longPrompts(n: number, seed: number): number[][];
  longTokens: number;
  streamsWindow(
    url: string,
    clients: { count: number; staggerMs: number; request(k: number, i: number): { prompt: number[]; maxTokens: number } },
    longs: { atMs: number; kind: 'short' | 'long'; prompt: number[] | string; maxTokens: number }[],
    seconds: number,
  ): Promise<{ kind: 'short' | 'long'; ok: boolean; ttftMs: number | null; t0: number; t1?: number; gaps: { t: number; ms: number }[] }[]>;
  pct(xs: number[], p: number): number;
  /** The decoder's own view of a window (metrics text before and after). */
  scrape(url: string): Promise<string>;
}

/** Shortest window (s); a burst window lasts until its last long prompt has ended. */
const WINDOW_S = 8;
/** When the burst starts within its window (s): every stream is running by then. */
const BURST_AT_S = 2;
const SEED = 5;
/** The streaming clients: how many, their start stagger, and each request's prompt and output length. */
const CLIENTS = { count: 4, staggerMs: 250, promptTokens: 48, maxTokens: 128 } as const;
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

/** `--configs A,B` (a subset of 1P1D, 2P2D, colocated; default all), checked: a clear error naming the flag. */
export function parseConfigs(arg: string | undefined): string[] {
  const names = CONFIGS.map(([n]) => n);
  if (arg === undefined) return names;
  const want = arg.split(',').map((s) => s.trim());
  const bad = want.filter((n) => !names.includes(n));
  if (!want.length || bad.length) throw new Error(`--configs: expected a comma-separated subset of ${names.join(', ')}; found ${JSON.stringify(arg)}`);
  return want;
}

const r1 = (x: number) => Math.round(x * 10) / 10;

/** Common English words: a long prompt's text has one per token id drawn (about one token each). */
const WORDS = (
  'the of and to in is that for it as was with be by on not he this are or his from at which but have an they you were her ' +
  'she there been one all would their we him when who will more no if out so said what up its about into than them can only ' +
  'other new some could time these two may then do first any my now such like our over man me even most made after also did ' +
  'many before must through back years where much your way well down should because each just those people how too little state ' +
  'good very make world still own see men work long get here between both life being under never day same another know while last'
).split(' ');

/** A long prompt as text, as clients send documents: the engines tokenize it (on the decoder too). */
function textOf(ids: number[]): string {
  return ids.map((id, i) => (i % 17 === 16 ? `${WORDS[id % WORDS.length]}.` : WORDS[id % WORDS.length])).join(' ');
}

function metricMax(text: string, name: string): number {
  let max = 0;
  for (const m of text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? ([\\d.e+-]+)$`, 'gm'))) max = Math.max(max, Number(m[1]));
  return max;
}

/**
 * The `q` quantile (0..1) of what a histogram counted between two scrapes of each of several
 * processes (summed), interpolated linearly inside its bucket; NaN when nothing was counted.
 */
export function histogramQuantile(before: string[], after: string[], name: string, q: number): number {
  const delta = new Map<number, number>();
  after.forEach((text, i) => {
    const b = histogram(before[i] ?? '', name);
    for (const [le, n] of histogram(text, name)) delta.set(le, (delta.get(le) ?? 0) + n - (b.get(le) ?? 0));
  });
  const bounds = [...delta.keys()].sort((a, b) => a - b);
  const total = delta.get(Infinity) ?? 0;
  if (!total) return NaN;
  let lo = 0;
  let below = 0;
  for (const le of bounds) {
    const n = delta.get(le)!;
    if (n >= q * total) return le === Infinity ? lo : lo + ((le - lo) * (q * total - below)) / Math.max(1, n - below);
    lo = le;
    below = n;
  }
  return lo;
}

/** What the decoders themselves did in one window (their metrics before and after it). */
function decoderView(before: string[], after: string[], sched: { before: ReturnType<typeof schedstat>; after: ReturnType<typeof schedstat>; seconds: number }) {
  const ms = (s: number) => r1(s * 1000);
  const sum = (texts: string[], re: RegExp) => texts.reduce((a, t) => a + [...t.matchAll(re)].reduce((x, m) => x + Number(m[1]), 0), 0);
  const gcSum = /^kvc_engine_nodejs_gc_duration_seconds_sum\{[^}]*\} ([\d.e+-]+)$/gm;
  const rowsSum = /^kvc_engine_step_tokens_sum\{[^}]*phase="decode"[^}]*\} ([\d.e+-]+)$/gm;
  const rowsCount = /^kvc_engine_step_tokens_count\{[^}]*phase="decode"[^}]*\} ([\d.e+-]+)$/gm;
  return {
    // The decode step interval in the CPU time of the scheduler's thread: the engine's own work
    // per token, which the machine's load does not stretch.
    cpu_interval_p99_ms: ms(histogramQuantile(before, after, 'kvc_engine_decode_step_interval_cpu_seconds', 0.99)),
    // The bucket bound under which every interval fell: the decoders' longest own block per token.
    cpu_interval_max_le_ms: ms(histogramQuantile(before, after, 'kvc_engine_decode_step_interval_cpu_seconds', 1)),
    wall_interval_p99_ms: ms(histogramQuantile(before, after, 'kvc_engine_decode_step_interval_seconds', 0.99)),
    event_loop_lag_max_ms: ms(Math.max(0, ...after.map((t) => metricMax(t, 'kvc_engine_nodejs_eventloop_lag_max_seconds')))),
    gc_ms: ms(sum(after, gcSum) - sum(before, gcSum)),
    // Sequences per decode step (its rows): a stalled stream released with others makes steps longer.
    decode_rows_mean:
      Math.round(
        ((sum(after, rowsSum) - sum(before, rowsSum)) / Math.max(1, sum(after, rowsCount) - sum(before, rowsCount))) * 100,
      ) / 100,
    // Share of the window the first decoder waited, runnable, for a CPU another program held.
    runqueue_wait_share: sched.before && sched.after ? Math.round((100 * (sched.after.wait - sched.before.wait)) / sched.seconds) / 100 : null,
  };
}

/** How the clients' gaps are spread: the tail a p99 stands on (how many gaps a stall touched). */
function gapFigures(gaps: number[]) {
  const over = (ms: number) => gaps.filter((g) => g > ms).length;
  return { gaps: gaps.length, itl_p50_ms: r1(pctOf(gaps, 50)), itl_p90_ms: r1(pctOf(gaps, 90)), itl_p999_ms: r1(pctOf(gaps, 99.9)), gaps_over_25ms: over(25), gaps_over_50ms: over(50), gaps_over_100ms: over(100) };
}

function pctOf(xs: number[], p: number): number {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

type WindowFigures = { span_s: [number, number]; itl_p99_ms: number; itl_max_ms: number; window_s: number; window_itl_p99_ms: number; window_gaps: number; short_ttft_p50_ms: number; short_ttft_p99_ms: number; load1: number } & ReturnType<typeof gapFigures> & ReturnType<typeof decoderView> & { cpu: ReturnType<typeof cpuWindow> & { cpus_allowed: Record<string, string | null> } };

export async function burstBench(parts: BurstParts, burst: { n: number; withinMs: number }, outDir: string, logRoot: string, only: string[] = parseConfigs(undefined)): Promise<void> {
  const clients = {
    count: CLIENTS.count,
    staggerMs: CLIENTS.staggerMs,
    // Client k's i-th prompt: token ids from its own seed, the same in every window and configuration.
    request: (k: number, i: number) => {
      const r = seededRandom(SEED * 1_000_003 + k * 10_007 + i);
      return { prompt: Array.from({ length: CLIENTS.promptTokens }, () => 100 + Math.floor(r() * 31000)), maxTokens: CLIENTS.maxTokens };
    },
  };
  const longs = parts.longPrompts(burst.n, SEED).map((ids, i) => ({
    atMs: BURST_AT_S * 1000 + (burst.n > 1 ? (i * burst.withinMs) / (burst.n - 1) : 0),
    kind: 'long' as const,
    prompt: textOf(ids),
    words: ids.length,
    maxTokens: parts.longTokens,
  }));
  console.log(
    `disagg burst workload: ${CLIENTS.count} streaming clients (client k from k x ${CLIENTS.staggerMs} ms, requests back to back: ${CLIENTS.promptTokens} prompt tokens -> ${CLIENTS.maxTokens} streamed, same seeded prompts in both windows) over ${WINDOW_S} s; burst window adds ${burst.n} long prompts ` +
      `(texts of ${longs.map((l) => l.words).join(', ')} words, about as many tokens) within ${burst.withinMs} ms from ${BURST_AT_S} s; the streams go on until the last has ended (at least ${WINDOW_S} s) and the clients' figures cover the burst's span (its first arrival to its last end; the idle window: as long, same span). Configurations at kvc up defaults: ${CONFIGS.filter(([n]) => only.includes(n)).map(([n, a]) => `${n} (${a.join(' ')})`).join('; ')}`,
  );
  type Result = { idle: WindowFigures; burst: WindowFigures; ratio: number; cpu_ratio: number; failed: number; long_ttft_p50_ms: number };
  const out: Record<string, Result> = {};
  // Every stream's gaps with their time in the window, per configuration and window (burst_gaps.json).
  const raw: Record<string, Record<string, { kind: string; t0: number; ttft_ms: number | null; gaps: [number, number][] }[]>> = {};
  for (const [name, args] of CONFIGS.filter(([n]) => only.includes(n))) {
    // `kvc up` and its processes inherit this process's CPUs: every CPU, whatever the last
    // configuration's clients were given.
    const pinSelf = (cpus: string) => execFileSync('taskset', ['-a', '-p', '-c', cpus, String(process.pid)], { stdio: 'ignore' });
    pinSelf(formatCpuList(machineCpus()));
    const dep = await parts.up(args, logRoot);
    // The streaming clients stand in for users on other machines: the bench runs them where
    // `kvc up` placed the proxy (off the decoders' CPUs with the default split; everywhere for
    // colocated engines), so that they do not take a decoder's core as no remote client would.
    const proxyPid = dep.procs.find((p) => p.name === 'proxy')?.pid;
    pinSelf((proxyPid !== undefined ? cpusAllowed(proxyPid) : null) ?? formatCpuList(machineCpus()));
    try {
      await parts.warm(dep.url);
      // One window: the streams (and the burst's prompts, if any) for at least `seconds`; the
      // clients' figures are taken over the gaps that arrived between BURST_AT_S and `spanEnd` (s).
      const measure = async (plan: typeof longs, seconds: number, spanEnd: (done: Awaited<ReturnType<BurstParts['streamsWindow']>>) => number) => {
        await parts.settle(dep.engines);
        const load1 = loadavg()[0]!;
        const before = await Promise.all(dep.decoders.map((d) => parts.scrape(d))); // also resets the event-loop lag max
        const procs = [...dep.procs, { name: 'bench-client', pid: process.pid }];
        const c0 = cpuSnapshot(procs);
        const s0 = schedstat(dep.decoderPid);
        const t0 = performance.now();
        const done = await parts.streamsWindow(dep.url, clients, plan, seconds);
        const windowS = (performance.now() - t0) / 1000;
        const s1 = schedstat(dep.decoderPid);
        const c1 = cpuSnapshot(procs);
        const after = await Promise.all(dep.decoders.map((d) => parts.scrape(d)));
        const end = spanEnd(done);
        const shortsDone = done.filter((d) => d.kind === 'short');
        const gaps = shortsDone.flatMap((d) => d.gaps.filter((g) => g.t >= BURST_AT_S && g.t <= end).map((g) => g.ms));
        const all = shortsDone.flatMap((d) => d.gaps.map((g) => g.ms));
        const figures: WindowFigures = {
          span_s: [BURST_AT_S, r1(end)],
          itl_p99_ms: r1(parts.pct(gaps, 99)),
          itl_max_ms: r1(Math.max(0, ...gaps)),
          ...gapFigures(gaps),
          // The whole window (the streams' first 2 s and, idle, any time after the span too).
          window_s: r1(windowS),
          window_itl_p99_ms: r1(parts.pct(all, 99)),
          window_gaps: all.length,
          // A short request held behind the burst's long prompts (a prefiller's queue) waits here.
          short_ttft_p50_ms: r1(parts.pct(shortsDone.filter((d) => d.ttftMs !== null).map((d) => d.ttftMs!), 50)),
          short_ttft_p99_ms: r1(parts.pct(shortsDone.filter((d) => d.ttftMs !== null).map((d) => d.ttftMs!), 99)),
          load1: Math.round(((load1 + loadavg()[0]!) / 2) * 10) / 10,
          ...decoderView(before, after, { before: s0, after: s1, seconds: windowS }),
          cpu: { ...cpuWindow(c0, c1), cpus_allowed: Object.fromEntries(procs.map((p) => [p.name, cpusAllowed(p.pid)])) },
        };
        return { done, figures };
      };
      // The burst window first: the burst's span (from its first prompt to the end of its last)
      // sets the idle window's length and the span measured in it, so both cover the same time.
      const hit = await measure(longs, WINDOW_S, (ds) => Math.max(...ds.filter((d) => d.kind === 'long').map((d) => d.t1 ?? WINDOW_S)));
      const span = hit.figures.span_s[1];
      const idle = await measure([], Math.max(WINDOW_S, span), () => span);
      const rawOf = (ds: typeof idle.done) => ds.map((d) => ({ kind: d.kind, t0: Math.round(d.t0 * 1000) / 1000, ttft_ms: d.ttftMs === null ? null : r1(d.ttftMs), gaps: d.gaps.map((g) => [Math.round(g.t * 1000) / 1000, r1(g.ms)] as [number, number]) }));
      raw[name] = { idle: rawOf(idle.done), burst: rawOf(hit.done) };
      const ttfts = hit.done.filter((d) => d.kind === 'long' && d.ttftMs !== null).map((d) => d.ttftMs!);
      out[name] = {
        idle: idle.figures,
        burst: hit.figures,
        ratio: Math.round((hit.figures.itl_p99_ms / idle.figures.itl_p99_ms) * 100) / 100,
        cpu_ratio: Math.round((hit.figures.cpu_interval_p99_ms / idle.figures.cpu_interval_p99_ms) * 100) / 100,
        failed: [...idle.done, ...hit.done].filter((d) => !d.ok).length,
        long_ttft_p50_ms: r1(parts.pct(ttfts, 50)),
      };
      const r = out[name]!;
      console.log(
        `  ${name}: client ITL p99 idle ${r.idle.itl_p99_ms} ms, burst ${r.burst.itl_p99_ms} ms: ${r.ratio} x idle; decoder CPU interval p99 idle ${r.idle.cpu_interval_p99_ms} ms, burst ${r.burst.cpu_interval_p99_ms} ms: ${r.cpu_ratio} x idle; ${JSON.stringify(r)}`,
      );
    } finally {
      await dep.stop();
    }
  }
  const rows = Object.entries(out).flatMap(([config, r]) => [
    { panel: 'client ITL p99 (ms)', series: `${config} idle`, value: r.idle.itl_p99_ms },
    { panel: 'client ITL p99 (ms)', series: `${config} burst`, value: r.burst.itl_p99_ms },
    { panel: 'client ITL p99, burst ÷ idle', series: config, value: r.ratio },
    { panel: 'decoder CPU per step p99 (ms)', series: `${config} idle`, value: r.idle.cpu_interval_p99_ms },
    { panel: 'decoder CPU per step p99 (ms)', series: `${config} burst`, value: r.burst.cpu_interval_p99_ms },
    { panel: 'decoder CPU per step p99, burst ÷ idle', series: config, value: r.cpu_ratio },
  ]);
  const svg = await writeBarsSvg(join(outDir, 'burst_itl.svg'), `${burst.n} long prompts within ${burst.withinMs} ms while streams run: what streaming clients and the decoders saw`, rows, 'value');
  writeFileSync(join(outDir, 'burst_results.json'), JSON.stringify({ burst, results: out }, null, 2));
  writeFileSync(join(outDir, 'burst_gaps.json'), JSON.stringify(raw));
  const co = out.colocated?.burst.itl_p99_ms ?? NaN;
  const coCpu = out.colocated?.burst.cpu_interval_p99_ms ?? NaN;
  for (const name of ['1P1D', '2P2D']) {
    const r = out[name];
    if (!r) continue;
    console.log(
      `targets ${name}: client ITL p99 ${r.burst.itl_p99_ms} ms <= 1.5 x idle (${r1(1.5 * r.idle.itl_p99_ms)}): ${r.ratio <= 1.5}; <= 0.2 x colocated (${r1(0.2 * co)}): ${r.burst.itl_p99_ms <= 0.2 * co}` +
        ` | decoder CPU per step p99 ${r.burst.cpu_interval_p99_ms} ms <= 1.5 x idle (${r1(1.5 * r.idle.cpu_interval_p99_ms)}): ${r.cpu_ratio <= 1.5}; <= 0.2 x colocated (${r1(0.2 * coCpu)}): ${r.burst.cpu_interval_p99_ms <= 0.2 * coCpu}`,
    );
  }
  console.log(`plot: ${svg}`);
  console.log(JSON.stringify({ bench: 'disagg-burst', burst: { n: burst.n, within_ms: burst.withinMs }, ...out }));
}
