// `npm run bench -- trace [--trace FILE] [options]`: replays a request trace in Mooncake's format
// (harness/trace_model.ts) against a `kvc up` deployment of the built-in model, once with
// round-robin and once with kv-aware routing, on the same requests, and measures both against two
// references simulated on those requests: one pooled LRU cache of the deployment's total tier size
// (the bound a cluster of caches can reach) and an infinite cache (the trace's own ceiling).
//
// Options (every one validated; a bad value stops the bench naming the flag):
//   --trace FILE|generated:NAME   a trace file, or one of the generator's named shapes
//                              (harness/trace_gen.ts: tenants, sessions) written for --seed to
//                              bench-results/trace/; default generated:tenants (bench/_trace_source.ts)
//   --prefillers N --decoders N   default 2 and 2
//   --routing MODES            comma list of round-robin,kv-aware (default both, in that order)
//   --window START:COUNT       requests START.. of the (sampled) trace; default 0:120
//   --sample-conversations F   keep a fraction F of the conversations, whole, chosen across the
//                              whole trace before the window (conversation: see conversations() in
//                              harness/trace_model.ts); default 0.05 (an hour-long trace of thousands)
//   --rate R                   the window's own arrival pattern scaled to R requests a second (default 1.2)
//   --block-tokens B           tokens per 512-token trace block = the deployment's chunk size (default 32)
//   --tier-fraction F          the engines' CPU tiers together hold F of the window's distinct
//                              blocks (default 0.2), split evenly
//   --max-output-tokens N      max_tokens = min(output_length, N) (default 16)
//   --seed S                   token ids of each hash id and conversation sampling (default 1)
//   --kv-up-args "<flags>"     more `kvc up` flags for the kv-aware deployment (A/B of a rule)
//   --kv-cache-dtypes LIST     comma list of engine KV dtypes (--kv-cache-dtype values), each run at
//                              the same --max-local-cpu-size (sized for float32 chunks); default
//                              float32. With more than one, each dtype's pooled bound is simulated
//                              for the chunks its tiers hold, and its computed ÷ sent is set beside
//                              the first dtype's: the drop the larger capacity predicts, and the one measured.
// Prompts are token ids: hash id h becomes B ids drawn from a generator seeded by h, a partial last
// block proportionally fewer; prompts longer than the model's context (4,096 − max tokens) keep
// their leading blocks that fit (the references see the same truncated prompts; the number of
// dropped blocks is printed).
//
// Each deployment serves 16 warm-up requests of its own prompts first (every process compiles its
// hot paths), whose chunks are then cleared from every tier. Then the window is sent at its
// times, streamed; TTFT is the client's time to the first streamed token. "computed ÷ sent" is
// the sum of the engines' kvc_engine_prompt_tokens_computed_total over the run ÷ the prompt tokens
// sent. Prefill shares come from the proxy's kvc_proxy_prefills_total{instance}; P2P and xfer bytes
// from the engines' kvc_p2p_bytes_total and kvc_xfer_sent_bytes_total. Each response's usage.kvc
// (docs/ledger.md) gives what that request computed, and why: the plot of computed ÷ sent over time
// and unexplained_miss_share come from it.
// Writes bench-results/trace/trace.svg; the last line is one JSON object (see main()).
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Agent, fetch as undiciFetch } from 'undici';
import { BUILTIN_MODELS } from '../src/engine/model/formats/builtin.js';
import { HEADER_BYTES, payloadBytes } from '../src/common/chunk.js';
import { headerDtypeOf, KV_DTYPE_FLAGS } from '../harness/kv_dtype.js';
import { sizeClass } from '../src/common/buffer_pool.js';
import { clearTiers, startDeployment, type Deployment } from '../harness/deployment.js';
import { byLabel, pct, scrape, sum } from './_scrape.js';
import { resultsDir } from './_plot.js';
import { writeTraceSvg, writeDtypeSvg, type DtypeBar, type SeriesPoint } from './_trace_plot.js';
import { DEFAULT_TRACE, loadTrace, TRACE_DEFAULTS } from './_trace_source.js';
import {
  applyWindow, distinctChunks, mapRequests, pooledEquivalent, parseTrace, parseWindow, promptIds, promptTokens, sampleConversations, sendTimes, simulate,
  type ReplayRequest, type SimResult,
} from '../harness/trace_model.js';

