// `npm run bench -- routing [--requests N] [--rate R] [--seed S]`: round-robin against kv-aware
// routing on a real 2P2D deployment (`kvc up`, built-in model), every engine's CPU tier sized to
// hold about 40 % of the workload's prefixes.
//
// Workload: 8 tenants, each with its own 1,024-token shared prefix; users send 32–96-token
// questions after it (token-id prompts, max_tokens 16, streamed), with Poisson arrivals. The
// same request sequence is replayed under round-robin and kv-aware (a fresh deployment each,
// after the same warm-up: `--warmup-requests N` requests of prompts of its own, default 48, so
// that every process has compiled its hot paths, whose chunks are then cleared from every tier
// unless `--keep-warmup-chunks`; then one request per tenant), then a skewed variant where tenant 0 sends
// half the requests. Reported per run: TTFT p50/p90 (client side, to the first streamed token),
// prompt tokens computed by the engines vs sent, the hit rate (prompt tokens no engine had to
// compute / sent), and each instance's share of prefills (the instance that computed
// the prompt: a prefiller, or the decoder when it prefilled locally).
//
// P2P (docs/p2p.md), in one kv-aware deployment of its own: recompute_ttft_ms is the TTFT of a
// request sent to prefiller-0 whose 1,024-token prefix nobody holds; p2p_ttft_ms the TTFT of the
// same prefix with another question sent to prefiller-1, which fetches the prefix's 4 chunks from
// prefiller-0 over P2P (medians of 3 pairs, alternating). `--only p2p|rr|kv|skew-rr|skew-kv` runs
// just that part (for diagnosis; each run prints where its prompt tokens came from, per engine,
// and how many copies of each prefix the deployment keeps). `--list-misses` also lists the
// requests whose prefix no instance held when they were sent. `--no-replica-hints` starts the
// deployments without the controller's replica hints (docs/storage.md), for an A/B;
// `--kv-up-args "<flags>"` adds `kvc up` flags to the kv-aware deployments (an A/B of a rule).
// The full run adds a reference without sharing: round-robin on engines started with `--no-p2p`
// (`rr no p2p`; JSON rr_no_p2p_*): every engine recomputes what its own tiers lack.
// Ends with one JSON line (see the end of main()) and writes bench-results/routing/routing.svg.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import * as vega from 'vega';
import { compile, type TopLevelSpec } from 'vega-lite';
import { PrefixClient } from '../src/proxy/prefix_client.js';
import { resultsDir } from './_plot.js';
import { breakdown, counters, ttftOf, up, type Deployment } from './_routing_deployment.js';
import { pct, scrape, sum } from './_scrape.js';
import { clearTiers } from '../harness/deployment.js';
import { mulberry32 } from '../harness/trace_model.js';

const TENANTS = 8;
const PREFIX = 1024;
/** Bytes of one 256-token chunk of the tiny model (f32, 4 layers, 2 KV heads × 32) plus its header. */
const CHUNK_BYTES = 2 * 4 * 256 * 64 * 4 + 64;
/** CPU tier per engine: about 40 % of the 8 prefixes (4 chunks each), in GiB. */
const CPU_GIB = (0.4 * TENANTS * (PREFIX / 256) * CHUNK_BYTES) / 2 ** 30;

/** `--no-replica-hints`: the deployment without the controller's replica hints (for A/B). */
const NO_REPLICA_HINTS = process.argv.includes('--no-replica-hints');

/**
 * `--warmup-requests N` (default 48, 0 for none): requests of the warm-up that is not the
 * workload's (warmPaths). A fresh deployment answers its first requests slower than later ones:
 * on an idle 2P2D, requests 2-10 with a 1,024-token prefix the decoder held had a TTFT of 60-68 ms
 * through the proxy, and 18-60 ms after a few dozen more (every process compiles its hot paths and
 * opens its connections as they are first used). With 64 timed requests spread over six processes,
 * that first use was part of what the timed requests measured. Its chunks are then cleared from
 * every tier (the controller's /clear), so that each run starts from empty tiers as before;
 * `--keep-warmup-chunks` keeps them (tiers already full of another workload's chunks).
 */
