// npm run bench -- disagg
// Does disaggregated prefill protect decoding? Three configurations on the built-in model, each a
// real deployment started with `kvc up` on the same machine (the same cores):
//   idle      the main window's short requests alone (on the 1P1D deployment): the ITL baseline;
//   coloc     `kvc up --prefillers 0 --decoders 2`: two kv_both engines (chunked prefill) behind
//             the proxy's round-robin, both on every CPU;
//   disagg    `kvc up --prefillers 1 --decoders 1 --routing kv-aware` (default placement:
//             prefiller on the first CPU, decoder on the rest; conditional disaggregation: prompts
//             of at most 256 uncached tokens are prefilled on the decoder itself, longer ones on the
//             prefiller), what a user who wants decoding protected from long prompts runs.
// Workload (the same seeded requests for every configuration): short requests (PROMPT_SHORT
// tokens in, SHORT_TOKENS streamed out) sent open-loop at SHORT_RATE per second (Poisson), plus
// long prompts (LONG_MIN..LONG_MAX tokens, LONG_TOKENS out): in the main window in bursts of
// BURST.size every BURST.everyS seconds, in the goodput probes as a Poisson process at the probed
// rate. Reported: ITL p50/p99/max over every stream, TTFT p50/p99 of short and long requests, and
// goodput: the highest long-prompt arrival rate at which at least 90 % of the short AND of the
// long requests meet the SLO (below), found by a bounded search. Per window, the first decoder's
// own step intervals, GC pauses, event-loop delay, CPU / run-queue shares and the backends the
// proxy marked down say where a stall came from.
// Plots (Vega-Lite rendered to SVG): ITL over time per configuration, SLO attainment vs rate.
// Output folder: bench-results/disagg/ (or --out DIR); `--replot DIR/results.json` redraws the plots
// of an earlier run without running anything; --keep-logs keeps the deployments' logs;
// `--probe CONFIG@RATE[xSECONDS]` runs one goodput probe window only (see probeOnly); `--burst [N@T]`
// runs the burst workload instead (bench/_disagg_burst.ts). Last line:
// {"bench":"disagg","idle_itl_p99_ms":…,"coloc_itl_p99_ms":…,"disagg_itl_p99_ms":…,
//  "coloc_goodput_rps":…,"disagg_goodput_rps":…,"long_ttft_p50_ms":…}
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as vega from 'vega';
import * as vl from 'vega-lite';
import { isPortFree } from '../src/common/ports.js';
import { resultsDir } from './_plot.js';
import { burstBench, parseBurst, type BurstParts } from './_disagg_burst.js';
import { seededRandom } from '../harness/numeric.js';

const CLI = join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'cli', 'main.js');

// ---- workload and SLO -------------------------------------------------------------------------
// Short requests arrive OPEN-LOOP (a seeded Poisson process), not from clients that send their
// next request when the last one ends: a closed-loop client stalled behind a prompt chunk sends
// fewer requests, so its slow tokens and slow requests are under-counted (coordinated omission),
// and a p99 over tokens or a share of requests then hides exactly the stalls disaggregation
// removes. With a fixed arrival rate every request, fast or stalled, counts once, and every short
// stream has the same length.
/** Short requests per second (Poisson). */
const SHORT_RATE = 3;
const PROMPT_SHORT = 48;
/** Tokens each short stream generates: ~64 × 4 ms on an idle engine, long enough to live through a prompt chunk. */
const SHORT_TOKENS = 64;
const LONG_MIN = 1500;
const LONG_MAX = 3000;
const LONG_TOKENS = 8;
/**
 * Long prompts of the main window: bursts of BURST.size prompts BURST.spacingMs apart, one burst
 * every BURST.everyS seconds from BURST.firstS (the issue's measurement: six ~1,500-word prompts
 * 150 ms apart, here repeated). 0.4 long prompts/s on average, arriving together as they do when
 * several users paste documents: a colocated engine then prefills for seconds at a time, a
 * prefiller queues them and the decoder should not notice.
 */
const BURST = { size: 6, spacingMs: 150, everyS: 15, firstS: 1 } as const;
const MAIN_WINDOW_S = 30;
/** Requests still running this long after a window closes are cut and count as SLO misses. */
const DRAIN_S = 15;
/** The SLO a request must meet: TTFT (by class) and the p99 of its own inter-token gaps. */
/** Seed of the main window's schedule (and of the idle window, which keeps its short requests). */
const MAIN_SEED = 2;
const SLO = { shortTtftMs: 2000, longTtftMs: 6000, itlP99Ms: 50 } as const;
const ATTAINMENT = 0.9;
/**
 * Goodput probes: the short requests as above plus long prompts as a Poisson process at the
 * probed rate. A probe must not hinge on one request: its window lasts long enough for PROBE_LONGS
 * long prompts on average (PROBE_LONGS / rate seconds, at least PROBE_MIN_S), so one long miss
 * moves the long attainment by ~6 %, not 20–30 % as with the 3–11 long prompts of 15–30 s windows.
 * The schedule of a probe depends only on its rate and repeat number, so both configurations see
 * the same requests at the same rate.
 */
const PROBE_LONGS = 16;
const PROBE_MIN_S = 20;
/**
 * Bounded search over the long-prompt rate (per second). From `first`: doubling while the SLO holds
 * (up to `max`), halving while it fails (down to `min`), then bisection between the highest rate
 * that held and the lowest that failed until they are within `within` of the upper one. A probe
 * whose attainment lands in `near` (close to the 90 % line) gets a second window with the next seed,
 * its requests pooled with the first's. The probes of one configuration together last at most
 * `budgetS` seconds of windows: a probe that would pass it is not run (the search then reports the
 * bracket it reached). `first` = 0.4/s: one CPU prefills a 1,500–3,000-token prompt of the built-in
 * model in roughly 1–3 s (quiet machine), so one prefiller saturates near 0.5–0.8 long prompts/s,
 * and colocated engines, which stall their streams at every long prompt, held up to 0.25–0.3/s:
 * starting between them reaches both boundaries in the fewest windows.
 */