const MODEL = BUILTIN_MODELS.tiny!;
const MODES = ['round-robin', 'kv-aware'] as const;
type Mode = (typeof MODES)[number];
const WARMUP = 16;
/** A replayed request's own bound (the proxy's timeouts end it sooner when an engine hangs). */
const REQUEST_TIMEOUT_MS = 600_000;
/** The client: no undici header/body timeouts of its own (a prefill queue under a burst may take minutes), no connection cap. */
const CLIENT = new Agent({ headersTimeout: REQUEST_TIMEOUT_MS, bodyTimeout: REQUEST_TIMEOUT_MS, connections: null });

interface Options {
  /** Engine KV dtypes to run, each at the same tier size. */
  dtypes: string[];
  trace: string;
  prefillers: number;
  decoders: number;
  routing: Mode[];
  window: { start: number; count: number };
  sample: number;
  rate: number;
  blockTokens: number;
  tierFraction: number;
  maxOutputTokens: number;
  seed: number;
  kvUpArgs: string[];
}

const FLAGS = ['--trace', '--prefillers', '--decoders', '--routing', '--window', '--sample-conversations', '--rate', '--block-tokens', '--tier-fraction', '--max-output-tokens', '--seed', '--kv-up-args', '--kv-cache-dtypes'];

function options(argv: string[]): Options {
  const given = new Map<string, string>();
  for (let i = 0; i < argv.length; i++) {
    const f = argv[i]!;
    if (!FLAGS.includes(f)) throw new Error(`${f}: unknown option (expected one of ${FLAGS.join(', ')})`);
    const v = argv[++i];
    if (v === undefined) throw new Error(`${f}: expected a value`);
    if (given.has(f)) throw new Error(`${f}: given twice`);
    given.set(f, v);
  }
  const num = (f: string, def: number, ok: (n: number) => boolean, what: string): number => {
    const v = given.get(f);
    if (v === undefined) return def;
    const n = Number(v);
    if (v.trim() === '' || !Number.isFinite(n) || !ok(n)) throw new Error(`${f}: expected ${what}, found "${v}"`);
    return n;
  };
  const int = (n: number) => Number.isInteger(n);
  const trace = given.get('--trace') ?? DEFAULT_TRACE;
  const routing = (given.get('--routing') ?? MODES.join(',')).split(',').map((m) => m.trim());
  for (const m of routing) if (!(MODES as readonly string[]).includes(m)) throw new Error(`--routing: expected a comma list of ${MODES.join(', ')}, found "${m}"`);
  if (new Set(routing).size !== routing.length) throw new Error('--routing: a mode is listed twice');
  const dtypes = (given.get('--kv-cache-dtypes') ?? 'float32').split(',').map((d) => d.trim());
  for (const d of dtypes) if (!(KV_DTYPE_FLAGS as readonly string[]).includes(d)) throw new Error(`--kv-cache-dtypes: expected a comma list of ${KV_DTYPE_FLAGS.join(', ')}, found "${d}"`);
  if (new Set(dtypes).size !== dtypes.length) throw new Error('--kv-cache-dtypes: a dtype is listed twice');
  const kvUp = given.get('--kv-up-args');
  if (kvUp !== undefined && kvUp.trim() === '') throw new Error('--kv-up-args: expected the flags in one argument, e.g. --kv-up-args "--max-local-prefill-tokens 0"');
  return {
    trace,
    prefillers: num('--prefillers', 2, (n) => int(n) && n >= 0 && n <= 8, 'an integer 0..8'),
    decoders: num('--decoders', 2, (n) => int(n) && n >= 1 && n <= 8, 'an integer 1..8'),
    routing: routing as Mode[],
    window: parseWindow(given.get('--window') ?? TRACE_DEFAULTS.window),
    sample: num('--sample-conversations', TRACE_DEFAULTS.sample, (n) => n > 0 && n <= 1, 'a fraction in (0, 1]'),
    rate: num('--rate', TRACE_DEFAULTS.rate, (n) => n > 0, 'requests a second > 0'),
    blockTokens: num('--block-tokens', TRACE_DEFAULTS.blockTokens, (n) => int(n) && n >= 1 && n <= 512, 'an integer 1..512'),
    tierFraction: num('--tier-fraction', TRACE_DEFAULTS.tierFraction, (n) => n > 0 && n <= 10, 'a fraction > 0 (1: the tiers hold every distinct block)'),
    maxOutputTokens: num('--max-output-tokens', 16, (n) => int(n) && n >= 1 && n <= 1024, 'an integer 1..1024'),
    seed: num('--seed', 1, (n) => int(n) && n >= 0, 'an integer >= 0'),
    kvUpArgs: kvUp === undefined ? [] : kvUp.trim().split(/\s+/),
    dtypes,
  };
}