const WARMUP_REQUESTS = (() => {
  const i = process.argv.indexOf('--warmup-requests');
  if (i < 0) return 48;
  const v = Number(process.argv[i + 1]);
  if (!Number.isInteger(v) || v < 0) {
    console.error(`--warmup-requests: expected an integer >= 0, found "${process.argv[i + 1]}"`);
    process.exit(2);
  }
  return v;
})();
const KEEP_WARMUP_CHUNKS = process.argv.includes('--keep-warmup-chunks');
/**
 * `--kv-up-args "<flags>"`: more `kvc up` flags for the kv-aware deployments only (e.g.
 * `--max-local-prefill-tokens 0`), for an A/B of the routing rules in the same run. Split on
 * spaces; `kvc up` itself refuses a flag it does not know, so a typo stops the bench at start.
 */
const KV_UP_ARGS = (() => {
  const i = process.argv.indexOf('--kv-up-args');
  if (i < 0) return [];
  const v = process.argv[i + 1];
  if (v === undefined || v.trim() === '') {
    console.error('--kv-up-args: expected the flags in one argument, e.g. --kv-up-args "--max-local-prefill-tokens 0"');
    process.exit(2);
  }
  return v.trim().split(/\s+/);
})();
/** Prompt lengths of the warm-up, in turn: a short prompt (kv-aware prefills it on the decoder), a prefill on a prefiller, and a prefix of a whole 1,024 tokens plus a question. */
const WARMUP_LENGTHS = [48, 320, PREFIX + 64];

/** The `kvc up` flags of a deployment beyond its routing: the CPU tier, and the A/B flags above. */
function upArgs(routing: string, p2p: boolean): string[] {
  return ['--max-local-cpu-size', CPU_GIB.toFixed(6), ...(NO_REPLICA_HINTS ? ['--no-replica-hints'] : []), ...(p2p ? [] : ['--no-p2p']), ...(routing === 'kv-aware' ? KV_UP_ARGS : [])];
}

function arg(name: string, def: number): number {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return def;
  const v = Number(process.argv[i + 1]);
  if (!Number.isFinite(v) || v <= 0) {
    console.error(`--${name}: expected a positive number, found "${process.argv[i + 1]}"`);
    process.exit(2);
  }
  return v;
}

/** Deterministic PRNG: the same sequence in every run and every mode. */
const rng = mulberry32;

interface Req {
  at: number;
  tenant: number;
  prompt: number[];
}

function workload(seed: number, n: number, rate: number, skewed: boolean): { prefixes: number[][]; warmup: Req[]; reqs: Req[] } {
  const r = rng(seed);
  const tok = () => 100 + Math.floor(r() * 31000);
  const prefixes = Array.from({ length: TENANTS }, () => Array.from({ length: PREFIX }, tok));
  const question = () => Array.from({ length: 32 + Math.floor(r() * 65) }, tok);
  const warmup = prefixes.map((p, tenant) => ({ at: 0, tenant, prompt: [...p, ...question()] }));
  const reqs: Req[] = [];
  let t = 0;
  for (let i = 0; i < n; i++) {
    t += -Math.log(1 - r()) / rate; // exponential gaps: Poisson arrivals
    const tenant = skewed && r() < 0.5 ? 0 : Math.floor(r() * TENANTS);
    reqs.push({ at: t * 1000, tenant, prompt: [...prefixes[tenant]!, ...question()] });
  }
  return { prefixes, warmup, reqs };
}

interface RunResult {
  name: string;
  p50: number;
  p90: number;
  computedRatio: number;
  hitRate: number;
  shares: Record<string, number>;
  maxShare: number;
  /** kv-aware: the routing lookup's time (one prompt, 1,024 + 64 tokens), p50 ms; null for round-robin. */
  decisionP50: number | null;
}

/**
 * What routing adds to a request: the proxy's lookup on the controller (the same client and
 * call the proxy makes) for a workload prompt, 300 times in a row on the loaded deployment.
 * The cost function itself is a loop over four backends (microseconds).
 */
