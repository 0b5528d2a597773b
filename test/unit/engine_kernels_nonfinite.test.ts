// The kernels are total: Inf and NaN inputs (a score from a key past f16's range, an activation a
// prompt drove to the extremes) never trap. They give the JS reference's values — a row of scores
// holding NaN or +Inf softmaxes to NaN, -Inf scores weigh 0 — in the f32 attention, the softmax's
// scalar tail, SwiGLU's scalar tail and attention over every narrow KV dtype. What the engine does
// with a NaN that reaches the logits: engine_nonfinite.test.ts.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { DType } from '../../src/common/dtype.js';
import { expf32 } from '../../src/engine/model/kernels/attention_js.js';
import { JsKernel } from '../../src/engine/model/kernels/js_kernel.js';
import { WasmKernel } from '../../src/engine/model/kernels/wasm_kernel.js';
import { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { propertyParams } from '../../harness/property.js';

let wasm: WasmKernel;
const js = new JsKernel();
before(async () => {
  wasm = await WasmKernel.create({ threads: 1 });
});
after(() => wasm.close());

/** Equal bits, or both NaN (WASM leaves a NaN's payload unspecified). */
function sameValues(a: Float32Array, b: Float32Array, what: string): void {
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < a.length; i++) {
    if (Number.isNaN(a[i]) && Number.isNaN(b[i])) continue;
    if (ua[i] !== ub[i]) assert.fail(`${what}: element ${i} is ${a[i]}, the reference's ${b[i]}`);
  }
}

const SPECIAL = [Infinity, -Infinity, NaN, 1e30, -1e30, 3.4e38];

test('expf32: NaN and +Inf give NaN, -Inf gives 0, no input throws', () => {
  assert.ok(Number.isNaN(expf32(NaN)));
  assert.ok(Number.isNaN(expf32(Infinity)));
  assert.equal(expf32(-Infinity), expf32(-87));
  assert.equal(expf32(0), 1);
});

test('f32 attention: Inf/NaN keys at every position of the vector body and the scalar tail give the reference, no trap', () => {
  const hd = 8;
  const P = 64;
  for (const bad of SPECIAL) {
    for (const at of [0, 3, 17, 36, 37, 38, 63]) {
      const q = Float32Array.from({ length: 3 * hd }, (_, i) => ((i % 5) - 2) * 0.5 + 0.25);
      const kt = Float32Array.from({ length: hd * P }, (_, i) => Math.sin(i * 0.37));
      kt[2 * P + at] = bad; // one element of key `at`
      const v = Float32Array.from({ length: P * hd }, (_, i) => Math.cos(i * 0.11));
      // lengths that end in the 8-wide body, the 4-wide step and a 1–3 element scalar tail
      for (const len of [at + 1, at + 2, at + 4, 39, 64]) {
        if (len > P) continue;
        const lens = Int32Array.of(len, Math.max(1, len - 1), len);
        const a = new Float32Array(3 * hd);
        const b = new Float32Array(3 * hd);
        wasm.attend(q, 3, hd, kt, P, v, lens, 0.35, a);
        js.attend(q, 3, hd, kt, P, v, lens, 0.35, b);
        sameValues(a, b, `key ${at} = ${bad}, len ${len}`);
        // row 0 sees key `at` when len > at: the special element times q[2] = 0.25
        const score = q[2]! * bad * 0.35;
        const row = [...a.subarray(0, hd)];
        if (len <= at) assert.ok(row.every(Number.isFinite), `key ${at} beyond len ${len} is not read`);
        // (a row whose only score is -Inf: m = -Inf and -Inf - m is NaN)
        else if (Number.isNaN(score) || score === Infinity || (score === -Infinity && len === 1)) assert.ok(row.every(Number.isNaN), `key ${at} = ${bad}: a NaN/+Inf score makes the row NaN`);
        else assert.ok(row.every(Number.isFinite), `key ${at} = ${bad}: score ${score} leaves the row finite`);
      }
    }
  }
});

