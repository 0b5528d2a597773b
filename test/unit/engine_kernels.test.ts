// The kernels' contract, bitwise: the WASM SIMD kernel (GEMM, argmax, a product's fused argmax,
// row argmax shared with the helper thread, attention over staged paged KV) equals the plain-JS
// reference and is batch invariant. The model built on them: engine_model.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { expf32 } from '../../src/engine/model/kernels/attention_js.js';
import { measureGemm } from '../../src/engine/model/kernels/gemm_bench.js';
import { argmaxJs } from '../../src/engine/model/kernels/kernel.js';
import { JsKernel } from '../../src/engine/model/kernels/js_kernel.js';
import { WasmKernel } from '../../src/engine/model/kernels/wasm_kernel.js';
import { BLOCK_TOKENS } from '../../src/engine/model/kv_cache.js';
import { bitsEqual } from '../../harness/numeric.js';
import { propertyParams } from '../../harness/property.js';

test('gemm: WASM SIMD kernel equals the JS reference bitwise and is batch invariant', async () => {
  const js = new JsKernel();
  const wa = await WasmKernel.create();
  for (const [m, n, k] of [[1, 40, 7], [5, 33, 16], [9, 100, 64], [70, 64, 9], [131, 70, 33]] as const) {
    const a = Float32Array.from({ length: m * k }, (_, i) => Math.sin(i * 1.7) * 3);
    const w = Float32Array.from({ length: n * k }, (_, i) => Math.cos(i * 0.37));
    const o1 = new Float32Array(m * n);
    const o2 = new Float32Array(m * n);
    js.matmul(js.upload(w, n, k), a, m, o1);
    const ww = wa.upload(w, n, k);
    wa.matmul(ww, a, m, o2);
    bitsEqual(o1, o2, `matmul ${m}x${n}x${k}`);
    // Each row alone gives the same bits as within the batch.
    for (const r of [0, m - 1, m >> 1]) {
      const one = new Float32Array(n);
      wa.matmul(ww, a.subarray(r * k, r * k + k), 1, one);
      bitsEqual(one, o2.subarray(r * n, r * n + n), `row ${r} of ${m}`);
    }
    const d1 = new Float32Array(m * n);
    const d2 = new Float32Array(m * n);
    const bt = new Float32Array(k * n);
    for (let i = 0; i < n; i++) for (let j = 0; j < k; j++) bt[j * n + i] = w[i * k + j]!;
    js.matmulDense(a, m, k, bt, n, d1);
    wa.matmulDense(a, m, k, bt, n, d2);
    bitsEqual(d1, o1, 'dense js');
    bitsEqual(d2, o1, 'dense wasm');
  }
  // Big enough to be split across the worker thread: still bitwise equal to the reference.
  const two = await WasmKernel.create({ threads: 2 });
  const one = await WasmKernel.create({ threads: 1 });
  try {
    const [m, n, k] = [37, 1000, 300];
    const a = Float32Array.from({ length: m * k }, (_, i) => Math.sin(i * 0.77));
    const w = Float32Array.from({ length: n * k }, (_, i) => Math.cos(i * 0.13));
    const r0 = new Float32Array(m * n);
    const r1 = new Float32Array(m * n);
    const r2 = new Float32Array(m * n);
    js.matmul(js.upload(w, n, k), a, m, r0);
    one.matmul(one.upload(w, n, k), a, m, r1);
    two.matmul(two.upload(w, n, k), a, m, r2);
    bitsEqual(r1, r0, 'one thread');
    bitsEqual(r2, r0, 'two threads');
    // Many back-to-back split calls: whichever thread claims the second half, same bits.
    const [m2, n2, k2] = [8, 1024, 256];
    const a2 = Float32Array.from({ length: m2 * k2 }, (_, i) => Math.sin(i * 0.5));
    const w2 = Float32Array.from({ length: n2 * k2 }, (_, i) => Math.cos(i * 0.21));
    const ref = new Float32Array(m2 * n2);
    one.matmul(one.upload(w2, n2, k2), a2, m2, ref);
    const wt2 = two.upload(w2, n2, k2);
    for (let i = 0; i < 150; i++) {
      const o = new Float32Array(m2 * n2);
      two.matmul(wt2, a2, m2, o);
      bitsEqual(o, ref, `split call ${i}`);
    }
    assert.equal(two.threads, 2, 'the worker is still attached');
  } finally {
    two.close();
    one.close();
  }
  // Attention core (Q·Kᵀ, softmax with the f32 polynomial exp, P·V): WASM == JS bitwise, and
  // close to an f64 softmax.
  for (let x = -90; x <= 0; x += 0.37) {
    const e = Math.exp(Math.fround(x));
    if (e > 1e-37) assert.ok(Math.abs(expf32(Math.fround(x)) - e) <= e * 2e-7, `expf32(${x})`);
  }
  for (const [M, hd, P] of [[1, 32, 32], [4, 32, 160], [9, 80, 64]] as const) {
    const q = Float32Array.from({ length: M * hd }, (_, i) => Math.sin(i * 0.31) * 2);
    const kt = Float32Array.from({ length: hd * P }, (_, i) => Math.cos(i * 0.7));
    const v = Float32Array.from({ length: P * hd }, (_, i) => Math.sin(i * 1.3));
    const lens = Int32Array.from({ length: M }, (_, r) => Math.max(1, P - ((r * 7) % P)));
    const o1 = new Float32Array(M * hd);
    const o2 = new Float32Array(M * hd);
    js.attend(q, M, hd, kt, P, v, lens, 1 / Math.sqrt(hd), o1);
    wa.attend(q, M, hd, kt, P, v, lens, 1 / Math.sqrt(hd), o2);
    bitsEqual(o1, o2, `attend ${M}x${hd}x${P}`);
    for (let r = 0; r < M; r++) {
      const s: number[] = [];
      for (let j = 0; j < lens[r]!; j++) {
        let d = 0;
        for (let e = 0; e < hd; e++) d += q[r * hd + e]! * kt[e * P + j]!;
        s.push(d / Math.sqrt(hd));
      }
      const mx = Math.max(...s);
      const ex = s.map((x) => Math.exp(x - mx));
      const sum = ex.reduce((a, b) => a + b, 0);
      for (let e = 0; e < hd; e++) {
        let o = 0;
        for (let j = 0; j < lens[r]!; j++) o += (ex[j]! / sum) * v[j * hd + e]!;
        assert.ok(Math.abs(o - o1[r * hd + e]!) < 1e-5, `attend row ${r} col ${e}: ${o} vs ${o1[r * hd + e]}`);
      }
    }
  }
  const g = await measureGemm(64, 256, 256, 2);
  assert.ok(g.kernelGflops > 0 && g.jsGflops > 0);
});

