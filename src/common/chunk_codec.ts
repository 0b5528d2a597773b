// Chunk codecs (docs/storage.md "Chunk codecs"): how a tier holds a chunk's payload. A codec
// changes the payload and the header's codec field, never the key, dtype or shape, so a lookup
// finds an encoded chunk exactly like a naive one and any reader decodes it back to the dtype the
// engine holds. Every encoded chunk is sealed with the xxh64 of its encoded payload, so every hop
// and disk read verifies it like any other chunk.
//
//   naive  the elements as the engine holds them (any dtype; the only codec of 8-bit dtypes);
//   int8   symmetric 8-bit quantisation with one f32 scale per (K/V, layer, token, KV head):
//          scale = max|x| / 127 over the head's head_dim elements, q = round(x / scale) in
//          [-127, 127], decoded as q · scale (then rounded to the chunk's dtype). Payload:
//          scales [2][L][T][H] f32 little-endian, then values [2][L][T][H·head_dim] i8.
//          Bytes per element 1 + 4 / head_dim: 0.27 × f32 at head_dim 64, 0.53 × f16.
//   int8_asym  asymmetric 8-bit quantisation per (K/V, layer, token, KV head) row, the same bytes:
//          z = the row's min rounded to f16, step = (max − z) / 255 rounded up to f16,
//          q = round((x − z) / step) in [0, 255], decoded as q · step + z. The row's range is
//          max − min instead of int8's 2 · max|x|, so its steps are smaller (on the kv_quality
//          models' KV, 11–13 % lower RMS error than int8). Payload: steps [2][L][T][H] f16, minimums
//          [2][L][T][H] f16, then values [2][L][T][H·head_dim] u8. Rows beyond f16's range (a
//          minimum or a step above 65504) are refused, the chunk then kept as it is.
import { ChunkFormatError, Codec, CODEC_NAMES, DType, DTYPE_NAMES, HEADER_BYTES, encodedPayloadBytes, readHeader, sealChunk, type ChunkHeader } from './chunk.js';
import { quantizeInt8Row } from './int8_rows.js';
import { isEightBit } from './dtype.js';
import { bf16Table, f16Table, f16ToF32, f32ToBf16, f32ToF16 } from './half.js';

/** Codec names as the cache YAML and the controller's /compress take them. */
export const CODECS = ['naive', 'int8', 'int8_asym'] as const;
export type CodecName = (typeof CODECS)[number];
/** The codecs that compress (every one but naive): /compress's and /decompress's `method`. */
export const COMPRESSING_CODECS = ['int8', 'int8_asym'] as const satisfies readonly Exclude<CodecName, 'naive'>[];

export function codecByName(name: CodecName): Codec {
  return Codec[name];
}

