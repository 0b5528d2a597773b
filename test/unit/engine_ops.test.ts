// The forward pass's element-wise operations (and strided row copies) and the in-place paths of the WASM kernel: RMSNorm,
// RoPE and the residual add in WASM SIMD (kernels/wat/ops.ts) equal their JS definitions (ops_js.ts) bit
// for bit, on activation buffers in kernel memory and on plain arrays alike; GEMMs and SwiGLU
// reading and writing activation buffers in place give the bits of the copying path, with one
// thread and with the work shared with the worker; softmax with extreme scores equals its JS twin.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { swigluJs } from '../../src/engine/model/kernels/attention_js.js';
import { JsKernel } from '../../src/engine/model/kernels/js_kernel.js';
import { WasmKernel } from '../../src/engine/model/kernels/wasm_kernel.js';
import { addIntoJs, copyRowsJs, rmsNormJs, ropeJs } from '../../src/engine/model/kernels/ops_js.js';

function sameBits(a: Float32Array, b: Float32Array, what: string): void {
  assert.equal(a.length, b.length, `${what}: lengths differ`);
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < ua.length; i++) if (ua[i] !== ub[i]) assert.fail(`${what}: element ${i} differs: ${a[i]} vs ${b[i]}`);
}

function rand(n: number, seed: number, scale = 1): Float32Array {
  const out = new Float32Array(n);
  let s = seed >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    out[i] = (s / 4294967296 - 0.5) * 2 * scale;
  }
  return out;
}

/** A copy of `v` in activation slot `slot` of the kernel (kernel memory). */
function inKernel(g: WasmKernel, slot: number, v: Float32Array): Float32Array {
  const a = g.activation(slot, v.length);
  a.set(v);
  return a;
}

/** Runs `fn` on a WASM kernel made with `opts`, then closes it (its worker thread), also on failure. */
async function withKernel(opts: Parameters<typeof WasmKernel.create>[0], fn: (g: WasmKernel) => void | Promise<void>): Promise<void> {
  const g = await WasmKernel.create(opts);
  try {
    await fn(g);
  } finally {
    g.close();
  }
}

