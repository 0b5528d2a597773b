// KV dtypes and chunk codecs: 16-bit conversions against exhaustive references, the int8 codec's
// and int8_asym codecs' round trips (checksummed, error bound, layout), and chunk keys that depend
// on the KV dtype.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Codec, DType, HEADER_BYTES, encodeChunk, encodedPayloadBytes, payloadBytes, readHeader, verifyChunk, ChunkFormatError } from '../../src/common/chunk.js';
import { decodeChunk, recodeChunk } from '../../src/common/chunk_codec.js';
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16, f16Table } from '../../src/common/half.js';
import { chunkKeys } from '../../src/common/keys.js';

test('f16: every 16-bit pattern survives f16 → f32 → f16 (NaNs stay NaN)', () => {
  for (let h = 0; h < 65536; h++) {
    const x = f16ToF32(h);
    const back = f32ToF16(x);
    if (Number.isNaN(x)) assert.ok(Number.isNaN(f16ToF32(back)), `NaN ${h}`);
    else assert.equal(back, h, `pattern ${h.toString(16)}`);
  }
  assert.equal(f16ToF32(0x3c00), 1);
  assert.equal(f16ToF32(0x0001), 2 ** -24);
  assert.equal(f16ToF32(0x7bff), 65504);
});

test('f16 and bf16 narrowing round to the nearest value, ties to even', () => {
  const table = f16Table();
  // Every f32 halfway between two adjacent positive f16 values (and just off it) rounds the right way.
  for (let h = 0; h < 0x7bff; h += 7) {
    const lo = table[h]!;
    const hi = table[h + 1]!;
    const mid = (lo + hi) / 2; // exact in f64, and in f32 (one more mantissa bit)
    assert.equal(f32ToF16(mid), h % 2 === 0 ? h : h + 1, `tie between ${h} and ${h + 1}`);
    assert.equal(f32ToF16(Math.fround(mid + (hi - lo) / 8)), h + 1);
    assert.equal(f32ToF16(Math.fround(mid - (hi - lo) / 8)), h);
  }
  assert.equal(f32ToF16(65520), 0x7c00); // rounds up to Inf
  assert.equal(f32ToF16(65519), 0x7bff);
  assert.equal(f32ToF16(-0), 0x8000);
  assert.equal(f32ToF16(2 ** -25), 0); // exactly half the smallest subnormal: tie to even (0)
  assert.equal(f32ToF16(Math.fround(2 ** -25 * 1.5)), 1);
  assert.equal(f32ToBf16(1 + 2 ** -8), 0x3f80); // tie → even
  assert.equal(f32ToBf16(1 + 3 * 2 ** -8), 0x3f82);
  assert.equal(bf16ToF32(f32ToBf16(-2.5)), -2.5);
  assert.ok(Number.isNaN(bf16ToF32(f32ToBf16(NaN))));
});

function naiveChunk(dtype: DType, tokens = 5, seed = 1): Uint8Array {
  const layout = { dtype, numLayers: 2, numKvHeads: 3, headDim: 8 };
  const n = payloadBytes(layout, tokens) / (dtype === DType.f32 ? 4 : 2);
  const vals = new Float32Array(n);
  for (let i = 0; i < n; i++) vals[i] = Math.sin(i * 0.37 + seed) * (1 + (i % 8)) * (i % 29 === 0 ? 0 : 1);
  let bytes: Uint8Array;
  if (dtype === DType.f32) bytes = new Uint8Array(vals.buffer);
  else {
    const u = new Uint16Array(n);
    for (let i = 0; i < n; i++) u[i] = dtype === DType.f16 ? f32ToF16(vals[i]!) : f32ToBf16(vals[i]!);
    bytes = new Uint8Array(u.buffer);
  }
  return encodeChunk(layout, tokens, '00000000deadbeef', bytes);
}

function values(c: Uint8Array): Float32Array {
  const h = readHeader(c);
  const p = c.subarray(HEADER_BYTES);
  if (h.dtype === DType.f32) return new Float32Array(p.slice().buffer);
  const u = new Uint16Array(p.slice().buffer);
  return Float32Array.from(u, (b) => (h.dtype === DType.f16 ? f16ToF32(b) : bf16ToF32(b)));
}

