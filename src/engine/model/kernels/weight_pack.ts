// Weights kept in their checkpoint's encoding (16-bit floats, 8- or 4-bit blocks) instead of being
// widened to f32 at load, and their packed layouts for the WASM kernel's formats (layout.ts
// WFmt: 16-bit in strips of 8-column panels, Q8 in one run of k-blocks per half-strip). For
// 16-bit weights the kernel turns each packed value into exactly the f32 that `dequantize` gives,
// so a model computes the same bits either way and only memory (and the bandwidth decode is bound
// by) halves. Q8_0 (3.6x smaller than f32) and the 4-bit formats Q4_0, Q4_1 and Q4_K (as Q8 by
// default; with KVC_WEIGHTS_4BIT=q4 as their 4-bit values with a scale and an offset per block of
// 32, 5.3x smaller) are computed as int8 dot products against quantized activations (q8_dot.ts),
// in the JS kernel too.
import type { WasmConverter } from './convert_wasm.js';
import { dequantize, quantizeQ8_0, TYPE_LAYOUT, type HeldType } from '../formats/gguf_format.js';
import { minOf, scaleOf } from '../formats/gguf_blocks.js';
import { padTo, PANEL, panelIndex, Q4_BLOCK_BYTES, Q4_HALF_BLOCK_BYTES, Q4_HALF_QUAD_BYTES, Q8_BLOCK_BYTES, Q8_HALF_BLOCK_BYTES, Q8_HALF_COLS, Q8_HALF_PAIR_BYTES, STRIP, type WFmt } from './layout.js';
import { f16ToF32 } from '../../../common/half.js';

/** A [n][k] weight in its stored encoding (row-major, rows of k values; blocks run along k). */
export interface EncodedWeight {
  type: HeldType;
  bytes: Uint8Array;
}

/** The kernel format an encoding is held in. */
export function kernelFormat(type: EncodedWeight['type']): WFmt {
  return type === 'F16' ? 'f16' : type === 'BF16' ? 'bf16' : type === 'Q8_0' ? 'q8' : 'q4';
}

/**
 * The format a kernel holds an encoding in: kernelFormat's, except that the 4-bit formats are held
 * as q8 (asQ8_0) unless the kernel holds them as q4 (KVC_WEIGHTS_4BIT=q4, env.ts).
 */
export function heldFormat(type: EncodedWeight['type'], q4: boolean): WFmt {
  const fmt = kernelFormat(type);
  return fmt === 'q4' && !q4 ? 'q8' : fmt;
}

/** A Q4_0, Q4_1 or Q4_K weight as Q8_0: Q4_0 with the same values, the others re-quantized. */
export function asQ8_0(w: EncodedWeight, conv: WasmConverter | null): EncodedWeight {
  if (w.type === 'Q4_0') return { type: 'Q8_0', bytes: conv ? conv.q4_0AsQ8_0(w.bytes) : q4_0AsQ8_0(w.bytes) };
  if (w.type === 'Q4_1' || w.type === 'Q4_K') return { type: 'Q8_0', bytes: requantizeToQ8_0(w.type, w.bytes, conv) };
  return w;
}

/** The encodings held in the q4 format: 4-bit values with a scale and an offset per block of 32. */
export type Q4Type = 'Q4_0' | 'Q4_1' | 'Q4_K';

/**
 * Block b (values 32b … 32b + 31) of row i of a Q4_0, Q4_1 or Q4_K weight of k columns: its
 * 4-bit values into q[0..31], its scale into so[0] and offset into so[1], so that value j is
 * so[0]·q[j] − so[1] — the file's value, exactly (no rounding: Q4_0 is d·(q − 8), offset 8d;
 * Q4_1 is d·q + m, offset −m; Q4_K's sub-block j of a super-block is (d·sc_j)·q − dmin·m_j,
 * each product of an f16 and a 6-bit integer exact in f32).
 */
