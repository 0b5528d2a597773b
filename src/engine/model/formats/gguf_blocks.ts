// The ggml block formats a GGUF file may hold beyond the ones the kernel computes in (F16, BF16,
// Q8_0, Q4_0): the legacy Q4_1, Q5_0, Q5_1 (blocks of 32) and the k-quants Q4_K, Q5_K, Q6_K
// (super-blocks of 256), i.e. what the common Q4_K_M, Q5_K_M and Q6_K files are made of (a
// Q4_K_M file is mostly Q4_K with Q6_K for the output head and half of attn_v / ffn_down; tensors
// whose rows are not whole super-blocks fall back to Q5_0, Q5_1 or Q8_0).
//
// The engine decodes these to f32 and re-quantizes them to Q8_0 at load (gguf_model.ts;
// kernels/wat/convert.ts runs the same decoders in WASM): one int8 kernel for every quantized file. Q4_1
// and Q4_K can instead be held as they are (KVC_WEIGHTS_4BIT=q4: weight_pack.ts q4Block reads
// their blocks with scaleOf / minOf below). Decoding follows ggml's definitions value for value; the
// encoders below are plain min/max quantizers (not llama.cpp's error-minimising search) that
// write the same layouts, for the tests and the benchmark's files.
//
// Byte layouts (little-endian, f16 = IEEE half):
//   Q4_1  20 B / 32: f16 d, f16 m, 16 B of nibbles        x = d·q + m, q in [0, 15]
//   Q5_0  22 B / 32: f16 d, u32 qh, 16 B of nibbles       x = d·(q − 16), q in [0, 31] (bit 4 in qh)
//   Q5_1  24 B / 32: f16 d, f16 m, u32 qh, 16 B nibbles   x = d·q + m, q in [0, 31]
//     (value j < 16 is the low nibble of byte j, value j + 16 its high nibble; qh bit j is bit 4
//     of value j)
//   Q4_K 144 B / 256: f16 d, f16 dmin, 12 B of 6-bit scales and mins, 128 B of nibbles
//   Q5_K 176 B / 256: f16 d, f16 dmin, 12 B scales/mins, 32 B qh, 128 B nibbles
//     eight sub-blocks of 32 with scale sc and min m: x = (d·sc)·q − (dmin·m); sub-blocks 2c and
//     2c + 1 are the low and high nibbles of bytes [32c, 32c + 32); Q5_K's bit 4 of value l of
//     sub-block s is bit s of qh[l]
//   Q6_K 210 B / 256: 128 B low nibbles ql, 64 B high pairs qh, 16 int8 scales, f16 d
//     sixteen sub-blocks of 16: x = (d·sc)·(q − 32), q in [0, 63] (see decodeQ6K for the order)
import { f16ToF32, f32ToF16 } from '../../../common/half.js';

/** The block formats of this file: values per block and bytes per block. */
export const BLOCK_LAYOUT = {
  Q4_1: { block: 32, bytes: 20 },
  Q5_0: { block: 32, bytes: 22 },
  Q5_1: { block: 32, bytes: 24 },
  Q4_K: { block: 256, bytes: 144 },
  Q5_K: { block: 256, bytes: 176 },
  Q6_K: { block: 256, bytes: 210 },
} as const;
export type RequantizedType = keyof typeof BLOCK_LAYOUT;

const fr = Math.fround;
const half = (dv: DataView, at: number) => f16ToF32(dv.getUint16(at, true));