test('argmax: the WASM SIMD kernel answers like the scalar loop (lowest index on ties, NaN), any length', async () => {
  const wa = await WasmKernel.create({ threads: 1 });
  const js = new JsKernel();
  try {
    const cases: Float32Array[] = [
      Float32Array.of(1),
      Float32Array.of(2, 2),
      Float32Array.of(-1, 3, 3, 0, 3),
      Float32Array.of(0, 0, 0, 0, 0, 0, 0),
      Float32Array.of(-Infinity, -Infinity, -5, -Infinity, -5, -5, -Infinity, -5, -5),
      Float32Array.from({ length: 32000 }, (_, i) => Math.sin(i * 0.37) * 3),
      // NaN: the scalar loop never takes one, and answers 0 when element 0 is NaN
      Float32Array.of(0, NaN, 0, 0, 0, 9, 1),
      Float32Array.of(NaN, 1, 2, 3, 4, 5, 6, 7, 8),
      Float32Array.of(-Infinity, NaN, NaN, NaN, -Infinity, -Infinity),
      Float32Array.of(-Infinity, NaN, -3, NaN, NaN, NaN, NaN, NaN, NaN, -2),
      Float32Array.of(NaN),
      Float32Array.of(3, NaN, 3),
    ];
    // The maximum at every lane and in the tail, with equal values before and after it.
    for (const at of [0, 1, 2, 3, 4, 5, 31996, 31999, 32001, 32002]) {
      const x = Float32Array.from({ length: 32003 }, (_, i) => (i * 7919) % 1000);
      x[at] = 5000;
      cases.push(x);
      const tie = x.slice();
      tie[at + 1] = 5000;
      if (at >= 4) tie[at - 3] = 5000; // an earlier tie in another lane wins
      cases.push(tie);
    }
    for (const [i, x] of cases.entries()) {
      assert.equal(wa.argmax(x), argmaxJs(x), `case ${i} (length ${x.length})`);
      assert.equal(js.argmax(x), argmaxJs(x));
    }
    // Random lengths over the 16 lanes and the tail, few distinct values (ties everywhere), NaN and
    // -Inf sprinkled: the lane merge must always pick the scalar loop's index.
    const value = fc.oneof({ weight: 8, arbitrary: fc.integer({ min: -3, max: 3 }) }, fc.constant(Number.NaN), fc.constant(-Infinity), fc.constant(Infinity));
    fc.assert(
      fc.property(fc.array(value, { minLength: 1, maxLength: 80 }), fc.nat(3000), (head, pad) => {
        const x = Float32Array.from([...head, ...Array.from({ length: pad }, () => -4)]);
        assert.equal(wa.argmax(x), argmaxJs(x));
      }),
      propertyParams({ numRuns: 2000 }),
    );
  } finally {
    wa.close();
  }
});