const SEARCH = { first: 0.4, min: 0.05, max: 1.6, within: 0.2, budgetS: 240, near: [0.85, 0.95] } as const;
/** Length of one probe window at `rate` (s). */
const probeSeconds = (rate: number) => Math.max(PROBE_MIN_S, PROBE_LONGS / rate);

type Config = 'idle' | 'coloc' | 'disagg';

interface Done {
  kind: 'short' | 'long';
  /** Start, relative to the window start (s). */
  t0: number;
  ttftMs: number | null;
  /** Inter-token gaps (ms) with their arrival time relative to the window start (s). */
  gaps: { t: number; ms: number }[];
  ok: boolean;
  /** Why it failed (HTTP status and error message, or cut at the drain deadline). */
  error?: string;
}

// ---- deterministic randomness -----------------------------------------------------------------
const rng = seededRandom;
const ids = (n: number, r: () => number) => Array.from({ length: n }, () => 100 + Math.floor(r() * 31000));

// ---- one streamed request ---------------------------------------------------------------------
async function streamOne(url: string, prompt: number[], maxTokens: number, kind: Done['kind'], w0: number, signal: AbortSignal): Promise<Done> {
  const t0 = performance.now();
  const out: Done = { kind, t0: (t0 - w0) / 1000, ttftMs: null, gaps: [], ok: false };
  try {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'builtin:tiny', prompt, max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true }),
      signal,
    });
    if (res.status !== 200 || !res.body) {
      const text = await res.text().catch(() => '');
      out.error = `HTTP ${res.status}: ${(/"message":"([^"]*)"/.exec(text)?.[1] ?? text).slice(0, 120)}`;
      return out;
    }
    const dec = new TextDecoder();
    let buf = '';
    let last = 0;
    for await (const piece of res.body as unknown as AsyncIterable<Uint8Array>) {
      const now = performance.now();
      buf += dec.decode(piece, { stream: true });
      let i: number;
      while ((i = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, i);
        buf = buf.slice(i + 2);
        if (!ev.startsWith('data: ') || ev === 'data: [DONE]') continue;
        const j = JSON.parse(ev.slice(6)) as { choices?: { text?: string }[] };
        if (!j.choices?.some((c) => typeof c.text === 'string')) continue;
        if (out.ttftMs === null) out.ttftMs = now - t0;
        else out.gaps.push({ t: (now - w0) / 1000, ms: now - last });
        last = now;
      }
    }
    out.ok = out.ttftMs !== null;
    if (!out.ok) out.error = 'the stream ended without a token';
  } catch (e) {
    // Cut at the drain deadline or failed: counted as not meeting the SLO.
    out.error = signal.aborted ? 'cut at the drain deadline' : `${(e as Error).message}${(e as Error & { cause?: Error }).cause ? ` (${(e as Error & { cause?: Error }).cause!.message})` : ''}`.slice(0, 160);
  }
  return out;
}

// ---- the request schedule ---------------------------------------------------------------------
interface Arrival {
  /** When the request is sent, ms after the window start. */
  atMs: number;
  kind: Done['kind'];
  prompt: number[];
  maxTokens: number;
}

/** How long prompts arrive in a window: none (idle), in bursts (main window), or Poisson at a rate (goodput probes). */
type LongArrivals = { kind: 'none' } | { kind: 'burst' } | { kind: 'poisson'; rate: number };

/**
 * Every request of a window, decided before it starts from `seed` alone: the same seed gives every
 * configuration the same requests (token ids, lengths, send times), whatever it does with them.
 * Short and long requests draw from separate streams, so the idle window (seed of the main window,
 * no long prompts) holds exactly the main window's short requests.
 */
function schedule(seconds: number, seed: number, long: LongArrivals): Arrival[] {
  const out: Arrival[] = [];
  const rs = rng(seed);
  const end = seconds * 1000;
  for (let t = -Math.log(1 - rs()) * (1000 / SHORT_RATE); t < end; t += -Math.log(1 - rs()) * (1000 / SHORT_RATE)) {
    out.push({ atMs: t, kind: 'short', prompt: ids(PROMPT_SHORT, rs), maxTokens: SHORT_TOKENS });
  }
  const rl = rng(seed * 7919 + 17);
  const longAt = (t: number) => {
    const n = LONG_MIN + Math.floor(rl() * (LONG_MAX - LONG_MIN + 1));
    out.push({ atMs: t, kind: 'long', prompt: ids(n, rl), maxTokens: LONG_TOKENS });
  };
  if (long.kind === 'burst') {
    for (let b = BURST.firstS * 1000; b < end; b += BURST.everyS * 1000) for (let i = 0; i < BURST.size; i++) longAt(b + i * BURST.spacingMs);
  } else if (long.kind === 'poisson' && long.rate > 0) {
    for (let t = -Math.log(1 - rl()) * (1000 / long.rate); t < end; t += -Math.log(1 - rl()) * (1000 / long.rate)) longAt(t);
  }
  return out.sort((a, b) => a.atMs - b.atMs);
}

// ---- one measurement window -------------------------------------------------------------------
/**
 * Sends every request of `plan` at its time (open loop: nothing waits for an answer) and collects
 * them; requests still running DRAIN_S after the last send time are cut (SLO misses).
 */
async function window(url: string, plan: Arrival[], seconds: number): Promise<Done[]> {
  const done: Done[] = [];
  const cut = new AbortController();
  const w0 = performance.now();
  const inflight: Promise<void>[] = [];
  for (const a of plan) {
    const wait = w0 + a.atMs - performance.now();
    if (wait > 0) await new Promise((res) => setTimeout(res, wait));
    inflight.push(streamOne(url, a.prompt, a.maxTokens, a.kind, w0, cut.signal).then((d) => void done.push(d)));
  }
  const drain = setTimeout(() => cut.abort(), Math.max(0, w0 + seconds * 1000 - performance.now()) + DRAIN_S * 1000);
  await Promise.all(inflight);
  clearTimeout(drain);
  return done;
}

// ---- statistics -------------------------------------------------------------------------------
function pct(xs: number[], p: number): number {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}
const r1 = (x: number) => Math.round(x * 10) / 10;