/** Decodes `count` values (whole blocks) of one of this file's formats into `out`. */
export function decodeBlocks(type: RequantizedType, bytes: Uint8Array, count: number, out: Float32Array): void {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const { block, bytes: bb } = BLOCK_LAYOUT[type];
  for (let b = 0, o = 0; b < count; b += block, o += bb) {
    switch (type) {
      case 'Q4_1':
      case 'Q5_1':
      case 'Q5_0': {
        const d = half(dv, o);
        const m = type === 'Q5_0' ? 0 : half(dv, o + 2);
        const qhAt = type === 'Q5_1' ? o + 4 : o + 2;
        const qh = type === 'Q4_1' ? 0 : dv.getUint32(qhAt, true);
        const qs = type === 'Q4_1' ? o + 4 : qhAt + 4;
        for (let j = 0; j < 16; j++) {
          const v = bytes[qs + j]!;
          const q0 = (v & 15) | (((qh >>> j) & 1) << 4);
          const q1 = (v >> 4) | (((qh >>> (j + 16)) & 1) << 4);
          out[b + j] = type === 'Q5_0' ? fr(d * (q0 - 16)) : fr(fr(d * q0) + m);
          out[b + j + 16] = type === 'Q5_0' ? fr(d * (q1 - 16)) : fr(fr(d * q1) + m);
        }
        break;
      }
      case 'Q4_K':
      case 'Q5_K':
        decodeQ45K(type === 'Q5_K', bytes, dv, o, out, b);
        break;
      case 'Q6_K':
        decodeQ6K(bytes, dv, o, out, b);
        break;
    }
  }
}

/** Scale of sub-block j (0..7) from the 12 packed bytes at `at` (ggml's get_scale_min_k4). */
export function scaleOf(bytes: Uint8Array, at: number, j: number): number {
  return j < 4 ? bytes[at + j]! & 63 : (bytes[at + j + 4]! & 15) | ((bytes[at + j - 4]! >> 6) << 4);
}

/** Min of sub-block j (0..7) from the same 12 bytes. */
export function minOf(bytes: Uint8Array, at: number, j: number): number {
  return j < 4 ? bytes[at + j + 4]! & 63 : (bytes[at + j + 4]! >> 4) | ((bytes[at + j]! >> 6) << 4);
}

function decodeQ45K(five: boolean, bytes: Uint8Array, dv: DataView, o: number, out: Float32Array, y: number): void {
  const d = half(dv, o);
  const dmin = half(dv, o + 2);
  const qh = o + 16;
  let ql = five ? o + 48 : o + 16;
  for (let c = 0; c < 4; c++, ql += 32) {
    const d1 = fr(d * scaleOf(bytes, o + 4, 2 * c));
    const mm1 = fr(dmin * minOf(bytes, o + 4, 2 * c));
    const d2 = fr(d * scaleOf(bytes, o + 4, 2 * c + 1));
    const mm2 = fr(dmin * minOf(bytes, o + 4, 2 * c + 1));
    for (let l = 0; l < 32; l++) {
      const v = bytes[ql + l]!;
      const h = five ? bytes[qh + l]! : 0;
      const q1 = (v & 15) + (((h >> (2 * c)) & 1) << 4);
      const q2 = (v >> 4) + (((h >> (2 * c + 1)) & 1) << 4);
      out[y + 64 * c + l] = fr(fr(d1 * q1) - mm1);
      out[y + 64 * c + 32 + l] = fr(fr(d2 * q2) - mm2);
    }
  }
}

/**
 * Q6_K: the super-block is two halves of 128; in half n, value l + 32i (l < 32, i < 4) has its
 * low nibble in ql[64n + l + 32(i & 1)] (low nibble for i < 2, high for i ≥ 2), its top two bits
 * at bits 2i of qh[32n + l], and scale scales[8n + 2i + l / 16].
 */
function decodeQ6K(bytes: Uint8Array, dv: DataView, o: number, out: Float32Array, y: number): void {
  const d = half(dv, o + 208);
  for (let n = 0; n < 2; n++) {
    const ql = o + 64 * n;
    const qh = o + 128 + 32 * n;
    const sc = o + 192 + 8 * n;
    for (let l = 0; l < 32; l++) {
      const is = l >> 4;
      const h = bytes[qh + l]!;
      const a = bytes[ql + l]!;
      const b = bytes[ql + l + 32]!;
      const at = y + 128 * n + l;
      out[at] = fr(fr(d * dv.getInt8(sc + is)) * (((a & 15) | ((h & 3) << 4)) - 32));
      out[at + 32] = fr(fr(d * dv.getInt8(sc + is + 2)) * (((b & 15) | (((h >> 2) & 3) << 4)) - 32));
      out[at + 64] = fr(fr(d * dv.getInt8(sc + is + 4)) * (((a >> 4) | (((h >> 4) & 3) << 4)) - 32));
      out[at + 96] = fr(fr(d * dv.getInt8(sc + is + 6)) * (((b >> 4) | (((h >> 6) & 3) << 4)) - 32));
    }
  }
}

