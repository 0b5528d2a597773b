// The Q8 and Q4 products (Q8_0 weights; Q4_0, Q4_1 and Q4_K weights): int8 dot products against
// activations quantized per row and block of 32, as llama.cpp computes its quantized layers. This
// file is the plain-JS definition of every bit; the WASM kernel (wat/quantized.ts `quantq8`, `gemmpq8`
// and `gemmpq4`) computes the same.
//
// Why not widen the weights to f32 and use the f32 dot: a decode step is bound by the weight
// stream only when the in-register work per weight is small. Widening an int8 weight to the f32
// `scale·q` costs four SIMD operations per four weights on top of the multiply-add, which made a
// Q8 decode step compute-bound at about the speed of f32; the integer dot (`i32x4.dot_i16x8_s`:
// eight int16 products summed in pairs per instruction) does 64 multiply-adds in 24 operations.
//
// Arithmetic (fixed, so batch invariant: each row is quantized on its own, and nothing depends on
// which rows or columns share a call):
//   activations, per row r and block b of 32 k:  amax = max |x|,  dx = f32(amax / 127),
//     id = dx ≠ 0 ? f32(1 / dx) : 0,  qx_k = round-half-even(f32(x_k · id)) (NaN → 0), as int16;
//   weights: int8 qw[n][k] and one f32 scale dw[n][b] per block (the f16 of the file, widened);
//   per output element, for b ascending from acc = 0:
//     isum = Σ_{k in b} qx_k · qw[n][k]    (exact in int32: |isum| ≤ 32·128·128)
//     acc  = f32(acc + f32(f32(isum) · f32(dw[n][b] · dx[r][b]))).
//
// The Q4 product (Q4_0, Q4_1 and Q4_K weights, held as their 4-bit values: weight_pack.ts q4):
// a weight value is s·q − o with q in 0..15 and a scale s and offset o per column and block of
// 32 (q4Block), so Σ_k (s·q_k − o)·qx_k = s·Σ q_k·qx_k − o·Σ qx_k, and with xsum[r][b] = Σ qx_k
// (exact, as f32):
//     isum = Σ_{k in b} qx_k · q[n][k]
//     acc  = f32(acc + f32(f32(f32(isum) · f32(s[n][b] · dx[r][b])) − f32(xsum[r][b] · f32(o[n][b] · dx[r][b])))).
import { checkEncoded, q4_0AsQ8_0, q4Block, type EncodedWeight, type Q4Type } from './weight_pack.js';
import { f16ToF32 } from '../../../common/half.js';

/** int8 weights [n][k] and their per-block scales [n][k/32] (the JS kernel's Q8 weight). */
export interface Q8Weight {
  q: Int8Array;
  d: Float32Array;
}

/** An activation quantized per row and block of 32: int16 values [m][k], scales and value sums [m][k/32]. */
export interface Q8Activations {
  q: Int16Array;
  d: Float32Array;
  sum: Float32Array;
}

/** 4-bit weights [n][k] (values 0..15) with a scale and an offset per block [n][k/32] (the JS kernel's Q4 weight). */
export interface Q4Weight {
  q: Uint8Array;
  s: Float32Array;
  o: Float32Array;
}