test('matmul with argmaxOut: each row answers like the scalar loop over the product, chunked across the helper thread or not', async () => {
  const two = await WasmKernel.create({ threads: 2 });
  const one = await WasmKernel.create({ threads: 1 });
  const js = new JsKernel();
  try {
    // [m, k, n]: shared by both threads (m·k·n ≥ 2^20) with and without padded columns, and small.
    for (const [m, k, n, nanFirst] of [[8, 64, 32003, false], [3, 64, 32000, false], [8, 64, 32000, true], [1, 8, 50, false], [8, 32, 4096, false]] as const) {
      const w = Float32Array.from({ length: n * k }, (_, i) => (((i * 7919) % 97) - 48) / 64);
      const row = (c: number, v: number) => w.fill(v, c * k, c * k + k);
      // The largest product of the positive rows, at several columns far apart (ties across
      // chunks: the first must win); a NaN column and +Inf / -Inf columns (sums that overflow).
      for (const c of [n - 1, 7, Math.floor(n / 2) + 3, 9]) row(c, 3);
      row(5, Number.NaN);
      row(Math.floor(n / 3), 1e38);
      row(Math.floor(n / 4), -1e38);
      if (nanFirst) row(0, Number.NaN);
      // Rows alternate in sign, so the odd ones' maximum lies elsewhere (and +Inf becomes -Inf).
      const a = Float32Array.from({ length: m * k }, (_, i) => (Math.floor(i / k) % 2 ? -1 : 1) * (0.5 + ((i * 31) % 17) / 17));
      for (const g of [two, one, js]) {
        const wt = g.upload(w, n, k);
        const plain = new Float32Array(m * n);
        g.matmul(wt, a, m, plain);
        const out = new Float32Array(m * n);
        const am = new Int32Array(m + 1).fill(-7);
        g.matmul(wt, a, m, out, am);
        assert.deepEqual(out, plain, `${g.kind} ${m}x${k}x${n}: the product is unchanged`);
        const want = Array.from({ length: m }, (_, r) => argmaxJs(out.subarray(r * n, r * n + n)));
        assert.deepEqual([...am.subarray(0, m)], want, `${g.kind} ${m}x${k}x${n}${nanFirst ? ' (NaN first)' : ''}`);
        assert.equal(am[m], -7, 'nothing written past the rows');
        // In kernel memory (the LM head's output buffer), where the product is written in place.
        if (g !== js) {
          const inKernel = g.activation(11, m * n);
          g.matmul(wt, a, m, inKernel, am);
          assert.deepEqual([...am.subarray(0, m)], want, `${g.kind} ${m}x${k}x${n} in place`);
        }
      }
    }
  } finally {
    two.close();
    one.close();
  }
});