// ---- encoders (min/max, for tests and benchmarks) ----------------------------------------------

const clamp = (v: number, lo: number, hi: number) => Math.max(lo, Math.min(hi, v));

/** Encodes f32 values (a multiple of the block) into `out` (typeBytes of them). */
export function encodeBlocks(type: RequantizedType, x: Float32Array, out: Uint8Array): void {
  const { block, bytes: bb } = BLOCK_LAYOUT[type];
  if (x.length % block !== 0) throw new Error(`${type} needs a multiple of ${block} values, got ${x.length}`);
  const dv = new DataView(out.buffer, out.byteOffset, out.byteLength);
  for (let b = 0, o = 0; b < x.length; b += block, o += bb) {
    if (type === 'Q4_K' || type === 'Q5_K') encodeQ45K(type === 'Q5_K', x, b, out, dv, o);
    else if (type === 'Q6_K') encodeQ6K(x, b, out, dv, o);
    else encodeLegacy(type, x, b, out, dv, o);
  }
}

function encodeLegacy(type: 'Q4_1' | 'Q5_0' | 'Q5_1', x: Float32Array, b: number, out: Uint8Array, dv: DataView, o: number): void {
  const q = new Uint8Array(32);
  if (type === 'Q5_0') {
    // As Q4_0: the value of largest magnitude maps to −16.
    let max = 0;
    for (let i = 0; i < 32; i++) if (Math.abs(x[b + i]!) > Math.abs(max)) max = x[b + i]!;
    const d = max / -16;
    const id = d ? 1 / d : 0;
    dv.setUint16(o, f32ToF16(d), true);
    for (let i = 0; i < 32; i++) q[i] = clamp(Math.trunc(fr(x[b + i]! * id) + 16.5), 0, 31);
  } else {
    const nmax = type === 'Q4_1' ? 15 : 31;
    let lo = Infinity;
    let hi = -Infinity;
    for (let i = 0; i < 32; i++) {
      lo = Math.min(lo, x[b + i]!);
      hi = Math.max(hi, x[b + i]!);
    }
    const d = (hi - lo) / nmax;
    const id = d ? 1 / d : 0;
    dv.setUint16(o, f32ToF16(d), true);
    dv.setUint16(o + 2, f32ToF16(lo), true);
    for (let i = 0; i < 32; i++) q[i] = clamp(Math.trunc((x[b + i]! - lo) * id + 0.5), 0, nmax);
  }
  const qhAt = type === 'Q5_1' ? o + 4 : o + 2;
  const qs = type === 'Q4_1' ? o + 4 : qhAt + 4;
  let qh = 0;
  for (let j = 0; j < 16; j++) {
    out[qs + j] = (q[j]! & 15) | ((q[j + 16]! & 15) << 4);
    qh |= ((q[j]! >> 4) << j) | ((q[j + 16]! >> 4) << (j + 16));
  }
  if (type !== 'Q4_1') dv.setUint32(qhAt, qh >>> 0, true);
}

