// Attention's plain-JS reference pieces (shared by the JS kernel, mirrored bit for bit by the
// WASM kernel's generators in wat/): staging a sequence's paged KV, gathering one KV head's keys and
// values, and the softmax with its deterministic f32 exp.
import { EXP_CONSTS } from './wat/exp.js';
import { f16Table } from '../../../common/half.js';
import { BLOCK_SHIFT, BLOCK_TOKENS } from '../kv_cache.js';
import type { KvElements } from './layout.js';

/**
 * JS twin of the WASM gatherkv: kt [hd][Pb] transposed keys, v [Pb][hd] values, zero padding.
 * Narrow staged KV is widened through `widen` (the f16, bf16, E4M3 or E5M2 table, src/common/half.ts
 * and fp8.ts); int8 (`int8`: true, src the staged bytes) as q · scale with the row's staged scale.
 */
export function gatherStagedJs(src: KvElements, kvDim: number, off: number, hd: number, P: number, Pb: number, kt: Float32Array, v: Float32Array, widen: Float32Array | null = null, int8 = false): void {
  if (int8) {
    gatherInt8Js(src as Uint8Array, kvDim, off, hd, P, Pb, kt, v);
    return;
  }
  if (widen) {
    gatherWidenedJs(src as Uint16Array | Uint8Array, kvDim, off, hd, P, Pb, kt, v, widen);
    return;
  }
  kt.fill(0, 0, hd * Pb);
  v.fill(0, 0, Pb * hd);
  const slab = BLOCK_TOKENS * kvDim;
  for (let j = 0; j < P; j++) {
    const kp = (j >> BLOCK_SHIFT) * 2 * slab + (j & (BLOCK_TOKENS - 1)) * kvDim + off;
    const vp = kp + slab;
    for (let e = 0; e < hd; e++) {
      kt[e * Pb + j] = src[kp + e]!;
      v[j * hd + e] = src[vp + e]!;
    }
  }
}

function gatherWidenedJs(src: Uint16Array | Uint8Array, kvDim: number, off: number, hd: number, P: number, Pb: number, kt: Float32Array, v: Float32Array, widen: Float32Array): void {
  kt.fill(0, 0, hd * Pb);
  v.fill(0, 0, Pb * hd);
  const slab = BLOCK_TOKENS * kvDim;
  for (let j = 0; j < P; j++) {
    const kp = (j >> BLOCK_SHIFT) * 2 * slab + (j & (BLOCK_TOKENS - 1)) * kvDim + off;
    const vp = kp + slab;
    for (let e = 0; e < hd; e++) {
      kt[e * Pb + j] = widen[src[kp + e]!]!;
      v[j * hd + e] = widen[src[vp + e]!]!;
    }
  }
}

/** Where one KV head's int8 values and scales of staged position j are (kv_cache.ts: per block,
 * K and V i8 slabs, then K and V f16 scales [16][heads]); the JS kernels' one reading of it. */
export function int8Staged(src: Uint8Array, kvDim: number, off: number, hd: number) {
  const heads = kvDim / hd;
  const g = off / hd;
  const slab = BLOCK_TOKENS * kvDim;
  const region = 2 * slab + 2 * BLOCK_TOKENS * heads * 2;
  const f16 = f16Table();
  const dv = new DataView(src.buffer, src.byteOffset, src.byteLength);
  const scaleAt = (j: number, which: 0 | 1) =>
    f16[dv.getUint16((j >> BLOCK_SHIFT) * region + 2 * slab + (which * BLOCK_TOKENS * heads + (j & (BLOCK_TOKENS - 1)) * heads + g) * 2, true)]!;
  return {
    /** The values, signed. */
    i8: new Int8Array(src.buffer, src.byteOffset, src.byteLength),
    /** Index in `i8` of position j's first K value; its V values start `slab` later. */
    kAt: (j: number) => (j >> BLOCK_SHIFT) * region + (j & (BLOCK_TOKENS - 1)) * kvDim + off,
    slab,
    kScale: (j: number) => scaleAt(j, 0),
    vScale: (j: number) => scaleAt(j, 1),
  };
}