test('RMSNorm, RoPE and the residual add: WASM SIMD equals the JS definition bitwise, in kernel memory and not', async () => {
  await withKernel({ threads: 1 }, async (g) => {
    // dim 37: vector body and scalar tail; hd 20 (half 10) and 6 (half 3) likewise for RoPE. Rows
    // 7 and 9: RMSNorm's groups of four rows and the rows after them.
    for (const [rows, dim] of [[7, 37], [3, 256], [1, 4], [9, 64]] as const) {
      const x = rand(rows * dim, dim, 3);
      x.set([0, -0, 1e-30, 1e30], 0);
      const w = rand(dim, dim + 1);
      for (const eps of [1e-5, 1e-6]) {
        const want = new Float32Array(rows * dim);
        rmsNormJs(x, w, want, rows, dim, eps);
        const xo = inKernel(g, 0, x);
        const out = g.activation(1, rows * dim);
        g.rmsNorm(xo, g.hold(w), out, rows, dim, eps);
        sameBits(out, want, `rmsNorm ${rows}x${dim} eps ${eps} (in place)`);
        const plain = new Float32Array(rows * dim);
        g.rmsNorm(x, w, plain, rows, dim, eps);
        sameBits(plain, want, `rmsNorm ${rows}x${dim} (copied)`);
      }
      const y = rand(rows * dim, dim + 2, 5);
      const want = Float32Array.from(x);
      addIntoJs(want, y, rows * dim);
      const xa = inKernel(g, 2, x);
      g.addInto(xa, inKernel(g, 3, y), rows * dim);
      sameBits(xa, want, `addInto ${rows * dim}`);
    }
    for (const [rows, heads, hd, stride] of [[9, 10, 32, 384], [4, 3, 20, 70], [5, 2, 6, 13]] as const) {
      const qkv = rand(rows * stride, hd + stride, 4);
      const half = hd / 2;
      const maxPos = 40;
      const cos = Float32Array.from({ length: maxPos * half }, (_, i) => Math.cos(i * 0.37));
      const sin = Float32Array.from({ length: maxPos * half }, (_, i) => Math.sin(i * 0.37));
      const pos = Int32Array.from({ length: rows }, (_, r) => (r * 7) % maxPos);
      const want = Float32Array.from(qkv);
      ropeJs(want, rows, stride, heads, hd, pos, cos, sin);
      const q = inKernel(g, 4, qkv);
      const pb = g.activation(5, rows);
      const p = new Int32Array(pb.buffer, pb.byteOffset, rows);
      p.set(pos);
      g.rope(q, rows, stride, heads, hd, p, inKernel(g, 6, cos), inKernel(g, 7, sin));
      sameBits(q, want, `rope ${rows}x${heads}x${hd} (in place)`);
      const plain = Float32Array.from(qkv);
      g.rope(plain, rows, stride, heads, hd, pos, cos, sin);
      sameBits(plain, want, `rope ${rows}x${heads}x${hd} (plain arrays)`);
    }
    // Strided row copies (attention's query gather and output scatter), n with a scalar tail.
    for (const [rows, n, ss, ds] of [[5, 128, 384, 128], [3, 7, 9, 11], [1, 4, 4, 4]] as const) {
      const src = rand(rows * ss + n, n + ss);
      const want = rand(rows * ds + n + 3, 77);
      const dst = g.activation(9, want.length);
      dst.set(want);
      copyRowsJs(src, 2, ss, want, 3, ds, rows, n);
      g.copyRows(inKernel(g, 8, src), 2, ss, dst, 3, ds, rows, n);
      sameBits(dst, want, `copyRows ${rows}x${n} (in place)`);
      const plain = rand(rows * ds + n + 3, 77);
      g.copyRows(src, 2, ss, plain, 3, ds, rows, n);
      sameBits(plain, want, `copyRows ${rows}x${n} (plain arrays)`);
    }
    // A position beyond the tables is refused rather than read past them.
    const pb = g.activation(5, 1);
    new Int32Array(pb.buffer, pb.byteOffset, 1)[0] = 100;
    assert.throws(() => g.rope(g.activation(4, 32), 1, 32, 1, 32, new Int32Array(pb.buffer, pb.byteOffset, 1), g.activation(6, 16), g.activation(7, 16)), /beyond the cos\/sin tables/);
  });
});

test('GEMMs and SwiGLU on activation buffers equal the copying path and the JS kernel, one and two threads', async () => {
  const js = new JsKernel();
  for (const threads of [1, 2] as const) {
    await withKernel({ threads, fma: js.fma }, async (g) => {
      // Large enough to be shared with the worker (2^20 multiply-adds; 2^15 SwiGLU elements).
      const [m, n, k] = [130, 384, 256];
      const wv = rand(n * k, 3);
      const w = g.upload(wv, n, k);
      const jw = js.upload(wv, n, k);
      const a = rand(m * k, 4);
      const want = new Float32Array(m * n);
      js.matmul(jw, a, m, want);
      const copied = new Float32Array(m * n);
      g.matmul(w, a, m, copied);
      sameBits(copied, want, `matmul copied, ${threads} thread(s)`);
      const out = g.activation(1, m * n);
      g.matmul(w, inKernel(g, 0, a), m, out);
      sameBits(out, want, `matmul in place, ${threads} thread(s)`);

      const rows = 70;
      const hidden = 515; // vector body and scalar tail; 36,050 elements
      const gu = rand(rows * 2 * hidden, 5, 20);
      gu.set([0, -0, 1e-30, -1e-30, 87, -87, 88.5, -88.5, 200, -200, 1e30, -1e30], 0);
      const sw = new Float32Array(rows * hidden);
      swigluJs(gu, rows, hidden, sw);
      const act = g.activation(3, rows * hidden);
      g.swiglu(inKernel(g, 2, gu), rows, hidden, act);
      sameBits(act, sw, `swiglu in place, ${threads} thread(s)`);
      const plain = new Float32Array(rows * hidden);
      g.swiglu(gu, rows, hidden, plain);
      sameBits(plain, sw, `swiglu copied, ${threads} thread(s)`);
      // Mixed: input in kernel memory, output not (and the reverse).
      const mixed = new Float32Array(rows * hidden);
      g.swiglu(g.activation(2, rows * 2 * hidden), rows, hidden, mixed);
      sameBits(mixed, sw, 'swiglu in → plain out');
      const act2 = g.activation(3, rows * hidden);
      act2.fill(0);
      g.swiglu(gu, rows, hidden, act2);
      sameBits(act2, sw, 'swiglu plain in → kernel out');
    });
  }
});

