// The plain-JS kernel: the exact summation order of the WASM kernel (kernel.ts; Q8 weights:
// q8_dot.ts), used as the bitwise reference in tests and as the fallback where WASM SIMD is
// unavailable.
import { gatherStagedJs, softmaxRowsJs, stageInto, swigluJs } from './attention_js.js';
import { attendInt8Js } from './attention_int8_js.js';
import type { KvElements } from './layout.js';
import { DType, DTYPE_BYTES } from '../../../common/dtype.js';
import { e4m3Table, e5m2Table } from '../../../common/fp8.js';
import { bf16Table, f16Table } from '../../../common/half.js';
import { fmaf, fmaSupport } from './fma.js';
import { kernelEnv } from './env.js';
import { padTo, STRIP } from './layout.js';
import { argmaxJs, checkArgs, transposePadded, type Kernel, type UploadOptions, type Weight } from './kernel.js';
import { BLOCK_TOKENS } from '../kv_cache.js';
import { addIntoJs, copyRowsJs, rmsNormJs, ropeJs } from './ops_js.js';
import { matmulQ4Js, matmulQ8Js, q4WeightOf, q8WeightOf } from './q8_dot.js';
import { asQ8_0, checkEncoded, decodeWeight, heldFormat, type EncodedWeight, type Q4Type } from './weight_pack.js';

/** The f32 value of every bit pattern, for the dtypes widened through a table. */
const WIDEN_TABLES: Partial<Record<DType, () => Float32Array>> = {
  [DType.f16]: f16Table,
  [DType.bf16]: bf16Table,
  [DType.fp8_e4m3]: e4m3Table,
  [DType.fp8_e5m2]: e5m2Table,
};

/** Plain-JS kernel with the exact summation order of the WASM kernel (reference and fallback). */
export class JsKernel implements Kernel {
  readonly kind = 'js' as const;
  /** Fused multiply-add (fmaf) like the WASM FMA kernel; default: fmaSupport(). */
  readonly fma: boolean;

  /** Q4_0, Q4_1 and Q4_K weights held as q4 (q8_dot.ts's Q4 product), else as q8, like the WASM kernel. */
  readonly q4: boolean;

  constructor(opts: { fma?: boolean; q4?: boolean } = {}) {
    this.fma = opts.fma ?? fmaSupport().fma;
    this.q4 = opts.q4 ?? kernelEnv(process.env).q4;
  }

  ready(): Promise<void> {
    return Promise.resolve();
  }
  close(): void {}
  park(): void {}

  // The layout is the same with `glu` (matmulSwiglu computes the product, then swigluJs).
  upload(w: Float32Array, n: number, k: number, _opts?: UploadOptions): Weight {
    const nPad = padTo(n, STRIP);
    const data = new Float32Array(k * nPad);
    transposePadded(w, n, k, nPad, data);
    return { k, n, nPad, ptr: -1, data, part: 0, fmt: 'f32' };
  }

  uploadEncoded(w: EncodedWeight, n: number, k: number): Weight {
    checkEncoded(w, n, k);
    const fmt = heldFormat(w.type, this.q4);
    if (fmt === 'q4') return { k, n, nPad: padTo(n, STRIP), ptr: -1, data: null, part: 0, fmt, q4: q4WeightOf(w.type as Q4Type, w.bytes, n, k) };
    if (fmt === 'q8') return { k, n, nPad: padTo(n, STRIP), ptr: -1, data: null, part: 0, fmt, q8: q8WeightOf(asQ8_0(w, null), n, k) };
    return this.upload(decodeWeight(w, n, k), n, k);
  }

  matmul(w: Weight, a: Float32Array, m: number, out: Float32Array, argmaxOut?: Int32Array): void {
    checkArgs(w, a, m, out);
    if (w.q8) matmulQ8Js(w.q8, w.n, w.k, a, m, out);
    else if (w.q4) matmulQ4Js(w.q4, w.n, w.k, a, m, out);
    else this.accumulate(a, m, w.k, w.data!, w.n, w.nPad, out);
    if (argmaxOut) this.argmaxRows(out, m, w.n, argmaxOut);
  }

  matmulSwiglu(w: Weight, a: Float32Array, m: number, gu: Float32Array, out: Float32Array): void {
    this.matmul(w, a, m, gu);
    swigluJs(gu, m, w.n / 2, out);
  }

  /** out[m][N] = a[m][K] · b[K][stride] (first N columns), in the kernel's order (kernel.ts). */
  private accumulate(a: Float32Array, m: number, K: number, b: Float32Array, N: number, stride: number, out: Float32Array): void {
    const fr = Math.fround;
    const fma = this.fma;
    for (let r = 0; r < m; r++) {
      const c = out.subarray(r * N, r * N + N);
      c.fill(0);
      const ar = r * K;
      for (let kk = 0; kk < K; kk++) {
        const av = a[ar + kk]!;
        const base = kk * stride;
        if (fma) for (let j = 0; j < N; j++) c[j] = fmaf(av, b[base + j]!, c[j]!);
        else for (let j = 0; j < N; j++) c[j] = c[j]! + fr(av * b[base + j]!);
      }
    }
  }

