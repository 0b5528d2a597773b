// KV chunk format (docs/storage.md). A chunk is ONE contiguous buffer: a 64-byte header
// followed by the payload. Keeping header and payload together lets the store, the
// disk tier and the wire move a chunk as a single slice with no re-packing.
//
// Header (little-endian):
//   0  u32  magic 'KVC1'         24 u32 num_tokens
//   4  u16  format version (1)   28 u32 reserved (0)
//   6  u16  dtype (DType)        32 u64 key (chunk key, see keys.ts)
//   8  u32  num_layers           40 u64 payload checksum (xxh64)
//   12 u32  num_kv_heads         48 u64 payload length in bytes
//   16 u32  head_dim             56 u64 reserved (0)
//   20 u16  codec (Codec)        22 u16 reserved (0)
// dtype is the KV's element type as the engine holds it (the chunk key depends on it, keys.ts);
// codec says how the payload encodes those elements:
//   naive (0): [2 (K,V)][num_layers][num_tokens][num_kv_heads * head_dim] elements of dtype; for
//              dtype int8 its f16 scales [2][num_layers][num_tokens][num_kv_heads] first, then
//              the i8 elements (the int8 codec's layout below with f16 scales);
//   int8  (1): the same elements quantised to int8 with one f32 scale per (K/V, layer, token, KV
//              head) — scales [2][num_layers][num_tokens][num_kv_heads] f32 first, then the values
//              [2][num_layers][num_tokens][num_kv_heads * head_dim] i8 (src/common/chunk_codec.ts);
//   int8_asym (2): the same rows quantised to u8 between the row's min and max — f16 steps
//              [2][L][T][H], then f16 minimums [2][L][T][H], then the values [2][L][T][H * head_dim]
//              u8: 4 bytes of parameters a row, as int8.
// Decoding an encoded chunk gives a naive chunk of the same dtype, key and shape.
import { checksum64 } from './keys.js';
import { DType, DTYPE_BYTES, DTYPE_NAMES, isEightBit, rowScaleBytes } from './dtype.js';

export const CHUNK_MAGIC = 0x3143564b; // 'KVC1' read as u32le
export const CHUNK_VERSION = 1;
export const HEADER_BYTES = 64;

export { DType, DTYPE_BYTES, DTYPE_NAMES } from './dtype.js';

/** How a chunk's payload encodes its elements (header offset 20; 0 was the reserved value, so every older chunk is naive). */
export enum Codec {
  naive = 0,
  int8 = 1,
  int8_asym = 2,
}
export const CODEC_NAMES: Record<Codec, string> = { [Codec.naive]: 'naive', [Codec.int8]: 'int8', [Codec.int8_asym]: 'int8_asym' };

/** The shape a model's KV has; two processes exchanging chunks must agree on it. */
export interface KvLayout {
  dtype: DType;
  numLayers: number;
  numKvHeads: number;
  headDim: number;
}

export interface ChunkHeader extends KvLayout {
  codec: Codec;
  numTokens: number;
  key: string;
  checksum: bigint;
  payloadBytes: number;
}

export class ChunkFormatError extends Error {
  override name = 'ChunkFormatError';
}

/** Naive payload bytes: the elements, plus an int8 chunk's f16 scale per (K/V, layer, token, KV head). */
export function payloadBytes(l: KvLayout, numTokens: number): number {
  const rows = 2 * l.numLayers * numTokens * l.numKvHeads;
  return rows * (l.headDim * DTYPE_BYTES[l.dtype] + rowScaleBytes(l.dtype));
}

/**
 * The first `keep` of the `n` tokens of a naive payload, repacked as a payload of `keep` tokens:
 * each section ([2][L][n][row]: the elements, and before them an int8 chunk's scales) cut per
 * (K/V, layer) row run.
 */