/** Bytes one full chunk of a KV dtype (--kv-cache-dtype value) takes in a CPU tier (payload + header, rounded up to the pool's size class). */
function chunkTierBytes(tokens: number, dtype = 'float32'): number {
  const layout = { dtype: headerDtypeOf(dtype), numLayers: MODEL.numLayers, numKvHeads: MODEL.numKvHeads, headDim: MODEL.headDim };
  return sizeClass(payloadBytes(layout, tokens) + HEADER_BYTES);
}

/** What the ledger (usage.kvc, docs/ledger.md) says about one request. */
export interface KvcUsage {
  predicted_cached_tokens: number;
  reused_tokens: number;
  computed_tokens: number;
  computed_chunks: Record<string, number>;
  instance: string | null;
}

interface Sent {
  ttft: number;
  /** Times from the start of the run at which the request was sent and its stream ended. */
  sentAt: number;
  endAt: number;
  /** Time from the start of the run at which the first token arrived. */
  doneAt: number;
  kvc: KvcUsage | null;
}

/** One streamed request through the proxy; the TTFT and the ledger of its final usage chunk. */
async function send(proxy: string, prompt: number[], maxTokens: number, t0: number): Promise<Sent> {
  const start = performance.now();
  const sentAt = start - t0;
  const res = await undiciFetch(`${proxy}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'builtin:tiny', prompt, max_tokens: maxTokens, temperature: 0, stream: true, stream_options: { include_usage: true } }),
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    dispatcher: CLIENT,
  });
  if (!res.ok || !res.body) throw new Error(`request failed: HTTP ${res.status} ${await res.text()}`);
  let first = 0;
  let doneAt = 0;
  let body = '';
  const dec = new TextDecoder();
  for await (const piece of res.body as unknown as AsyncIterable<Uint8Array>) {
    body += dec.decode(piece, { stream: true });
    if (!first && /data: \{/.test(body)) {
      first = performance.now() - start;
      doneAt = performance.now() - t0;
    }
  }
  if (!first) throw new Error(`stream ended without a token: ${body.slice(0, 300)}`);
  let kvc: KvcUsage | null = null;
  for (const line of body.split('\n')) {
    if (!line.startsWith('data: {')) continue;
    const o = JSON.parse(line.slice(6)) as { usage?: { kvc?: KvcUsage } | null };
    if (o.usage?.kvc) kvc = o.usage.kvc;
  }
  return { ttft: first, doneAt, kvc, sentAt, endAt: performance.now() - t0 };
}

interface EngineTotals {
  computed: number;
  p2pBytes: number;
  xferBytes: number;
  /** Its CPU tier when scraped: chunks, of them cold and replicas; copies declined and chunks evicted so far. */
  tier: number;
  cold: number;
  replicas: number;
  declined: number;
  evicted: number;
  /** P2P fetches by outcome and attempts ended early by reason. */
  p2pFetches: Map<string, number>;
  p2pFailures: Map<string, number>;
}

/**
 * The share of the tiers' chunks that duplicate a chunk held elsewhere, from the controller's index
 * (1 − distinct keys ÷ copies), sampled every 2 s while the replay runs; `stop()` gives the mean
 * over the samples taken once the tiers held anything and the last sample.
 */
function sampleDuplicates(controller: string): { stop(): Promise<{ mean: number; last: number; samples: number }> } {
  const shares: number[] = [];
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      try {
        const m = await scrape(controller);
        const copies = sum(m, 'kvc_controller_index_copies');
        if (copies > 0) shares.push(1 - sum(m, 'kvc_controller_index_keys') / copies);
      } catch { /* a late scrape misses one sample */ }
      await new Promise((res) => setTimeout(res, 2000));
    }
  })();
  return {
    async stop() {
      stopped = true;
      await loop;
      return { mean: shares.length ? shares.reduce((a, b) => a + b, 0) / shares.length : 0, last: shares.at(-1) ?? 0, samples: shares.length };
    },
  };
}

async function totals(d: Deployment): Promise<{ engines: Map<string, EngineTotals>; prefills: Map<string, number>; keepers: Map<string, number>; decisions: Map<string, number>; where: Map<string, number> }> {
  const engines = new Map<string, EngineTotals>();
  for (const e of d.engines) {
    const m = await scrape(e.http);
    engines.set(e.name, {
      computed: sum(m, 'kvc_engine_prompt_tokens_computed_total'),
      p2pBytes: sum(m, 'kvc_p2p_bytes_total'),
      xferBytes: sum(m, 'kvc_xfer_sent_bytes_total'),
      tier: sum(m, 'kvc_cache_chunks'),
      cold: sum(m, 'kvc_cache_cold_chunks'),
      replicas: sum(m, 'kvc_cache_replica_chunks'),
      declined: sum(m, 'kvc_cache_declined_copies_total'),
      evicted: sum(m, 'kvc_cache_evicted_chunks_total'),
      p2pFetches: byLabel(m, 'kvc_p2p_fetches_total', 'outcome'),
      p2pFailures: byLabel(m, 'kvc_p2p_failures_total', 'reason'),
    });
  }
  const pm = await scrape(d.proxy);
  const byInstance = byLabel(pm, 'kvc_proxy_prefills_total', 'instance');
  const prefills = new Map<string, number>();
  for (const e of d.engines) prefills.set(e.name, [...byInstance].filter(([k]) => k.startsWith(`${e.name}(`) || k === e.name).reduce((a, [, v]) => a + v, 0));
  return { engines, prefills, keepers: byLabel(pm, 'kvc_proxy_keepers_total', 'keeper'), decisions: byLabel(pm, 'kvc_proxy_routing_decisions_total', 'reason'), where: byLabel(pm, 'kvc_proxy_prefills_total', 'where') };
}

/** after − before of every key of two counter maps (keys with no change left out), as "k n, …". */
function delta(after: Map<string, number>, before: Map<string, number> | undefined): Map<string, number> {
  const out = new Map<string, number>();
  for (const [k, v] of after) if (v - (before?.get(k) ?? 0) !== 0) out.set(k, v - (before?.get(k) ?? 0));
  return out;
}

function addInto(into: Map<string, number>, from: Map<string, number>): void {
  for (const [k, v] of from) into.set(k, (into.get(k) ?? 0) + v);
}

const listed = (m: Map<string, number>) => [...m].sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(', ') || 'none';

interface ModeResult {
  mode: Mode;
  computedRatio: number;
  p50: number;
  p90: number;
  p99: number;
  shares: Map<string, number>;
  maxShare: number;
  p2pBytes: number;
  xferBytes: number;
  /** Computed chunks by reason (the ledger, summed over the responses), and those without one. */
  reasons: Map<string, number>;
  computedChunks: number;
  unexplained: number;
  predicted: number;
  reused: number;
  /** Cumulative computed ÷ sent of the requests whose first token had arrived, over time. */
  series: SeriesPoint[];
  /** Mean share of the tiers' chunks that duplicate one held elsewhere (controller's index, every 2 s). */
  duplicateShare: number;
}

/**
 * The requests that set the p90: the slowest tenth, each with where its prompt was computed, what
 * it computed and reused, and how many requests were in flight at the client when it was sent;
 * every request is written to bench-results/trace/requests-MODE.jsonl for a closer look.
 */
function tail(mode: Mode, reqs: ReplayRequest[], sent: Sent[], engines: string[]): void {
  const rows = sent.map((s, i) => ({
    i,
    at: Math.round(s.sentAt),
    ttft: Math.round(s.ttft),
    prompt: promptTokens(reqs[i]!),
    computed: s.kvc?.computed_tokens ?? null,
    reused: s.kvc?.reused_tokens ?? null,
    predicted: s.kvc?.predicted_cached_tokens ?? null,
    instance: s.kvc?.instance ?? null,
    inFlight: sent.filter((x, j) => j !== i && x.sentAt <= s.sentAt && x.endAt > s.sentAt).length,
  }));
  const file = join(resultsDir('trace'), `requests-${mode}.jsonl`);
  writeFileSync(file, rows.map((r) => JSON.stringify(r)).join('\n') + '\n');
  const slow = [...rows].sort((a, b) => b.ttft - a.ttft).slice(0, Math.max(1, Math.ceil(rows.length / 10)));
  const by = new Map<string, number>();
  for (const r of slow) by.set(r.instance ?? '?', (by.get(r.instance ?? '?') ?? 0) + 1);
  const mean = (f: (r: (typeof rows)[number]) => number, xs = rows) => xs.reduce((a, r) => a + f(r), 0) / Math.max(1, xs.length);
  console.log(
    `${''.padEnd(12)} slowest tenth (${slow.length}): computed on ${engines.filter((e) => [...by.keys()].some((k) => k.startsWith(e))).map((e) => `${e} ${[...by].filter(([k]) => k.startsWith(e)).reduce((a, [, v]) => a + v, 0)}`).join(', ') || 'unknown'}; ` +
      `mean computed ${mean((r) => r.computed ?? 0, slow).toFixed(0)} tokens (all ${mean((r) => r.computed ?? 0).toFixed(0)}), in flight at send ${mean((r) => r.inFlight, slow).toFixed(1)} (all ${mean((r) => r.inFlight).toFixed(1)}); ` +
      `${slow.map((r) => `#${r.i} ${r.ttft}ms ${r.instance ?? '?'} c${r.computed ?? '?'}`).join(', ')} (all: ${file})`,
  );
}

async function warm(d: Deployment, seed: number): Promise<void> {
  // Prompts of their own (hash ids past any trace's): short, one chunk, and a few chunks twice.
  const prompts: number[][] = [];
  for (let i = 0; i < WARMUP; i++) {
    const blocks = [1, 3, 8][i % 3]!;
    const base = 1e9 + Math.floor(i / 2) * 16;
    const r: ReplayRequest = { index: i, at: 0, chunks: Array.from({ length: blocks }, (_, b) => String(base + b)), chunkTokens: Array.from({ length: blocks }, () => 64), maxTokens: 4, droppedBlocks: 0 };
    prompts.push(promptIds(r, seed));
  }
  let next = 0;
  const t0 = performance.now();
  await Promise.all([0, 1].map(async () => {
    while (next < prompts.length) await send(d.proxy, prompts[next++]!, 4, t0);
  }));
  await clearTiers(d.controller, d.secret, d.engines.map((e) => e.name));
}

async function runMode(o: Options, mode: Mode, reqs: ReplayRequest[], tierGib: number, dtype: string, bound: SimResult): Promise<ModeResult> {
  const args = ['--routing', mode, '--chunk-size', String(o.blockTokens), '--max-local-cpu-size', tierGib.toFixed(9), '--kv-cache-dtype', dtype, ...(mode === 'kv-aware' ? o.kvUpArgs : [])];
  const d = await startDeployment({ prefillers: o.prefillers, decoders: o.decoders, args, env: { KVC_LOG_LEVEL: 'warn' }, startupTimeoutMs: 240_000 });
  try {
    await warm(d, o.seed);
    const before = await totals(d);
    const prompts = reqs.map((r) => promptIds(r, o.seed));
    const dup = sampleDuplicates(d.controller);
    const t0 = performance.now();
    const sent = await Promise.all(reqs.map(async (r, i) => {
      const wait = r.at - (performance.now() - t0);
      if (wait > 0) await new Promise((res) => setTimeout(res, wait));
      return send(d.proxy, prompts[i]!, r.maxTokens, t0);
    }));
    // Counters reach /metrics at once, but a decoder's last stores may still be under way: a
    // short pause so that the after-scrape sees every prefill the requests caused.
    await new Promise((res) => setTimeout(res, 500));
    const duplicates = await dup.stop();
    const after = await totals(d);
    const tokensSent = reqs.reduce((a, r) => a + promptTokens(r), 0);
    let computed = 0;
    let p2pBytes = 0;
    let xferBytes = 0;
    for (const [name, a] of after.engines) {
      const b = before.engines.get(name)!;
      computed += a.computed - b.computed;
      p2pBytes += a.p2pBytes - b.p2pBytes;
      xferBytes += a.xferBytes - b.xferBytes;
    }
    const shares = new Map<string, number>();
    for (const e of d.engines) shares.set(e.name, (after.prefills.get(e.name)! - before.prefills.get(e.name)!) / reqs.length);
    const ttfts = sent.map((s) => s.ttft).sort((a, b) => a - b);
    const reasons = new Map<string, number>();
    let computedChunks = 0;
    let predicted = 0;
    let reused = 0;
    let missingLedger = 0;
    for (const s of sent) {
      if (!s.kvc) {
        missingLedger++;
        continue;
      }
      predicted += s.kvc.predicted_cached_tokens;
      reused += s.kvc.reused_tokens;
      for (const [k, v] of Object.entries(s.kvc.computed_chunks)) {
        reasons.set(k, (reasons.get(k) ?? 0) + v);
        computedChunks += v;
      }
    }
    if (missingLedger) console.log(`  ${missingLedger} of ${sent.length} responses carried no usage.kvc`);
    // Over time: requests in the order their first token arrived; computed from the ledger when
    // every response has one, else each request's share of the engines' total by prompt size.
    const order = sent.map((s, i) => ({ s, r: reqs[i]! })).sort((a, b) => a.s.doneAt - b.s.doneAt);
    const series: SeriesPoint[] = [];
    let cs = 0;
    let cc = 0;
    const fallback = computed / tokensSent;
    for (const { s, r } of order) {
      cs += promptTokens(r);
      cc += s.kvc && !missingLedger ? s.kvc.computed_tokens : fallback * promptTokens(r);
      series.push({ series: mode, t: s.doneAt / 1000, ratio: cc / cs });
    }
    const unexplained = reasons.get('unexplained') ?? 0;
    tail(mode, reqs, sent, d.engines.map((e) => e.name));
    const res: ModeResult = {
      mode,
      computedRatio: computed / tokensSent,
      p50: pct(ttfts, 50),
      p90: pct(ttfts, 90),
      p99: pct(ttfts, 99),
      shares,
      maxShare: Math.max(...shares.values()),
      p2pBytes,
      xferBytes,
      reasons,
      computedChunks,
      unexplained,
      predicted,
      reused,
      series,
      duplicateShare: duplicates.mean,
    };
    const mib = (b: number) => (b / 2 ** 20).toFixed(1);
    console.log(
      `${mode.padEnd(12)} computed/sent ${res.computedRatio.toFixed(3)}  TTFT p50 ${res.p50.toFixed(0)} p90 ${res.p90.toFixed(0)} p99 ${res.p99.toFixed(0)} ms  ` +
        `prefills ${[...shares].map(([k, v]) => `${k} ${(100 * v).toFixed(0)}%`).join(', ')}  P2P ${mib(p2pBytes)} MiB  xfer ${mib(xferBytes)} MiB`,
    );
    console.log(
      `${''.padEnd(12)} ledger: predicted cached ${predicted} tokens, reused ${reused}; computed chunks ${computedChunks}: ` +
        `${[...reasons].sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v}`).join(', ') || 'none'}`,
    );
    console.log(
      `${''.padEnd(12)} duplicates: ${(100 * duplicates.mean).toFixed(1)}% of the tiers' chunks on average (${duplicates.samples} samples of the index), ${(100 * duplicates.last).toFixed(1)}% at the end; tiers at the end: ` +
        [...after.engines].map(([name, a]) => `${name} ${a.tier} (cold ${a.cold}, replicas ${a.replicas}; declined ${a.declined - before.engines.get(name)!.declined}, evicted ${a.evicted - before.engines.get(name)!.evicted})`).join(', '),
    );
    const kept = (k: string) => (after.keepers.get(k) ?? 0) - (before.keepers.get(k) ?? 0);
    console.log(`${''.padEnd(12)} keepers of transferred prompts (docs/storage.md): prefiller ${kept('prefiller')}, decoder ${kept('decoder')}`);
    const fetches = new Map<string, number>();
    const failures = new Map<string, number>();
    for (const [name, a] of after.engines) {
      addInto(fetches, delta(a.p2pFetches, before.engines.get(name)!.p2pFetches));
      addInto(failures, delta(a.p2pFailures, before.engines.get(name)!.p2pFailures));
    }
    console.log(
      `${''.padEnd(12)} routing decisions: ${listed(delta(after.decisions, before.decisions))}; prefills: ${listed(delta(after.where, before.where))}; ` +
        `P2P fetches: ${listed(fetches)}; ended early: ${listed(failures)}`,
    );
    // Where the reuse the pooled bound has was lost: computed chunks beyond the bound's, by reason.
    const beyond = new Map<string, number>();
    for (const [k, v] of reasons) beyond.set(k, v - (k in bound.reasons ? bound.reasons[k as keyof typeof bound.reasons] : 0));
    for (const k of Object.keys(bound.reasons)) if (!reasons.has(k)) beyond.set(k, -bound.reasons[k as keyof typeof bound.reasons]);
    console.log(`${''.padEnd(12)} computed chunks beyond the pooled bound's, by reason: ${[...beyond].sort((a, b) => b[1] - a[1]).map(([k, v]) => `${k} ${v >= 0 ? '+' : ''}${v}`).join(', ')}`);
    return res;
  } finally {
    await d.stop();
  }
}