test('softmax with extreme scores (exp underflow, equal maxima, large magnitudes): WASM equals JS bitwise', async () => {
  const js = new JsKernel();
  await withKernel({ threads: 1, fma: js.fma }, async (g) => {
    const [M, hd, P] = [6, 4, 64];
    const q = Float32Array.from({ length: M * hd }, (_, i) => [0, 1, -1, 30, -30, 1e3][Math.floor(i / hd)]! * (i % 2 ? 1 : -0.5));
    const kt = Float32Array.from({ length: hd * P }, (_, i) => ((i * 37) % 11) - 5);
    const v = rand(P * hd, 9);
    const lens = Int32Array.from([1, 3, 64, 61, 17, 40]);
    const a = new Float32Array(M * hd);
    const b = new Float32Array(M * hd);
    js.attend(q, M, hd, kt, P, v, lens, 0.5, a);
    g.attend(q, M, hd, kt, P, v, lens, 0.5, b);
    sameBits(b, a, 'attend with extreme scores');
    for (let i = 0; i < b.length; i++) assert.ok(Number.isFinite(b[i]!), `output ${i} finite`);
  });
});

test('fused gate|up + SwiGLU (matmulSwiglu): WASM equals the JS product then SwiGLU bitwise, fused and not, one and two threads', async () => {
  const js = new JsKernel();
  for (const threads of [1, 2] as const) {
    await withKernel({ threads, fma: js.fma }, async (g) => {
      // hidden 48 (96 rows: packed for the fused kernel), 40 (80 rows: not a whole number of
      // strips, so the product then SwiGLU) and 1408 with K 256 (large enough to be shared with
      // the worker); gate values up to ±12 reach both branches of the logistic function.
      for (const [hidden, K] of [[48, 64], [40, 64], [1408, 256]] as const) {
        const w = rand(2 * hidden * K, 11 + hidden, 0.5);
        const wj = js.upload(w, 2 * hidden, K, { glu: true });
        const wf = g.upload(w, 2 * hidden, K, { glu: true });
        assert.equal(wf.glu, (2 * hidden) % 32 === 0, `hidden ${hidden}: fused layout only for whole strips`);
        if (wf.glu) assert.throws(() => g.matmul(wf, new Float32Array(K), 1, new Float32Array(2 * hidden)), /matmulSwiglu/);
        for (const rows of [1, 3, 4, 9, 70]) {
          const a = rand(rows * K, rows * 31 + hidden, 3);
          const want = new Float32Array(rows * hidden);
          js.matmulSwiglu(wj, a, rows, new Float32Array(rows * 2 * hidden), want);
          const ref = new Float32Array(rows * 2 * hidden);
          js.matmul(wj, a, rows, ref);
          const sw = new Float32Array(rows * hidden);
          swigluJs(ref, rows, hidden, sw);
          sameBits(want, sw, 'JS matmulSwiglu = matmul then swigluJs');
          // plain arrays in and out
          const got = new Float32Array(rows * hidden);
          g.matmulSwiglu(wf, a, rows, new Float32Array(rows * 2 * hidden), got);
          sameBits(got, want, `threads ${threads} hidden ${hidden} rows ${rows} (plain arrays)`);
          // activation buffers in kernel memory, read and written in place
          const out = g.activation(3, rows * hidden);
          out.fill(NaN);
          g.matmulSwiglu(wf, inKernel(g, 1, a), rows, g.activation(2, rows * 2 * hidden), out);
          sameBits(out, want, `threads ${threads} hidden ${hidden} rows ${rows} (kernel memory)`);
        }
      }
    });
  }
});