async function decisionTime(d: Deployment, prompt: number[]): Promise<number> {
  const c = new PrefixClient(d.controller, 1000);
  try {
    for (let i = 0; i < 20; i++) await c.lookup(prompt);
    const t: number[] = [];
    for (let i = 0; i < 300; i++) {
      const t0 = performance.now();
      await c.lookup(prompt);
      t.push(performance.now() - t0);
    }
    return pct(t.sort((a, b) => a - b), 50);
  } finally {
    await c.close();
  }
}

/**
 * Runs every path of the request flow before the timed part (see WARMUP_REQUESTS), the same
 * requests in every run: prompts no workload request shares a chunk with (their own random
 * tokens), two at a time, of the WARMUP_LENGTHS in turn; each long one after the first repeats the
 * previous long one's 1,024-token prefix with another question, so that a prefix is found held
 * (locally, or on a peer, depending on where the routing sends it). Their chunks take room in the
 * CPU tiers and are the first to be evicted by the workload's (least recently used).
 */
async function warmPaths(d: Deployment): Promise<void> {
  const r = rng(0x5eed);
  const tok = () => 100 + Math.floor(r() * 31000);
  let lastPrefix: number[] | null = null;
  const prompts: number[][] = [];
  for (let i = 0; i < WARMUP_REQUESTS; i++) {
    const len = WARMUP_LENGTHS[i % WARMUP_LENGTHS.length]!;
    if (len < PREFIX) {
      prompts.push(Array.from({ length: len }, tok));
      continue;
    }
    const prefix: number[] = lastPrefix ?? Array.from({ length: PREFIX }, tok);
    prompts.push([...prefix, ...Array.from({ length: len - PREFIX }, tok)]);
    // Pairs: a new prefix, then the same prefix again.
    lastPrefix = lastPrefix ? null : prefix;
  }
  let next = 0;
  await Promise.all([0, 1].map(async () => {
    while (next < prompts.length) await ttftOf(d.proxy, prompts[next++]!);
  }));
  if (!KEEP_WARMUP_CHUNKS) await clearTiers(d.controller, d.secret, d.engines.map((e) => e.name));
}