export function q4Block(type: Q4Type, bytes: Uint8Array, k: number, i: number, b: number, q: Uint8Array, so: Float32Array): void {
  const row = i * rowBytes(type, k);
  const half = (at: number) => f16ToF32(bytes[at]! | (bytes[at + 1]! << 8));
  if (type === 'Q4_K') {
    const at = row + (b >> 3) * 144;
    const j = b & 7;
    so[0] = Math.fround(half(at) * scaleOf(bytes, at + 4, j));
    so[1] = Math.fround(half(at + 2) * minOf(bytes, at + 4, j));
    // Sub-blocks 2c and 2c + 1 are the low and high nibbles of the 32 bytes at 16 + 32c.
    const nib = at + 16 + 32 * (j >> 1);
    const shift = (j & 1) * 4;
    for (let l = 0; l < 32; l++) q[l] = (bytes[nib + l]! >> shift) & 15;
    return;
  }
  const at = row + b * (type === 'Q4_0' ? 18 : 20);
  const d = half(at);
  so[0] = d;
  so[1] = type === 'Q4_0' ? 8 * d : -half(at + 2);
  const nib = at + (type === 'Q4_0' ? 2 : 4);
  for (let l = 0; l < 16; l++) {
    q[l] = bytes[nib + l]! & 15;
    q[l + 16] = bytes[nib + l]! >> 4;
  }
}

/** Bytes of the packed layout of an n x k weight in format `fmt` (N padded to the strip). */
export function packedBytes(fmt: WFmt, n: number, k: number): number {
  const strips = padTo(n, STRIP) / STRIP;
  if (fmt === 'q8') return strips * (k / 32) * Q8_BLOCK_BYTES;
  if (fmt === 'q4') return strips * (k / 32) * Q4_BLOCK_BYTES;
  return strips * k * STRIP * (fmt === 'f32' ? 4 : 2);
}

/** The f32 values of an encoded weight (the JS kernel's path; the reference the WASM formats equal). */
export function decodeWeight(w: EncodedWeight, n: number, k: number): Float32Array {
  return dequantize(w.type, w.bytes, n * k);
}

/**
 * A Q4_0 weight as Q8_0 bytes with the same values: each block's f16 scale and its 4-bit values
 * −8..7 as int8. The kernel holds both in one layout, so a layer stacked from Q4_0 and Q8_0 parts
 * (llama.cpp files mix them) is held as one Q8 weight, computing the same bits as either alone.
 */
export function q4_0AsQ8_0(bytes: Uint8Array): Uint8Array {
  if (bytes.length % 18 !== 0) throw new Error(`Q4_0 weight of ${bytes.length} bytes is not whole 18-byte blocks`);
  const blocks = bytes.length / 18;
  const out = new Uint8Array(blocks * 34);
  for (let b = 0; b < blocks; b++) {
    const i = b * 18;
    const o = b * 34;
    out[o] = bytes[i]!;
    out[o + 1] = bytes[i + 1]!;
    for (let j = 0; j < 16; j++) {
      const v = bytes[i + 2 + j]!;
      out[o + 2 + j] = ((v & 15) - 8) & 255;
      out[o + 2 + j + 16] = ((v >> 4) - 8) & 255;
    }
  }
  return out;
}

/**
 * The encoded parts of a stacked layer in one encoding, or null when they cannot share one
 * (then the layer is widened to f32): parts of one type as they are; parts of the block types
 * mixed (a Q4_K_M file's Q4_K attn_q beside a Q6_K attn_v, which the loader has re-quantized
 * to Q8_0) together as Q8_0 — Q4_0 with the same values (q4_0AsQ8_0), Q4_1 and Q4_K
 * re-quantized (requantizeToQ8_0: what the loader does to the formats it does not hold); in the
 * WASM converter when there is one (the same bytes).
 */
