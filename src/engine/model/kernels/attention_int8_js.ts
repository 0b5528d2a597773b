// Attention over an int8 KV (per-token-per-head f16 scales), the kernels' int8 semantics in plain
// JavaScript: the JS kernel computes it, and the WASM kernel's attendnarrow (wat/attention_narrow.ts)
// gives the same bits. Scores are integer dot products: each query row quantized to int16 with
// its own scale, each key row used as it is held, the sum exact in i32, then scaled once per
// (row, key) by the two scales. Values: p times the value row's scale once per (row, key), then
// the f32 sum over keys of p'·v with v the held integers (the GEMMs' order, attention_js.ts).
import { int8Staged, softmaxRowsJs } from './attention_js.js';

const fr = Math.fround;

/** x rounded to the nearest integer, ties to even (f32x4.nearest). */
function nearestEven(x: number): number {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

/** i32x4.trunc_sat_f32x4_s then i16x8.narrow_i32x4_s: NaN → 0, saturated to int16. */
const toI16 = (x: number) => (x !== x ? 0 : Math.max(-32768, Math.min(32767, Math.trunc(x))));

/**
 * The M query rows of q (hd floats each) as int16 (q16, [M][hd]) and their f32 scales (sq):
 * m = max |q|, sq = f32(m / 32767), q16 = nearest-even(f32(q · f32(32767 / m))), 0 for a zero row.
 */
export function quantizeQueries(q: Float32Array, M: number, hd: number, q16: Int16Array, sq: Float32Array): void {
  for (let r = 0; r < M; r++) {
    let m = 0;
    for (let e = 0; e < hd; e++) m = Math.max(m, Math.abs(q[r * hd + e]!));
    const inv = m > 0 ? fr(32767 / m) : 0;
    sq[r] = fr(m / 32767);
    for (let e = 0; e < hd; e++) q16[r * hd + e] = toI16(nearestEven(fr(q[r * hd + e]! * inv)));
  }
}

/**
 * One KV head's attention (columns [off, off + hd) of each staged position) over the staged int8
 * regions (kv_cache.ts: K and V i8 slabs, then K and V f16 scales [16][heads]), for M query rows
 * q ([M][hd]) with row lengths lens, into out ([M][hd]). Pb: keys rounded up to the strip;
 * `matmul(a, m, K, b, N, out)` is the kernel's dense product (its summation order).
 */
export function attendInt8Js(
  src: Uint8Array, kvDim: number, off: number, hd: number, keys: number, Pb: number, q: Float32Array, M: number, lens: Int32Array, scale: number, out: Float32Array,
  matmul: (a: Float32Array, m: number, K: number, b: Float32Array, N: number, out: Float32Array) => void,
): void {
  const s = int8Staged(src, kvDim, off, hd);
  const ks = new Float32Array(Pb);
  const vs = new Float32Array(Pb);
  const k = new Int8Array(keys * hd);
  const v = new Float32Array(Pb * hd);
  for (let j = 0; j < keys; j++) {
    const kp = s.kAt(j);
    ks[j] = s.kScale(j);
    vs[j] = s.vScale(j);
    for (let e = 0; e < hd; e++) {
      k[j * hd + e] = s.i8[kp + e]!;
      v[j * hd + e] = s.i8[kp + s.slab + e]!;
    }
  }
  const q16 = new Int16Array(M * hd);
  const sq = new Float32Array(M);
  quantizeQueries(q, M, hd, q16, sq);
  const S = new Float32Array(M * Pb);
  for (let r = 0; r < M; r++) {
    for (let j = 0; j < keys; j++) {
      let sum = 0;
      // i32 arithmetic like the kernel's lanes (two's complement sums do not depend on the order)
      for (let e = 0; e < hd; e++) sum = (sum + q16[r * hd + e]! * k[j * hd + e]!) | 0;
      S[r * Pb + j] = fr(fr(sum) * fr(sq[r]! * ks[j]!));
    }
  }
  softmaxRowsJs(S, M, Pb, lens, scale);
  for (let r = 0; r < M; r++) for (let j = 0; j < Pb; j++) S[r * Pb + j] = fr(S[r * Pb + j]! * vs[j]!);
  matmul(S, M, Pb, v, hd, out);
}