async function run(name: string, routing: string, w: ReturnType<typeof workload>, p2p = true): Promise<RunResult> {
  const d = await up(routing, upArgs(routing, p2p));
  try {
    await warmPaths(d);
    // Then one request per tenant, one at a time (the same in every run).
    for (const q of w.warmup) await ttftOf(d.proxy, q.prompt);
    const before = await counters(d);
    const t0 = performance.now();
    // Every 2 s, where each tenant's whole prefix is held (the controller's index): how many
    // copies the deployment keeps per prefix, and how often a prefix is held nowhere.
    const copies = { samples: 0, copies: 0, nowhere: 0 };
    let sampling = true;
    const sampler = (async () => {
      const c = new PrefixClient(d.controller, 1000);
      try {
        while (sampling) {
          await new Promise((r) => setTimeout(r, 2000));
          for (const p of w.prefixes) {
            const held = await c.lookup(p).catch(() => null);
            if (!held) continue;
            const n = Object.values(held.instances).filter((t) => t >= PREFIX).length;
            copies.samples++;
            copies.copies += n;
            if (n === 0) copies.nowhere++;
          }
        }
      } finally {
        await c.close();
      }
    })();
    // --list-misses: before each request, ask the index whether anyone holds its tenant's prefix.
    const probe = process.argv.includes('--list-misses') ? new PrefixClient(d.controller, 1000) : null;
    const lastAt = new Map<number, number>();
    const misses: string[] = [];
    const ttfts = await Promise.all(
      w.reqs.map(async (q, i) => {
        const wait = q.at - (performance.now() - t0);
        if (wait > 0) await new Promise((r) => setTimeout(r, wait));
        if (probe) {
          const h = await probe.lookup(w.prefixes[q.tenant]!).catch(() => null);
          const prev = lastAt.get(q.tenant);
          lastAt.set(q.tenant, q.at);
          if (h && Object.values(h.instances).every((t) => t === 0)) misses.push(`#${i} t${q.tenant} (its previous request: ${prev === undefined ? 'the warm-up' : `${((q.at - prev) / 1000).toFixed(1)} s earlier`})`);
        }
        return ttftOf(d.proxy, q.prompt);
      }),
    );
    if (probe) {
      await probe.close();
      console.log(`  prefix held nowhere when sent: ${misses.join(', ') || 'none'}`);
    }
    sampling = false;
    await sampler;
    const after = await counters(d);
    breakdown(before, after, w.reqs.length);
    if (copies.samples) {
      console.log(`  copies per prefix (whole ${PREFIX} tokens, index every 2 s): mean ${(copies.copies / copies.samples).toFixed(2)}, held nowhere ${((100 * copies.nowhere) / copies.samples).toFixed(0)}% of ${copies.samples} samples`);
    }
    // The tail that sets p90: which requests (index, tenant) were slowest.
    const slow = ttfts.map((ms, i) => ({ ms, i })).sort((a, b) => b.ms - a.ms).slice(0, Math.ceil(w.reqs.length / 8));
    console.log(`  slowest: ${slow.map((x) => `#${x.i} t${w.reqs[x.i]!.tenant} ${x.ms.toFixed(0)}ms`).join(', ')}`);
    const decisionP50 = routing === 'kv-aware' ? await decisionTime(d, w.reqs[0]!.prompt) : null;
    const sent = w.reqs.reduce((a, q) => a + q.prompt.length, 0);
    const sorted = [...ttfts].sort((a, b) => a - b);
    const shares: Record<string, number> = {};
    for (const e of d.engines) shares[e.name] = (after.prefills.get(e.name)! - before.prefills.get(e.name)!) / w.reqs.length;
    const r: RunResult = {
      name,
      p50: pct(sorted, 50),
      p90: pct(sorted, 90),
      computedRatio: (after.computed - before.computed) / sent,
      // Prompt tokens no engine had to compute (a decoder loading what a prefiller computed for
      // it does not count twice): 1 − computed/sent.
      hitRate: 1 - (after.computed - before.computed) / sent,
      shares,
      maxShare: Math.max(...Object.values(shares)),
      decisionP50,
    };
    console.log(
      `${name.padEnd(14)} TTFT p50 ${r.p50.toFixed(0).padStart(6)} ms  p90 ${r.p90.toFixed(0).padStart(6)} ms  computed/sent ${r.computedRatio.toFixed(3)}  ` +
        `hit rate ${(100 * r.hitRate).toFixed(1)}%${decisionP50 === null ? '' : `  routing lookup p50 ${decisionP50.toFixed(3)} ms`}  shares ${Object.entries(shares).map(([k, v]) => `${k} ${(100 * v).toFixed(0)}%`).join(', ')}`,
    );
    return r;
  } finally {
    await d.stop();
  }
}

interface P2pResult {
  recompute: number;
  p2p: number;
  /** Chunks prefiller-1 received over P2P during the p2p requests (4 per request when it works). */
  chunks: number;
}

/**
 * TTFT of a request whose 1,024-token prefix no instance holds, against the same prefix fetched
 * by P2P from the instance that computed it. Requests go straight to the engines (not through
 * the proxy) so that which engine computes and which fetches is fixed.
 */
async function p2pTtft(seed: number): Promise<P2pResult> {
  const d = await up('kv-aware', upArgs('kv-aware', true));
  try {
    const [computer, fetcher] = [d.engines[0]!, d.engines[1]!];
    const r = rng(seed + 99);
    const tok = () => 100 + Math.floor(r() * 31000);
    // Warm both engines (model pages, buffers, the peer connection path).
    for (const e of [computer, fetcher]) await ttftOf(e.url, Array.from({ length: 64 }, tok));
    const chunks0 = sum(await scrape(fetcher.url), 'kvc_p2p_chunks_total');
    const rec: number[] = [];
    const p2p: number[] = [];
    for (let i = 0; i < 3; i++) {
      const prefix = Array.from({ length: PREFIX }, tok);
      rec.push(await ttftOf(computer.url, [...prefix, ...Array.from({ length: 48 }, tok)]));
      // The computer's chunks reach the controller's index within a few ms; wait for them.
      const deadline = Date.now() + 30_000;
      for (;;) {
        const held = (await fetch(`${d.controller}/prefix_lookup`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ tokens: prefix }), signal: AbortSignal.timeout(5_000) })
          .then((res) => res.json())
          .catch(() => null)) as { instances: Record<string, number> } | null;
        if (held && (held.instances[computer.name] ?? 0) >= PREFIX) break;
        if (Date.now() > deadline) throw new Error(`the controller did not index ${computer.name}'s prefix within 30 s`);
        await new Promise((res) => setTimeout(res, 20));
      }
      p2p.push(await ttftOf(fetcher.url, [...prefix, ...Array.from({ length: 48 }, tok)]));
    }
    const chunks = sum(await scrape(fetcher.url), 'kvc_p2p_chunks_total') - chunks0;
    const med = (v: number[]) => v.sort((a, b) => a - b)[1]!;
    return { recompute: med(rec), p2p: med(p2p), chunks };
  } finally {
    await d.stop();
  }
}