export function payloadPrefix(l: KvLayout, payload: Uint8Array, n: number, keep: number): Uint8Array {
  if (keep === n) return payload;
  const parts = 2 * l.numLayers;
  const out = new Uint8Array(payloadBytes(l, keep));
  let src = 0;
  let dst = 0;
  for (const row of [l.numKvHeads * rowScaleBytes(l.dtype), l.numKvHeads * l.headDim * DTYPE_BYTES[l.dtype]]) {
    for (let part = 0; part < parts; part++) out.set(payload.subarray(src + part * n * row, src + (part * n + keep) * row), dst + part * keep * row);
    src += parts * n * row;
    dst += parts * keep * row;
  }
  return out;
}

/** Payload bytes of `numTokens` positions encoded with `codec`. */
export function encodedPayloadBytes(l: KvLayout, numTokens: number, codec: Codec): number {
  if (codec === Codec.naive) return payloadBytes(l, numTokens);
  const rows = 2 * l.numLayers * numTokens * l.numKvHeads;
  return rows * 4 + rows * l.headDim; // int8: an f32 scale a row; int8_asym: an f16 step and an f16 minimum a row; one byte an element
}

export function chunkBytes(l: KvLayout, numTokens: number): number {
  return HEADER_BYTES + payloadBytes(l, numTokens);
}

export function sameLayout(a: KvLayout, b: KvLayout): boolean {
  return a.dtype === b.dtype && a.numLayers === b.numLayers && a.numKvHeads === b.numKvHeads && a.headDim === b.headDim;
}

export function describeLayout(l: KvLayout): string {
  return `${DTYPE_NAMES[l.dtype] ?? `dtype#${l.dtype}`} layers=${l.numLayers} kv_heads=${l.numKvHeads} head_dim=${l.headDim}`;
}

/**
 * Writes the header into `buf[0..64)` for a payload already present at `buf[64..)`, computing the checksum.
 * The caller fills the payload in place (e.g. the engine copying its paged KV), then seals: no extra copy.
 */
export function sealChunk(buf: Uint8Array, layout: KvLayout, numTokens: number, key: string, codec: Codec = Codec.naive): Uint8Array {
  const plen = encodedPayloadBytes(layout, numTokens, codec);
  if (buf.byteLength < HEADER_BYTES + plen) throw new ChunkFormatError(`buffer of ${buf.byteLength} bytes is too small for a chunk of ${HEADER_BYTES + plen}`);
  const view = buf.subarray(0, HEADER_BYTES + plen);
  const dv = new DataView(view.buffer, view.byteOffset, HEADER_BYTES);
  dv.setUint32(0, CHUNK_MAGIC, true);
  dv.setUint16(4, CHUNK_VERSION, true);
  dv.setUint16(6, layout.dtype, true);
  dv.setUint32(8, layout.numLayers, true);
  dv.setUint32(12, layout.numKvHeads, true);
  dv.setUint32(16, layout.headDim, true);
  dv.setUint16(20, codec, true);
  dv.setUint16(22, 0, true);
  dv.setUint32(24, numTokens, true);
  dv.setUint32(28, 0, true);
  dv.setBigUint64(32, BigInt('0x' + key), true);
  dv.setBigUint64(40, checksum64(view.subarray(HEADER_BYTES)), true);
  dv.setBigUint64(48, BigInt(plen), true);
  dv.setBigUint64(56, 0n, true);
  return view;
}

/** Allocates a chunk buffer, copies `payload` in and seals it. */
export function encodeChunk(layout: KvLayout, numTokens: number, key: string, payload: Uint8Array, codec: Codec = Codec.naive): Uint8Array {
  const buf = new Uint8Array(HEADER_BYTES + payload.byteLength);
  buf.set(payload, HEADER_BYTES);
  return sealChunk(buf, layout, numTokens, key, codec);
}

