// The kernel interface the model computes its linear layers and attention with, and the weight
// layouts both implementations share.
//
// Matrix multiply for the model's linear layers: out[m][n] = sum_k a[m][k] * W[n][k], W in the
// Hugging Face [out][in] layout, pre-transposed once at load to Wt [k][nPad].
//
// Determinism contract (shared by both implementations, and tested bitwise):
//   every output element is a single f32 accumulator, starting at 0, updated for k ascending as
//   acc = f32(acc + f32(a[m][k] * Wt[k][n]))   (fma off), or
//   acc = f32(a[m][k] * Wt[k][n] + acc)         (fma on: one rounding, fma.ts).
// Nothing depends on M, on the row's position in the batch or on how columns are split, so a
// row's result is the same alone or in any batch (batch invariance), and the WASM SIMD kernel
// (vectorised over n) equals the plain-JS reference with the same fma setting bit for bit.
// (JS evaluates in f64; rounding the product and the sum to f32 each step gives exactly the f32
// results, since f64 has more than 2*24+2 bits; fma.ts fmaf gives the fused result exactly.)
// One process uses one setting (fmaSupport(): KVC_WASM_FMA, then the platform) for every kernel.
import type { KvElements } from './layout.js';
import type { DType } from '../../../common/dtype.js';
import { PANEL, panelIndex, STRIP, type WFmt } from './layout.js';
import type { Q4Weight, Q8Weight } from './q8_dot.js';
import type { EncodedWeight } from './weight_pack.js';

export interface Weight {
  /** Input features (K) and output features (N) of the layer. */
  readonly k: number;
  readonly n: number;
  /** N padded to the kernel's strip width; Wt rows have this stride. */
  readonly nPad: number;
  /** Byte offset of Wt in WASM memory (wasm kernel) … */
  readonly ptr: number;
  /** … or the Wt array itself (JS kernel). */
  readonly data: Float32Array | null;
  /** Which WASM instance holds it (WasmKernelPool). */
  readonly part: number;
  /** How the kernel holds it (weight_pack.ts); the JS kernel holds 'f32', 'q8' or 'q4'. */
  readonly fmt: WFmt;
  /** The JS kernel's Q8 weight (int8 values and block scales, q8_dot.ts); null otherwise. */
  readonly q8?: Q8Weight | null;
  /** The JS kernel's Q4 weight (4-bit values, block scales and offsets, q8_dot.ts); null otherwise. */
  readonly q4?: Q4Weight | null;
  /**
   * A gate|up weight in the fused layout (packGluStrips): usable only through matmulSwiglu,
   * which then computes the product and SwiGLU in one pass.
   */
  readonly glu?: boolean;
}

/** Options of Kernel.upload. */
export interface UploadOptions {
  /**
   * The weight is a gate|up projection ([gate (n/2 rows) | up (n/2 rows)][k]) meant for
   * matmulSwiglu: a kernel that fuses SwiGLU into the product may pack it for that (the WASM
   * kernel does for f32 weights when n/2 is a multiple of 16); matmul no longer accepts it then.
   */
  glu?: boolean;
}