export function commonEncoding(parts: (EncodedWeight | null)[], conv: WasmConverter | null): EncodedWeight[] | null {
  if (parts.some((p) => p === null)) return null;
  const ps = parts as EncodedWeight[];
  if (ps.every((p) => p.type === ps[0]!.type)) return ps;
  if (!ps.every((p) => p.type === 'Q8_0' || kernelFormat(p.type) === 'q4')) return null;
  return ps.map((p) => asQ8_0(p, conv));
}

/** The Q8_0 bytes of a Q4_1 or Q4_K tensor's decoded values (as the loader re-quantizes formats it does not hold). */
export function requantizeToQ8_0(type: 'Q4_1' | 'Q4_K', bytes: Uint8Array, conv: WasmConverter | null): Uint8Array {
  const { block, bytes: bb } = TYPE_LAYOUT[type];
  const count = (bytes.length / bb) * block;
  if (conv) return conv.requantize(type, bytes, count);
  const q8 = new Uint8Array((count / 32) * 34);
  quantizeQ8_0(dequantize(type, bytes, count), q8);
  return q8;
}

/** Refuses an encoded [n][k] weight whose K its blocks cannot divide or whose byte count is not n rows. */
export function checkEncoded(w: EncodedWeight, n: number, k: number): void {
  const block = w.type === 'Q4_K' ? 256 : kernelFormat(w.type) === 'f16' || kernelFormat(w.type) === 'bf16' ? 1 : 32;
  if (k % block !== 0) throw new Error(`${w.type} weight: K=${k} is not a multiple of ${block}`);
  const rb = rowBytes(w.type, k);
  if (w.bytes.length !== n * rb) throw new Error(`${w.type} weight has ${w.bytes.length} bytes, expected ${n}x${k} (${n * rb})`);
}

/** Rows [n][k] bytes per row of an encoding. */
export function rowBytes(type: EncodedWeight['type'], k: number): number {
  if (type === 'Q8_0') return (k / 32) * 34;
  if (type === 'Q4_0') return (k / 32) * 18;
  if (type === 'Q4_1') return (k / 32) * 20;
  if (type === 'Q4_K') return (k / 256) * 144;
  return k * 2;
}

/**
 * Packs an encoded [n][k] weight into `dest` (a view of exactly packedBytes) in the kernel layout.
 * Refuses F16 Inf/NaN (the kernel's exact f16 widening covers finite values only) and K not a
 * multiple of 32 for block formats.
 */