/** Round half to even, as WASM's `f32x4.nearest` (|v| < 2^23 here, so every half is exact). */
function roundEven(v: number): number {
  const r = Math.round(v); // halves toward +Infinity
  return r - v === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** i32x4.trunc_sat_f32x4_s then i16x8.narrow_i32x4_s: NaN → 0, saturating to int16. */
function toI16(v: number): number {
  if (v !== v) return 0;
  return Math.max(-32768, Math.min(32767, v));
}

/** Quantizes rows [m][k] (k a multiple of 32) as defined above. */
export function quantizeActivationsQ8(x: Float32Array, m: number, k: number): Q8Activations {
  const n = m * k;
  const q = new Int16Array(n);
  const d = new Float32Array(n / 32);
  const sum = new Float32Array(n / 32);
  const fr = Math.fround;
  for (let b = 0; b < n / 32; b++) {
    const o = b * 32;
    let amax = 0;
    for (let i = 0; i < 32; i++) amax = Math.max(amax, Math.abs(x[o + i]!));
    const dx = fr(amax / 127);
    const id = dx !== 0 ? fr(1 / dx) : 0;
    d[b] = dx;
    let t = 0;
    for (let i = 0; i < 32; i++) t += q[o + i] = toI16(roundEven(fr(x[o + i]! * id)));
    sum[b] = t;
  }
  return { q, d, sum };
}

/** The int8 values and f32 block scales of a Q8_0 weight [n][k] (or Q4_0 as q4_0AsQ8_0: its −8..7 widen exactly). */
export function q8WeightOf(w: EncodedWeight, n: number, k: number): Q8Weight {
  if (w.type !== 'Q8_0' && w.type !== 'Q4_0') throw new Error(`q8WeightOf: ${w.type} is not a block-quantized type`);
  if (k % 32 !== 0) throw new Error(`${w.type} weight: K=${k} is not a multiple of 32`);
  const blocks = (n * k) / 32;
  const bb = w.type === 'Q4_0' ? 18 : 34;
  if (w.bytes.length !== blocks * bb) throw new Error(`${w.type} weight has ${w.bytes.length} bytes, expected ${n}x${k} (${blocks * bb})`);
  const bytes = w.type === 'Q4_0' ? q4_0AsQ8_0(w.bytes) : w.bytes;
  const src = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const q = new Int8Array(n * k);
  const d = new Float32Array(blocks);
  for (let b = 0; b < blocks; b++) {
    const at = b * 34;
    d[b] = f16ToF32(src.getUint16(at, true));
    for (let j = 0; j < 32; j++) q[b * 32 + j] = src.getInt8(at + 2 + j);
  }
  return { q, d };
}

/**
 * out[r][j] = acc after every block b of row r of `a` [m][k] (quantized) and weight row j [k] of
 * `wq`, acc starting at 0 and each block's integer dot isum added by `step` (given the indices of
 * the activations' and the weight's block scales) — the loop both products share.
 */
function blockProducts(wq: ArrayLike<number>, n: number, k: number, a: Float32Array, m: number, out: Float32Array, step: (acc: number, isum: number, xa: Q8Activations, xb: number, wb: number) => number): void {
  const xa = quantizeActivationsQ8(a, m, k);
  const kb = k / 32;
  for (let r = 0; r < m; r++) {
    for (let j = 0; j < n; j++) {
      let acc = 0;
      for (let b = 0; b < kb; b++) {
        const xo = r * k + b * 32;
        const wo = j * k + b * 32;
        let isum = 0;
        for (let i = 0; i < 32; i++) isum += xa.q[xo + i]! * wq[wo + i]!;
        acc = step(acc, isum, xa, r * kb + b, j * kb + b);
      }
      out[r * n + j] = acc;
    }
  }
}

const fr = Math.fround;

/** out[r][j] = the Q8 product of row r of `a` [m][k] with weight row j (the WASM kernel's bits). */
export function matmulQ8Js(w: Q8Weight, n: number, k: number, a: Float32Array, m: number, out: Float32Array): void {
  blockProducts(w.q, n, k, a, m, out, (acc, isum, xa, xb, wb) => fr(acc + fr(isum * fr(w.d[wb]! * xa.d[xb]!))));
}

/** The 4-bit values, scales and offsets of a Q4_0, Q4_1 or Q4_K weight [n][k] (q4Block). */
export function q4WeightOf(type: Q4Type, bytes: Uint8Array, n: number, k: number): Q4Weight {
  checkEncoded({ type, bytes }, n, k);
  const kb = k / 32;
  const q = new Uint8Array(n * k);
  const s = new Float32Array(n * kb);
  const o = new Float32Array(n * kb);
  const so = new Float32Array(2);
  for (let i = 0; i < n; i++) {
    for (let b = 0; b < kb; b++) {
      q4Block(type, bytes, k, i, b, q.subarray(i * k + b * 32, i * k + b * 32 + 32), so);
      s[i * kb + b] = so[0]!;
      o[i * kb + b] = so[1]!;
    }
  }
  return { q, s, o };
}

/** out[r][j] = the Q4 product of row r of `a` [m][k] with weight row j (the WASM kernel's bits). */
export function matmulQ4Js(w: Q4Weight, n: number, k: number, a: Float32Array, m: number, out: Float32Array): void {
  blockProducts(w.q, n, k, a, m, out, (acc, isum, xa, xb, wb) => {
    const dx = xa.d[xb]!;
    return fr(acc + fr(fr(isum * fr(w.s[wb]! * dx)) - fr(xa.sum[xb]! * fr(w.o[wb]! * dx))));
  });
}
