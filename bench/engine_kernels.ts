// `npm run bench -- engine_kernels`: the model's compute kernels in isolation (no server):
// GEMM rate of the kernel prefill uses vs the plain-JS triple loop, single- and two-threaded,
// the FMA kernel against the mul+add one (one thread each, interleaved; fma.ts), the kernel on
// each GEMM shape of the 156M model's 512-token prefill (1 and 2 threads; gemm_bench.ts),
// then prefill and decode rates of the built-in model straight through LlamaModel.forward (a
// 512-token prefill at one and at two kernel threads as well), and where a 512-token prefill's
// time goes per operation class at one and at two threads (the built-in model, and the 156M
// model of `bench peer` when bench/.peer/models/ holds it): wall ms per class and the second
// thread's speed-up on each.
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureBuiltinModel } from '../src/engine/model/formats/builtin.js';
import type { Kernel } from '../src/engine/model/kernels/kernel.js';
import { measureGemm, measureGemmFma, measureGemmShapes, PREFILL_156M_SHAPES } from '../src/engine/model/kernels/gemm_bench.js';
import { LlamaModel } from '../src/engine/model/model.js';

const MiB = 1024 * 1024;
const prompt = (n: number, salt: number) => Array.from({ length: n }, (_, i) => 3 + ((i * 7919 + salt * 104729) % 31000));
const BIG_DIR = join(resolve(dirname(fileURLToPath(import.meta.url)), '..', '..'), 'bench', '.peer', 'models', 'random-156m-v1');

/** The kernel operations timed per class (wall clock, main thread: a shared call's wall time includes the worker's part). */
const PROFILED = ['matmul', 'matmulSwiglu', 'attendStagedHeads', 'swiglu', 'rmsNorm', 'rope', 'addInto', 'copyRows', 'stageKv'] as const;

/**
 * Where a 512-token prefill's time goes: a model at 1 and at 2 threads, forwards alternating
 * (rep 0 warms up), each kernel call timed by class (matmul by its shape m×n×k); "rest" is the
 * forward's time outside them (JS bookkeeping, K/V writes into the cache, the embedding rows).
 * Returns per thread count the median ms per class and of the whole forward.
 */
async function profilePrefill(dir: string, reps: number): Promise<Record<1 | 2, Record<string, number>>> {
  const out = {} as Record<1 | 2, Record<string, number>>;
  const models = { 1: await LlamaModel.load(dir, { threads: 1 }), 2: await LlamaModel.load(dir, { threads: 2 }) };
  const samples = { 1: [] as Record<string, number>[], 2: [] as Record<string, number>[] };
  for (const th of [1, 2] as const) {
    const g = models[th].kernel as unknown as Record<string, (...a: unknown[]) => unknown>;
    for (const name of PROFILED) {
      const f = g[name]!.bind(g);
      g[name] = (...a: unknown[]) => {
        const t = performance.now();
        const r = f(...a);
        const cur = samples[th].at(-1);
        if (cur) {
          const w = a[0] as { n: number; k: number };
          const key = name === 'matmul' ? `matmul ${a[2]}x${w.n}x${w.k}` : name === 'matmulSwiglu' ? `gate|up+SwiGLU ${a[2]}x${w.n}x${w.k}` : name;
          cur[key] = (cur[key] ?? 0) + performance.now() - t;
        }
        return r;
      };
    }
  }
  const kvs = { 1: models[1].createKvCache(256 * MiB), 2: models[2].createKvCache(256 * MiB) };
  for (let rep = 0; rep <= reps; rep++) {
    for (const th of rep % 2 ? ([2, 1] as const) : ([1, 2] as const)) {
      (globalThis as { gc?: () => void }).gc?.();
      const cur: Record<string, number> = {};
      if (rep > 0) samples[th].push(cur);
      const t = performance.now();
      models[th].forward([{ seqId: 'p', tokens: prompt(512, 5), startPos: 0, wantLogits: true }], kvs[th], { transientLogits: true });
      cur['total'] = performance.now() - t;
      kvs[th].free('p');
    }
  }
  for (const th of [1, 2] as const) {
    // The run whose total is the median, so the classes add up to one real forward.
    const runs = [...samples[th]].sort((a, b) => a['total']! - b['total']!);
    const run = runs[runs.length >> 1]!;
    const inOps = Object.entries(run).filter(([k]) => k !== 'total').reduce((a, [, v]) => a + v, 0);
    out[th] = { ...run, rest: run['total']! - inOps };
    (models[th].kernel as Kernel).close();
  }
  return out;
}

