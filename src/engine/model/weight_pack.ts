// Weights kept in their checkpoint's encoding (16-bit floats, 8- or 4-bit blocks) instead of being
// widened to f32 at load, and their packed layouts for the WASM kernel's formats (gemm_wat.ts
// WFmt: 16-bit in strips of 8-column panels, Q8 in one run of k-blocks per half-strip). For
// 16-bit weights the kernel turns each packed value into exactly the f32 that `dequantize` gives,
// so a model computes the same bits either way and only memory (and the bandwidth decode is bound
// by) halves. Q8_0 (3.6x smaller than f32) and Q4_0 (held in the Q8 layout: its 4-bit values
// widen to int8 exactly, same scale) are computed as int8 dot products against quantized
// activations (q8_dot.ts), in the JS kernel too.
import type { WasmConverter } from './convert_wasm.js';
import { dequantize, type HeldType } from './gguf_format.js';
import { PANEL, panelIndex, Q8_BLOCK_BYTES, Q8_HALF_BLOCK_BYTES, Q8_HALF_COLS, Q8_HALF_PAIR_BYTES, STRIP, type WFmt } from './gemm_wat.js';
import { f16ToF32 } from './safetensors.js';

/** A [n][k] weight in its stored encoding (row-major, rows of k values; blocks run along k). */
export interface EncodedWeight {
  type: HeldType;
  bytes: Uint8Array;
}

export const padTo = (n: number, s: number) => Math.ceil(n / s) * s;

/** The kernel format an encoding is held in. */
export function kernelFormat(type: EncodedWeight['type']): WFmt {
  return type === 'F16' ? 'f16' : type === 'BF16' ? 'bf16' : 'q8';
}

/** Bytes of the packed layout of an n x k weight in format `fmt` (N padded to the strip). */
export function packedBytes(fmt: WFmt, n: number, k: number): number {
  const strips = padTo(n, STRIP) / STRIP;
  if (fmt === 'q8') return strips * (k / 32) * Q8_BLOCK_BYTES;
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
 * without changing a value (then the layer is widened to f32): parts of one type as they are,
 * Q4_0 and Q8_0 parts together as Q8_0 (q4_0AsQ8_0).
 */
export function commonEncoding(parts: (EncodedWeight | null)[]): EncodedWeight[] | null {
  if (parts.some((p) => p === null)) return null;
  const ps = parts as EncodedWeight[];
  if (ps.every((p) => p.type === ps[0]!.type)) return ps;
  if (ps.every((p) => p.type === 'Q8_0' || p.type === 'Q4_0')) return ps.map((p) => (p.type === 'Q4_0' ? { type: 'Q8_0', bytes: q4_0AsQ8_0(p.bytes) } : p));
  return null;
}

/** Rows [n][k] bytes per row of an encoding. */
export function rowBytes(type: EncodedWeight['type'], k: number): number {
  if (type === 'Q8_0') return (k / 32) * 34;
  if (type === 'Q4_0') return (k / 32) * 18;
  return k * 2;
}

/**
 * Packs an encoded [n][k] weight into `dest` (a view of exactly packedBytes) in the kernel layout.
 * Refuses F16 Inf/NaN (the kernel's exact f16 widening covers finite values only) and K not a
 * multiple of 32 for block formats.
 */
export function packEncoded(w: EncodedWeight, n: number, k: number, dest: Uint8Array, conv: WasmConverter | null = null): void {
  // Q4_0 is held as the Q8_0 of the same values (q4_0AsQ8_0), packed like any Q8_0 weight.
  if (w.type === 'Q4_0') {
    if (w.bytes.length !== n * rowBytes('Q4_0', k)) throw new Error(`Q4_0 weight has ${w.bytes.length} bytes, expected ${n}x${k} (${n * rowBytes('Q4_0', k)})`);
    return packEncoded({ type: 'Q8_0', bytes: conv ? conv.q4_0AsQ8_0(w.bytes) : q4_0AsQ8_0(w.bytes) }, n, k, dest, conv);
  }
  const fmt = kernelFormat(w.type);
  const rb = rowBytes(w.type, k);
  if (w.bytes.length !== n * rb) throw new Error(`${w.type} weight has ${w.bytes.length} bytes, expected ${n}x${k} (${n * rb})`);
  const src = new DataView(w.bytes.buffer, w.bytes.byteOffset, w.bytes.byteLength);
  const out = new DataView(dest.buffer, dest.byteOffset, dest.byteLength);
  const bytes = w.bytes;
  if (fmt !== 'q8') {
    // The same placement in WASM (convert_wat.ts p16pack), ≈ 10 × faster.
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
  // The same placement in WASM (convert_wat.ts q8pack), ≈ 10 × faster: most of a load.
  if (conv) return conv.packQ8(bytes, n, k, dest);
  dest.fill(0);
  const kBlocks = k / 32;
  for (let i = 0; i < n; i++) {
    const s = Math.floor(i / STRIP);
    // The strip's half this column is in, and its place there: each half is a run of k-blocks
    // of its own (gemm_wat.ts gemmpq8).
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