export function packEncoded(w: EncodedWeight, n: number, k: number, dest: Uint8Array, conv: WasmConverter | null = null): void {
  if (kernelFormat(w.type) === 'q4') {
    // The same placement in WASM (wat/convert.ts q4pack), ≈ 10 × faster.
    if (conv) {
      checkEncoded(w, n, k);
      return conv.packQ4(w.type as Q4Type, w.bytes, n, k, dest);
    }
    return packQ4(w.type as Q4Type, w.bytes, n, k, dest);
  }
  const fmt = kernelFormat(w.type);
  const rb = rowBytes(w.type, k);
  if (w.bytes.length !== n * rb) throw new Error(`${w.type} weight has ${w.bytes.length} bytes, expected ${n}x${k} (${n * rb})`);
  const src = new DataView(w.bytes.buffer, w.bytes.byteOffset, w.bytes.byteLength);
  const out = new DataView(dest.buffer, dest.byteOffset, dest.byteLength);
  const bytes = w.bytes;
  if (fmt !== 'q8') {
    // The same placement in WASM (wat/convert.ts p16pack), ≈ 10 × faster.
    if (conv) return conv.pack16(bytes, n, k, fmt === 'f16', dest);
    dest.fill(0); // the padding columns
    for (let i = 0; i < n; i++) {
      const base = panelIndex(i, k) * 2;
      for (let j = 0; j < k; j++) {
        const h = src.getUint16((i * k + j) * 2, true);
        if (fmt === 'f16' && (h & 0x7c00) === 0x7c00) throw new Error(`F16 weight holds Inf or NaN at row ${i}, column ${j}`);
        out.setUint16(base + j * PANEL * 2, h, true);
      }
    }
    return;
  }
  if (k % 32 !== 0) throw new Error(`${w.type} weight: K=${k} is not a multiple of 32`);
  // The same placement in WASM (wat/convert.ts q8pack), ≈ 10 × faster: most of a load.
  if (conv) return conv.packQ8(bytes, n, k, dest);
  dest.fill(0);
  const kBlocks = k / 32;
  for (let i = 0; i < n; i++) {
    const s = Math.floor(i / STRIP);
    // The strip's half this column is in, and its place there: each half is a run of k-blocks
    // of its own (wat/quantized.ts gemmpq8).
    const half = Math.floor((i % STRIP) / Q8_HALF_COLS);
    const col = i % Q8_HALF_COLS;
    for (let b = 0; b < kBlocks; b++) {
      const at = i * rb + b * 34;
      const blk = s * kBlocks * Q8_BLOCK_BYTES + (half * kBlocks + b) * Q8_HALF_BLOCK_BYTES;
      out.setFloat32(blk + col * 4, f16ToF32(src.getUint16(at, true)), true);
      // k-row r of the block: pair r>>1 (after the half's column scales), column col, slot r&1
      // (the layout i32x4.dot_i16x8_s takes: a column's two k values side by side). Plain byte
      // copies: an int8 value's byte is the same in both places.
      const q0 = blk + Q8_HALF_COLS * 4 + col * 2;
      for (let p = 0; p < 16; p++) {
        dest[q0 + p * Q8_HALF_PAIR_BYTES] = bytes[at + 2 + 2 * p]!;
        dest[q0 + p * Q8_HALF_PAIR_BYTES + 1] = bytes[at + 3 + 2 * p]!;
      }
    }
  }
}

/**
 * The q4 layout (layout.ts) of a Q4_0, Q4_1 or Q4_K weight: per strip, per half of 16
 * columns, per k-block, the 16 columns' scales, their offsets (q4Block), then 8 k-quad rows of
 * 32 bytes: value r of column c's block (k-quad r >> 2, 4-column group g = (c mod 16) >> 2) in
 * byte 16·(g >> 1) + 4·(c mod 4) + (r mod 4) of its row, the low nibble for even g, the high one
 * for odd — so that gemmpq4 finds each group's [4 columns][4 k] with one `and` or shift.
 */
function packQ4(type: Q4Type, bytes: Uint8Array, n: number, k: number, dest: Uint8Array): void {
  checkEncoded({ type, bytes }, n, k);
  dest.fill(0);
  const out = new DataView(dest.buffer, dest.byteOffset, dest.byteLength);
  const kBlocks = k / 32;
  const q = new Uint8Array(32);
  const so = new Float32Array(2);
  for (let i = 0; i < n; i++) {
    const half = Math.floor((i % STRIP) / Q8_HALF_COLS);
    const col = i % Q8_HALF_COLS;
    const g = col >> 2;
    const at0 = (g >> 1) * 16 + (col & 3) * 4;
    const shift = g & 1 ? 4 : 0;
    for (let b = 0; b < kBlocks; b++) {
      q4Block(type, bytes, k, i, b, q, so);
      const blk = Math.floor(i / STRIP) * kBlocks * Q4_BLOCK_BYTES + (half * kBlocks + b) * Q4_HALF_BLOCK_BYTES;
      out.setFloat32(blk + col * 4, so[0]!, true);
      out.setFloat32(blk + Q8_HALF_COLS * 4 + col * 4, so[1]!, true);
      const rows = blk + Q8_HALF_COLS * 8 + at0;
      for (let r = 0; r < 32; r++) dest[rows + (r >> 2) * Q4_HALF_QUAD_BYTES + (r & 3)]! |= q[r]! << shift;
    }
  }
}
