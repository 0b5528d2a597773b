// Attention over a narrow KV cache read in place (the WASM kernel's attendnarrow: the score and
// value products load the staged 16- and 8-bit rows and widen them in registers): for every dtype,
// the built-in model's and the 156M model's head shapes, odd key counts (partial blocks and
// strips), decode and 3-token rows, it gives the JS kernel's bits (attention_js.ts widening K and V
// to f32 first; int8: attention_int8_js.ts) and stays close to a float64 attention over the same
// values (TOLERANCE). Inf/NaN values and queries too large for the fast widening take the exact
// path and still agree.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { DType } from '../../src/common/dtype.js';
import { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { JsKernel } from '../../src/engine/model/kernels/js_kernel.js';
import { WasmKernel } from '../../src/engine/model/kernels/wasm_kernel.js';
import { gatherStagedJs } from '../../src/engine/model/kernels/attention_js.js';
import { f16Table } from '../../src/common/half.js';

let wasm: WasmKernel;
const js = new JsKernel();

before(async () => {
  wasm = await WasmKernel.create({ threads: 1 });
});
after(() => wasm.close());

/** A deterministic generator (xorshift) of floats in [-1, 1). */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return ((s >>> 0) / 2 ** 32) * 2 - 1;
  };
}

interface Shape {
  name: string;
  heads: number;
  hd: number;
  group: number;
}
const SHAPES: Shape[] = [
  { name: 'built-in tiny (2 KV heads × 32, 4 queries each)', heads: 2, hd: 32, group: 4 },
  { name: '156M (4 KV heads × 64, 4 queries each)', heads: 4, hd: 64, group: 4 },
  { name: 'head_dim 20 (a 4-column tail), 3 queries each', heads: 1, hd: 20, group: 3 },
];
const NARROW = [DType.f16, DType.bf16, DType.int8, DType.fp8_e4m3, DType.fp8_e5m2];

/** A cache of `keys` positions of one layer, K from `val(i)` and V from `vval(i)`, staged into both kernels. */
function staged(dtype: DType, s: Shape, keys: number, val: (i: number) => number, vval = (i: number, k: number) => -k * 0.75): PagedKvCache {
  const kv = new PagedKvCache({ numLayers: 1, numKvHeads: s.heads, headDim: s.hd, dtype }, (keys + 16) * 2 * s.heads * s.hd * 4 + (1 << 16));
  kv.allocate('s', keys);
  const kvDim = s.heads * s.hd;
  const rows = Float32Array.from({ length: keys * kvDim }, (_, i) => val(i));
  const blocks = kv.blockTable('s');
  for (let p = 0; p < keys; p = Math.min(keys, (p & ~15) + 16)) {
    const end = Math.min(keys, (p & ~15) + 16);
    kv.writeRows(rows, p * kvDim, end * kvDim, kv.offset(blocks, 0, 0, p));
    kv.writeRows(rows.map((x, i) => vval(i, x)), p * kvDim, end * kvDim, kv.offset(blocks, 0, 1, p));
  }
  kv.setLength('s', keys);
  for (const k of [wasm, js]) k.stageKv(kv.pool, blocks, Math.ceil(keys / 16), kv.blockFloats, kv.layerOffset(0), kvDim, dtype, kv.layerElems);
  return kv;
}

/** Both kernels' attention of T query tokens (causal, the last at position keys − 1). */
function attend(s: Shape, keys: number, T: number, q: Float32Array): { a: Float32Array; b: Float32Array; lens: Int32Array } {
  const M = T * s.group;
  const lens = new Int32Array(M);
  for (let t = 0; t < T; t++) for (let h = 0; h < s.group; h++) lens[t * s.group + h] = keys - T + t + 1;
  const a = new Float32Array(s.heads * M * s.hd);
  const b = new Float32Array(s.heads * M * s.hd);
  wasm.attendStagedHeads(q, M, s.hd, s.heads, keys, lens, 1 / Math.sqrt(s.hd), a);
  js.attendStagedHeads(q, M, s.hd, s.heads, keys, lens, 1 / Math.sqrt(s.hd), b);
  return { a, b, lens };
}

/** Equal bits, or both NaN (a NaN's payload is not specified by WASM). */
function sameBits(a: Float32Array, b: Float32Array, what: string): void {
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < a.length; i++) {
    if (Number.isNaN(a[i]) && Number.isNaN(b[i])) continue;
    if (ua[i] !== ub[i]) assert.fail(`${what}: element ${i} is ${a[i]} (0x${ua[i]!.toString(16)}), the reference's ${b[i]} (0x${ub[i]!.toString(16)})`);
  }
}