test('argmaxRows: every row answers like the scalar loop, the rows shared with the helper thread or not', async () => {
  const two = await WasmKernel.create({ threads: 2 });
  const one = await WasmKernel.create({ threads: 1 });
  const js = new JsKernel();
  try {
    for (const [rows, n] of [[1, 7], [2, 32000], [8, 32003], [13, 50], [3, 1]] as const) {
      const x = Float32Array.from({ length: rows * n }, (_, i) => ((i * 7919) % 97) - 40);
      // Ties across rows and lanes, a NaN at the start of one row, -Inf everywhere in another.
      if (rows > 1) x[n] = Number.NaN;
      if (rows > 2) x.fill(-Infinity, 2 * n, 3 * n);
      const want = Array.from({ length: rows }, (_, r) => argmaxJs(x.subarray(r * n, r * n + n)));
      for (const k of [two, one, js]) {
        const out = new Int32Array(rows + 2).fill(-7);
        // In kernel memory (the LM head's buffer) and as an ordinary array (copied).
        const inKernel = k === js ? x : k.activation(9, rows * n);
        if (inKernel !== x) inKernel.set(x);
        k.argmaxRows(inKernel, rows, n, out);
        assert.deepEqual([...out.subarray(0, rows)], want, `${k.kind} ${rows}x${n}`);
        assert.deepEqual([...out.subarray(rows)], [-7, -7], 'nothing written past the rows');
        k.argmaxRows(x, rows, n, out);
        assert.deepEqual([...out.subarray(0, rows)], want, `${k.kind} ${rows}x${n} (copied)`);
      }
    }
  } finally {
    two.close();
    one.close();
  }
});

test('attention over staged paged KV equals attend() on gathered operands, WASM and JS, bitwise', async () => {
  const js = new JsKernel();
  const wa = await WasmKernel.create({ threads: 1 });
  try {
    // A pool of 6 blocks [layers=2][K,V][16][kvDim]; the sequence owns blocks 4, 1, 3 (out of order).
    const layers = 2;
    const kvHeads = 3;
    const hd = 20; // not a multiple of the strip: value columns are padded
    const kvDim = kvHeads * hd;
    const blockFloats = layers * 2 * BLOCK_TOKENS * kvDim;
    const pool = Float32Array.from({ length: 6 * blockFloats }, (_, i) => Math.sin(i * 0.013) * 1.5);
    const table = [4, 1, 3];
    for (const [l, g, keys, M] of [[1, 2, 37, 5], [0, 0, 1, 1], [1, 1, 48, 8], [0, 2, 16, 3]] as const) {
      const layerOffset = l * 2 * BLOCK_TOKENS * kvDim;
      const Pb = Math.ceil(keys / 32) * 32;
      // The operands attend() takes, gathered here the slow obvious way (zeros beyond `keys`).
      const kt = new Float32Array(hd * Pb);
      const v = new Float32Array(Pb * hd);
      for (let j = 0; j < keys; j++) {
        const base = table[Math.floor(j / BLOCK_TOKENS)]! * blockFloats + layerOffset + (j % BLOCK_TOKENS) * kvDim + g * hd;
        for (let e = 0; e < hd; e++) {
          kt[e * Pb + j] = pool[base + e]!;
          v[j * hd + e] = pool[base + BLOCK_TOKENS * kvDim + e]!;
        }
      }
      const q = Float32Array.from({ length: M * hd }, (_, i) => Math.cos(i * 0.29 + l));
      const lens = Int32Array.from({ length: M }, (_, r) => Math.max(1, keys - r));
      const want = new Float32Array(M * hd);
      js.attend(q, M, hd, kt, Pb, v, lens, 0.25, want);
      for (const [name, k] of [['js', js], ['wasm', wa]] as const) {
        const got = new Float32Array(M * hd);
        k.stageKv(pool, table, Math.ceil(keys / BLOCK_TOKENS), blockFloats, layerOffset, kvDim);
        k.attendStaged(q, M, hd, g * hd, keys, lens, 0.25, got);
        bitsEqual(got, want, `${name} staged attention l=${l} g=${g} keys=${keys}`);
        // All heads in one call ([heads][M][hd] queries) equals one call per head.
        const qAll = Float32Array.from({ length: kvHeads * M * hd }, (_, i) => Math.cos(i * 0.11 + g));
        const all = new Float32Array(kvHeads * M * hd);
        k.attendStagedHeads(qAll, M, hd, kvHeads, keys, lens, 0.25, all);
        for (let h = 0; h < kvHeads; h++) {
          const one = new Float32Array(M * hd);
          k.attendStaged(qAll.subarray(h * M * hd, (h + 1) * M * hd), M, hd, h * hd, keys, lens, 0.25, one);
          bitsEqual(all.subarray(h * M * hd, (h + 1) * M * hd), one, `${name} all-heads attention, head ${h}, keys=${keys}`);
        }
      }
    }
  } finally {
    wa.close();
  }
});
