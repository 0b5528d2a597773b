// The load-time conversions in WASM (kernels/wat/convert.ts, kernels/convert_wasm.ts) against their JavaScript
// definitions, bit for bit: Q8_0 quantization (gguf_format.ts quantizeQ8_0), the six block
// decoders (gguf_blocks.ts decodeBlocks) and decode-then-quantize, and the q8 packing
// (weight_pack.ts packEncoded). Inputs cover what a file may hold: random weights, exact
// halves (roundf's ties), zeros and −0, subnormals, NaN and Inf, random bytes as blocks (every
// scale bit pattern), and tensors longer than one chunk of the module's memory.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { wasmConverter, type WasmConverter } from '../../src/engine/model/kernels/convert_wasm.js';
import { BLOCK_LAYOUT, decodeBlocks, encodeBlocks, type RequantizedType } from '../../src/engine/model/formats/gguf_blocks.js';
import { quantizeQ8_0 } from '../../src/engine/model/formats/gguf_format.js';
import { packedBytes, packEncoded, q4_0AsQ8_0 } from '../../src/engine/model/kernels/weight_pack.js';
import { seededRandom } from '../../harness/numeric.js';
import { propertyParams } from '../../harness/property.js';

const TYPES = Object.keys(BLOCK_LAYOUT) as RequantizedType[];

async function converter(): Promise<WasmConverter> {
  const c = await wasmConverter();
  assert.ok(c, 'the WASM converter compiles on Node 20');
  return c;
}

const rng = seededRandom;

function randomBytes(n: number, seed: number): Uint8Array {
  const r = rng(seed);
  return Uint8Array.from({ length: n }, () => Math.floor(r() * 256));
}

/** Weights with blocks of every special kind mixed in. */
function awkwardValues(blocks: number, seed: number): Float32Array {
  const r = rng(seed);
  const x = new Float32Array(blocks * 32);
  for (let b = 0; b < blocks; b++) {
    const at = b * 32;
    const kind = b % 9;
    for (let i = 0; i < 32; i++) {
      const g = (r() - 0.5) * 0.1;
      x[at + i] =
        kind === 0 ? g
        : kind === 1 ? (i - 16) * 0.5 // amax 8 → id 15.875: many products land on halves
        : kind === 2 ? (i === 0 ? 127 : Math.round((r() - 0.5) * 254) / 2) // amax 127 → id 1: exact halves
        : kind === 3 ? 0 * (i % 2 ? -1 : 1) // zeros and −0
        : kind === 4 ? g * 1e-39 // subnormal f32 values, d below f16's range
        : kind === 5 ? (i === 7 ? NaN : g)
        : kind === 6 ? (i === 3 ? -Infinity : g)
        : kind === 7 ? g * 1e6 // d beyond f16's range (Inf scale)
        : (i === 5 ? 0.49999997 : i === 6 ? -2.5 : i === 9 ? 127 : g);
    }
  }
  return x;
}

function q8Js(x: Float32Array): Uint8Array {
  const out = new Uint8Array((x.length / 32) * 34);
  quantizeQ8_0(x, out);
  return out;
}

