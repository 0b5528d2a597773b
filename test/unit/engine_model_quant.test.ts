// Weights kept in their stored encoding (F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K) in the WASM kernel:
// every product equals, bit for bit, the plain-JS kernel's (16-bit: on the decoded f32 values;
// block formats: the int8 dot products of q8_dot.ts, Q8 and Q4), for any number of rows (batch
// invariance) and whether or not the worker thread takes a share of the columns.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { encodeTensor } from '../../src/engine/model/formats/gguf_write.js';
import { fmaSupport } from '../../src/engine/model/kernels/fma.js';
import { JsKernel } from '../../src/engine/model/kernels/js_kernel.js';
import { WasmKernel } from '../../src/engine/model/kernels/wasm_kernel.js';
import { decodeWeight, type EncodedWeight } from '../../src/engine/model/kernels/weight_pack.js';
import { relativeRms } from '../../harness/numeric.js';

function rand(len: number, seed: number, scale = 1): Float32Array {
  const out = new Float32Array(len);
  let s = seed >>> 0;
  for (let i = 0; i < len; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = (s / 4294967296 - 0.5) * scale;
  }
  return out;
}

function sameBits(a: Float32Array, b: Float32Array, what: string): void {
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < a.length; i++) if (ua[i] !== ub[i]) assert.fail(`${what}: element ${i}: ${a[i]} vs ${b[i]}`);
}

test('encoded weights: WASM F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K kernels equal the JS kernel bitwise (16-bit: on decoded weights), alone or batched', async () => {
  // 4-bit weights held as q8 (the default) and as q4 (KVC_WEIGHTS_4BIT=q4: relaxed SIMD only).
  for (const [threads, q4] of [[1, false], [2, false], [1, true], [2, true]] as const) {
    if (q4 && !fmaSupport().fma) {
      console.log(`q4 kernel not tested: it needs relaxed SIMD with FMA (${fmaSupport().reason})`);
      continue;
    }
    const js = new JsKernel({ q4 });
    const wasm = await WasmKernel.create({ threads, q4 });
    try {
      // n not a multiple of the strip (padding), k a multiple of 32 (block formats).
      for (const [n, k] of [
        [70, 256],
        [300, 512],
      ] as const) {
        const w = rand(n * k, n + k, 0.2);
        // Subnormal f16 values and exact zeros must widen exactly too.
        w[3] = 3e-6;
        w[5] = -1e-7;
        w[7] = 0;
        for (const type of ['F16', 'BF16', 'Q8_0', 'Q4_0', 'Q4_1', 'Q4_K'] as const) {
          const enc: EncodedWeight = { type, bytes: encodeTensor(type, w) };
          const ref = type === 'F16' || type === 'BF16' ? js.upload(decodeWeight(enc, n, k), n, k) : js.uploadEncoded(enc, n, k);
          assert.equal(ref.fmt, type === 'F16' || type === 'BF16' ? 'f32' : type === 'Q8_0' || !q4 ? 'q8' : 'q4');
          assert.equal(wasm.uploadEncoded(enc, n, k).fmt, ref.fmt === 'f32' ? type.toLowerCase() : ref.fmt);
          const wt = wasm.uploadEncoded(enc, n, k);
          // 70 rows: past the kernel's 64-row block, and large enough to be split with the worker.
          const a = rand(70 * k, 7);
          // Q8 activation quantization edge cases: an all-zero block (scale 0) and exact halves
          // (amax 127 makes the scale 1, so 2.5 → 2 and -3.5 → -4: half to even).
          a.fill(0, k, k + 32);
          a.set([127, 2.5, -3.5, 0.5, -0.5, 1.5, -127], 2 * k);
          const full = new Float32Array(70 * n);
          wasm.matmul(wt, a, 70, full);
          for (const m of [1, 4, 9, 70]) {
            const got = new Float32Array(m * n);
            const exp = new Float32Array(m * n);
            wasm.matmul(wt, a, m, got);
            js.matmul(ref, a, m, exp);
            sameBits(got, exp, `${type} ${n}x${k} m=${m} threads=${threads} q4=${q4}`);
            sameBits(got, full.subarray(0, m * n), `${type} batch invariance m=${m}`);
          }
        }
      }
    } finally {
      wasm.close();
    }
  }
});

