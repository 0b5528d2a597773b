// Several WASM kernel instances as one kernel, for checkpoints whose weights exceed one 4 GiB
// address space.
import type { KvElements } from './layout.js';
import type { DType } from '../../../common/dtype.js';
import type { Kernel, UploadOptions, Weight } from './kernel.js';
import type { WasmKernel } from './wasm_kernel.js';
import { heldFormat, type EncodedWeight } from './weight_pack.js';

/**
 * Weights spread over several WASM instances (each addresses at most 4 GiB), for checkpoints
 * whose f32 weights exceed one. A weight is used by the instance that holds it; attention runs
 * on the first. Same kernel everywhere, so the same bits as a single instance.
 */
export class WasmKernelPool implements Kernel {
  readonly kind = 'wasm-simd' as const;
  private cur = 0;

  constructor(private readonly parts: WasmKernel[]) {
    if (parts.length === 0) throw new Error('WasmKernelPool needs at least one instance');
    // One model, one arithmetic: mixing FMA and mul+add instances would change bits by layer.
    if (parts.some((p) => p.fma !== parts[0]!.fma)) throw new Error('WasmKernelPool instances must share one fma setting');
  }

  get fma(): boolean {
    return this.parts[0]!.fma;
  }

  get size(): number {
    return this.parts.length;
  }

  upload(w: Float32Array, n: number, k: number, opts?: UploadOptions): Weight {
    while (this.cur < this.parts.length && !this.parts[this.cur]!.canHold(n, k)) this.cur++;
    const part = this.parts[this.cur];
    if (!part) throw new Error(`WASM kernel pool full: no instance left for a ${n}x${k} weight`);
    return { ...part.upload(w, n, k, opts), part: this.cur };
  }

  uploadEncoded(w: EncodedWeight, n: number, k: number): Weight {
    const fmt = heldFormat(w.type, this.parts[0]!.q4);
    while (this.cur < this.parts.length && !this.parts[this.cur]!.canHold(n, k, fmt)) this.cur++;
    const part = this.parts[this.cur];
    if (!part) throw new Error(`WASM kernel pool full: no instance left for a ${n}x${k} weight`);
    return { ...part.uploadEncoded(w, n, k), part: this.cur };
  }

  matmul(w: Weight, a: Float32Array, m: number, out: Float32Array, argmaxOut?: Int32Array): void {
    this.parts[w.part]!.matmul(w, a, m, out, argmaxOut);
  }

  matmulSwiglu(w: Weight, a: Float32Array, m: number, gu: Float32Array, out: Float32Array): void {
    this.parts[w.part]!.matmulSwiglu(w, a, m, gu, out);
  }

  matmulDense(a: Float32Array, m: number, k: number, b: Float32Array, n: number, out: Float32Array): void {
    this.parts[0]!.matmulDense(a, m, k, b, n, out);
  }

  attend(q: Float32Array, M: number, hd: number, kt: Float32Array, P: number, v: Float32Array, lens: Int32Array, scale: number, out: Float32Array): void {
    this.parts[0]!.attend(q, M, hd, kt, P, v, lens, scale, out);
  }

  stageKv(pool: KvElements, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, kvDim: number, dtype?: DType, layerElems?: number): void {
    this.parts[0]!.stageKv(pool, blocks, nBlocks, blockFloats, layerOffset, kvDim, dtype, layerElems);
  }

  attendStaged(q: Float32Array, M: number, hd: number, off: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    this.parts[0]!.attendStaged(q, M, hd, off, keys, lens, scale, out);
  }

  argmax(x: Float32Array): number {
    return this.parts[0]!.argmax(x);
  }

  argmaxRows(x: Float32Array, rows: number, n: number, out: Int32Array): void {
    this.parts[0]!.argmaxRows(x, rows, n, out);
  }

  swiglu(gu: Float32Array, rows: number, hidden: number, out: Float32Array): void {
    this.parts[0]!.swiglu(gu, rows, hidden, out);
  }

  attendStagedHeads(q: Float32Array, M: number, hd: number, heads: number, keys: number, lens: Int32Array, scale: number, out: Float32Array): void {
    this.parts[0]!.attendStagedHeads(q, M, hd, heads, keys, lens, scale, out);
  }

  // Activations live in the first instance; a weight in another one copies them (matmul).
  activation(slot: number, n: number): Float32Array {
    return this.parts[0]!.activation(slot, n);
  }

  hold(v: Float32Array): Float32Array {
    return this.parts[0]!.hold(v);
  }

  rmsNorm(x: Float32Array, w: Float32Array, out: Float32Array, rows: number, dim: number, eps: number): void {
    this.parts[0]!.rmsNorm(x, w, out, rows, dim, eps);
  }

  rope(qkv: Float32Array, rows: number, stride: number, heads: number, hd: number, pos: Int32Array, cos: Float32Array, sin: Float32Array): void {
    this.parts[0]!.rope(qkv, rows, stride, heads, hd, pos, cos, sin);
  }

  addInto(x: Float32Array, y: Float32Array, n: number): void {
    this.parts[0]!.addInto(x, y, n);
  }

  copyRows(src: Float32Array, so: number, ss: number, dst: Float32Array, d0: number, ds: number, rows: number, n: number): void {
    this.parts[0]!.copyRows(src, so, ss, dst, d0, ds, rows, n);
  }

  ready(): Promise<void> {
    return Promise.all(this.parts.map((p) => p.ready())).then(() => undefined);
  }

  park(): void {
    for (const p of this.parts) p.park();
  }

  close(): void {
    for (const p of this.parts) p.close();
  }
}
