// The WASM modules the kernel runs, compiled once per process: the kernel module (every product,
// attention, softmax, SwiGLU and argmax export, wat/kernel.ts) in its fma/q4 variants, and the
// element-wise operations (wat/ops.ts), with the exports' signatures.
import v8 from 'node:v8';
import { fmaSupport } from './fma.js';
import { compileWat } from './wat/compile.js';
import { kernelWat } from './wat/kernel.js';
import { opsWat } from './wat/ops.js';

/** The kernel module's exports (wat/kernel.ts). */
export interface KernelExports {
  /** Dense Wt [K][N] (attention operands). */
  gemm(A: number, W: number, C: number, M: number, K: number, N: number, m0: number, m1: number, n0: number, n1: number): void;
  /** Strip-packed Wt (model weights); same arguments and bits as gemm. */
  gemmp(A: number, W: number, C: number, M: number, K: number, N: number, m0: number, m1: number, n0: number, n1: number): void;
  /** gemmp for 16-bit strip-packed weights (layout.ts WFmt); same bits as gemmp on the decoded values. */
  gemmpbf16(A: number, W: number, C: number, M: number, K: number, N: number, m0: number, m1: number, n0: number, n1: number): void;
  gemmpf16(A: number, W: number, C: number, M: number, K: number, N: number, m0: number, m1: number, n0: number, n1: number): void;
  /** The gate|up product with SwiGLU fused (packGluStrips layout); C is [M][N/2]. */
  gemmpglu(A: number, W: number, C: number, M: number, K: number, N: number, m0: number, m1: number, n0: number, n1: number): void;
  /** Q8 weights: A is the activation quantq8 made (int8 dot products, q8_dot.ts's bits). */
  gemmpq8(A: number, W: number, C: number, M: number, K: number, N: number, m0: number, m1: number, n0: number, n1: number): void;
  /** Q4 weights (layout.ts q4): gemmpq8's arguments, the weight's nibbles with scales and offsets. */
  gemmpq4(A: number, W: number, C: number, M: number, K: number, N: number, m0: number, m1: number, n0: number, n1: number): void;
  quantq8(X: number, M: number, K: number, Q: number): void;
  /** quantq8's values as int8 [M][K], then scales, then block sums (gemmpq4's activations). */
  quantq8i8(X: number, M: number, K: number, Q: number): void;
  softmax(S: number, rows: number, stride: number, L: number, scale: number): void;
  /** dt: the staged KV's dtype (0 f32, 1 f16, 2 bf16), widened to f32 as it is gathered. */
  gatherkv(src: number, P: number, Pb: number, kvDim: number, off: number, hd: number, kt: number, v: number, hdPad: number, dt: number): void;
  argmax(p: number, n: number): number;
  swiglu(GU: number, O: number, rows: number, hidden: number): void;
  /** swiglu of rows [r0, r1) in the gemm entry points' argument shape (shared with the worker). */
  swiglurows(GU: number, O: number, hidden: number, u3: number, u4: number, u5: number, u6: number, u7: number, r0: number, r1: number): void;
  argmaxrows(X: number, OUT: number, n: number, u3: number, u4: number, u5: number, u6: number, u7: number, r0: number, r1: number): void;
  /** The candidates of one chunk [n0, n1) of an LM-head product's rows (wat/argmax.ts argmaxColsFunc). */
  argmaxcols(C: number, nPad: number, N: number, M: number, SLOT: number, u5: number, u6: number, u7: number, n0: number, n1: number): void;
  attendheads(stage: number, Q: number, KT: number, S: number, V: number, O: number, L: number, M: number, hd: number, hdPad: number, kvDim: number, heads: number, keys: number, P: number, scale: number, dt: number): void;
  /**
   * The attention of KV heads [g0, g1) over a narrow staged KV (dt 1..5, hd a multiple of 4) without
   * the f32 operands: the products read the staged 16- and 8-bit rows and widen them in registers
   * (wat/attention_narrow.ts). scr: scratch for 2·P + 8 floats; qs: for M·hd + 4 floats.
   */
  attendnarrow(stage: number, Q: number, S: number, O: number, L: number, M: number, hd: number, hdPad: number, kvDim: number, heads: number, g0: number, g1: number, keys: number, P: number, scale: number, dt: number, scr: number, qs: number): void;
  /** One head's attention for query rows [r0, r1); prm holds Q, KT, S, V, O, L, M, hd, P, hdPad, scale bits. */
  attendrows(prm: number, u1: number, u2: number, u3: number, u4: number, u5: number, u6: number, u7: number, r0: number, r1: number): void;
}

/** The element-wise operations' module (wat/ops.ts), on the same memory. */
export interface OpsExports {
  rmsnorm(X: number, W: number, O: number, rows: number, dim: number, eps: number): void;
  rope(QKV: number, rows: number, stride: number, heads: number, hd: number, POS: number, COS: number, SIN: number): void;
  addinto(X: number, Y: number, n: number): void;
  copyrows(S: number, ss: number, D: number, ds: number, rows: number, n: number): void;
}

let opsModulePromise: Promise<WebAssembly.Module> | null = null;

/** Compiles the element-wise operations' WAT (wat/ops.ts), once per process. */
export function opsModule(): Promise<WebAssembly.Module> {
  opsModulePromise ??= compileWat('ops.wat', opsWat(), { simd: true, threads: true });
  return opsModulePromise;
}

const wasmModulePromises = new Map<string, Promise<WebAssembly.Module>>();

/**
 * Compiles the kernel's WAT (wat/kernel.ts) with wabt, once per process, `fma` and `q4` setting. The FMA
 * module needs relaxed SIMD, which fmaSupport() switches on in V8 (process-wide, so the worker
 * thread can instantiate it too) — asking for it where fmaSupport() found none is an error.
 */
export function kernelModule(fma = false, q4 = false): Promise<WebAssembly.Module> {
  if (fma && !fmaSupport().fma) return Promise.reject(new Error(`FMA kernel requested but unavailable: ${fmaSupport().reason}`));
  if (q4 && !fma) return Promise.reject(new Error(`4-bit weights held as q4 (KVC_WEIGHTS_4BIT=q4) need the relaxed-SIMD (FMA) kernel: ${fmaSupport().reason}`));
  const key = `${fma}/${q4}`;
  let p = wasmModulePromises.get(key);
  if (p) return p;
  // gemmpq4's i32x4.relaxed_dot_i8x16_i7x16_add_s is miscompiled by V8's baseline compiler
  // (Liftoff) in Node 20 (wrong sums, measured; the optimizing compiler is right), and a function
  // runs in Liftoff until it is hot: the q4 module, compiled from here on, skips Liftoff
  // (process-wide: every module compiled later too; ≈ 0.2 s more at start). Its own module, so
  // no code compiled before the flag runs gemmpq4.
  if (q4) v8.setFlagsFromString('--no-liftoff');
  p = compileWat(q4 ? 'kernel-q4.wat' : 'kernel.wat', kernelWat({ fma, q4 }), { simd: true, threads: true, relaxed_simd: fma });
  wasmModulePromises.set(key, p);
  return p;
}
