// Chooses the kernel for a model (kernel.ts describes the interface and the determinism
// contract every implementation keeps).
import { fmaSupport } from './fma.js';
import { kernelEnv } from './env.js';
import { JsKernel } from './js_kernel.js';
import type { Kernel } from './kernel.js';
import { padTo, STRIP } from './layout.js';
import { WasmKernel } from './wasm_kernel.js';
import { WASM_WEIGHT_CAP } from './wasm_limits.js';
import { WasmKernelPool } from './wasm_kernel_pool.js';

/**
 * The kernel for a model: WASM SIMD (one instance, or a pool of them when the weights exceed
 * one 4 GiB address space), else JS. All give bitwise identical results (all use the process's
 * fma setting, fma.ts), so the choice never changes outputs. `weightCapBytes` (tests) lowers the per-instance weight budget; `threads` (1 or 2)
 * overrides the WASM kernel's default (KVC_GEMM_THREADS, else 2 on a multi-core machine). The
 * WASM kernel's worker thread is still starting when this returns: `ready()` says when it runs.
 */
export async function createKernel(opts: { shapes?: [number, number][]; prefer?: 'wasm' | 'js'; weightCapBytes?: number; threads?: 1 | 2; q4?: boolean } = {}): Promise<Kernel> {
  // Decided first and outside the fallback below: a bad or unsatisfiable KVC_WASM_FMA or
  // KVC_WEIGHTS_4BIT is an error at start, never a silent switch of arithmetic.
  const fma = fmaSupport().fma;
  const env = kernelEnv(process.env);
  const q4 = opts.q4 ?? env.q4;
  if (q4 && !fma) throw new Error(`4-bit weights held as q4 (KVC_WEIGHTS_4BIT=q4) need relaxed SIMD with fused multiply-add: ${fmaSupport().reason}`);
  const prefer = opts.prefer ?? env.prefer;
  if (prefer === 'js') return new JsKernel({ q4 });
  const cap = Math.min(opts.weightCapBytes ?? WASM_WEIGHT_CAP, WASM_WEIGHT_CAP);
  // Pack the weights (in upload order, first fit like WasmKernelPool.upload) to count instances.
  let parts = 1;
  let used = 0;
  for (const [n, k] of opts.shapes ?? []) {
    const b = k * padTo(n, STRIP) * 4;
    if (b > cap) return new JsKernel(); // one weight larger than an address space
    if (used + b > cap) {
      parts++;
      used = 0;
    }
    used += b;
  }
  try {
    const threads = opts.threads ?? env.threads;
    if (parts === 1) return await WasmKernel.create({ q4, threadsLater: true, ...(opts.weightCapBytes !== undefined ? { weightCapBytes: cap } : {}), ...(threads ? { threads } : {}) });
    const list: WasmKernel[] = [];
    for (let i = 0; i < parts; i++) list.push(await WasmKernel.create({ q4, weightCapBytes: cap, threadsLater: true, ...(i > 0 ? { threads: 1 } : threads ? { threads } : {}) }));
    return new WasmKernelPool(list);
  } catch {
    return new JsKernel({ q4 });
  }
}