async function plot(file: string, rows: RunResult[]): Promise<void> {
  const values = rows.flatMap((r) => [
    { run: r.name, figure: 'TTFT p50', ms: Math.round(r.p50) },
    { run: r.name, figure: 'TTFT p90', ms: Math.round(r.p90) },
  ]);
  const spec: TopLevelSpec = {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    title: 'Routing: TTFT, round-robin vs kv-aware (2P2D, 8 tenants x 1,024-token prefix)',
    data: { values },
    mark: 'bar',
    encoding: {
      x: { field: 'run', type: 'nominal', title: null, sort: rows.map((r) => r.name) },
      xOffset: { field: 'figure' },
      y: { field: 'ms', type: 'quantitative', title: 'ms' },
      color: { field: 'figure', type: 'nominal', title: null },
    },
    width: 420,
    height: 260,
  };
  const view = new vega.View(vega.parse(compile(spec).spec), { renderer: 'none' });
  writeFileSync(file, await view.toSVG());
}

const PARTS = ['p2p', 'rr', 'kv', 'skew-rr', 'skew-kv', 'rr-no-p2p'] as const;
type Part = (typeof PARTS)[number];

/** `--only p2p|rr|kv|skew-rr|skew-kv|rr-no-p2p`: one part of the bench (diagnosis; the targets need the full run). */
function onlyPart(): Part | null {
  const i = process.argv.indexOf('--only');
  if (i < 0) return null;
  const v = process.argv[i + 1];
  if (!PARTS.includes(v as Part)) {
    console.error(`--only: expected one of ${PARTS.join(', ')} (run only that part), found "${v ?? ''}"`);
    process.exit(2);
  }
  return v as Part;
}

async function runP2p(seed: number): Promise<P2pResult> {
  const p = await p2pTtft(seed);
  console.log(
    `1,024-token prefix: recomputed TTFT ${p.recompute.toFixed(0)} ms, fetched by P2P TTFT ${p.p2p.toFixed(0)} ms (x${(p.p2p / p.recompute).toFixed(3)}, target <= 0.25); ` +
      `${p.chunks} chunks arrived over P2P (expected ${3 * (PREFIX / 256)})`,
  );
  return p;
}