function firstDiff(a: Uint8Array, b: Uint8Array): number {
  assert.equal(a.length, b.length);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

test('quantizeQ8_0 rounds as ggml in f32: d = amax/127 as f16, halves away from zero', () => {
  const x = new Float32Array(32);
  x.set([127, 2.5, -2.5, 0.5, -0.5, 0.49999997, -0.49999997, 126.5, -126.5, 1.4999999]);
  const out = q8Js(x);
  assert.equal(out[0]! | (out[1]! << 8), 0x3c00, 'd = 1 as f16');
  const q = Array.from(new Int8Array(out.buffer, 2, 10));
  assert.deepEqual(q, [127, 3, -3, 1, -1, 0, 0, 127, -127, 1]);
});

test('WASM Q8_0 quantization equals quantizeQ8_0 bit for bit (specials, ties, several chunks, an offset)', async () => {
  const c = await converter();
  const x = awkwardValues(40_000, 7); // 1.28M values: three chunks of the module's 16,384 blocks
  const want = q8Js(x);
  const got = new Uint8Array(want.length + 34);
  c.quantizeQ8_0(x, got, 34);
  assert.equal(firstDiff(got.subarray(34), want), -1);
  assert.deepEqual([...got.subarray(0, 34)], new Array(34).fill(0), 'nothing written before the offset');
  assert.throws(() => c.quantizeQ8_0(new Float32Array(33), new Uint8Array(68)), /multiple of 32/);
  assert.throws(() => c.quantizeQ8_0(new Float32Array(64), new Uint8Array(67)), /cannot take 2 blocks/);
});

test('WASM Q8_0 quantization: property over arbitrary f32 blocks', async () => {
  const c = await converter();
  fc.assert(
    fc.property(fc.array(fc.float(), { minLength: 32, maxLength: 32 * 8 }), (vals) => {
      const x = new Float32Array(vals.slice(0, vals.length - (vals.length % 32)));
      if (x.length === 0) return;
      const got = new Uint8Array((x.length / 32) * 34);
      c.quantizeQ8_0(x, got);
      assert.equal(firstDiff(got, q8Js(x)), -1);
    }),
    propertyParams({ numRuns: 300 }),
  );
});

/** Equal f32 values, NaN equal to NaN (its bits are not specified: JS and WASM may differ). */
function sameValues(got: Float32Array, want: Float32Array, what: string): void {
  assert.equal(got.length, want.length);
  const gb = new Uint32Array(got.buffer, got.byteOffset, got.length);
  const wb = new Uint32Array(want.buffer, want.byteOffset, want.length);
  for (let i = 0; i < got.length; i++) {
    if (gb[i] === wb[i] || (Number.isNaN(got[i]) && Number.isNaN(want[i]))) continue;
    assert.fail(`${what}: value ${i} is ${got[i]} (0x${gb[i]!.toString(16)}), expected ${want[i]} (0x${wb[i]!.toString(16)})`);
  }
}

for (const type of TYPES) {
  test(`WASM ${type} decoding, and decoding then quantizing, equal the JS definitions`, async () => {
    const c = await converter();
    const { block, bytes: bb } = BLOCK_LAYOUT[type];
    // Encoded weights (realistic scales) and random bytes (every bit pattern, NaN/Inf scales too),
    // each past one 65,536-value chunk.
    const count = 65_536 * 2 + 4 * block;
    const encoded = new Uint8Array((count / block) * bb);
    encodeBlocks(type, awkwardValues(count / 32, 11).map((v) => (Number.isFinite(v) ? v : 0)), encoded);
    for (const [name, bytes] of [['encoded', encoded], ['random bytes', randomBytes((count / block) * bb, 3)]] as const) {
      const want = new Float32Array(count);
      decodeBlocks(type, bytes, count, want);
      const got = new Float32Array(count);
      c.decode(type, bytes, count, got);
      sameValues(got, want, `${type} ${name}`);
      assert.equal(firstDiff(c.requantize(type, bytes, count), q8Js(want)), -1, `${type} ${name}: Q8_0 bytes`);
    }
    assert.throws(() => c.requantize(type, encoded, count + block), /cannot hold/);
    assert.throws(() => c.decode(type, encoded, block + 16, new Float32Array(block + 16)), /multiple of/);
  });
}

test('WASM q8 packing equals packEncoded in JS (partial strips, several calls, NaN/Inf scales)', async () => {
  const c = await converter();
  for (const [n, k, seed] of [[70, 64, 1], [33, 2816, 2], [1000, 4096, 3], [32, 32, 4]] as const) {
    const src = randomBytes(n * (k / 32) * 34, seed);
    const size = packedBytes('q8', n, k);
    const want = new Uint8Array(size).fill(0xaa);
    packEncoded({ type: 'Q8_0', bytes: src }, n, k, want);
    const got = new Uint8Array(size).fill(0x55); // stale bytes must not survive in padding
    packEncoded({ type: 'Q8_0', bytes: src }, n, k, got, c);
    assert.equal(firstDiff(got, want), -1, `${n}x${k}`);
  }
  // Q4_0 as Q8_0 (a Q4_0 part stacked with Q8_0 ones: weight_pack.ts commonEncoding).
  const long = randomBytes(40_000 * 18, 6); // several chunks
  assert.equal(firstDiff(c.q4_0AsQ8_0(long), q4_0AsQ8_0(long)), -1, 'Q4_0 as Q8_0');
  assert.throws(() => c.q4_0AsQ8_0(new Uint8Array(19)), /whole 18-byte blocks/);
});

test('WASM 16-bit packing equals packEncoded in JS (F16, BF16; partial strips, several calls) and refuses F16 Inf/NaN alike', async () => {
  const c = await converter();
  for (const type of ['F16', 'BF16'] as const) {
    for (const [n, k, seed] of [[70, 64, 1], [33, 2816, 2], [1500, 1024, 3]] as const) {
      const src = randomBytes(n * k * 2, seed);
      // Random F16 bits include Inf/NaN exponents: clear bit 14 of each half so they are finite.
      if (type === 'F16') for (let i = 1; i < src.length; i += 2) src[i]! &= 0xbf;
      const size = packedBytes(type === 'F16' ? 'f16' : 'bf16', n, k);
      const want = new Uint8Array(size).fill(0xaa);
      packEncoded({ type, bytes: src }, n, k, want);
      const got = new Uint8Array(size).fill(0x55);
      packEncoded({ type, bytes: src }, n, k, got, c);
      assert.equal(firstDiff(got, want), -1, `${type} ${n}x${k}`);
    }
  }
  const bad = new Uint8Array(40 * 64 * 2);
  bad[(37 * 64 + 5) * 2 + 1] = 0x7c; // +Inf at row 37, column 5
  const dest = new Uint8Array(packedBytes('f16', 40, 64));
  assert.throws(() => packEncoded({ type: 'F16', bytes: bad }, 40, 64, dest), /Inf or NaN at row 37, column 5/);
  assert.throws(() => packEncoded({ type: 'F16', bytes: bad }, 40, 64, dest, c), /Inf or NaN at row 37, column 5/);
});

test('WASM q4 packing equals packEncoded in JS (Q4_0, Q4_1, Q4_K; partial strips, several calls)', async () => {
  const c = await converter();
  const layout = { Q4_0: [32, 18, [0]], Q4_1: [32, 20, [0, 2]], Q4_K: [256, 144, [0, 2]] } as const;
  for (const type of ['Q4_0', 'Q4_1', 'Q4_K'] as const) {
    const [block, bb, scales] = layout[type];
    for (const [n, k, seed] of [[70, 256, 1], [33, 2816 - (2816 % block), 2], [700, 4096, 3]] as const) {
      const src = randomBytes(n * (k / block) * bb, seed);
      // Finite f16 scales (bit 14 clear): the bits of a NaN scale's products are not specified.
      for (let at = 0; at < src.length; at += bb) for (const o of scales) src[at + o + 1]! &= 0xbf;
      const size = packedBytes('q4', n, k);
      const want = new Uint8Array(size).fill(0xaa);
      packEncoded({ type, bytes: src }, n, k, want);
      const got = new Uint8Array(size).fill(0x55);
      packEncoded({ type, bytes: src }, n, k, got, c);
      assert.equal(firstDiff(got, want), -1, `${type} ${n}x${k}`);
    }
  }
  assert.throws(() => packEncoded({ type: 'Q4_K', bytes: new Uint8Array(10) }, 32, 256, new Uint8Array(packedBytes('q4', 32, 256)), c), /expected 32x256/);
});