function printProfile(label: string, p: Record<1 | 2, Record<string, number>>): void {
  console.log(`${label}: 512-token prefill, the median of the runs: 1 thread ${p[1]['total']!.toFixed(1)} ms, 2 threads ${p[2]['total']!.toFixed(1)} ms (x${(p[1]['total']! / p[2]['total']!).toFixed(2)})`);
  const keys = Object.keys(p[1]).filter((k) => k !== 'total').sort((a, b) => p[1][b]! - p[1][a]!);
  for (const k of keys) {
    const a = p[1][k]!;
    const b = p[2][k] ?? 0;
    console.log(`  ${k.padEnd(34)} ${a.toFixed(2).padStart(8)} ms  ${b.toFixed(2).padStart(8)} ms  x${b > 0 ? (a / b).toFixed(2) : '-'}  (${((100 * b) / p[2]['total']!).toFixed(1)} % of 2 threads)`);
  }
}

async function main(): Promise<void> {
  // The shape of the tiny model's fused gate/up projection over a 512-row prefill chunk.
  const g = await measureGemm(512, 1536, 256, 5);
  console.log(`GEMM 512x1536x256: kernel (${g.kernel}${g.fma ? ', FMA' : ''}) ${g.kernelGflops.toFixed(2)} GFLOP/s, plain JS ${g.jsGflops.toFixed(2)} GFLOP/s (x${(g.kernelGflops / g.jsGflops).toFixed(1)})`);
  // FMA against mul+add, one thread each, interleaved: the tiny model's gate/up shape and the
  // 156M model's (dim 1024 -> 2 x 2816).
  const fmaRuns = [] as { shape: string; fma: number; plain: number; fmaMed: number; plainMed: number }[];
  let fmaUnavailable: string | null = null;
  for (const [m, n, k] of [[512, 1536, 256], [256, 5632, 1024]] as const) {
    const r = await measureGemmFma(m, n, k);
    if ('unavailable' in r) {
      fmaUnavailable = r.unavailable;
      console.log(`FMA kernel: not measured (${r.unavailable})`);
      break;
    }
    fmaRuns.push({ shape: `${m}x${n}x${k}`, fma: r.fmaGflops, plain: r.plainGflops, fmaMed: r.fmaMedian, plainMed: r.plainMedian });
    console.log(
      `GEMM ${m}x${n}x${k}, 1 thread, best of 15: FMA ${r.fmaGflops.toFixed(2)} GFLOP/s, mul+add ${r.plainGflops.toFixed(2)} GFLOP/s (x${(r.fmaGflops / r.plainGflops).toFixed(2)}); medians ${r.fmaMedian.toFixed(2)} / ${r.plainMedian.toFixed(2)}`,
    );
  }

  // The 156M model's prefill shapes (bench peer), the kernel as the model calls it, 1 and 2 threads.
  const shapeRuns = [...(await measureGemmShapes(PREFILL_156M_SHAPES, 1)), ...(await measureGemmShapes(PREFILL_156M_SHAPES, 2))];
  for (const r of shapeRuns) console.log(`GEMM ${r.shape}, ${r.threads} thread${r.threads > 1 ? 's' : ''}, best of 5: ${r.gflops.toFixed(1)} GFLOP/s wall, ${r.cpuGflops.toFixed(1)} GFLOP/s per CPU-second`);

  const model = await LlamaModel.load(await ensureBuiltinModel('tiny'));
  const kv = model.createKvCache(512 * MiB);
  model.forward([{ seqId: 'warm', tokens: prompt(64, 0), startPos: 0, wantLogits: true }], kv);
  kv.free('warm');

  let t = performance.now();
  model.forward([{ seqId: 'p', tokens: prompt(1024, 1), startPos: 0, wantLogits: true }], kv);
  const prefillMs = performance.now() - t;
  kv.free('p');
  console.log(`prefill 1024 tokens: ${prefillMs.toFixed(0)} ms (${((1024 * 1000) / prefillMs).toFixed(0)} tok/s)`);

  const decode = (batch: number, steps: number): number => {
    const segs = Array.from({ length: batch }, (_, b) => {
      const id = `d${batch}-${b}`;
      model.forward([{ seqId: id, tokens: prompt(32, b + 2), startPos: 0, wantLogits: false }], kv);
      return { seqId: id, tokens: [5], startPos: 32, wantLogits: true };
    });
    const t0 = performance.now();
    for (let i = 0; i < steps; i++) {
      model.forward(segs, kv);
      for (const s of segs) s.startPos++;
    }
    const ms = performance.now() - t0;
    for (const s of segs) kv.free(s.seqId);
    return (batch * steps * 1000) / ms;
  };
  // A 512-token prefill (the peer benchmark's) at one and at two kernel threads, best of 5 each,
  // the two models alternating so load hits both alike; one KV cache, freed after each run.
  const models = { 1: await LlamaModel.load(await ensureBuiltinModel('tiny'), { threads: 1 }), 2: await LlamaModel.load(await ensureBuiltinModel('tiny'), { threads: 2 }) };
  const kvs = { 1: models[1].createKvCache(64 * MiB), 2: models[2].createKvCache(64 * MiB) };
  const best512: Record<1 | 2, number> = { 1: 0, 2: 0 };
  for (let rep = 0; rep < 6; rep++) {
    for (const th of [1, 2] as const) {
      const t0 = performance.now();
      models[th].forward([{ seqId: 'p512', tokens: prompt(512, 3), startPos: 0, wantLogits: true }], kvs[th], { transientLogits: true });
      if (rep > 0) best512[th] = Math.max(best512[th], 512_000 / (performance.now() - t0)); // rep 0 warms up
      kvs[th].free('p512');
    }
  }
  models[1].close();
  models[2].close();
  console.log(`prefill 512 tokens, best of 5: 1 thread ${best512[1].toFixed(0)} tok/s, 2 threads ${best512[2].toFixed(0)} tok/s (x${(best512[2] / best512[1]).toFixed(2)})`);

  const profTiny = await profilePrefill(await ensureBuiltinModel('tiny'), 5);
  printProfile('built-in tiny', profTiny);
  const profBig = existsSync(join(BIG_DIR, 'config.json')) ? await profilePrefill(BIG_DIR, 3) : null;
  if (profBig) printProfile('156M (bench peer)', profBig);
  else console.log(`156M profile: skipped (${BIG_DIR} not there; \`npm run bench -- peer --only big\` generates it)`);
  const round = (p: Record<1 | 2, Record<string, number>> | null) =>
    p && { 1: Object.fromEntries(Object.entries(p[1]).map(([k, v]) => [k, +v.toFixed(2)])), 2: Object.fromEntries(Object.entries(p[2]).map(([k, v]) => [k, +v.toFixed(2)])) };

  const d1 = decode(1, 64);
  const d8 = decode(8, 64);
  console.log(`decode: batch 1 ${d1.toFixed(1)} tok/s, batch 8 ${d8.toFixed(1)} tok/s (x${(d8 / d1).toFixed(2)})`);
  console.log(
    JSON.stringify({
      bench: 'engine_kernels',
      kernel_gflops: +g.kernelGflops.toFixed(3),
      js_baseline_gflops: +g.jsGflops.toFixed(3),
      fma: g.fma,
      fma_unavailable: fmaUnavailable,
      fma_gflops: fmaRuns.map((r) => ({ shape: r.shape, fma: +r.fma.toFixed(2), mul_add: +r.plain.toFixed(2), ratio: +(r.fma / r.plain).toFixed(3), fma_median: +r.fmaMed.toFixed(2), mul_add_median: +r.plainMed.toFixed(2) })),
      gemm_shapes: shapeRuns.map((r) => ({ shape: r.shape, threads: r.threads, gflops: +r.gflops.toFixed(2), cpu_gflops: +r.cpuGflops.toFixed(2) })),
      prefill_tps: +((1024 * 1000) / prefillMs).toFixed(1),
      prefill512_1thread_tps: +best512[1].toFixed(1),
      prefill512_2threads_tps: +best512[2].toFixed(1),
      decode_tps: +d1.toFixed(1),
      decode_tps_batch8: +d8.toFixed(1),
      prefill512_profile_ms: { tiny: round(profTiny), big: round(profBig) },
    }),
  );
  process.exit(0);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