export function codecName(c: Codec): CodecName {
  return CODEC_NAMES[c] as CodecName;
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
if (!LITTLE_ENDIAN) throw new Error('chunk codecs assume a little-endian host (every supported platform is)');

/** The naive payload's elements widened to f32 (a copy). */
function elementsAsF32(h: ChunkHeader, payload: Uint8Array): Float32Array {
  const n = payload.byteLength / (h.dtype === DType.f32 ? 4 : 2);
  if (h.dtype === DType.f32) {
    const out = new Float32Array(n);
    new Uint8Array(out.buffer).set(payload);
    return out;
  }
  const bits = new Uint16Array(n);
  new Uint8Array(bits.buffer).set(payload);
  const table = h.dtype === DType.f16 ? f16Table() : bf16Table();
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = table[bits[i]!]!;
  return out;
}

/** Writes f32 values into `dest` as the naive payload of dtype `dtype`. */
function writeElements(dtype: DType, values: Float32Array, dest: Uint8Array): void {
  if (dtype === DType.f32) {
    dest.set(new Uint8Array(values.buffer, values.byteOffset, values.byteLength));
    return;
  }
  const bits = new Uint16Array(values.length);
  if (dtype === DType.f16) for (let i = 0; i < values.length; i++) bits[i] = f32ToF16(values[i]!);
  else for (let i = 0; i < values.length; i++) bits[i] = f32ToBf16(values[i]!);
  dest.set(new Uint8Array(bits.buffer));
}

function encodeInt8(h: ChunkHeader, payload: Uint8Array, dest: Uint8Array): void {
  const x = elementsAsF32(h, payload);
  const hd = h.headDim;
  const rows = x.length / hd;
  const scales = new Float32Array(rows);
  const q = new Int8Array(dest.buffer, dest.byteOffset + rows * 4, rows * hd);
  for (let r = 0; r < rows; r++) {
    const scale = quantizeInt8Row(x, r * hd, hd, q, r * hd);
    if (Number.isNaN(scale)) throw new ChunkFormatError(`int8 codec: chunk ${h.key} holds a non-finite value (row ${r}); kept as it is`);
    scales[r] = scale;
  }
  dest.set(new Uint8Array(scales.buffer), 0);
}

function decodeInt8(h: ChunkHeader, payload: Uint8Array): Float32Array {
  const hd = h.headDim;
  const rows = 2 * h.numLayers * h.numTokens * h.numKvHeads;
  const scales = new Float32Array(rows);
  new Uint8Array(scales.buffer).set(payload.subarray(0, rows * 4));
  const q = new Int8Array(payload.buffer, payload.byteOffset + rows * 4, rows * hd);
  const out = new Float32Array(rows * hd);
  for (let r = 0; r < rows; r++) {
    const s = scales[r]!;
    const o = r * hd;
    for (let e = 0; e < hd; e++) out[o + e] = q[o + e]! * s;
  }
  return out;
}

/** The smallest f16 value ≥ v (v ≥ 0 and finite), as bits; Infinity's bits when v is above 65504. */
function f16Ceil(v: number): number {
  const b = f32ToF16(v);
  return f16ToF32(b) < v ? b + 1 : b;
}

function encodeInt8Asym(h: ChunkHeader, payload: Uint8Array, dest: Uint8Array): void {
  const x = elementsAsF32(h, payload);
  const hd = h.headDim;
  const rows = x.length / hd;
  const steps = new Uint16Array(rows);
  const mins = new Uint16Array(rows);
  const q = new Uint8Array(dest.buffer, dest.byteOffset + rows * 4, rows * hd);
  for (let r = 0; r < rows; r++) {
    const o = r * hd;
    let lo = Infinity;
    let hi = -Infinity;
    let finite = true;
    for (let e = 0; e < hd; e++) {
      const v = x[o + e]!;
      if (!(Math.abs(v) <= 3.4028234663852886e38)) finite = false;
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    }
    if (!finite) throw new ChunkFormatError(`int8_asym codec: chunk ${h.key} holds a non-finite value (row ${r}); kept as it is`);
    const zBits = f32ToF16(lo);
    const z = f16ToF32(zBits);
    const sBits = f16Ceil(Math.max(0, hi - z) / 255);
    const step = f16ToF32(sBits);
    if (!Number.isFinite(z) || !Number.isFinite(step)) throw new ChunkFormatError(`int8_asym codec: chunk ${h.key} row ${r} spans [${lo}, ${hi}], beyond f16's range; kept as it is`);
    mins[r] = zBits;
    steps[r] = sBits;
    for (let e = 0; e < hd; e++) {
      const v = step === 0 ? 0 : Math.round((x[o + e]! - z) / step);
      q[o + e] = v < 0 ? 0 : v > 255 ? 255 : v;
    }
  }
  dest.set(new Uint8Array(steps.buffer), 0);
  dest.set(new Uint8Array(mins.buffer), rows * 2);
}

function decodeInt8Asym(h: ChunkHeader, payload: Uint8Array): Float32Array {
  const hd = h.headDim;
  const rows = 2 * h.numLayers * h.numTokens * h.numKvHeads;
  const params = new Uint16Array(2 * rows);
  new Uint8Array(params.buffer).set(payload.subarray(0, rows * 4));
  const table = f16Table();
  const q = payload.subarray(rows * 4, rows * 4 + rows * hd);
  const out = new Float32Array(rows * hd);
  for (let r = 0; r < rows; r++) {
    const step = table[params[r]!]!;
    const z = table[params[rows + r]!]!;
    const o = r * hd;
    for (let e = 0; e < hd; e++) out[o + e] = q[o + e]! * step + z;
  }
  return out;
}

/**
 * The chunk re-encoded with `codec` (a new buffer, sealed with a fresh checksum), or `chunk` itself
 * when it already is. The input is read as it is (callers verify chunks at the hops that need it).
 * Throws ChunkFormatError when the chunk cannot be encoded (a non-finite value; for int8_asym also
 * a row beyond f16's range).
 */
export function recodeChunk(chunk: Uint8Array, codec: Codec): Uint8Array {
  const h = readHeader(chunk);
  if (h.codec === codec) return chunk;
  if (isEightBit(h.dtype)) throw new ChunkFormatError(`chunk ${h.key} holds ${DTYPE_NAMES[h.dtype]} KV: 8-bit chunks are kept as the engine holds them; the ${codecName(codec)} codec applies to f32, f16 and bf16 chunks`);
  if (h.codec !== Codec.naive) chunk = decodeChunk(chunk, h);
  if (codec === Codec.naive) return chunk;
  const naive = readHeader(chunk);
  const out = new Uint8Array(HEADER_BYTES + encodedPayloadBytes(naive, naive.numTokens, codec));
  (codec === Codec.int8_asym ? encodeInt8Asym : encodeInt8)(naive, chunk.subarray(HEADER_BYTES), out.subarray(HEADER_BYTES));
  return sealChunk(out, naive, naive.numTokens, naive.key, codec);
}

/** The naive chunk (the engine's dtype) a chunk encodes; `chunk` itself when it is naive. */
export function decodeChunk(chunk: Uint8Array, h: ChunkHeader = readHeader(chunk)): Uint8Array {
  if (h.codec === Codec.naive) return chunk;
  const values = (h.codec === Codec.int8_asym ? decodeInt8Asym : decodeInt8)(h, chunk.subarray(HEADER_BYTES, HEADER_BYTES + h.payloadBytes));
  const out = new Uint8Array(HEADER_BYTES + encodedPayloadBytes(h, h.numTokens, Codec.naive));
  writeElements(h.dtype, values, out.subarray(HEADER_BYTES));
  return sealChunk(out, h, h.numTokens, h.key, Codec.naive);
}

/** The codec a chunk is held in. */
export function codecOf(chunk: Uint8Array): Codec {
  return readHeader(chunk).codec;
}
