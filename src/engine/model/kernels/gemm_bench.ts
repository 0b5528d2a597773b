// GEMM rates for the engine benchmarks: the model's kernel against a plain-JS triple loop.
import { fmaSupport } from './fma.js';
import { createKernel } from './create.js';
import { WasmKernel } from './wasm_kernel.js';

/** The textbook triple loop (i-k-j order) over Float32Arrays: the "plain JS" baseline. */
export function plainJsMatmul(a: Float32Array, b: Float32Array, c: Float32Array, m: number, n: number, k: number): void {
  c.fill(0, 0, m * n);
  for (let i = 0; i < m; i++) {
    for (let p = 0; p < k; p++) {
      const av = a[i * k + p]!;
      const bo = p * n;
      const co = i * n;
      for (let j = 0; j < n; j++) c[co + j] += av * b[bo + j]!;
    }
  }
}

function randomArray(len: number, seed: number): Float32Array {
  const out = new Float32Array(len);
  let s = seed >>> 0;
  for (let i = 0; i < len; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = s / 4294967296 - 0.5;
  }
  return out;
}

/**
 * GEMM rates for the engine benchmark: the model's kernel (as prefill uses it) against the plain-JS
 * triple loop, on the same M x N x K problem, GFLOP/s counting a multiply-add as 2 FLOPs.
 */
export async function measureGemm(m = 256, n = 768, k = 256, iters = 5): Promise<{ kernelGflops: number; jsGflops: number; kernel: string; fma: boolean }> {
  const flops = 2 * m * n * k;
  const a = randomArray(m * k, 1);
  const w = randomArray(n * k, 2);
  const out = new Float32Array(m * n);
  const gemm = await createKernel();
  await gemm.ready(); // timed with both threads
  const wt = gemm.upload(w, n, k);
  gemm.matmul(wt, a, m, out); // warm-up (JIT / tier-up)
  let t = process.hrtime.bigint();
  for (let i = 0; i < iters; i++) gemm.matmul(wt, a, m, out);
  const kernelSec = Number(process.hrtime.bigint() - t) / 1e9;
  const b = new Float32Array(k * n);
  for (let i = 0; i < n; i++) for (let j = 0; j < k; j++) b[j * n + i] = w[i * k + j]!;
  const c = new Float32Array(m * n);
  plainJsMatmul(a, b, c, m, n, k);
  t = process.hrtime.bigint();
  for (let i = 0; i < iters; i++) plainJsMatmul(a, b, c, m, n, k);
  const jsSec = Number(process.hrtime.bigint() - t) / 1e9;
  gemm.close();
  return { kernelGflops: (flops * iters) / kernelSec / 1e9, jsGflops: (flops * iters) / jsSec / 1e9, kernel: gemm.kind, fma: gemm.fma };
}
/**
 * The WASM kernel with and without fused multiply-add (fma.ts) on one M x N x K problem, one
 * thread each (per-thread GFLOP/s), interleaved call by call so load on a shared machine hits
 * both alike; the best of `rounds` short calls each (load only ever slows a call down, so the
 * best is the closest to the unloaded rate) and the median. `unavailable` when the platform has
 * no fused relaxed_madd.
 */
export async function measureGemmFma(m: number, n: number, k: number, rounds = 15, iters = 1): Promise<{ fmaGflops: number; plainGflops: number; fmaMedian: number; plainMedian: number } | { unavailable: string }> {
  const support = fmaSupport();
  if (!support.fma) return { unavailable: support.reason };
  const a = randomArray(m * k, 3);
  const w = randomArray(n * k, 4);
  const out = new Float32Array(m * n);
  let kernels: WasmKernel[];
  try {
    kernels = [await WasmKernel.create({ threads: 1, fma: true }), await WasmKernel.create({ threads: 1, fma: false })];
  } catch (e) {
    return { unavailable: (e as Error).message };
  }
  const wts = kernels.map((g) => g.upload(w, n, k));
  kernels.forEach((g, i) => g.matmul(wts[i]!, a, m, out)); // warm-up
  const rates: number[][] = [[], []];
  for (let r = 0; r < rounds; r++) {
    for (let i = 0; i < 2; i++) {
      const t = process.hrtime.bigint();
      for (let j = 0; j < iters; j++) kernels[i]!.matmul(wts[i]!, a, m, out);
      rates[i]!.push((2 * m * n * k * iters) / (Number(process.hrtime.bigint() - t) / 1e9) / 1e9);
    }
  }
  kernels.forEach((g) => g.close());
  const med = (x: number[]) => [...x].sort((p, q) => p - q)[Math.floor(x.length / 2)]!;
  return { fmaGflops: Math.max(...rates[0]!), plainGflops: Math.max(...rates[1]!), fmaMedian: med(rates[0]!), plainMedian: med(rates[1]!) };
}

/** The GEMM shapes of a 512-token prefill on the 156M benchmark model (bench peer): M x N x K. */
export const PREFILL_156M_SHAPES: readonly (readonly [number, number, number])[] = [
  [512, 1536, 1024], // q|k|v fused: 1024 -> 1024 + 2 x 256
  [512, 1024, 1024], // o
  [512, 5632, 1024], // gate|up fused: 1024 -> 2 x 2816
  [512, 1024, 2816], // down
  [1, 32000, 1024], // LM head: the last row only
];

/**
 * The WASM kernel's rate on each shape with `threads` threads (matmul as the model calls it:
 * operands copied in and out), the best of `rounds` calls: wall-clock GFLOP/s and CPU-time
 * GFLOP/s (process CPU time, so per thread when two run). On a shared machine the CPU-time figure
 * is the one that load disturbs least; the wall figure is what the model sees.
 */
export async function measureGemmShapes(shapes: readonly (readonly [number, number, number])[], threads: 1 | 2, rounds = 5): Promise<{ shape: string; threads: number; gflops: number; cpuGflops: number }[]> {
  const gemm = await WasmKernel.create({ threads });
  const out: { shape: string; threads: number; gflops: number; cpuGflops: number }[] = [];
  try {
    for (const [m, n, k] of shapes) {
      const a = randomArray(m * k, 5);
      const wt = gemm.upload(randomArray(n * k, 6), n, k);
      const c = new Float32Array(m * n);
      const flops = 2 * m * n * k;
      const iters = Math.max(1, Math.round(1e8 / flops)); // >= ~0.1 GFLOP per measurement
      gemm.matmul(wt, a, m, c); // warm-up
      let wall = 0;
      let cpu = 0;
      for (let r = 0; r < rounds; r++) {
        const c0 = process.cpuUsage();
        const t0 = process.hrtime.bigint();
        for (let i = 0; i < iters; i++) gemm.matmul(wt, a, m, c);
        const sec = Number(process.hrtime.bigint() - t0) / 1e9;
        const u = process.cpuUsage(c0);
        wall = Math.max(wall, (flops * iters) / sec / 1e9);
        cpu = Math.max(cpu, (flops * iters) / ((u.user + u.system) / 1e6) / 1e9);
      }
      out.push({ shape: `${m}x${n}x${k}`, threads, gflops: wall, cpuGflops: cpu });
    }
  } finally {
    gemm.close();
  }
  return out;
}
