// The workload of the disaggregation bench (bench/disagg.ts and its burst mode): the seeded request
// schedule, one streamed request, one measurement window and how a window is judged against the SLO.
import { seededRandom } from '../harness/numeric.js';

// ---- workload and SLO -------------------------------------------------------------------------
// Short requests arrive OPEN-LOOP (a seeded Poisson process), not from clients that send their
// next request when the last one ends: a closed-loop client stalled behind a prompt chunk sends
// fewer requests, so its slow tokens and slow requests are under-counted (coordinated omission),
// and a p99 over tokens or a share of requests then hides exactly the stalls disaggregation
// removes. With a fixed arrival rate every request, fast or stalled, counts once, and every short
// stream has the same length.
/** Short requests per second (Poisson). */
export const SHORT_RATE = 3;
export const PROMPT_SHORT = 48;
/** Tokens each short stream generates: ~64 × 4 ms on an idle engine, long enough to live through a prompt chunk. */
export const SHORT_TOKENS = 64;
export const LONG_MIN = 1500;
export const LONG_MAX = 3000;
export const LONG_TOKENS = 8;
/**
 * Long prompts of the main window: bursts of BURST.size prompts BURST.spacingMs apart, one burst
 * every BURST.everyS seconds from BURST.firstS (the issue's measurement: six ~1,500-word prompts
 * 150 ms apart, here repeated). 0.4 long prompts/s on average, arriving together as they do when
 * several users paste documents: a colocated engine then prefills for seconds at a time, a
 * prefiller queues them and the decoder should not notice.
 */
export const BURST = { size: 6, spacingMs: 150, everyS: 15, firstS: 1 } as const;
export const MAIN_WINDOW_S = 30;
/** Requests still running this long after a window closes are cut and count as SLO misses. */
const DRAIN_S = 15;
/** Seed of the main window's schedule (and of the idle window, which keeps its short requests). */
export const MAIN_SEED = 2;
/** The SLO a request must meet: TTFT (by class) and the p99 of its own inter-token gaps. */
export const SLO = { shortTtftMs: 2000, longTtftMs: 6000, itlP99Ms: 50 } as const;
export const ATTAINMENT = 0.9;

export type Config = 'idle' | 'coloc' | 'disagg';

export interface Done {
  kind: 'short' | 'long';
  /** Start, relative to the window start (s). */
  t0: number;
  /** When it ended (its last byte, or its failure), relative to the window start (s). */
  t1?: number;
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
async function streamOne(url: string, prompt: number[] | string, maxTokens: number, kind: Done['kind'], w0: number, signal: AbortSignal): Promise<Done> {
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
    out.t1 = (performance.now() - w0) / 1000;
    out.ok = out.ttftMs !== null;
    if (!out.ok) out.error = 'the stream ended without a token';
  } catch (e) {
    // Cut at the drain deadline or failed: counted as not meeting the SLO.
    out.t1 = (performance.now() - w0) / 1000;
    out.error = signal.aborted ? 'cut at the drain deadline' : `${(e as Error).message}${(e as Error & { cause?: Error }).cause ? ` (${(e as Error & { cause?: Error }).cause!.message})` : ''}`.slice(0, 160);
  }
  return out;
}