async function main(): Promise<void> {
  const o = options(process.argv.slice(2));
  const src = loadTrace(o.trace, o.seed);
  const all = parseTrace(src.text, src.file);
  const sampled = sampleConversations(all, o.sample, o.seed);
  const window = applyWindow(sampled, o.window);
  const maxPrompt = MODEL.maxPositionEmbeddings - o.maxOutputTokens;
  const reqs = mapRequests(window, sendTimes(window, o.rate), { blockTokens: o.blockTokens, maxPromptTokens: maxPrompt, maxOutputTokens: o.maxOutputTokens });
  const engines = o.prefillers + o.decoders;
  const distinct = distinctChunks(reqs);
  const perEngine = Math.max(1, Math.ceil((o.tierFraction * distinct) / engines));
  const pooled = perEngine * engines;
  // Half a chunk more than the whole chunks, so that rounding GiB never loses one.
  const tierGib = (perEngine * chunkTierBytes(o.blockTokens) + chunkTierBytes(o.blockTokens) / 2) / 2 ** 30;
  const sentTokens = reqs.reduce((a, r) => a + promptTokens(r), 0);
  const dropped = reqs.reduce((a, r) => a + r.droppedBlocks, 0);
  const bound = simulate(reqs, pooled);
  const ceiling = simulate(reqs, Infinity);
  const span = reqs[reqs.length - 1]!.at / 1000;
  console.log(
    `trace bench: ${src.file}: ${all.length} requests${o.sample < 1 ? `, ${sampled.length} in the ${o.sample} of conversations sampled` : ''}; window ${o.window.start}:${o.window.count} = ${reqs.length} requests over ${span.toFixed(0)} s (${o.rate}/s), ` +
      `${sentTokens} prompt tokens (${o.blockTokens} a block${dropped ? `; ${dropped} blocks past the ${maxPrompt}-token context dropped` : ''}), ${distinct} distinct chunks; ` +
      `${o.prefillers}P${o.decoders}D, CPU tier ${perEngine} chunks (${(tierGib * 1024).toFixed(1)} MiB) per engine = ${pooled} in all (${((100 * pooled) / distinct).toFixed(0)}% of distinct)`,
  );
  const why = (x: SimResult) => `computed chunks: cold ${x.reasons.cold}, evicted ${x.reasons.evicted}, partial ${x.reasons.partial}`;
  console.log(`references on the same requests: pooled LRU of ${pooled} chunks computed/sent ${(bound.computed / bound.sent).toFixed(3)} (${why(bound)}); infinite cache ${(ceiling.computed / ceiling.sent).toFixed(3)} (${why(ceiling)})`);
  const results: ModeResult[] = [];
  const first = o.dtypes[0]!;
  // The same tier bytes hold more chunks of a smaller dtype: each dtype's pooled bound is simulated
  // for the chunks its tiers hold (printed before the runs: a window where they are all equal is
  // not capacity-bound and cannot show a dtype's effect).
  const perDtype = o.dtypes.map((dtype) => {
    const chunks = engines * Math.floor((tierGib * 2 ** 30) / chunkTierBytes(o.blockTokens, dtype));
    const sim = simulate(reqs, chunks);
    return { dtype, chunks, bound: sim.computed / sim.sent, sim, results: [] as ModeResult[] };
  });
  if (perDtype.length > 1) console.log(`pooled bound per dtype at this tier size: ${perDtype.map((x) => `${x.dtype} ${x.chunks} chunks ${x.bound.toFixed(3)}`).join(', ')}`);
  for (const x of perDtype) {
    if (perDtype.length > 1) console.log(`--kv-cache-dtype ${x.dtype}:`);
    for (const mode of o.routing) x.results.push(await runMode(o, mode, reqs, tierGib, x.dtype, x.sim));
    if (x.dtype === first) results.push(...x.results);
  }
  if (perDtype.length > 1) {
    const base = perDtype[0]!;
    for (const x of perDtype) {
      const own = (c: number) => (1 - c) / (1 - x.bound);
      const measured = x.results.map((r, i) => `${r.mode} ${r.computedRatio.toFixed(3)} (${(r.computedRatio / base.results[i]!.computedRatio).toFixed(3)} × ${first}'s; reuse ${own(r.computedRatio).toFixed(3)} × its bound's)`).join(', ');
      console.log(`${x.dtype.padEnd(9)} tiers ${x.chunks} chunks: pooled bound ${x.bound.toFixed(3)} (${(x.bound / base.bound).toFixed(3)} × ${first}'s); computed/sent ${measured}`);
    }
    const bars: DtypeBar[] = perDtype.flatMap((x) => [
      { dtype: x.dtype, series: 'pooled LRU bound', ratio: x.bound },
      ...x.results.map((r) => ({ dtype: x.dtype, series: r.mode, ratio: r.computedRatio })),
    ]);
    for (const x of perDtype) bars.push({ dtype: x.dtype, series: 'infinite ceiling', ratio: ceiling.computed / ceiling.sent });
    const dsvg = await writeDtypeSvg(join(resultsDir('trace'), 'trace_dtypes.svg'), `Trace replay per KV dtype: ${reqs.length} requests, ${(tierGib * 1024).toFixed(1)} MiB a tier`, bars);
    console.log(`plot: ${dsvg}`);
  }
  const ratio = (s: { computed: number; sent: number }) => s.computed / s.sent;
  // Reuse relative to the bound: (1 − computed/sent) ÷ (1 − bound's computed/sent).
  const reuse = (c: number) => (1 - c) / (1 - ratio(bound));
  for (const r of results) {
    const eq = pooledEquivalent(reqs, r.computedRatio);
    console.log(`${r.mode}: reuse ${reuse(r.computedRatio).toFixed(3)} x the pooled bound's; computed what one pooled LRU of ${eq === null ? '(none: below the ceiling)' : `${eq} chunks (${(eq / pooled).toFixed(2)} × the deployment's ${pooled})`} computes`);
  }
  const rr = results.find((r) => r.mode === 'round-robin');
  const kv = results.find((r) => r.mode === 'kv-aware');
  if (rr && kv) console.log(`kv-aware TTFT p90 ÷ round-robin's: ${(kv.p90 / rr.p90).toFixed(2)}`);
  // The plot: both modes' cumulative ratio, and the references at the send times of the requests.
  const points: SeriesPoint[] = results.flatMap((r) => r.series);
  for (const [name, sim] of [['pooled LRU bound', bound], ['infinite ceiling', ceiling]] as const) {
    let cs = 0;
    let cc = 0;
    reqs.forEach((r, i) => {
      cs += promptTokens(r);
      cc += sim.perRequest[i]!;
      points.push({ series: name, t: r.at / 1000, ratio: cc / cs });
    });
  }
  const svg = await writeTraceSvg(join(resultsDir('trace'), 'trace.svg'), `Trace replay: ${reqs.length} requests, ${o.prefillers}P${o.decoders}D, tiers ${(o.tierFraction * 100).toFixed(0)}% of distinct blocks`, points);
  console.log(`plot: ${svg}`);
  const r3 = (v: number | undefined) => (v === undefined ? null : Math.round(v * 1000) / 1000);
  const chunks = results.reduce((a, r) => a + r.computedChunks, 0);
  const unexplained = results.reduce((a, r) => a + r.unexplained, 0);
  console.log(JSON.stringify({
    bench: 'trace',
    requests: reqs.length,
    pooled_bound: r3(ratio(bound)),
    infinite_ceiling: r3(ratio(ceiling)),
    rr_computed: r3(rr?.computedRatio),
    kv_computed: r3(kv?.computedRatio),
    rr_p90_ms: rr ? Math.round(rr.p90) : null,
    kv_p90_ms: kv ? Math.round(kv.p90) : null,
    kv_max_share: r3(kv?.maxShare),
    rr_duplicate_share: r3(rr?.duplicateShare),
    kv_duplicate_share: r3(kv?.duplicateShare),
    unexplained_miss_share: chunks ? r3(unexplained / chunks) : null,
    // Per dtype (first = the figures above): tier chunks, pooled bound and computed ÷ sent per mode.
    dtypes: Object.fromEntries(perDtype.map((x) => [x.dtype, { tier_chunks: x.chunks, pooled_bound: r3(x.bound), ...Object.fromEntries(x.results.map((r) => [r.mode === 'round-robin' ? 'rr_computed' : 'kv_computed', r3(r.computedRatio)])) }])),
  }));
}

main().catch((e: unknown) => {
  const cause = (e as Error).cause as Error | undefined;
  console.error(`trace bench: ${(e as Error).message}${cause ? ` (${cause.message})` : ''}`);
  process.exit(1);
});