  argmax(x: Float32Array): number {
    return argmaxJs(x);
  }

  argmaxRows(x: Float32Array, rows: number, n: number, out: Int32Array): void {
    for (let r = 0; r < rows; r++) out[r] = argmaxJs(x.subarray(r * n, r * n + n));
  }

  swiglu(gu: Float32Array, rows: number, hidden: number, out: Float32Array): void {
    swigluJs(gu, rows, hidden, out);
  }

  private readonly acts: Float32Array[] = [];

  activation(slot: number, n: number): Float32Array {
    const b = this.acts[slot];
    if (b && b.length >= n) return b.subarray(0, n);
    const grown = new Float32Array(Math.max(n, (b?.length ?? 0) * 2));
    this.acts[slot] = grown;
    return grown.subarray(0, n);
  }

  hold(v: Float32Array): Float32Array {
    return v;
  }

  rmsNorm(x: Float32Array, w: Float32Array, out: Float32Array, rows: number, dim: number, eps: number): void {
    rmsNormJs(x, w, out, rows, dim, eps);
  }

  rope(qkv: Float32Array, rows: number, stride: number, heads: number, hd: number, pos: Int32Array, cos: Float32Array, sin: Float32Array): void {
    ropeJs(qkv, rows, stride, heads, hd, pos, cos, sin);
  }

  addInto(x: Float32Array, y: Float32Array, n: number): void {
    addIntoJs(x, y, n);
  }

  copyRows(src: Float32Array, so: number, ss: number, dst: Float32Array, d0: number, ds: number, rows: number, n: number): void {
    copyRowsJs(src, so, ss, dst, d0, ds, rows, n);
  }

  attendStagedHeads(q: Float32Array, M: number, hd: number, heads: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    for (let g = 0; g < heads; g++) {
      const rows = M * hd;
      this.attendStaged(q.subarray(g * rows, (g + 1) * rows), M, hd, g * hd, keys, lens, scale, out.subarray(g * rows, (g + 1) * rows));
    }
  }

  private staged = new Float32Array(0);
  private staged16 = new Uint16Array(0);
  private staged8 = new Uint8Array(0);
  private stagedKvDim = 0;
  private stagedDtype = DType.f32;
  /** Null for f32 and int8 KV; the f16, bf16, E4M3 or E5M2 → f32 table otherwise. */
  private widen: Float32Array | null = null;

  stageKv(pool: KvElements, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, kvDim: number, dtype: DType = DType.f32, layerElems = 2 * BLOCK_TOKENS * kvDim): void {
    const n = nBlocks * layerElems;
    this.stagedKvDim = kvDim;
    this.stagedDtype = dtype;
    this.widen = WIDEN_TABLES[dtype]?.() ?? null;
    if (dtype === DType.f32) {
      if (this.staged.length < n) this.staged = new Float32Array(n);
      stageInto(this.staged, 0, pool as Float32Array, blocks, nBlocks, blockFloats, layerOffset, layerElems);
    } else if (DTYPE_BYTES[dtype] === 2) {
      if (this.staged16.length < n) this.staged16 = new Uint16Array(n);
      stageInto(this.staged16, 0, pool as Uint16Array, blocks, nBlocks, blockFloats, layerOffset, layerElems);
    } else {
      if (this.staged8.length < n) this.staged8 = new Uint8Array(n);
      stageInto(this.staged8, 0, pool as Uint8Array, blocks, nBlocks, blockFloats, layerOffset, layerElems);
    }
  }

  attendStaged(q: Float32Array, M: number, hd: number, off: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    const Pb = padTo(keys, STRIP);
    const kt = new Float32Array(hd * Pb);
    const v = new Float32Array(Pb * hd);
    const dt = this.stagedDtype;
    // int8 (head_dim a multiple of 4, as the WASM kernel's attendnarrow takes it): integer scores.
    if (dt === DType.int8 && hd % 4 === 0) {
      attendInt8Js(this.staged8, this.stagedKvDim, off, hd, keys, Pb, q, M, lens, scale, out, (a, m, K, b, N, o) => this.matmulDense(a, m, K, b, N, o));
      return;
    }
    const src = dt === DType.f32 ? this.staged : DTYPE_BYTES[dt] === 2 ? this.staged16 : this.staged8;
    gatherStagedJs(src, this.stagedKvDim, off, hd, keys, Pb, kt, v, this.widen, dt === DType.int8);
    this.attend(q, M, hd, kt, Pb, v, lens, scale, out);
  }

  attend(q: Float32Array, M: number, hd: number, kt: Float32Array, P: number, v: Float32Array, lens: Int32Array, scale: number, out: Float32Array): void {
    const S = new Float32Array(M * P);
    this.matmulDense(q, M, hd, kt, P, S);
    softmaxRowsJs(S, M, P, lens, scale);
    this.matmulDense(S, M, P, v, hd, out);
  }

  matmulDense(a: Float32Array, m: number, K: number, b: Float32Array, N: number, out: Float32Array): void {
    this.accumulate(a, m, K, b, N, N, out);
  }
}