test('Q8 product: close to the f32 product of the decoded weights (activations quantized per block of 32)', async () => {
  const js = new JsKernel();
  const [n, k, m] = [96, 256, 3];
  const w = rand(n * k, 11, 0.2);
  const enc: EncodedWeight = { type: 'Q8_0', bytes: encodeTensor('Q8_0', w) };
  const a = rand(m * k, 5);
  const q8 = new Float32Array(m * n);
  const f32 = new Float32Array(m * n);
  js.matmul(js.uploadEncoded(enc, n, k), a, m, q8);
  js.matmul(js.upload(decodeWeight(enc, n, k), n, k), a, m, f32);
  // int8 activations carry ~0.4 % noise per value; the dot averages it down.
  const rel = relativeRms(q8, f32);
  assert.ok(rel < 0.01, `relative RMS error ${rel}`);
  assert.ok(rel > 0, 'the Q8 product quantizes the activations, so it differs from the f32 one');
});

test('Q4 product: close to the f32 product of the decoded weights, for Q4_0, Q4_1 and Q4_K', async () => {
  const js = new JsKernel({ q4: true });
  const [n, k, m] = [96, 512, 3];
  const w = rand(n * k, 11, 0.2);
  const a = rand(m * k, 5);
  for (const type of ['Q4_0', 'Q4_1', 'Q4_K'] as const) {
    const enc: EncodedWeight = { type, bytes: encodeTensor(type, w) };
    const q4 = new Float32Array(m * n);
    const f32 = new Float32Array(m * n);
    js.matmul(js.uploadEncoded(enc, n, k), a, m, q4);
    js.matmul(js.upload(decodeWeight(enc, n, k), n, k), a, m, f32);
    // The same weight values (s·q − o is the decoded value), only the activations quantized.
    const rel = relativeRms(q4, f32);
    assert.ok(rel < 0.01, `${type}: relative RMS error ${rel}`);
  }
});

test('encoded weights: F16 Inf/NaN and malformed sizes are refused at upload', async () => {
  const wasm = await WasmKernel.create({ threads: 1 });
  try {
    const bytes = encodeTensor('F16', rand(32 * 32, 1));
    new DataView(bytes.buffer).setUint16(10, 0x7c00, true);
    assert.throws(() => wasm.uploadEncoded({ type: 'F16', bytes }, 32, 32), /Inf or NaN/);
    assert.throws(() => wasm.uploadEncoded({ type: 'Q8_0', bytes: new Uint8Array(10) }, 32, 32), /expected 32x32/);
    assert.throws(() => wasm.uploadEncoded({ type: 'Q4_K', bytes: new Uint8Array(10) }, 32, 256), /expected 32x256/);
    assert.throws(() => wasm.uploadEncoded({ type: 'Q4_K', bytes: new Uint8Array(32 * 18) }, 32, 32), /not a multiple of 256/);
  } finally {
    wasm.close();
  }
});

test('swiglu: the WASM kernel equals swigluJs bitwise, extremes included, and is per element', async () => {
  const { swigluJs } = await import('../../src/engine/model/kernels/attention_js.js');
  const wasm = await WasmKernel.create({ threads: 1 });
  try {
    const hidden = 37; // vector body and scalar tail
    const rows = 5;
    const gu = rand(rows * 2 * hidden, 11, 20);
    gu.set([0, -0, 1e-30, -1e-30, 87, -87, 88.5, -88.5, 200, -200, 1e30, -1e30], 0);
    const a = new Float32Array(rows * hidden);
    const b = new Float32Array(rows * hidden);
    wasm.swiglu(gu, rows, hidden, a);
    swigluJs(gu, rows, hidden, b);
    sameBits(a, b, 'swiglu');
    for (let i = 0; i < a.length; i++) assert.ok(Number.isFinite(a[i]!), `element ${i} finite`);
    const one = new Float32Array(hidden);
    wasm.swiglu(gu.subarray(2 * 2 * hidden), 1, hidden, one);
    sameBits(one, a.subarray(2 * hidden, 3 * hidden), 'row alone');
    // silu(g) * u against the f64 definition
    for (let i = 0; i < hidden; i++) {
      const g = gu[i]!;
      const ref = (g / (1 + Math.exp(-g))) * gu[hidden + i]!;
      assert.ok(Math.abs(a[i]! - ref) <= 1e-6 * Math.max(1, Math.abs(ref)), `element ${i}: ${a[i]} vs ${ref}`);
    }
  } finally {
    wasm.close();
  }
});