for (const dtype of [DType.f32, DType.f16, DType.bf16]) {
  test(`int8 codec (${DType[dtype]}): sealed and checksummed, decodes within half a step per head`, () => {
    const c = naiveChunk(dtype);
    const h = readHeader(c);
    const enc = recodeChunk(c, Codec.int8);
    const eh = verifyChunk(enc, h.key);
    assert.equal(eh.codec, Codec.int8);
    assert.deepEqual([eh.dtype, eh.numLayers, eh.numKvHeads, eh.headDim, eh.numTokens], [h.dtype, h.numLayers, h.numKvHeads, h.headDim, h.numTokens]);
    assert.equal(enc.byteLength, HEADER_BYTES + encodedPayloadBytes(h, h.numTokens, Codec.int8));
    assert.equal(encodedPayloadBytes(h, h.numTokens, Codec.int8), (2 * 2 * 5 * 3) * (4 + 8));
    const dec = decodeChunk(enc);
    const dh = verifyChunk(dec, h.key);
    assert.equal(dh.codec, Codec.naive);
    assert.equal(dec.byteLength, c.byteLength);
    const a = values(c);
    const b = values(dec);
    for (let r = 0; r < a.length / 8; r++) {
      let m = 0;
      for (let e = 0; e < 8; e++) m = Math.max(m, Math.abs(a[r * 8 + e]!));
      const step = m / 127;
      const rounding = dtype === DType.f32 ? 0 : m * (dtype === DType.f16 ? 2 ** -11 : 2 ** -8);
      for (let e = 0; e < 8; e++) assert.ok(Math.abs(a[r * 8 + e]! - b[r * 8 + e]!) <= step / 2 + rounding + 1e-7, `row ${r} element ${e}`);
    }
    // Encoding is idempotent on an encoded chunk; naive → naive is the same buffer.
    assert.equal(recodeChunk(enc, Codec.int8), enc);
    assert.equal(recodeChunk(c, Codec.naive), c);
    // A flipped bit in the encoded payload is caught like in any chunk.
    const bad = enc.slice();
    bad[HEADER_BYTES + 3]! ^= 1;
    assert.throws(() => verifyChunk(bad), /checksum mismatch/);
  });
}

for (const dtype of [DType.f32, DType.f16, DType.bf16]) {
  test(`int8_asym codec (${DType[dtype]}): sealed and checksummed, decodes within half an f16 step of each row's range`, () => {
    const c = naiveChunk(dtype, 5, 3);
    const h = readHeader(c);
    const enc = recodeChunk(c, Codec.int8_asym);
    const eh = verifyChunk(enc, h.key);
    assert.equal(eh.codec, Codec.int8_asym);
    assert.deepEqual([eh.dtype, eh.numLayers, eh.numKvHeads, eh.headDim, eh.numTokens], [h.dtype, h.numLayers, h.numKvHeads, h.headDim, h.numTokens]);
    // Same bytes as int8: 4 bytes of parameters a row (f16 step, f16 minimum), one byte an element.
    assert.equal(encodedPayloadBytes(h, h.numTokens, Codec.int8_asym), encodedPayloadBytes(h, h.numTokens, Codec.int8));
    assert.equal(enc.byteLength, HEADER_BYTES + (2 * 2 * 5 * 3) * (4 + 8));
    const dec = decodeChunk(enc);
    assert.equal(verifyChunk(dec, h.key).codec, Codec.naive);
    const a = values(c);
    const b = values(dec);
    const sym = values(decodeChunk(recodeChunk(c, Codec.int8)));
    let errAsym = 0;
    let errSym = 0;
    for (let r = 0; r < a.length / 8; r++) {
      let lo = Infinity;
      let hi = -Infinity;
      for (let e = 0; e < 8; e++) (lo = Math.min(lo, a[r * 8 + e]!)), (hi = Math.max(hi, a[r * 8 + e]!));
      // The step is (max − min) / 255 rounded up to f16 (at most 2^-10 relative), the minimum rounded to f16.
      const step = ((hi - lo) / 255) * (1 + 2 ** -10) + Math.abs(lo) * 2 ** -11 / 255;
      const rounding = dtype === DType.f32 ? 0 : Math.max(Math.abs(lo), Math.abs(hi)) * (dtype === DType.f16 ? 2 ** -11 : 2 ** -8);
      for (let e = 0; e < 8; e++) {
        const i = r * 8 + e;
        assert.ok(Math.abs(a[i]! - b[i]!) <= step / 2 + Math.abs(lo) * 2 ** -11 + rounding + 1e-6, `row ${r} element ${e}: ${a[i]} decoded as ${b[i]}`);
        errAsym += (a[i]! - b[i]!) ** 2;
        errSym += (a[i]! - sym[i]!) ** 2;
      }
    }
    // This chunk's rows are mostly one-signed, where the row's range is well under 2·max|x|.
    assert.ok(errAsym < errSym, `int8_asym squared error ${errAsym} not below int8's ${errSym}`);
    assert.equal(recodeChunk(enc, Codec.int8_asym), enc);
    // Between codecs: decoded first, then encoded (never one codec's bytes read as another's).
    const viaInt8 = recodeChunk(recodeChunk(c, Codec.int8), Codec.int8_asym);
    assert.equal(readHeader(viaInt8).codec, Codec.int8_asym);
    assert.equal(decodeChunk(viaInt8).byteLength, c.byteLength);
    const bad = enc.slice();
    bad[HEADER_BYTES + 70]! ^= 1;
    assert.throws(() => verifyChunk(bad), /checksum mismatch/);
  });
}