// ---- the request schedule ---------------------------------------------------------------------
export interface Arrival {
  /** When the request is sent, ms after the window start. */
  atMs: number;
  kind: Done['kind'];
  /** Token ids, or text (the burst workload's long prompts: the engines tokenize them). */
  prompt: number[] | string;
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
export function schedule(seconds: number, seed: number, long: LongArrivals): Arrival[] {
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
export async function window(url: string, plan: Arrival[], seconds: number): Promise<Done[]> {
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

/**
 * A window of the burst workload: `clients` streaming clients, client k starting at k ×
 * `staggerMs` and sending its requests back to back (the next when the last one ends), and the
 * `longs` (open loop: each sent at its time, whatever is running). The clients keep streaming for
 * at least `seconds` and until every long prompt has ended, so the whole of the burst's service
 * is inside the window in every configuration, however long it takes. Client k's i-th request is
 * `request(k, i)` (decided by the caller from a seed). Requests still running DRAIN_S after the
 * clients stop are cut.
 */
export async function streamsWindow(
  url: string,
  clients: { count: number; staggerMs: number; request(k: number, i: number): { prompt: number[]; maxTokens: number } },
  longs: Arrival[],
  seconds: number,
): Promise<Done[]> {
  const done: Done[] = [];
  const cut = new AbortController();
  const w0 = performance.now();
  const end = w0 + seconds * 1000;
  let longsOver = longs.length === 0;
  const sleepUntil = async (t: number) => {
    const wait = t - performance.now();
    if (wait > 0) await new Promise((res) => setTimeout(res, wait));
  };
  const client = async (k: number) => {
    await sleepUntil(w0 + k * clients.staggerMs);
    for (let i = 0; (performance.now() < end || !longsOver) && !cut.signal.aborted; i++) {
      const r = clients.request(k, i);
      const d = await streamOne(url, r.prompt, r.maxTokens, 'short', w0, cut.signal);
      done.push(d);
      if (!d.ok) await sleepUntil(performance.now() + 100); // a refused request is not retried in a tight loop
    }
  };
  const sendLongs = async () => {
    const inflight: Promise<void>[] = [];
    for (const a of longs) {
      await sleepUntil(w0 + a.atMs);
      inflight.push(streamOne(url, a.prompt, a.maxTokens, a.kind, w0, cut.signal).then((d) => void done.push(d)));
    }
    await Promise.all(inflight);
    longsOver = true;
  };
  // A long prompt that never ends must not keep the clients streaming forever: cut everything
  // DRAIN_S after the window's length plus the longest a burst may take (LONGS_MAX_S).
  const drain = setTimeout(() => cut.abort(), (seconds + LONGS_MAX_S + DRAIN_S) * 1000);
  await Promise.all([...Array.from({ length: clients.count }, (_, k) => client(k)), sendLongs()]);
  clearTimeout(drain);
  return done;
}

/** Longest the clients of a burst window keep streaming past its length while long prompts run (s). */
const LONGS_MAX_S = 60;

// ---- statistics -------------------------------------------------------------------------------
export function pct(xs: number[], p: number): number {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}
export const r1 = (x: number) => Math.round(x * 10) / 10;

function meetsSlo(d: Done): boolean {
  if (!d.ok || d.ttftMs === null) return false;
  if (d.ttftMs > (d.kind === 'short' ? SLO.shortTtftMs : SLO.longTtftMs)) return false;
  return d.gaps.length === 0 || pct(d.gaps.map((g) => g.ms), 99) <= SLO.itlP99Ms;
}

/** Why requests of one kind missed the SLO: failed or cut, TTFT over its bound, ITL p99 over its bound (both can count). */
export function misses(ds: Done[], kind: Done['kind']): string {
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
export function attainment(ds: Done[]): { short: number; long: number; both: number } {
  const frac = (k: Done['kind']) => {
    const xs = ds.filter((d) => d.kind === k);
    return xs.length ? xs.filter(meetsSlo).length / xs.length : 1;
  };
  const short = frac('short');
  const long = frac('long');
  return { short, long, both: Math.min(short, long) };
}

export function summary(ds: Done[]) {
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

/** N long prompts of LONG_MIN..LONG_MAX tokens, drawn from the long-prompt stream of `seed` (as `schedule` draws them). */
export function longPrompts(n: number, seed: number): number[][] {
  const r = rng(seed * 7919 + 17);
  return Array.from({ length: n }, () => ids(LONG_MIN + Math.floor(r() * (LONG_MAX - LONG_MIN + 1)), r));
}

/** A few requests so that every engine has compiled its kernels before measuring. */
export async function warm(url: string): Promise<void> {
  const r = rng(7);
  const w0 = performance.now();
  const c = new AbortController();
  const t = setTimeout(() => c.abort(), 60_000);
  await Promise.all([0, 1, 2, 3].map(() => streamOne(url, ids(600, r), 4, 'long', w0, c.signal)));
  clearTimeout(t);
}

/** Rates found by halving and bisecting print as binary fractions (0.30000000000000004): four decimals say it. */
export function r4(v: number): number {
  return Math.round(v * 10_000) / 10_000;
}