export interface Kernel {
  readonly kind: 'wasm-simd' | 'js';
  /** Products accumulate with a fused multiply-add (fma.ts; both kernels, the same bits). */
  readonly fma: boolean;
  /** Copies a weight given as [n][k] (row-major, HF layout) into kernel layout. */
  upload(w: Float32Array, n: number, k: number, opts?: UploadOptions): Weight;
  /**
   * Same, for a weight kept in its stored encoding. 16-bit: the products equal, bit for bit,
   * upload(decodeWeight(w)) — only the memory it takes differs. Q8_0/Q4_0: int8 dot products
   * against per-row quantized activations (q8_dot.ts), the same bits in both kernels.
   */
  uploadEncoded(w: EncodedWeight, n: number, k: number): Weight;
  /**
   * out[0..m*n) = a[0..m*k) · Wᵀ; with `argmaxOut`, also each of the m rows' greedy argmax
   * (argmaxRows's answers), which a kernel may take while the product's columns are still in
   * cache (the LM head, wasm_kernel.ts).
   */
  matmul(w: Weight, a: Float32Array, m: number, out: Float32Array, argmaxOut?: Int32Array): void;
  /**
   * out[m][n/2] = SwiGLU of a · Wᵀ for a gate|up weight (n = 2·hidden): the bits of matmul into
   * `gu` ([m][n]) then swiglu. A weight uploaded with `glu` and packed for it is computed in one
   * fused pass (gu untouched); any other weight goes through `gu`.
   */
  matmulSwiglu(w: Weight, a: Float32Array, m: number, gu: Float32Array, out: Float32Array): void;
  /**
   * Resolves when the helper threads are running, or were given up on (the kernel then computes
   * on the calling thread alone, with the same bits). Products work before it resolves, on the
   * calling thread: the model loads its weights while the threads start.
   */
  ready(): Promise<void>;
  /** Releases threads (the kernel still works afterwards, single-threaded). */
  close(): void;
  /**
   * No product is coming soon (the forward pass ended): helper threads sleep now instead of
   * spinning for the next job. The next product wakes them as usual.
   */
  park(): void;
  /** out[m][n] = a[m][k] · b[k][n] for a transient b (attention), same summation order. */
  matmulDense(a: Float32Array, m: number, k: number, b: Float32Array, n: number, out: Float32Array): void;
  /**
   * Attention core for M query rows of one KV head: S = q·kt ([M][hd]·[hd][P]), row r softmaxed
   * over its first lens[r] columns (scaled by `scale`, the rest set to 0), out = S·v ([P][hd]).
   * P must be a multiple of STRIP (callers pad keys/values with zeros).
   */
  attend(q: Float32Array, M: number, hd: number, kt: Float32Array, P: number, v: Float32Array, lens: Int32Array, scale: number, out: Float32Array): void;
  /**
   * Stages one layer of a sequence's paged KV for attendStaged: for each of `nBlocks` cache
   * blocks, the layer's region of `layerElems` elements (default 2*BLOCK_TOKENS*kvDim: K slab, then
   * V slab; an int8 cache adds its scales, kv_cache.ts) at pool[blocks[b] * blockFloats +
   * layerOffset]. Copied in bulk, once per sequence and layer, in the pool's own dtype (`dtype`:
   * f32, f16/bf16 bit patterns in a Uint16Array, int8/fp8 bytes in a Uint8Array): narrow KV is
   * widened to f32 by the gather inside the kernel, so its staging moves fewer bytes.
   */
  stageKv(pool: KvElements, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, kvDim: number, dtype?: DType, layerElems?: number): void;
  /**
   * attend() over the staged KV of one KV head (columns [off, off+hd) of each position), using
   * its first `keys` positions (zero-padded to a multiple of STRIP). Same result bits as
   * attend() given those keys/values and zeros as padding.
   */
  attendStaged(q: Float32Array, M: number, hd: number, off: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void;
  /**
   * attendStaged for every KV head of the staged KV: q is [heads][M][hd] (head g's rows at
   * g*M*hd), out the same shape. Same bits as calling attendStaged per head.
   */
  attendStagedHeads(q: Float32Array, M: number, hd: number, heads: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void;
  /** Index of the largest value, lowest index on ties (greedy sampling): argmaxJs's answer, NaN included. */
  argmax(x: Float32Array): number;
  /** out[r] = argmax of row r of x ([rows][n]), for r < rows: argmax()'s answer per row. */
  argmaxRows(x: Float32Array, rows: number, n: number, out: Int32Array): void;
  /** SwiGLU: gu is [rows][gate (hidden) | up (hidden)], out [rows][hidden] (attention_js.ts swigluJs defines the bits). */
  swiglu(gu: Float32Array, rows: number, hidden: number, out: Float32Array): void;
  /**
   * Reusable activation buffer number `slot`, at least n floats, contents unspecified (a larger
   * request may return a new buffer). The WASM kernel keeps it in its own memory, so GEMMs and
   * the element-wise operations below read and write it in place instead of copying through
   * scratch; any Float32Array is still accepted everywhere (copied).
   */
  activation(slot: number, n: number): Float32Array;
  /** A permanent copy of `v` where the kernel reads it in place (normalisation weights). */
  hold(v: Float32Array): Float32Array;
  /** RMSNorm of `rows` rows of `dim` (ops_js.ts rmsNormJs defines the bits). */
  rmsNorm(x: Float32Array, w: Float32Array, out: Float32Array, rows: number, dim: number, eps: number): void;
  /** RoPE in place on `heads` heads of each row (ops_js.ts ropeJs defines the bits). */
  rope(qkv: Float32Array, rows: number, stride: number, heads: number, hd: number, pos: Int32Array, cos: Float32Array, sin: Float32Array): void;
  /** x[i] += y[i] for i < n (ops_js.ts addIntoJs). */
  addInto(x: Float32Array, y: Float32Array, n: number): void;
  /** `rows` rows of n floats, src[so + r*ss …] → dst[d0 + r*ds …] (ops_js.ts copyRowsJs). */
  copyRows(src: Float32Array, so: number, ss: number, dst: Float32Array, d0: number, ds: number, rows: number, n: number): void;
}

/** Greedy decoding's scalar argmax: the largest value, the lowest index on ties. */
export function argmaxJs(x: Float32Array): number {
  let best = 0;
  let bv = x[0]!;
  for (let i = 1; i < x.length; i++) {
    const v = x[i]!;
    if (v > bv) {
      bv = v;
      best = i;
    }
  }
  return best;
}

export function transposePadded(w: Float32Array, n: number, k: number, nPad: number, dest: Float32Array): void {
  if (w.length !== n * k) throw new Error(`weight has ${w.length} values, expected ${n}x${k}`);
  dest.fill(0, 0, k * nPad);
  for (let i = 0; i < n; i++) {
    const row = i * k;
    for (let j = 0; j < k; j++) dest[j * nPad + i] = w[row + j]!;
  }
}

/** Wt packed in panels (the WASM kernel's weight layout): w[c][kk] at panelIndex(c, k) + kk·PANEL. */
export function packStrips(w: Float32Array, n: number, k: number, nPad: number, dest: Float32Array): void {
  if (w.length !== n * k) throw new Error(`weight has ${w.length} values, expected ${n}x${k}`);
  dest.fill(0, 0, k * nPad);
  for (let i = 0; i < n; i++) {
    const row = i * k;
    const base = panelIndex(i, k);
    for (let j = 0; j < k; j++) dest[base + j * PANEL] = w[row + j]!;
  }
}

/**
 * A gate|up weight ([gate (h rows) | up (h rows)][k], h a multiple of 16) in the fused SwiGLU
 * layout: panels like packStrips, where strip s holds gate columns 16s..16s+15 and the up columns
 * of the same indices, in groups of 4 — packed column 8q + j is gate 16s + 4q + j and 8q + 4 + j is
 * up 16s + 4q + j (q < 4, j < 4) — so each 8-column register tile holds 4 gate columns and their 4 up
 * columns (wat/gemm.ts gemmpglu).
 */
export function packGluStrips(w: Float32Array, h: number, k: number, dest: Float32Array): void {
  if (w.length !== 2 * h * k) throw new Error(`weight has ${w.length} values, expected ${2 * h}x${k}`);
  if (h % 16 !== 0) throw new Error(`packGluStrips: hidden ${h} is not a multiple of 16`);
  for (let s = 0; s < h / 16; s++) {
    for (let p = 0; p < STRIP; p++) {
      const q = p >> 3;
      const j = p & 3;
      const col = 16 * s + 4 * q + j;
      const row = (p & 4 ? h + col : col) * k;
      const base = panelIndex(s * STRIP + p, k);
      for (let kk = 0; kk < k; kk++) dest[base + kk * PANEL] = w[row + kk]!;
    }
  }
}

export function checkArgs(w: Weight, a: Float32Array, m: number, out: Float32Array): void {
  if (a.length < m * w.k) throw new Error(`matmul: input holds ${a.length} values, ${m}x${w.k} needed`);
  if (out.length < m * w.n) throw new Error(`matmul: output holds ${out.length} values, ${m}x${w.n} needed`);
}