function encodeQ45K(five: boolean, x: Float32Array, b: number, out: Uint8Array, dv: DataView, o: number): void {
  const nmax = five ? 31 : 15;
  const scales = new Float64Array(8);
  const mins = new Float64Array(8);
  for (let j = 0; j < 8; j++) {
    let lo = 0; // the min is at most 0 (stored negated, as a non-negative m)
    let hi = -Infinity;
    for (let i = 0; i < 32; i++) {
      lo = Math.min(lo, x[b + 32 * j + i]!);
      hi = Math.max(hi, x[b + 32 * j + i]!);
    }
    scales[j] = Math.max(0, (hi - lo) / nmax);
    mins[j] = -lo;
  }
  const maxScale = Math.max(...scales);
  const maxMin = Math.max(...mins);
  const ls = scales.map((s) => (maxScale > 0 ? Math.min(63, Math.round((63 / maxScale) * s)) : 0));
  const lm = mins.map((m) => (maxMin > 0 ? Math.min(63, Math.round((63 / maxMin) * m)) : 0));
  dv.setUint16(o, f32ToF16(maxScale / 63), true);
  dv.setUint16(o + 2, f32ToF16(maxMin / 63), true);
  const s = o + 4;
  for (let j = 0; j < 12; j++) out[s + j] = 0;
  for (let j = 0; j < 8; j++) {
    if (j < 4) {
      out[s + j] = ls[j]!;
      out[s + j + 4] = lm[j]!;
    } else {
      out[s + j + 4] = (ls[j]! & 15) | ((lm[j]! & 15) << 4);
      out[s + j - 4]! |= (ls[j]! >> 4) << 6;
      out[s + j]! |= (lm[j]! >> 4) << 6;
    }
  }
  const d = half(dv, o);
  const dmin = half(dv, o + 2);
  const L = new Uint8Array(256);
  for (let j = 0; j < 8; j++) {
    const dd = fr(d * scaleOf(out, s, j));
    if (!dd) continue;
    const dm = fr(dmin * minOf(out, s, j));
    for (let i = 0; i < 32; i++) L[32 * j + i] = clamp(Math.round((x[b + 32 * j + i]! + dm) / dd), 0, nmax);
  }
  const qh = o + 16;
  const ql = five ? o + 48 : o + 16;
  if (five) for (let l = 0; l < 32; l++) out[qh + l] = 0;
  for (let c = 0; c < 4; c++) {
    for (let l = 0; l < 32; l++) {
      const q1 = L[64 * c + l]!;
      const q2 = L[64 * c + 32 + l]!;
      out[ql + 32 * c + l] = (q1 & 15) | ((q2 & 15) << 4);
      if (five) out[qh + l]! |= ((q1 >> 4) << (2 * c)) | ((q2 >> 4) << (2 * c + 1));
    }
  }
}

function encodeQ6K(x: Float32Array, b: number, out: Uint8Array, dv: DataView, o: number): void {
  // Per sub-block of 16, the value of largest magnitude maps to −32; the sub-block scales are
  // then 8-bit multiples of one f16 d (the largest maps to −128).
  const scales = new Float64Array(16);
  let maxScale = 0;
  for (let ib = 0; ib < 16; ib++) {
    let max = 0;
    for (let i = 0; i < 16; i++) if (Math.abs(x[b + 16 * ib + i]!) > Math.abs(max)) max = x[b + 16 * ib + i]!;
    scales[ib] = max / -32;
    if (Math.abs(scales[ib]!) > Math.abs(maxScale)) maxScale = scales[ib]!;
  }
  out.fill(0, o, o + 210);
  if (maxScale === 0) return;
  const iscale = -128 / maxScale;
  dv.setUint16(o + 208, f32ToF16(1 / iscale), true);
  const d = half(dv, o + 208);
  const L = new Uint8Array(256);
  for (let ib = 0; ib < 16; ib++) {
    const sc = clamp(Math.round(iscale * scales[ib]!), -128, 127);
    dv.setInt8(o + 192 + ib, sc);
    const dd = fr(d * sc);
    for (let i = 0; i < 16; i++) L[16 * ib + i] = dd ? clamp(Math.round(x[b + 16 * ib + i]! / dd), -32, 31) + 32 : 32;
  }
  for (let n = 0; n < 2; n++) {
    for (let l = 0; l < 32; l++) {
      const [a, c, e, g] = [L[128 * n + l]!, L[128 * n + l + 32]!, L[128 * n + l + 64]!, L[128 * n + l + 96]!];
      out[o + 64 * n + l] = (a & 15) | ((e & 15) << 4);
      out[o + 64 * n + l + 32] = (c & 15) | ((g & 15) << 4);
      out[o + 128 + 32 * n + l] = (a >> 4) | ((c >> 4) << 2) | ((e >> 4) << 4) | ((g >> 4) << 6);
    }
  }
}