function meetsSlo(d: Done): boolean {
  if (!d.ok || d.ttftMs === null) return false;
  if (d.ttftMs > (d.kind === 'short' ? SLO.shortTtftMs : SLO.longTtftMs)) return false;
  return d.gaps.length === 0 || pct(d.gaps.map((g) => g.ms), 99) <= SLO.itlP99Ms;
}

/** Why requests of one kind missed the SLO: failed or cut, TTFT over its bound, ITL p99 over its bound (both can count). */
function misses(ds: Done[], kind: Done['kind']): string {
  const xs = ds.filter((d) => d.kind === kind);
  const failed = xs.filter((d) => !d.ok || d.ttftMs === null).length;
  const ttft = xs.filter((d) => d.ttftMs !== null && d.ttftMs > (kind === 'short' ? SLO.shortTtftMs : SLO.longTtftMs)).length;
  const itl = xs.filter((d) => d.gaps.length > 0 && pct(d.gaps.map((g) => g.ms), 99) > SLO.itlP99Ms).length;
  const why = new Map<string, number>();
  for (const d of xs) if (d.error) why.set(d.error, (why.get(d.error) ?? 0) + 1);
  const reasons = [...why].sort((a, b) => b[1] - a[1]).slice(0, 3).map(([e, n]) => `${n}× ${e}`);
  return `${kind} misses: ${failed} failed${reasons.length ? ` [${reasons.join('; ')}]` : ''}, ${ttft} TTFT, ${itl} ITL`;
}

/** Fraction of short and of long requests meeting the SLO; the attainment is the smaller one. */
function attainment(ds: Done[]): { short: number; long: number; both: number } {
  const frac = (k: Done['kind']) => {
    const xs = ds.filter((d) => d.kind === k);
    return xs.length ? xs.filter(meetsSlo).length / xs.length : 1;
  };
  const short = frac('short');
  const long = frac('long');
  return { short, long, both: Math.min(short, long) };
}

function summary(ds: Done[]) {
  const gaps = ds.flatMap((d) => d.gaps.map((g) => g.ms));
  const ttft = (k: Done['kind']) => ds.filter((d) => d.kind === k && d.ttftMs !== null).map((d) => d.ttftMs!);
  return {
    requests: ds.length,
    long_requests: ds.filter((d) => d.kind === 'long').length,
    failed: ds.filter((d) => !d.ok).length,
    itl_p50_ms: r1(pct(gaps, 50)),
    itl_p99_ms: r1(pct(gaps, 99)),
    itl_max_ms: r1(gaps.length ? Math.max(...gaps) : NaN),
    /** Share of all inter-token gaps over the SLO's 50 ms (how many tokens a stall touched). */
    itl_over_slo_share: gaps.length ? Math.round((1e4 * gaps.filter((g) => g > SLO.itlP99Ms).length) / gaps.length) / 1e4 : NaN,
    short_ttft_p50_ms: r1(pct(ttft('short'), 50)),
    short_ttft_p99_ms: r1(pct(ttft('short'), 99)),
    long_ttft_p50_ms: r1(pct(ttft('long'), 50)),
    long_ttft_p99_ms: r1(pct(ttft('long'), 99)),
    slo_attainment: attainment(ds),
  };
}

// ---- deployments ------------------------------------------------------------------------------
interface Deployment {
  url: string;
  /** HTTP address of the first decoder (`decoder-0`, or `engine-0` when colocated). */
  decoder: string;
  /** Its pid (read from the deployment.json `kvc up` writes), for /proc/<pid>/schedstat. */
  decoderPid: number | null;
  /** `kvc up --log-dir` of this deployment (the proxy's log is read for backends marked down). */
  logDir: string;
  /** HTTP address of every engine (prefillers, decoders, colocated engines). */
  engines: string[];
  stop(): Promise<void>;
}

/** Starts `kvc up` with `args` on a free port offset; resolves when it prints "ready". */
async function up(args: string[], logRoot: string): Promise<Deployment> {
  for (let attempt = 0; attempt < 5; attempt++) {
    const offset = 20000 + Math.floor(Math.random() * 200) * 100;
    if (!(await isPortFree(9100 + offset, '127.0.0.1')) || !(await isPortFree(7100 + offset, '127.0.0.1'))) continue;
    const logDir = join(logRoot, `up-${offset}`);
    const child: ChildProcess = spawn(process.execPath, [CLI, 'up', ...args, '--port-offset', String(offset), '--log-dir', logDir], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env },
    });
    let out = '';
    const exited = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    const ready = await new Promise<string | null>((res) => {
      const timer = setTimeout(() => res(null), 180_000);
      const onData = (d: Buffer) => {
        out += d.toString();
        const m = /endpoint: (http:\/\/[\d.]+:\d+)\/v1/.exec(out);
        if (m) {
          clearTimeout(timer);
          res(m[1]!);
        }
      };
      child.stdout!.on('data', onData);
      child.stderr!.on('data', onData);
      void exited.then(() => {
        clearTimeout(timer);
        res(null);
      });
    });
    const stop = async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 30_000);
        await exited;
        clearTimeout(t);
      }
    };
    if (ready) {
      process.on('exit', () => child.exitCode === null && child.kill('SIGKILL'));
      // The first decoder's HTTP port is 7200 + offset (docs/proxy.md), engine-0 too when colocated.
      let decoderPid: number | null = null;
      const engines: string[] = [];
      try {
        const procs = (JSON.parse(readFileSync(join(logDir, 'deployment.json'), 'utf8')) as { processes: { name: string; pid: number }[] }).processes;
        decoderPid = procs.find((p) => p.name === 'decoder-0' || p.name === 'engine-0')?.pid ?? null;
        // Prefillers listen on 7100 + i, decoders and colocated engines on 7200 + i (+ offset).
        for (const p of procs) {
          const m = /^(prefiller|decoder|engine)-(\d+)$/.exec(p.name);
          if (m) engines.push(`http://127.0.0.1:${(m[1] === 'prefiller' ? 7100 : 7200) + Number(m[2]) + offset}`);
        }
      } catch {
        /* no pid: the run-queue figures are reported as null; no engine list: windows do not wait to settle */
      }
      return { url: ready, decoder: `http://127.0.0.1:${7200 + offset}`, decoderPid, logDir, engines, stop };
    }
    await stop();
    // Another program may take a port between the check and the start: try another offset.
    if (!/ports already in use|EADDRINUSE/.test(out)) throw new Error(`kvc up ${args.join(' ')} did not start:\n${out.slice(-3000)}`);
  }
  throw new Error('no free port offset found for kvc up');
}