test('int8_asym codec: a constant row decodes to its value; rows beyond f16 or non-finite are refused', () => {
  const layout = { dtype: DType.f32, numLayers: 1, numKvHeads: 1, headDim: 4 };
  const one = encodeChunk(layout, 1, '0000000000000002', new Uint8Array(new Float32Array([0.5, 0.5, 0.5, 0.5, -3, -3, -3, -3]).buffer));
  assert.deepEqual([...values(decodeChunk(recodeChunk(one, Codec.int8_asym)))], [0.5, 0.5, 0.5, 0.5, -3, -3, -3, -3]);
  const big = encodeChunk(layout, 1, '0000000000000003', new Uint8Array(new Float32Array([-1e6, 2, 3, 4, 0, 0, 0, 0]).buffer));
  assert.throws(() => recodeChunk(big, Codec.int8_asym), /beyond f16's range/);
  const nan = encodeChunk(layout, 1, '0000000000000004', new Uint8Array(new Float32Array([1, NaN, 3, 4, 0, 0, 0, 0]).buffer));
  assert.throws(() => recodeChunk(nan, Codec.int8_asym), /non-finite value \(row 0\)/);
});

test('int8 codec refuses a chunk with a non-finite value', () => {
  const layout = { dtype: DType.f32, numLayers: 1, numKvHeads: 1, headDim: 4 };
  const c = encodeChunk(layout, 1, '0000000000000001', new Uint8Array(new Float32Array([1, 2, Infinity, 3, 0, 0, 0, 0]).buffer));
  assert.throws(() => recodeChunk(c, Codec.int8), ChunkFormatError);
});

test('an unknown codec code is refused by name', () => {
  const c = naiveChunk(DType.f32).slice();
  new DataView(c.buffer).setUint16(20, 9, true);
  assert.throws(() => readHeader(c), /unknown codec code 9/);
});

test('chunk keys depend on the KV dtype; f32 keys are the ones without a dtype', () => {
  const tokens = Array.from({ length: 20 }, (_, i) => i * 3);
  const p = { modelId: 'm', chunkSize: 4, seed: 0n };
  const plain = chunkKeys(tokens, p).map((s) => s.key);
  const f32 = chunkKeys(tokens, { ...p, kvDtype: DType.f32 }).map((s) => s.key);
  const f16 = chunkKeys(tokens, { ...p, kvDtype: DType.f16 }).map((s) => s.key);
  const bf16 = chunkKeys(tokens, { ...p, kvDtype: DType.bf16 }).map((s) => s.key);
  const eight = [DType.int8, DType.fp8_e4m3, DType.fp8_e5m2].map((d) => chunkKeys(tokens, { ...p, kvDtype: d }).map((s) => s.key));
  assert.deepEqual(f32, plain);
  for (let i = 0; i < plain.length; i++) assert.equal(new Set([plain[i], f16[i], bf16[i], ...eight.map((k) => k[i])]).size, 6);
  // Interleaving calls with different dtypes (the one-root cache) gives the same answers.
  assert.deepEqual(chunkKeys(tokens, { ...p, kvDtype: DType.f16 }).map((s) => s.key), f16);
  // With a cache salt too: four distinct roots.
  const salted = chunkKeys(tokens, { ...p, salt: 's' }).map((s) => s.key);
  const saltedF16 = chunkKeys(tokens, { ...p, salt: 's', kvDtype: DType.f16 }).map((s) => s.key);
  assert.equal(new Set([plain[0], f16[0], salted[0], saltedF16[0]]).size, 4);
});

test('8-bit chunks: int8 carries its scales in the naive payload; codecs refuse 8-bit dtypes', () => {
  const shape = { numLayers: 2, numKvHeads: 3, headDim: 8 };
  const rows = 2 * 2 * 5 * 3;
  // int8: scales [2][L][T][H] f16, then the i8 elements; fp8: one byte an element.
  assert.equal(payloadBytes({ ...shape, dtype: DType.int8 }, 5), rows * 2 + rows * 8);
  assert.equal(payloadBytes({ ...shape, dtype: DType.fp8_e4m3 }, 5), rows * 8);
  assert.equal(payloadBytes({ ...shape, dtype: DType.fp8_e5m2 }, 5), rows * 8);
  for (const dtype of [DType.int8, DType.fp8_e4m3, DType.fp8_e5m2]) {
    const layout = { ...shape, dtype };
    const payload = new Uint8Array(payloadBytes(layout, 5)).map((_, i) => (i * 37) & 0x7f);
    const c = encodeChunk(layout, 5, '00000000000000a1', payload);
    const h = verifyChunk(c, '00000000000000a1');
    assert.equal(h.dtype, dtype);
    assert.equal(h.codec, Codec.naive);
    assert.throws(() => recodeChunk(c, Codec.int8), /8-bit chunks are kept as the engine holds them/);
    assert.equal(recodeChunk(c, Codec.naive), c);
    // A header claiming a codec on an 8-bit dtype is inconsistent.
    const bad = c.slice();
    new DataView(bad.buffer).setUint16(20, Codec.int8, true);
    assert.throws(() => readHeader(bad), /8-bit chunks are only held naive/);
  }
});