async function main(): Promise<void> {
  const r2 = (v: number) => Math.round(v * 100) / 100;
  const only = onlyPart();
  if (only === 'p2p') {
    const seed = Math.round(arg('seed', 11));
    const p = await runP2p(seed);
    console.log(JSON.stringify({ bench: 'routing', p2p_ttft_ms: r2(p.p2p), recompute_ttft_ms: r2(p.recompute), p2p_chunks: p.chunks }));
    return;
  }
  const n = Math.round(arg('requests', 64));
  const rate = arg('rate', 0.75);
  const seed = Math.round(arg('seed', 11));
  console.log(`routing bench: 2P2D builtin:tiny, ${TENANTS} tenants x ${PREFIX}-token prefix, ${n} requests at ${rate}/s (Poisson), CPU tier ${(CPU_GIB * 1024).toFixed(1)} MiB per engine (~40% of the prefixes); each deployment first serves ${WARMUP_REQUESTS} warm-up requests of its own prompts (${KEEP_WARMUP_CHUNKS ? 'their chunks kept' : 'their chunks then cleared'}), then one per tenant`);
  const uniform = workload(seed, n, rate, false);
  const skew = workload(seed, n, rate, true);
  if (only !== null) {
    const [name, routing, w, p2p] = ({ rr: ['round-robin', 'round-robin', uniform, true], kv: ['kv-aware', 'kv-aware', uniform, true], 'skew-rr': ['skew rr', 'round-robin', skew, true], 'skew-kv': ['skew kv', 'kv-aware', skew, true], 'rr-no-p2p': ['rr no p2p', 'round-robin', uniform, false] } as const)[only];
    const r = await run(name, routing, w, p2p);
    console.log(JSON.stringify({ bench: 'routing', part: only, ttft_p50_ms: r2(r.p50), ttft_p90_ms: r2(r.p90), computed_ratio: r2(r.computedRatio), max_share: r2(r.maxShare) }));
    return;
  }
  const rr = await run('round-robin', 'round-robin', uniform);
  const kv = await run('kv-aware', 'kv-aware', uniform);
  const srr = await run('skew rr', 'round-robin', skew);
  const skv = await run('skew kv', 'kv-aware', skew);
  // The reference without sharing: round-robin on engines that do not fetch from each other
  // (`kvc up --no-p2p`), i.e. a deployment that does not use the controller's index to serve.
  const rrAlone = await run('rr no p2p', 'round-robin', uniform, false);
  const p2p = await runP2p(seed);
  const fair = 1 / 4;
  console.log(
    `targets: kv p90 <= 0.33 x rr p90: ${(kv.p90 / rr.p90).toFixed(2)}; computed kv/rr <= 0.5: ${(kv.computedRatio / rr.computedRatio).toFixed(2)}; ` +
      `skew kv p90 <= skew rr p90: ${(skv.p90 / srr.p90).toFixed(2)}; skew max share <= 2 x fair (${2 * fair}): ${skv.maxShare.toFixed(2)}`,
  );
  console.log(
    `against round-robin without P2P (engines that share nothing): kv p90 ${(kv.p90 / rrAlone.p90).toFixed(2)} x, computed ${(kv.computedRatio / rrAlone.computedRatio).toFixed(2)} x`,
  );
  const out = resultsDir('routing');
  mkdirSync(out, { recursive: true });
  await plot(join(out, 'routing.svg'), [rrAlone, rr, kv, srr, skv]);
  console.log(`plot: ${join(out, 'routing.svg')}`);
  console.log(
    JSON.stringify({
      bench: 'routing',
      rr_ttft_p90_ms: r2(rr.p90),
      kv_ttft_p90_ms: r2(kv.p90),
      rr_computed_ratio: r2(rr.computedRatio),
      kv_computed_ratio: r2(kv.computedRatio),
      kv_max_share: r2(skv.maxShare),
      skew_rr_ttft_p90_ms: r2(srr.p90),
      skew_kv_ttft_p90_ms: r2(skv.p90),
      p2p_ttft_ms: r2(p2p.p2p),
      recompute_ttft_ms: r2(p2p.recompute),
      rr_no_p2p_ttft_p90_ms: r2(rrAlone.p90),
      rr_no_p2p_computed_ratio: r2(rrAlone.computedRatio),
      routing_decision_p50_ms: Math.round(kv.decisionP50! * 1000) / 1000,
    }),
  );
}

main().catch((e: unknown) => {
  console.error((e as Error).stack ?? String(e));
  process.exit(1);
});