// ---- the decoder's own view -------------------------------------------------------------------
/** The Prometheus text of a process's /metrics ('' if unreadable: reported as no data). */
async function scrape(base: string): Promise<string> {
  try {
    const res = await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(10_000) });
    return res.status === 200 ? await res.text() : '';
  } catch {
    return '';
  }
}

/** Cumulative buckets (le → count) of one histogram, summed over its label sets (e.g. GC kinds). */
function histogram(text: string, name: string): Map<number, number> {
  const out = new Map<number, number>();
  const re = new RegExp(`^${name}_bucket\\{[^}]*le="([^"]+)"[^}]*\\} (\\d+)`, 'gm');
  for (const m of text.matchAll(re)) {
    const le = m[1] === '+Inf' ? Infinity : Number(m[1]);
    out.set(le, (out.get(le) ?? 0) + Number(m[2]));
  }
  return out;
}

/** The value of a gauge or counter with a single label set (NaN if absent). */
function value(text: string, name: string): number {
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? ([\\d.e+-]+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}

/** A counter's values per value of one label, summed over the other labels. */
function counterBy(text: string, name: string, label: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const m of text.matchAll(new RegExp(`^${name}\\{([^}]*)\\} ([\\d.e+-]+)$`, 'gm'))) {
    const v = new RegExp(`${label}="([^"]*)"`).exec(m[1]!)?.[1];
    if (v !== undefined) out.set(v, (out.get(v) ?? 0) + Number(m[2]));
  }
  return out;
}

/**
 * Where the proxy had prompts prefilled during a window (`remote`: a prefiller; `local_*`: the
 * decoder itself, and why): a long prompt prefilled on the decoder stalls its streams.
 */
function prefillsWhere(beforeText: string, afterText: string): Record<string, number> {
  const before = counterBy(beforeText, 'kvc_proxy_prefills_total', 'where');
  const out: Record<string, number> = {};
  for (const [k, v] of counterBy(afterText, 'kvc_proxy_prefills_total', 'where')) if (v - (before.get(k) ?? 0) > 0) out[k] = v - (before.get(k) ?? 0);
  return out;
}

/** Sum of a histogram's _sum over its label sets. */
function histogramSum(text: string, name: string): number {
  let sum = 0;
  for (const m of text.matchAll(new RegExp(`^${name}_sum(?:\\{[^}]*\\})? ([\\d.e+-]+)$`, 'gm'))) sum += Number(m[1]);
  return sum;
}

/**
 * The kernel's scheduler statistics of a process: seconds it ran on a CPU and seconds it was
 * runnable but waited for one (/proc/<pid>/schedstat). The wait says how much of a stall other
 * programs on the same CPUs caused, which no change to the engine can remove.
 */
function schedstat(pid: number | null): { run: number; wait: number } | null {
  if (pid === null) return null;
  try {
    const [run, wait] = readFileSync(`/proc/${pid}/schedstat`, 'utf8').trim().split(/\s+/).map(Number);
    return { run: run! / 1e9, wait: wait! / 1e9 };
  } catch {
    return null;
  }
}

/**
 * What the decoder itself saw during a window: how many intervals between its decode steps there
 * were, how many exceeded 50 ms and 100 ms, and the bucket bounds under which 99 % and all fell. A stall the
 * clients saw that is missing here happened after the engine (HTTP, proxy, the client's reads).
 */
function stepIntervals(
  beforeText: string,
  afterText: string,
  proxyLagMaxS: number,
  sched: { before: ReturnType<typeof schedstat>; after: ReturnType<typeof schedstat>; seconds: number },
) {
  const name = 'kvc_engine_decode_step_interval_seconds';
  const before = histogram(beforeText, name);
  const after = histogram(afterText, name);
  const d = (le: number) => (after.get(le) ?? 0) - (before.get(le) ?? 0);
  const total = d(Infinity);
  const bounds = [...after.keys()].sort((a, b) => a - b);
  const p99 = bounds.find((le) => d(le) >= 0.99 * total);
  const max = bounds.find((le) => d(le) >= total);
  const ms = (le: number | undefined) => (le === undefined || !total ? null : le === Infinity ? 'inf' : le * 1000);
  // Garbage collection in the decoder (prom-client's default metrics: buckets 1, 10, 100 ms, …).
  const gc = 'kvc_engine_nodejs_gc_duration_seconds';
  const gcBefore = histogram(beforeText, gc);
  const gcAfter = histogram(afterText, gc);
  const g = (le: number) => (gcAfter.get(le) ?? 0) - (gcBefore.get(le) ?? 0);
  return {
    intervals: total,
    over_50ms: total - d(0.05),
    over_100ms: total - d(0.1),
    p99_le_ms: ms(p99),
    max_le_ms: ms(max),
    gc_pauses: g(Infinity),
    gc_over_10ms: g(Infinity) - g(0.01),
    gc_total_ms: r1((histogramSum(afterText, gc) - histogramSum(beforeText, gc)) * 1000),
    // Longest event-loop delay since the previous scrape (prom-client resets it per collection).
    event_loop_lag_max_ms: r1(value(afterText, 'kvc_engine_nodejs_eventloop_lag_max_seconds') * 1000),
    proxy_event_loop_lag_max_ms: r1(proxyLagMaxS * 1000),
    // Share of the window the decoder ran on a CPU, and waited runnable for one (machine load).
    cpu_share: sched.before && sched.after ? r1((100 * (sched.after.run - sched.before.run)) / sched.seconds) / 100 : null,
    runqueue_wait_share: sched.before && sched.after ? r1((100 * (sched.after.wait - sched.before.wait)) / sched.seconds) / 100 : null,
  };
}

/**
 * How many times the proxy has marked a backend down so far (its log lines): a prefiller marked
 * down while busy sends its long prompts to the decoder, the stall disaggregation must not have.
 */