function gatherInt8Js(src: Uint8Array, kvDim: number, off: number, hd: number, P: number, Pb: number, kt: Float32Array, v: Float32Array): void {
  kt.fill(0, 0, hd * Pb);
  v.fill(0, 0, Pb * hd);
  const s = int8Staged(src, kvDim, off, hd);
  for (let j = 0; j < P; j++) {
    const kp = s.kAt(j);
    const vp = kp + s.slab;
    const ks = s.kScale(j);
    const vs = s.vScale(j);
    for (let e = 0; e < hd; e++) {
      kt[e * Pb + j] = Math.fround(s.i8[kp + e]! * ks);
      v[j * hd + e] = Math.fround(s.i8[vp + e]! * vs);
    }
  }
}

/**
 * Copies one layer's region (`layerElems` elements: K/V slabs, and int8's scales) of `nBlocks`
 * cache blocks to dest[destOff..] (see Kernel.stageKv); dest and pool of one element type.
 */
export function stageInto<T extends KvElements>(dest: T, destOff: number, pool: T, blocks: readonly number[], nBlocks: number, blockFloats: number, layerOffset: number, layerElems: number): void {
  for (let b = 0; b < nBlocks; b++) {
    const at = blocks[b]! * blockFloats + layerOffset;
    dest.set(pool.subarray(at, at + layerElems) as never, destOff + b * layerElems);
  }
}

// ---- softmax reference (mirrors the WASM "softmax" function in wat/softmax.ts bit for bit) ----

const fr = Math.fround;
const EC = {
  lo: fr(EXP_CONSTS.lo),
  log2e: fr(EXP_CONSTS.log2e),
  half: fr(EXP_CONSTS.half),
  c1: fr(EXP_CONSTS.c1),
  c2: fr(EXP_CONSTS.c2),
  p: EXP_CONSTS.p.map(fr),
};
const powBuf = new Int32Array(1);
const powF = new Float32Array(powBuf.buffer);

/** Cephes expf in f32, every operation rounded like the WASM kernel's. Valid for x <= 88. */
export function expf32(x: number): number {
  x = Math.max(x, EC.lo);
  const fx = Math.floor(fr(fr(x * EC.log2e) + EC.half));
  x = fr(x - fr(fx * EC.c1));
  x = fr(x - fr(fx * EC.c2));
  const z = fr(x * x);
  let y = EC.p[0]!;
  for (let i = 1; i < 6; i++) y = fr(fr(y * x) + EC.p[i]!);
  y = fr(fr(fr(y * z) + x) + 1);
  powBuf[0] = (fx + 127) << 23;
  return fr(y * powF[0]!);
}

export function softmaxRowsJs(S: Float32Array, rows: number, stride: number, lens: Int32Array, scale: number): void {
  const sc = fr(scale);
  for (let r = 0; r < rows; r++) {
    const p = r * stride;
    const len = lens[r]!;
    const len4 = len & ~3;
    let m = -Infinity;
    for (let j = 0; j < len; j++) m = Math.max(m, fr(S[p + j]! * sc));
    const acc = [0, 0, 0, 0];
    for (let j = 0; j < len4; j++) {
      const e = expf32(fr(fr(S[p + j]! * sc) - m));
      S[p + j] = e;
      acc[j & 3] = fr(acc[j & 3]! + e);
    }
    let sum = fr(fr(acc[0]! + acc[1]!) + fr(acc[2]! + acc[3]!));
    for (let j = len4; j < len; j++) {
      const e = expf32(fr(fr(S[p + j]! * sc) - m));
      S[p + j] = e;
      sum = fr(sum + e);
    }
    const inv = fr(1 / sum);
    for (let j = 0; j < len; j++) S[p + j] = fr(S[p + j]! * inv);
    S.fill(0, p + len, p + stride);
  }
}

/**
 * SwiGLU of `rows` rows of gate|up ([rows][2*hidden]) into out ([rows][hidden]), the WASM
 * "swiglu" export's bit-exact twin: e = exp(-|g|), d = 1 + e, s = g >= 0 ? 1/d : e/d,
 * out = (g * s) * u, every operation rounded to f32.
 */
export function swigluJs(gu: Float32Array, rows: number, hidden: number, out: Float32Array): void {
  for (let r = 0; r < rows; r++) {
    const gb = r * 2 * hidden;
    const ob = r * hidden;
    for (let i = 0; i < hidden; i++) {
      const g = gu[gb + i]!;
      const e = expf32(-Math.abs(g));
      const d = fr(1 + e);
      const s = g >= 0 ? fr(1 / d) : fr(e / d);
      out[ob + i] = fr(fr(g * s) * gu[gb + hidden + i]!);
    }
  }
}