/** float64 attention of head g's rows over the widened staged K/V (JS gather: the exact widening). */
function reference(dtype: DType, kv: PagedKvCache, s: Shape, keys: number, q: Float32Array, M: number, lens: Int32Array): Float64Array {
  const kvDim = s.heads * s.hd;
  const stagedBytes = new Uint8Array(Math.ceil(keys / 16) * kv.layerElems * kv.elemBytes);
  const pool = new Uint8Array(kv.pool.buffer, kv.pool.byteOffset, kv.pool.byteLength);
  const blocks = kv.blockTable('s');
  for (let b = 0; b < Math.ceil(keys / 16); b++) {
    const at = blocks[b]! * kv.blockFloats * kv.elemBytes;
    stagedBytes.set(pool.subarray(at, at + kv.layerElems * kv.elemBytes), b * kv.layerElems * kv.elemBytes);
  }
  const src = kv.elemBytes === 2 ? new Uint16Array(stagedBytes.buffer) : stagedBytes;
  const widen = dtype === DType.f16 ? f16Table() : null;
  const out = new Float64Array(s.heads * M * s.hd);
  for (let g = 0; g < s.heads; g++) {
    const kt = new Float32Array(s.hd * keys);
    const v = new Float32Array(keys * s.hd);
    if (dtype === DType.f16 || dtype === DType.int8) gatherStagedJs(src, kvDim, g * s.hd, s.hd, keys, keys, kt, v, widen, dtype === DType.int8);
    else return out; // the other dtypes' widening tables are private to the JS kernel; bits are compared for them
    for (let r = 0; r < M; r++) {
      const qr = q.subarray((g * M + r) * s.hd, (g * M + r + 1) * s.hd);
      const sc = new Float64Array(lens[r]!);
      let mx = -Infinity;
      for (let j = 0; j < lens[r]!; j++) {
        let d = 0;
        for (let e = 0; e < s.hd; e++) d += qr[e]! * kt[e * keys + j]!;
        sc[j] = d / Math.sqrt(s.hd);
        mx = Math.max(mx, sc[j]!);
      }
      let sum = 0;
      for (let j = 0; j < sc.length; j++) sum += sc[j] = Math.exp(sc[j]! - mx);
      for (let e = 0; e < s.hd; e++) {
        let o = 0;
        for (let j = 0; j < sc.length; j++) o += (sc[j]! / sum) * v[j * s.hd + e]!;
        out[(g * M + r) * s.hd + e] = o;
      }
    }
  }
  return out;
}

/**
 * Largest |Δ| ÷ (1 + |x|) against the float64 attention over the same widened K and V: f16, f32
 * rounding only; int8, its queries quantized to int16 (2^-16 of the row's largest per element).
 */
const TOLERANCE: Partial<Record<DType, number>> = { [DType.f16]: 1e-5, [DType.int8]: 2e-4 };

for (const dtype of NARROW) {
  for (const s of SHAPES) {
    test(`${DType[dtype]} KV, ${s.name}: read in place, the reference's bits for decode and 3-token rows at odd lengths`, () => {
      for (const keys of [1, 7, 16, 37, 130, 301]) {
        const r = rng(keys * 31 + dtype);
        const kv = staged(dtype, s, keys, () => r() * 3);
        for (const T of [1, Math.min(3, keys)]) {
          const M = T * s.group;
          const q = Float32Array.from({ length: s.heads * M * s.hd }, () => r() * 2);
          const { a, b, lens } = attend(s, keys, T, q);
          sameBits(a, b, `keys ${keys}, ${T} tokens`);
          const ref = reference(dtype, kv, s, keys, q, M, lens);
          const tol = TOLERANCE[dtype];
          if (tol) for (let i = 0; i < a.length; i++) assert.ok(Math.abs(a[i]! - ref[i]!) <= tol * (1 + Math.abs(ref[i]!)), `keys ${keys}, element ${i}: ${a[i]} against float64 ${ref[i]}`);
        }
      }
    });
  }

  test(`${DType[dtype]} KV: Inf/NaN values and queries beyond the fast widening's range give the reference's bits`, () => {
    const s = SHAPES[0]!;
    const keys = 45;
    const small = (i: number) => ((i * 7919) % 200) / 100 - 1;
    // V past the dtype's range: Inf (f16, E5M2), saturated (E4M3) or scaled (int8); NaN as is.
    // (Inf/NaN K: engine_kernels_nonfinite.test.ts.)
    staged(dtype, s, keys, small, (i) => (i % 97 === 5 ? 1e6 : i % 89 === 3 ? -1e6 : i % 101 === 7 ? NaN : small(i)));
    const q = Float32Array.from({ length: s.heads * s.group * s.hd }, (_, i) => ((i % 13) - 6) * 0.1);
    const { a, b } = attend(s, keys, 1, q);
    sameBits(a, b, 'special elements');
    staged(dtype, s, keys, small);
    const large = q.map((x, i) => (i === 3 ? 3e5 : x * 1000));
    const r2 = attend(s, keys, 1, large);
    sameBits(r2.a, r2.b, 'large queries');
  });
}