/** Parses and sanity-checks the header (no checksum work). Throws ChunkFormatError. */
export function readHeader(buf: Uint8Array): ChunkHeader {
  if (buf.byteLength < HEADER_BYTES) throw new ChunkFormatError(`truncated chunk: ${buf.byteLength} bytes, header needs ${HEADER_BYTES}`);
  const dv = new DataView(buf.buffer, buf.byteOffset, HEADER_BYTES);
  if (dv.getUint32(0, true) !== CHUNK_MAGIC) throw new ChunkFormatError('not a KV chunk (bad magic)');
  const version = dv.getUint16(4, true);
  if (version !== CHUNK_VERSION) throw new ChunkFormatError(`unsupported chunk format version ${version} (this build reads ${CHUNK_VERSION})`);
  const dtype = dv.getUint16(6, true) as DType;
  if (!(dtype in DTYPE_BYTES)) throw new ChunkFormatError(`unknown dtype code ${dtype}`);
  const codec = dv.getUint16(20, true) as Codec;
  if (!(codec in CODEC_NAMES)) throw new ChunkFormatError(`unknown codec code ${codec} (this build reads ${Object.values(CODEC_NAMES).join(', ')})`);
  if (codec !== Codec.naive && isEightBit(dtype)) throw new ChunkFormatError(`codec ${CODEC_NAMES[codec]} on a ${DTYPE_NAMES[dtype]} chunk: 8-bit chunks are only held naive`);
  const h: ChunkHeader = {
    dtype,
    codec,
    numLayers: dv.getUint32(8, true),
    numKvHeads: dv.getUint32(12, true),
    headDim: dv.getUint32(16, true),
    numTokens: dv.getUint32(24, true),
    key: dv.getBigUint64(32, true).toString(16).padStart(16, '0'),
    checksum: dv.getBigUint64(40, true),
    payloadBytes: Number(dv.getBigUint64(48, true)),
  };
  const implied = encodedPayloadBytes(h, h.numTokens, codec);
  if (h.payloadBytes !== implied) {
    throw new ChunkFormatError(`chunk header is inconsistent: payload ${h.payloadBytes} bytes, shape implies ${implied}`);
  }
  return h;
}

/**
 * Cheap check (header and length, no checksum) that `buf` is a chunk for `key`: what a store does
 * before accepting a put, so a chunk can never be filed under another prefix's key. The checksum is
 * left to the hops that move bytes between processes and to disk reads (verifyChunk).
 * Throws ChunkFormatError naming the key and what is wrong.
 */
export function checkChunkFor(buf: Uint8Array, key: string): ChunkHeader {
  let h: ChunkHeader;
  try {
    h = readHeader(buf);
  } catch (e) {
    throw new ChunkFormatError(`refusing chunk for key ${key}: ${(e as Error).message}`);
  }
  if (h.key !== key) throw new ChunkFormatError(`refusing chunk for key ${key}: its header carries key ${h.key}`);
  if (buf.byteLength !== HEADER_BYTES + h.payloadBytes) {
    throw new ChunkFormatError(`refusing chunk for key ${key}: ${buf.byteLength} bytes, its header implies ${HEADER_BYTES + h.payloadBytes}`);
  }
  return h;
}

/**
 * Full check used on every hop between processes and every disk read: header, length, checksum
 * and (when given) the expected key. Returns the header; throws ChunkFormatError on any mismatch.
 */
export function verifyChunk(buf: Uint8Array, expectedKey?: string): ChunkHeader {
  return verifyStreamed(buf, expectedKey, checksum64(buf.subarray(HEADER_BYTES)));
}

/**
 * verifyChunk with the payload checksum already computed while the bytes arrived (a frame reader
 * hashes each piece as it copies it, while it is hot in cache): the same checks — header, exact
 * length, key, xxh64 of the payload — without a second pass over the payload.
 */
export function verifyStreamed(buf: Uint8Array, expectedKey: string | undefined, payloadSum: bigint): ChunkHeader {
  const h = readHeader(buf);
  if (buf.byteLength !== HEADER_BYTES + h.payloadBytes) {
    throw new ChunkFormatError(`truncated or padded chunk ${h.key}: ${buf.byteLength} bytes, expected ${HEADER_BYTES + h.payloadBytes}`);
  }
  if (expectedKey !== undefined && h.key !== expectedKey) throw new ChunkFormatError(`chunk key mismatch: expected ${expectedKey}, found ${h.key}`);
  if (payloadSum !== h.checksum) throw new ChunkFormatError(`checksum mismatch for chunk ${h.key}`);
  return h;
}

/** The payload bytes of a chunk buffer, as a view (no copy). */
export function chunkPayload(buf: Uint8Array): Uint8Array {
  return buf.subarray(HEADER_BYTES);
}
