// Fused multiply-add in the GEMM (fma.ts): the JS twin fmaf is an exactly rounded f32 FMA; where
// the platform's relaxed_madd is fused, the WASM FMA kernel equals the JS kernel with fmaf bit for
// bit and is batch invariant, like the mul+add kernel; the setting is validated.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readEnvironment } from '../../src/common/environment.js';
import { detectFma, fmaf, fmaSupport } from '../../src/engine/model/kernels/fma.js';
import { JsKernel } from '../../src/engine/model/kernels/js_kernel.js';
import { WasmKernel } from '../../src/engine/model/kernels/wasm_kernel.js';

function bitsEqual(a: Float32Array, b: Float32Array, what: string): void {
  assert.equal(a.length, b.length, `${what}: lengths differ`);
  for (let i = 0; i < a.length; i++) if (!Object.is(a[i], b[i])) assert.fail(`${what}: element ${i} differs: ${a[i]} vs ${b[i]}`);
}

test('fmaf: one rounding, including the double-rounding midpoints f64 alone gets wrong', () => {
  const fr = Math.fround;
  // (1 + 2^-23)(1 - 2^-23) - 1 = -2^-46 exactly; rounding the product first gives 0.
  assert.equal(fmaf(fr(1 + 2 ** -23), fr(1 - 2 ** -23), -1), -(2 ** -46));
  // (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 is exactly halfway between two f32 values; a tiny c decides
  // the side, which f32(f64(p + c)) loses (it ties to even: 1 + 2^-11).
  const a = 1 + 2 ** -12;
  assert.equal(fr(a * a + 2 ** -80), 1 + 2 ** -11, 'f64 then f32 double-rounds');
  assert.equal(fmaf(a, a, 2 ** -80), 1 + 2 ** -11 + 2 ** -23);
  assert.equal(fmaf(a, a, -(2 ** -80)), 1 + 2 ** -11);
  assert.equal(fmaf(-a, a, -(2 ** -80)), -(1 + 2 ** -11 + 2 ** -23));
  assert.equal(fmaf(2, 3, 4), 10);
  assert.ok(Number.isNaN(fmaf(NaN, 1, 1)));
  assert.equal(fmaf(fr(3e38), 2, 0), Infinity);
});

test('KVC_WASM_FMA: "0" is off, "1" requires it, anything else is a clear error', () => {
  assert.deepEqual(detectFma('0'), { fma: false, reason: 'off (KVC_WASM_FMA=0)' });
  assert.throws(() => readEnvironment({ KVC_WASM_FMA: 'yes' }).get('wasmFma'), /KVC_WASM_FMA must be "0" \(off\) or "1" \(required\), or unset.*"yes"/);
  const auto = detectFma(undefined);
  if (auto.fma) assert.equal(detectFma('1').fma, true);
  else assert.throws(() => detectFma('1'), /KVC_WASM_FMA=1 but fused multiply-add is unavailable/);
});

test('gemm: FMA and mul+add WASM kernels each equal the JS kernel with the same setting, bitwise, batch invariant', async (t) => {
  const support = fmaSupport();
  if (!support.fma) {
    // Nothing fused to test here: asking for the FMA kernel must fail, not silently compute mul+add.
    await assert.rejects(WasmKernel.create({ fma: true }), /FMA kernel requested but unavailable/);
    t.diagnostic(`FMA unavailable: ${support.reason}`);
    return;
  }
  const shapes = [[1, 40, 7], [5, 33, 16], [9, 100, 64], [70, 64, 9], [131, 70, 300]] as const;
  const outs: Record<string, Float32Array[]> = {};
  for (const fma of [true, false]) {
    const js = new JsKernel({ fma });
    const one = await WasmKernel.create({ fma, threads: 1 });
    const two = await WasmKernel.create({ fma, threads: 2 });
    assert.equal(one.fma, fma);
    outs[String(fma)] = [];
    for (const [m, n, k] of shapes) {
      const a = Float32Array.from({ length: m * k }, (_, i) => Math.sin(i * 1.7) * 3);
      const w = Float32Array.from({ length: n * k }, (_, i) => Math.cos(i * 0.37));
      const ref = new Float32Array(m * n);
      js.matmul(js.upload(w, n, k), a, m, ref);
      for (const g of [one, two]) {
        const ww = g.upload(w, n, k);
        const o = new Float32Array(m * n);
        g.matmul(ww, a, m, o);
        bitsEqual(o, ref, `fma=${fma} threads=${g.threads} ${m}x${n}x${k}`);
        for (const r of [0, m - 1, m >> 1]) {
          const row = new Float32Array(n);
          g.matmul(ww, a.subarray(r * k, r * k + k), 1, row);
          bitsEqual(row, ref.subarray(r * n, r * n + n), `fma=${fma} row ${r} alone`);
        }
      }
      const bt = new Float32Array(k * n);
      for (let i = 0; i < n; i++) for (let j = 0; j < k; j++) bt[j * n + i] = w[i * k + j]!;
      const d = new Float32Array(m * n);
      one.matmulDense(a, m, k, bt, n, d);
      bitsEqual(d, ref, `fma=${fma} dense`);
      outs[String(fma)]!.push(ref);
    }
    one.close();
    two.close();
  }
  // The two arithmetics differ (else the FMA kernel would not be in use) but only by rounding.
  let differing = 0;
  for (let s = 0; s < shapes.length; s++) {
    const f = outs.true![s]!;
    const p = outs.false![s]!;
    for (let i = 0; i < f.length; i++) {
      if (f[i] !== p[i]) differing++;
      assert.ok(Math.abs(f[i]! - p[i]!) <= 1e-4 * (1 + Math.abs(p[i]!)), `fma vs mul+add element ${i}: ${f[i]} vs ${p[i]}`);
    }
  }
  assert.ok(differing > 0, 'the FMA kernel changes some roundings');
});