function markedDown(logDir: string): number {
  try {
    return (readFileSync(join(logDir, 'proxy.log'), 'utf8').match(/ marked down: /g) ?? []).length;
  } catch {
    return 0;
  }
}

/** Longest wait for a deployment to finish the work of the previous window (s). */
const SETTLE_MAX_S = 30;

/**
 * Waits until no engine has a request running or queued (requests cut at a window's drain deadline
 * are cancelled through the proxy, but a long prefill may still be finishing), at most SETTLE_MAX_S:
 * each window starts from an idle deployment, so one window's backlog does not fail the next.
 */
async function settle(engines: string[]): Promise<void> {
  const t0 = performance.now();
  while (performance.now() - t0 < SETTLE_MAX_S * 1000) {
    let busy = 0;
    for (const e of engines) {
      const text = await scrape(e);
      busy += (value(text, 'kvc_engine_num_requests_running') || 0) + (value(text, 'kvc_engine_num_requests_waiting') || 0);
    }
    if (busy === 0) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  console.log(`  (the deployment still had requests in flight ${SETTLE_MAX_S} s after the window: the next window starts anyway)`);
}

/** A few requests so that every engine has compiled its kernels before measuring. */
async function warm(url: string): Promise<void> {
  const r = rng(7);
  const w0 = performance.now();
  const c = new AbortController();
  const t = setTimeout(() => c.abort(), 60_000);
  await Promise.all([0, 1, 2, 3].map(() => streamOne(url, ids(600, r), 4, 'long', w0, c.signal)));
  clearTimeout(t);
}

/** One point of the attainment curve: the pooled windows of one configuration at one rate. */
interface CurvePoint {
  config: Config;
  rate: number;
  /** Lower of the short and long attainment (%). */
  attainment: number;
  short: number;
  long: number;
  windows: number;
  /** Requests pooled at this point, and how many of them were short and long. */
  requests: number;
  short_requests?: number;
  long_requests?: number;
  /** Seconds of windows pooled. */
  seconds?: number;
}

/** The seed of probe `repeat` at `rate`: a function of the rate, so every configuration gets the same requests there. */
const probeSeed = (rate: number, repeat: number) => 1000 + Math.round(rate * 10_000) * 10 + repeat;

/**
 * Bounded goodput search (SEARCH): doubling / halving from SEARCH.first until the SLO's outcome
 * flips, then bisection; probes near the 90 % line get a second window, pooled; at most
 * SEARCH.budgetS seconds of windows.
 */
async function goodput(url: string, engines: string[], name: Config, curve: CurvePoint[]): Promise<{ rps: number; held: number; failed: number | null; seconds: number; stoppedBy: string }> {
  let good = 0;
  let bad = Infinity;
  let rate: number = SEARCH.first;
  let spent = 0;
  let stoppedBy = 'resolution';
  const pooled = new Map<number, Done[]>();
  const probe = async (repeat: number) => {
    const seconds = probeSeconds(rate);
    await settle(engines);
    const ds = await window(url, schedule(seconds, probeSeed(rate, repeat), { kind: 'poisson', rate }), seconds);
    spent += seconds;
    const all = [...(pooled.get(rate) ?? []), ...ds];
    pooled.set(rate, all);
    const a = attainment(all);
    const longs = all.filter((d) => d.kind === 'long').length;
    const point: CurvePoint = {
      config: name,
      rate: r4(rate),
      attainment: r1(a.both * 100),
      short: r1(a.short * 100),
      long: r1(a.long * 100),
      windows: repeat + 1,
      requests: all.length,
      short_requests: all.length - longs,
      long_requests: longs,
      seconds: r1(seconds * (repeat + 1)),
    };
    const i = curve.findIndex((c) => c.config === name && c.rate === point.rate);
    if (i >= 0) curve[i] = point;
    else curve.push(point);
    console.log(
      `  ${name} @ ${rate.toFixed(4)} long/s (${repeat + 1} window(s) of ${seconds.toFixed(0)} s): SLO attainment short ${(a.short * 100).toFixed(1)} %, long ${(a.long * 100).toFixed(1)} % (${all.length - longs} short, ${longs} long; ${misses(all, 'short')}; ${misses(all, 'long')})`,
    );
    return a.both;
  };
  for (;;) {
    if (spent + probeSeconds(rate) > SEARCH.budgetS) {
      stoppedBy = 'time budget';
      break;
    }
    let a = await probe(0);
    // Close to the line: a second window with the next seed, pooled (if the budget allows).
    if (a >= SEARCH.near[0] && a < SEARCH.near[1] && spent + probeSeconds(rate) <= SEARCH.budgetS) a = await probe(1);
    if (a >= ATTAINMENT) good = Math.max(good, rate);
    else bad = Math.min(bad, rate);
    let next: number;
    if (bad === Infinity) next = rate * 2; // everything so far held: go up
    else if (good === 0) next = rate / 2; // everything so far failed: go down
    else next = (good + bad) / 2;
    if (next > SEARCH.max || next < SEARCH.min) {
      stoppedBy = next > SEARCH.max ? 'search ceiling' : 'search floor';
      break;
    }
    if (good > 0 && bad !== Infinity && (bad - good) / bad <= SEARCH.within) break;
    rate = next;
  }
  console.log(
    `  ${name} goodput search: held at ${r4(good)}/s, failed at ${bad === Infinity ? 'none tried' : `${r4(bad)}/s`}; ${spent.toFixed(0)} s of probe windows; stopped by the ${stoppedBy}`,
  );
  return { rps: good, held: good, failed: bad === Infinity ? null : r4(bad), seconds: Math.round(spent), stoppedBy };
}

// ---- plots ------------------------------------------------------------------------------------
/** Width of the time bins of the ITL plot (s): one point per bin and statistic keeps the SVG small. */
const BIN_S = 0.5;

/** ITL samples → p50 / p99 / max per configuration and BIN_S-second bin. */
function binned(series: { config: Config; t: number; itl_ms: number }[]): { config: Config; t: number; stat: string; ms: number }[] {
  const bins = new Map<string, { config: Config; t: number; xs: number[] }>();
  for (const s of series) {
    const t = Math.floor(s.t / BIN_S) * BIN_S;
    const k = `${s.config}@${t}`;
    let b = bins.get(k);
    if (!b) bins.set(k, (b = { config: s.config, t, xs: [] }));
    b.xs.push(s.itl_ms);
  }
  const out: { config: Config; t: number; stat: string; ms: number }[] = [];
  for (const b of [...bins.values()].sort((x, y) => x.t - y.t)) {
    // Tokens that reached the client in one read have a 0 ms gap: floored at 0.1 ms for the log scale.
    const floor = (ms: number) => Math.max(0.1, ms);
    out.push({ config: b.config, t: b.t, stat: 'p50', ms: floor(pct(b.xs, 50)) });
    out.push({ config: b.config, t: b.t, stat: 'p99', ms: floor(pct(b.xs, 99)) });
    out.push({ config: b.config, t: b.t, stat: 'max', ms: floor(Math.max(...b.xs)) });
  }
  return out;
}

async function svg(spec: vl.TopLevelSpec): Promise<string> {
  const view = new vega.View(vega.parse(vl.compile(spec).spec), { renderer: 'none' });
  return view.toSVG();
}


interface Saved {
  results: Partial<Record<Config, ReturnType<typeof summary>>>;
  goodput: Partial<Record<Config, number>>;
  /** How each goodput search ended (absent in results of older runs). */
  searches?: Partial<Record<Config, { rps: number; held: number; failed: number | null; seconds: number; stoppedBy: string }>>;
  curve: CurvePoint[];
  series: { config: Config; t: number; itl_ms: number }[];
  slo: typeof SLO;
  /** Start of each long-prompt burst of the main window (s; absent in results of older runs). */
  bursts?: number[];
  /** The first decoder's step intervals per measured window (absent in results of older runs). */
  steps?: Partial<Record<Config, ReturnType<typeof stepIntervals> & { proxy_marked_down?: number; proxy_prefills?: Record<string, number> }>>;
}

/** Writes the two SVG plots and results.json (which --replot FILE reads back to redraw them). */
async function plots(outDir: string, saved: Saved): Promise<void> {
  const { series, curve } = saved;
  // Burst starts (s) drawn as dashed rules on the configurations that had long prompts, and the
  // SLO's 50 ms gap bound as a dotted line on every row.
  const bursts = saved.bursts ?? [];
  const marks = (['coloc', 'disagg'] as const).flatMap((config) => bursts.map((t) => ({ config, t, burst: true })));
  const itlPlot = await svg({
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: `Inter-token latency over time, per ${BIN_S} s (short requests at ${SHORT_RATE}/s; dashed: a burst of ${BURST.size} long prompts of ${LONG_MIN}-${LONG_MAX} tokens; dotted: ${SLO.itlP99Ms} ms)`,
    data: { values: [...binned(series), ...marks] },
    facet: { row: { field: 'config', type: 'nominal', title: null, sort: ['idle', 'coloc', 'disagg'] } },
    spec: {
      width: 640,
      height: 130,
      layer: [
        {
          transform: [{ filter: 'isValid(datum.stat)' }],
          mark: { type: 'line', interpolate: 'step-after' },
          encoding: {
            x: { field: 't', type: 'quantitative', title: 'time in the window (s)' },
            y: { field: 'ms', type: 'quantitative', title: 'ITL (ms, log)', scale: { type: 'log' } },
            color: { field: 'stat', type: 'nominal', title: 'per bin', sort: ['p50', 'p99', 'max'] },
          },
        },
        {
          transform: [{ filter: 'datum.burst === true' }],
          mark: { type: 'rule', strokeDash: [4, 3], color: 'gray' },
          encoding: { x: { field: 't', type: 'quantitative' } },
        },
        { mark: { type: 'rule', strokeDash: [1, 3], color: 'black' }, encoding: { y: { datum: SLO.itlP99Ms } } },
      ],
    },
  });
  const sloPlot = await svg({
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: `SLO attainment vs long-prompt arrival rate (TTFT <= ${SLO.shortTtftMs}/${SLO.longTtftMs} ms, ITL p99 <= ${SLO.itlP99Ms} ms; label: long prompts pooled)`,
    width: 520,
    height: 300,
    layer: [
      {
        data: { values: curve },
        mark: { type: 'line', point: true },
        encoding: {
          x: { field: 'rate', type: 'quantitative', title: 'long prompts per second (log: the search doubles and halves)', scale: { type: 'log' } },
          y: { field: 'attainment', type: 'quantitative', title: 'requests meeting the SLO (%, lower of short and long)', scale: { domain: [0, 100] } },
          color: { field: 'config', type: 'nominal', title: 'configuration' },
          order: { field: 'rate', type: 'quantitative' },
        },
      },
      {
        // Each point labelled with the long prompts it pooled (short requests: results.json).
        data: { values: curve },
        transform: [{ filter: 'isValid(datum.long_requests)' }, { calculate: "datum.long_requests + ' long'", as: 'label' }],
        mark: { type: 'text', dy: -9, fontSize: 9 },
        encoding: {
          x: { field: 'rate', type: 'quantitative', scale: { type: 'log' } },
          y: { field: 'attainment', type: 'quantitative' },
          text: { field: 'label', type: 'nominal' },
          color: { field: 'config', type: 'nominal' },
        },
      },
      { data: { values: [{ y: ATTAINMENT * 100 }] }, mark: { type: 'rule', strokeDash: [4, 4] }, encoding: { y: { field: 'y', type: 'quantitative' } } },
    ],
  });
  writeFileSync(join(outDir, 'itl_over_time.svg'), itlPlot);
  writeFileSync(join(outDir, 'slo_attainment.svg'), sloPlot);
  writeFileSync(join(outDir, 'results.json'), JSON.stringify(saved) + '\n');
}

async function main(): Promise<void> {
  const argOut = process.argv.indexOf('--out');
  const outDir = resolve(argOut > 0 ? process.argv[argOut + 1]! : resultsDir('disagg'));
  mkdirSync(outDir, { recursive: true });
  const replot = process.argv.indexOf('--replot');
  if (replot > 0) {
    // Redraw the plots of an earlier run from its results.json, without running anything.
    await plots(outDir, JSON.parse(readFileSync(process.argv[replot + 1]!, 'utf8')) as Saved);
    console.log(`plots redrawn in ${outDir}`);
    return;
  }
  const logRoot = mkdtempSync(join(tmpdir(), 'kvc-bench-disagg-'));
  const burstAt = process.argv.indexOf('--burst');
  if (burstAt > 0) {
    try {
      const parts: BurstParts = {
        up,
        warm,
        settle,
        shortPlan: (seconds, seed) => schedule(seconds, seed, { kind: 'none' }),
        longPrompts: (n, seed) => {
          const r = rng(seed * 7919 + 17);
          return Array.from({ length: n }, () => ids(LONG_MIN + Math.floor(r() * (LONG_MAX - LONG_MIN + 1)), r));
        },
        longTokens: LONG_TOKENS,
        window,
        pct,
        scrape,
      };
      await burstBench(parts, parseBurst(process.argv[burstAt + 1]), outDir, logRoot);
    } finally {
      if (process.argv.includes('--keep-logs')) console.log(`logs kept in ${logRoot}`);
      else rmSync(logRoot, { recursive: true, force: true });
    }
    return;
  }
  const probeAt = process.argv.indexOf('--probe');
  if (probeAt > 0) {
    try {
      await probeOnly(process.argv[probeAt + 1], logRoot);
    } finally {
      if (process.argv.includes('--keep-logs')) console.log(`logs kept in ${logRoot}`);
      else rmSync(logRoot, { recursive: true, force: true });
    }
    return;
  }
  const started = performance.now();
  const mainPlan = schedule(MAIN_WINDOW_S, MAIN_SEED, { kind: 'burst' });
  const mainLongs = mainPlan.filter((a) => a.kind === 'long');
  console.log(
    `disagg bench workload (the same seeded requests for every configuration): short requests open-loop, Poisson at ${SHORT_RATE}/s (${PROMPT_SHORT} prompt tokens -> ${SHORT_TOKENS} streamed); ` +
      `main window ${MAIN_WINDOW_S} s: ${mainPlan.length - mainLongs.length} short + ${mainLongs.length} long prompts of ${LONG_MIN}-${LONG_MAX} tokens (-> ${LONG_TOKENS}) in bursts of ${BURST.size}, ${BURST.spacingMs} ms apart, every ${BURST.everyS} s from ${BURST.firstS} s ` +
      `(${r4(BURST.size / BURST.everyS)} long/s on average); idle window: the same short requests without the long prompts`,
  );
  console.log('configurations: idle and disagg on `kvc up --prefillers 1 --decoders 1 --routing kv-aware` (prefiller CPU 0, decoder CPU 1; prompts of <= 256 uncached tokens prefilled on the decoder), coloc on `kvc up --prefillers 0 --decoders 2` (both engines on both CPUs, round-robin); every other setting at its default');
  console.log(
    `SLO: TTFT <= ${SLO.shortTtftMs} ms (short) / ${SLO.longTtftMs} ms (long) and the request's own ITL p99 <= ${SLO.itlP99Ms} ms; goodput = highest Poisson long-prompt rate (short requests as above) with >= ${ATTAINMENT * 100} % of short and of long requests meeting it, ` +
      `search from ${SEARCH.first}/s doubling/halving within [${SEARCH.min}, ${SEARCH.max}] then bisecting until within ${SEARCH.within * 100} %; a probe window holds ${PROBE_LONGS} long prompts on average (${PROBE_LONGS}/rate s, at least ${PROBE_MIN_S} s), one at ${SEARCH.near[0] * 100}-${SEARCH.near[1] * 100} % gets a second window (next seed, pooled); <= ${SEARCH.budgetS} s of probe windows per configuration`,
  );
  const results: Partial<Record<Config, ReturnType<typeof summary>>> = {};
  const series: { config: Config; t: number; itl_ms: number }[] = [];
  const curve: CurvePoint[] = [];
  const good: Partial<Record<Config, number>> = {};
  const searches: Partial<Record<Config, Awaited<ReturnType<typeof goodput>>>> = {};
  const steps: Partial<Record<Config, ReturnType<typeof stepIntervals> & { proxy_marked_down: number; proxy_prefills: Record<string, number> }>> = {};
  const keep = (name: Config, ds: Done[]) => {
    results[name] = summary(ds);
    for (const d of ds) for (const g of d.gaps) series.push({ config: name, t: g.t, itl_ms: r1(g.ms) });
    console.log(`${name}: ${JSON.stringify(results[name])}`);
  };

  for (const [name, args] of [
    ['disagg', ['--prefillers', '1', '--decoders', '1', '--routing', 'kv-aware']],
    ['coloc', ['--prefillers', '0', '--decoders', '2']],
  ] as const) {
    console.log(`\nstarting: kvc up ${args.join(' ')}`);
    const dep = await up([...args], logRoot);
    try {
      await warm(dep.url);
      const measured = async (config: Config, plan: Arrival[]) => {
        await settle(dep.engines);
        const before = await scrape(dep.decoder);
        const proxyBefore = await scrape(dep.url); // also resets the proxy's event-loop lag maximum
        const s0 = schedstat(dep.decoderPid);
        const downs0 = markedDown(dep.logDir);
        const t0 = performance.now();
        const ds = await window(dep.url, plan, MAIN_WINDOW_S);
        const sched = { before: s0, after: schedstat(dep.decoderPid), seconds: (performance.now() - t0) / 1000 };
        const proxyAfter = await scrape(dep.url);
        const proxyLag = value(proxyAfter, 'kvc_proxy_nodejs_eventloop_lag_max_seconds');
        steps[config] = {
          ...stepIntervals(before, await scrape(dep.decoder), proxyLag, sched),
          proxy_marked_down: markedDown(dep.logDir) - downs0,
          proxy_prefills: prefillsWhere(proxyBefore, proxyAfter),
        };
        keep(config, ds);
        console.log(`  ${config}: ${misses(ds, 'short')}; ${misses(ds, 'long')}`);
        console.log(`  ${config}: decoder ${name === 'coloc' ? 'engine-0' : 'decoder-0'} step intervals ${JSON.stringify(steps[config])}`);
      };
      if (name === 'disagg') await measured('idle', mainPlan.filter((a) => a.kind === 'short'));
      await measured(name, mainPlan);
      searches[name] = await goodput(dep.url, dep.engines, name, curve);
      good[name] = searches[name].rps;
      console.log(`  ${name} goodput: ${r4(good[name]!)} long prompts/s`);
    } finally {
      await dep.stop();
    }
  }
  // --keep-logs keeps every process's log (and deployment.json) for a closer look.
  if (process.argv.includes('--keep-logs')) console.log(`logs kept in ${logRoot}`);
  else rmSync(logRoot, { recursive: true, force: true });

  const bursts = [...new Set(mainLongs.map((a) => Math.floor(a.atMs / (BURST.everyS * 1000))))].map((k) => BURST.firstS + k * BURST.everyS);
  await plots(outDir, { results, goodput: good, searches, curve, series, slo: SLO, steps, bursts });
  console.log(`\nplots: ${join(outDir, 'itl_over_time.svg')}, ${join(outDir, 'slo_attainment.svg')}; ran ${((performance.now() - started) / 1000).toFixed(0)} s`);

  // The attainment curve (the SLO plot's points), one line per configuration, rates ascending.
  for (const config of ['coloc', 'disagg'] as const) {
    const pts = curve.filter((c) => c.config === config).sort((a, b) => a.rate - b.rate);
    const s = searches[config];
    console.log(
      `curve ${config}: ${pts.map((c) => `${c.rate}/s ${c.attainment} % (short ${c.short} %, long ${c.long} %; ${c.short_requests} short + ${c.long_requests} long, ${c.windows} window(s), ${c.seconds} s)`).join('; ')}` +
        (s ? ` -> goodput ${r4(s.rps)}/s, failed at ${s.failed ?? 'none tried'}, ${s.seconds} s of windows, stopped by the ${s.stoppedBy}` : ''),
    );
  }
  const idle = results.idle!.itl_p99_ms;
  const coloc = results.coloc!.itl_p99_ms;
  const dis = results.disagg!.itl_p99_ms;
  console.log(`targets: disagg ITL p99 ${dis} ms <= 1.5 x idle (${r1(idle * 1.5)}): ${dis <= idle * 1.5}; <= 0.2 x coloc (${r1(coloc * 0.2)}): ${dis <= coloc * 0.2}; goodput ${r4(good.disagg!)} >= 1.5 x coloc ${r4(good.coloc!)}: ${good.coloc! > 0 || good.disagg! > 0 ? good.disagg! >= 1.5 * good.coloc! : 'n/a (neither met the SLO at any rate tried)'}`);
  console.log(
    JSON.stringify({
      bench: 'disagg',
      idle_itl_p99_ms: idle,
      coloc_itl_p99_ms: coloc,
      disagg_itl_p99_ms: dis,
      coloc_goodput_rps: r4(good.coloc!),
      disagg_goodput_rps: r4(good.disagg!),
      long_ttft_p50_ms: results.disagg!.long_ttft_p50_ms,
    }),
  );
}

/**
 * `--probe CONFIG@RATE[xSECONDS]` (e.g. `disagg@0.7x30`): one Poisson window of that configuration
 * at that long-prompt rate (seed of repeat 0), with the decoder's own figures: for looking into a
 * probe of the goodput search (e.g. under `--cpu-prof`) without running the whole bench.
 */
async function probeOnly(arg: string | undefined, logRoot: string): Promise<void> {
  const m = /^(disagg|coloc)@([\d.]+)(?:x(\d+))?$/.exec(arg ?? '');
  if (!m) throw new Error(`--probe: expected CONFIG@RATE[xSECONDS] with CONFIG disagg or coloc (e.g. disagg@0.7x30), found ${JSON.stringify(arg ?? '')}`);
  const name = m[1] as 'disagg' | 'coloc';
  const rate = Number(m[2]);
  if (!(rate > 0)) throw new Error(`--probe: the rate must be a positive number of long prompts per second, found ${m[2]}`);
  const seconds = m[3] ? Number(m[3]) : probeSeconds(rate);
  const args = name === 'disagg' ? ['--prefillers', '1', '--decoders', '1', '--routing', 'kv-aware'] : ['--prefillers', '0', '--decoders', '2'];
  const dep = await up(args, logRoot);
  try {
    await warm(dep.url);
    await settle(dep.engines);
    const before = await scrape(dep.decoder);
    const proxyBefore = await scrape(dep.url);
    const s0 = schedstat(dep.decoderPid);
    const t0 = performance.now();
    const ds = await window(dep.url, schedule(seconds, probeSeed(rate, 0), { kind: 'poisson', rate }), seconds);
    const sched = { before: s0, after: schedstat(dep.decoderPid), seconds: (performance.now() - t0) / 1000 };
    const proxyAfter = await scrape(dep.url);
    const steps = { ...stepIntervals(before, await scrape(dep.decoder), value(proxyAfter, 'kvc_proxy_nodejs_eventloop_lag_max_seconds'), sched), proxy_prefills: prefillsWhere(proxyBefore, proxyAfter) };
    const a = attainment(ds);
    console.log(`${name} @ ${rate} long/s, ${seconds} s (decoder pid ${dep.decoderPid}): attainment short ${r1(a.short * 100)} %, long ${r1(a.long * 100)} %; ${misses(ds, 'short')}; ${misses(ds, 'long')}`);
    console.log(`  ${JSON.stringify(summary(ds))}`);
    console.log(`  decoder: ${JSON.stringify(steps)}`);
    // The gaps over the SLO, with when they happened, to line up with a --cpu-prof of the decoder.
    const slow = ds.flatMap((d) => d.gaps.filter((g) => g.ms > SLO.itlP99Ms).map((g) => `${g.t.toFixed(2)}s:${r1(g.ms)}ms`));
    console.log(`  gaps over ${SLO.itlP99Ms} ms (time in window: length): ${slow.join(' ') || 'none'}`);
  } finally {
    await dep.stop();
  }
}

/** Rates found by halving and bisecting print as binary fractions (0.30000000000000004): four decimals say it. */
function r4(v: number): number {
  return Math.round(v * 10_000) / 10_000;
}

await main();
