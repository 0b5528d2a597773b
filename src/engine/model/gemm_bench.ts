// GEMM rates for the engine benchmarks: the model's kernel against a plain-JS triple loop.
import { createGemm } from './gemm.js';

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
export async function measureGemm(m = 256, n = 768, k = 256, iters = 5): Promise<{ kernelGflops: number; jsGflops: number; kernel: string }> {
  const flops = 2 * m * n * k;
  const a = randomArray(m * k, 1);
  const w = randomArray(n * k, 2);
  const out = new Float32Array(m * n);
  const gemm = await createGemm();
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
  return { kernelGflops: (flops * iters) / kernelSec / 1e9, jsGflops: (flops * iters) / jsSec / 1e9, kernel: gemm.kind };
}