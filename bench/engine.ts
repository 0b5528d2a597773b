// `npm run bench -- engine`: the engine end to end over HTTP with the built-in model.
//   prefill tokens/s   1024-token prompt, max_tokens 1 (time to first token)
//   decode tokens/s    128 tokens at batch 1 and batch 8, measured as the difference between
//                      128-token and 1-token requests (so prefill and HTTP cancel out), medians of 3
//   TTFT cold / warm   a 2048-token prompt, then the same prompt with its KV in LocalCPUBackend
//   GEMM               the kernel prefill uses vs a plain-JS matmul, same shape, same run
//   HTTP step cost     per decode step at batch 8 (8 streams), the median gap between forward calls
//                      (with sampling done inside them), and HTTP step − the same forward in a
//                      plain loop (bench/_http_step.ts); with `--baseline DIR` (a built older checkout) the
//                      same figure for that tree, alternated in the same run, and the ratio
// Options: `--baseline DIR`; `--only http-step` runs just the step-cost part, `--only kv-dtype` just
// decode at 2,048 and 4,096 tokens per KV dtype, with llama.cpp's own F32/F16/Q8_0 KV beside (bench/_kv_dtype.ts).
// Last line: one JSON object with every figure (targets: docs/engine.md).
import { kvDtypeDecode } from './_kv_dtype.js';
import { validateCacheConfig } from '../src/common/config.js';
import { measureGemm } from '../src/engine/model/kernels/gemm_bench.js';
import { startEngine, type Engine } from '../src/engine/server.js';
import { readStreamTtft } from './_stream_ttft.js';
import { measureStepCost, type StepCost } from './_http_step.js';
import { resultsDir, writeBarsSvg } from './_plot.js';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join, resolve } from 'node:path';

const MODEL = 'builtin:tiny';
const prompt = (n: number, salt: number) => Array.from({ length: n }, (_, i) => 1000 + ((i * 7919 + salt * 104729) % 30000));

async function complete(e: Engine, p: number[], maxTokens: number): Promise<number> {
  const t = performance.now();
  const r = await fetch(`${e.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: p, max_tokens: maxTokens, temperature: 0, ignore_eos: true }),
    signal: AbortSignal.timeout(600_000),
  });
  const j = (await r.json()) as { usage?: { completion_tokens: number }; error?: { message: string } };
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${j.error?.message}`);
  if (j.usage!.completion_tokens !== maxTokens) throw new Error(`expected ${maxTokens} tokens, got ${j.usage!.completion_tokens}`);
  return performance.now() - t;
}