test('softmax: random rows sprinkled with Inf/NaN, any length: WASM equals the reference and never traps', () => {
  const value = fc.oneof({ weight: 10, arbitrary: fc.float({ min: -8, max: 8, noNaN: true }) }, ...SPECIAL.map((x) => fc.constant(x)));
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 47 }), fc.array(value, { minLength: 48, maxLength: 48 }), (len, keys) => {
      // hd = 1, q = 1: the scores are the keys themselves
      const P = 64;
      const kt = new Float32Array(P);
      kt.set(keys);
      const v = Float32Array.from({ length: P }, (_, i) => i + 1);
      const lens = Int32Array.of(len);
      const a = new Float32Array(1);
      const b = new Float32Array(1);
      wasm.attend(Float32Array.of(1), 1, 1, kt, P, v, lens, 1, a);
      js.attend(Float32Array.of(1), 1, 1, kt, P, v, lens, 1, b);
      sameValues(a, b, `len ${len}`);
    }),
    propertyParams({ numRuns: 300 }),
  );
});

test('swiglu: Inf/NaN gates in the vector body and the scalar tail give the reference, no trap', () => {
  for (const hidden of [1, 3, 5, 7, 13]) {
    for (const bad of SPECIAL) {
      const gu = Float32Array.from({ length: 2 * 2 * hidden }, (_, i) => Math.sin(i));
      for (let i = 0; i < hidden; i += 2) gu[i] = bad; // row 0's gates
      gu[2 * hidden + hidden - 1] = bad; // row 1's last gate (the tail)
      const a = new Float32Array(2 * hidden);
      const b = new Float32Array(2 * hidden);
      wasm.swiglu(gu, 2, hidden, a);
      js.swiglu(gu, 2, hidden, b);
      sameValues(a, b, `hidden ${hidden}, gate ${bad}`);
    }
  }
});

const NARROW = [DType.f16, DType.bf16, DType.int8, DType.fp8_e4m3, DType.fp8_e5m2];
for (const dtype of NARROW) {
  test(`${DType[dtype]} KV: keys past the dtype's range (Inf in f16) and NaN keys give the reference, no trap`, () => {
    const heads = 2;
    const hd = 32;
    const group = 4;
    const kvDim = heads * hd;
    for (const keys of [5, 37, 45]) {
      for (const bad of [1e6, -1e6, NaN, Infinity]) {
        const kv = new PagedKvCache({ numLayers: 1, numKvHeads: heads, headDim: hd, dtype }, (keys + 16) * 2 * kvDim * 4 + (1 << 16));
        kv.allocate('s', keys);
        const blocks = kv.blockTable('s');
        const small = (i: number) => ((i * 7919) % 200) / 100 - 1;
        const k = Float32Array.from({ length: keys * kvDim }, (_, i) => small(i));
        k[(keys - 2) * kvDim + 3] = bad; // head 0 of the last-but-one key (a scalar-tail position when keys % 4 != 0)
        k[1 * kvDim + hd + 5] = bad; // head 1 of key 1 (the vector body)
        const v = Float32Array.from({ length: keys * kvDim }, (_, i) => -small(i) * 0.75);
        for (let p = 0; p < keys; p = Math.min(keys, (p & ~15) + 16)) {
          const end = Math.min(keys, (p & ~15) + 16);
          kv.writeRows(k, p * kvDim, end * kvDim, kv.offset(blocks, 0, 0, p));
          kv.writeRows(v, p * kvDim, end * kvDim, kv.offset(blocks, 0, 1, p));
        }
        kv.setLength('s', keys);
        for (const kn of [wasm, js]) kn.stageKv(kv.pool, blocks, Math.ceil(keys / 16), kv.blockFloats, kv.layerOffset(0), kvDim, dtype, kv.layerElems);
        const lens = new Int32Array(group).fill(keys);
        const q = Float32Array.from({ length: heads * group * hd }, (_, i) => ((i % 13) - 6) * 0.1 + 0.05);
        const a = new Float32Array(heads * group * hd);
        const b = new Float32Array(heads * group * hd);
        wasm.attendStagedHeads(q, group, hd, heads, keys, lens, 1 / Math.sqrt(hd), a);
        js.attendStagedHeads(q, group, hd, heads, keys, lens, 1 / Math.sqrt(hd), b);
        sameValues(a, b, `${keys} keys, K element ${bad}`);
      }
    }
  });
}