/** Time to the first streamed token. */
async function ttft(e: Engine, p: number[]): Promise<number> {
  const t = performance.now();
  const r = await fetch(`${e.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: p, max_tokens: 2, temperature: 0, ignore_eos: true, stream: true }),
    signal: AbortSignal.timeout(600_000),
  });
  const { first } = await readStreamTtft(r, t);
  return first;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

function parseArgs(argv: string[]): { baseline: string | null; onlyStep: boolean; onlyKv: boolean } {
  let baseline: string | null = null;
  let onlyStep = false;
  let onlyKv = false;
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--baseline') {
      const d = argv[++i];
      if (!d) throw new Error('--baseline: expected the root of a built kvc checkout');
      baseline = resolve(d);
      if (!existsSync(join(baseline, 'dist/src/engine/server.js'))) throw new Error(`--baseline ${d}: no dist/src/engine/server.js there (build that tree first)`);
    } else if (a === '--only') {
      const v = argv[++i];
      if (v === 'kv-dtype') onlyKv = true;
      else if (v === 'http-step') onlyStep = true;
      else throw new Error(`--only: expected "http-step" or "kv-dtype", found ${JSON.stringify(v ?? '')}`);
    } else {
      throw new Error(`unknown argument ${JSON.stringify(a)} (expected --baseline DIR, --only http-step|kv-dtype)`);
    }
  }
  return { baseline, onlyStep, onlyKv };
}

const ms2 = (x: number) => Number(x.toFixed(2));

/** The per-step HTTP cost at batch 8 of this tree (and of the baseline tree, same run). */
async function stepCost(baseline: string | null): Promise<Record<string, number | null>> {
  const here = fileURLToPath(new URL('../..', import.meta.url));
  const trees = [{ label: 'this', root: here }, ...(baseline ? [{ label: 'baseline', root: baseline }] : [])];
  const r = await measureStepCost(trees);
  const line = (label: string, c: StepCost) =>
    console.log(
      `HTTP step cost at batch 8 (${label}): step gap ${c.overheadMs.toFixed(2)} ms (median); HTTP step ${c.httpMs.toFixed(2)} ms − direct forward ${c.directMs.toFixed(2)} ms = ${c.overheadDirectMs.toFixed(2)} ms ` +
        `(− forward call inside it ${c.forwardMs.toFixed(2)} ms = ${c.overheadInsideMs.toFixed(2)} ms); engine CPU ${c.httpCpuMs.toFixed(2)} − ${c.directCpuMs.toFixed(2)} = ${c.overheadCpuMs.toFixed(2)} ms per step`,
    );
  const mine = r.get('this')!;
  line('this tree', mine);
  const base = r.get('baseline');
  if (base) {
    line(`baseline ${baseline}`, base);
    console.log(
      `HTTP step cost ratio this ÷ baseline: step gap ${(mine.overheadMs / base.overheadMs).toFixed(2)} (target ≤ 0.5); HTTP − direct ${(mine.overheadDirectMs / base.overheadDirectMs).toFixed(2)}, CPU ${(mine.overheadCpuMs / base.overheadCpuMs).toFixed(2)}`,
    );
  } else {
    console.log('HTTP step cost: no --baseline given, so no ratio');
  }
  const bars = [...r].flatMap(([label, c]) => [
    { panel: 'step gap (headline)', series: label, value: ms2(c.overheadMs) },
    { panel: 'HTTP step − plain-loop forward', series: label, value: ms2(c.overheadDirectMs) },
    { panel: 'engine CPU outside the forward', series: label, value: ms2(c.overheadCpuMs) },
  ]);
  const svg = await writeBarsSvg(join(resultsDir('engine'), 'http_step.svg'), 'Per-step cost at batch 8 outside the model (ms, medians)', bars, 'ms per step');
  console.log(`plot: ${svg}`);
  return {
    http_step_overhead_ms: ms2(mine.overheadMs),
    http_step_overhead_cpu_ms: ms2(mine.overheadCpuMs),
    http_step_forward_ms: ms2(mine.forwardMs),
    http_step_direct_ms: ms2(mine.directMs),
    http_step_overhead_direct_ms: ms2(mine.overheadDirectMs),
    http_step_overhead_inside_ms: ms2(mine.overheadInsideMs),
    baseline_http_step_overhead_direct_ms: base ? ms2(base.overheadDirectMs) : null,
    baseline_http_step_overhead_inside_ms: base ? ms2(base.overheadInsideMs) : null,
    baseline_http_step_overhead_ms: base ? ms2(base.overheadMs) : null,
    baseline_http_step_overhead_cpu_ms: base ? ms2(base.overheadCpuMs) : null,
    http_step_ratio: base ? ms2(mine.overheadMs / base.overheadMs) : null,
    http_step_direct_ratio: base ? ms2(mine.overheadDirectMs / base.overheadDirectMs) : null,
    http_step_cpu_ratio: base ? ms2(mine.overheadCpuMs / base.overheadCpuMs) : null,
  };
}

async function main(): Promise<void> {
  const args = parseArgs(process.argv.slice(2));
  if (args.onlyKv) {
    console.log(JSON.stringify({ bench: 'engine', ...(await kvDtypeDecode()) }));
    return;
  }
  if (args.onlyStep) {
    console.log(JSON.stringify({ bench: 'engine', ...(await stepCost(args.baseline)) }));
    return;
  }
  const g = await measureGemm(512, 1536, 256, 5);
  console.log(`GEMM 512x1536x256 (prefill's gate/up projection): kernel ${g.kernel} ${g.kernelGflops.toFixed(2)} GFLOP/s, plain JS ${g.jsGflops.toFixed(2)} GFLOP/s (x${(g.kernelGflops / g.jsGflops).toFixed(1)})`);

  const e = await startEngine({
    model: MODEL,
    maxNumSeqs: 8,
    maxNumBatchedTokens: 512,
    kvTransferConfig: { kv_connector: 'KvcConnectorV1', kv_role: 'kv_both', kv_connector_extra_config: { discard_partial_chunks: false, skip_last_n_tokens: 0 } },
    cacheConfig: validateCacheConfig({ chunk_size: 256, local_cpu: true, max_local_cpu_size: 2 }).config,
    // The bench prints its own figures; the engine's request and statistics lines would only interleave.
    logRequests: false,
    logStats: false,
  });
  let out: Record<string, unknown> = {};
  try {
    // Warm-up: JIT and first-touch of buffers.
    await complete(e, prompt(256, 99), 8);

    const prefillRuns: number[] = [];
    for (let i = 0; i < 3; i++) prefillRuns.push(await ttft(e, prompt(1024, 10 + i)));
    const prefillMs = median(prefillRuns);
    const prefillTps = 1024 / (prefillMs / 1000);
    console.log(`prefill: 1024-token prompt, TTFT ${prefillMs.toFixed(0)} ms → ${prefillTps.toFixed(0)} tokens/s`);

    // Decode figures are medians of 3 (this VM's neighbours make single runs swing by a third).
    const d1a = median([await complete(e, prompt(32, 20), 1), await complete(e, prompt(32, 22), 1), await complete(e, prompt(32, 24), 1)]);
    const d1b = median([await complete(e, prompt(32, 21), 128), await complete(e, prompt(32, 23), 128), await complete(e, prompt(32, 25), 128)]);
    const decodeTps = 127 / ((d1b - d1a) / 1000);
    console.log(`decode batch 1: 128 tokens in ${d1b.toFixed(0)} ms (1 token: ${d1a.toFixed(0)} ms) → ${decodeTps.toFixed(1)} tokens/s`);

    const wall = async (salt: number, maxTokens: number) => {
      const t = performance.now();
      await Promise.all(Array.from({ length: 8 }, (_, i) => complete(e, prompt(32, salt + i), maxTokens)));
      return performance.now() - t;
    };
    const d8a = median([await wall(30, 1), await wall(50, 1), await wall(70, 1)]);
    const d8b = median([await wall(40, 128), await wall(60, 128), await wall(80, 128)]);
    const decodeTps8 = (8 * 127) / ((d8b - d8a) / 1000);
    console.log(`decode batch 8: 8 x 128 tokens in ${d8b.toFixed(0)} ms (8 x 1 token: ${d8a.toFixed(0)} ms) → ${decodeTps8.toFixed(1)} tokens/s (x${(decodeTps8 / decodeTps).toFixed(1)} batch 1)`);

    const long = prompt(2048, 77);
    const cold = await ttft(e, long);
    // The first request stored its chunks before answering; the second loads all but the last token.
    const loadedBefore = (await e.metrics.tokensLoaded.get()).values[0]?.value ?? 0;
    const warmRuns: number[] = [];
    for (let i = 0; i < 3; i++) warmRuns.push(await ttft(e, long));
    const warm = median(warmRuns);
    const loaded = ((await e.metrics.tokensLoaded.get()).values[0]?.value ?? 0) - loadedBefore;
    console.log(`TTFT 2048-token prompt: cold ${cold.toFixed(0)} ms, warm (LocalCPUBackend) ${warm.toFixed(1)} ms (x${(cold / warm).toFixed(0)}; ${loaded / warmRuns.length} tokens loaded per warm request)`);

    out = {
      bench: 'engine',
      prefill_tps: Math.round(prefillTps),
      decode_tps: Number(decodeTps.toFixed(1)),
      decode_tps_batch8: Number(decodeTps8.toFixed(1)),
      ttft_cold_ms: Number(cold.toFixed(1)),
      ttft_warm_ms: Number(warm.toFixed(1)),
      kernel_gflops: Number(g.kernelGflops.toFixed(2)),
      js_baseline_gflops: Number(g.jsGflops.toFixed(2)),
    };
  } finally {
    await e.close();
  }
  console.log(JSON.stringify({ ...out, ...(await stepCost(args.baseline)), ...(await kvDtypeDecode([2048])) }));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
