// The GGUF container (llama.cpp's model file), version 3, little-endian:
//   "GGUF" magic, u32 version, u64 tensor count, u64 metadata count,
//   metadata: (string key, u32 value type, value)*, a string being u64 length + UTF-8 bytes,
//   tensor infos: (string name, u32 n_dims, u64 dims[n_dims] innermost first, u32 ggml type,
//                  u64 offset within the data section)*,
//   padding to `general.alignment` (default 32), then the data section.
// A 2-D weight of Hugging Face shape [out][in] is stored with dims [in, out] and the same bytes.
import { BLOCK_LAYOUT, decodeBlocks, type RequantizedType } from './gguf_blocks.js';
import { f16ToF32, f32ToF16 } from '../../../common/half.js';

export const GGUF_MAGIC = 0x46554747; // "GGUF" read as u32 LE
export const GGUF_VERSION = 3;
export const GGUF_DEFAULT_ALIGNMENT = 32;

/** Metadata value types. */
export const enum GV {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
}

/**
 * The ggml tensor types this engine reads and writes. F16, BF16 and Q8_0 are computed in their
 * encoding; Q4_0 as Q8_0 of the same values, or with Q4_1 and Q4_K as 4-bit (KVC_WEIGHTS_4BIT=q4);
 * the others (gguf_blocks.ts) are decoded and re-quantized to Q8_0 at load.
 */
export const GGML_TYPES = {
  F32: 0,
  F16: 1,
  Q4_0: 2,
  Q4_1: 3,
  Q5_0: 6,
  Q5_1: 7,
  Q8_0: 8,
  Q4_K: 12,
  Q5_K: 13,
  Q6_K: 14,
  BF16: 30,
} as const;
export type GgmlTypeName = keyof typeof GGML_TYPES;

/** The 2-D weight encodings the kernel holds as they are (weight_pack.ts). */
export type HeldType = 'F16' | 'BF16' | 'Q8_0' | 'Q4_0' | 'Q4_1' | 'Q4_K';

/** Whether a block type's 2-D weights are held as they are (weight_pack.ts q4: 4-bit with a scale and offset per 32). */
export function isHeldBlockType(type: GgmlTypeName): type is 'Q4_0' | 'Q4_1' | 'Q4_K' {
  return type === 'Q4_0' || type === 'Q4_1' || type === 'Q4_K';
}

/**
 * Whether a type is decoded to f32 by gguf_blocks.ts (every block format beyond Q8_0 and Q4_0);
 * its 2-D weights are then re-quantized to Q8_0 at load unless they are held (isHeldBlockType).
 */
export function isRequantized(type: GgmlTypeName): type is RequantizedType {
  return type in BLOCK_LAYOUT;
}

/**
 * `general.file_type` for a file whose 2-D weights are all of one type (llama.cpp's llama_ftype;
 * an all-Q4_K file is its Q4_K_S, all-Q5_K its Q5_K_S).
 */
export const FILE_TYPE: Record<GgmlTypeName, number> = { F32: 0, F16: 1, Q4_0: 2, Q4_1: 3, Q8_0: 7, Q5_0: 8, Q5_1: 9, Q4_K: 14, Q5_K: 16, Q6_K: 18, BF16: 32 };

/** Values per block and bytes per block of each type. */
export const TYPE_LAYOUT: Record<GgmlTypeName, { block: number; bytes: number }> = {
  F32: { block: 1, bytes: 4 },
  F16: { block: 1, bytes: 2 },
  BF16: { block: 1, bytes: 2 },
  Q8_0: { block: 32, bytes: 34 }, // f16 scale, 32 x int8
  Q4_0: { block: 32, bytes: 18 }, // f16 scale, 16 bytes of 4-bit pairs
  ...BLOCK_LAYOUT,
};

export function typeName(t: number): GgmlTypeName | null {
  for (const [k, v] of Object.entries(GGML_TYPES)) if (v === t) return k as GgmlTypeName;
  return null;
}

/** Bytes of `count` values of a type (count a multiple of its block). */
export function typeBytes(type: GgmlTypeName, count: number): number {
  const l = TYPE_LAYOUT[type];
  return (count / l.block) * l.bytes;
}

// ---- quantization (ggml's reference rounding, so llama.cpp reads what it would have written) ----

/** Q8_0: per block of 32, d = amax/127 (stored as f16), q = round(x/d) (halves away from zero). */
export function quantizeQ8_0(x: Float32Array, out: Uint8Array, outOff = 0): void {
  if (x.length % 32 !== 0) throw new Error(`Q8_0 needs a multiple of 32 values, got ${x.length}`);
  const dv = new DataView(out.buffer, out.byteOffset, out.byteLength);
  // Int8 stores wrap like DataView.setInt8 (and NaN becomes 0); this runs once per weight at load.
  const q = new Int8Array(out.buffer, out.byteOffset, out.byteLength);
  const fr = Math.fround;
  for (let b = 0, o = outOff; b < x.length; b += 32, o += 34) {
    // amax = Math.max over |x| (NaN if any value is NaN), without the calls.
    let amax = 0;
    let nan = false;
    for (let i = 0; i < 32; i++) {
      const v = x[b + i]!;
      const a = v < 0 ? -v : v;
      if (a > amax) amax = a;
      else if (a !== a) nan = true;
    }
    if (nan) amax = NaN;
    // d and id in f32, as ggml computes them (a double id could round x · id differently).
    const d = fr(amax / 127);
    const id = d ? fr(1 / d) : 0;
    dv.setUint16(o, f32ToF16(d), true);
    for (let i = 0; i < 32; i++) {
      // C roundf (halves away from zero): v is an f32, so v ± 0.5 is exact in a double and
      // truncating it rounds; |v| ≤ 127.5 fits the int32 truncation. NaN gives 0, and so does
      // ±Inf, which x · id is when 1 / d overflows f32 (amax < ≈ 4e-37: the f16 scale is 0, so
      // the block's values are 0 whatever q holds; ggml's conversion is undefined there).
      const v = fr(x[b + i]! * id);
      q[o + 2 + i] = v >= 0 ? (v + 0.5) | 0 : (v - 0.5) | 0;
    }
  }
}

/** Q4_0: per block of 32, d = max/-8 (max the value of largest magnitude), q = min(15, floor(x/d + 8.5)). */
export function quantizeQ4_0(x: Float32Array, out: Uint8Array, outOff = 0): void {
  if (x.length % 32 !== 0) throw new Error(`Q4_0 needs a multiple of 32 values, got ${x.length}`);
  const dv = new DataView(out.buffer, out.byteOffset, out.byteLength);
  for (let b = 0, o = outOff; b < x.length; b += 32, o += 18) {
    let amax = 0;
    let max = 0;
    for (let i = 0; i < 32; i++) {
      const v = x[b + i]!;
      if (Math.abs(v) > amax) {
        amax = Math.abs(v);
        max = v;
      }
    }
    const d = max / -8;
    const id = d ? 1 / d : 0;
    dv.setUint16(o, f32ToF16(d), true);
    for (let j = 0; j < 16; j++) {
      const q0 = Math.min(15, Math.trunc(Math.fround(x[b + j]! * id) + 8.5));
      const q1 = Math.min(15, Math.trunc(Math.fround(x[b + j + 16]! * id) + 8.5));
      out[o + 2 + j] = q0 | (q1 << 4);
    }
  }
}

/** Decodes `count` values of a type from bytes to f32. */
export function dequantize(type: GgmlTypeName, bytes: Uint8Array, count: number): Float32Array {
  const out = new Float32Array(count);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  switch (type) {
    case 'F32':
      new Uint8Array(out.buffer).set(bytes.subarray(0, count * 4));
      break;
    case 'F16':
      if (bytes.byteOffset % 2 === 0) {
        // Aligned (tensor data is): a Uint16Array view, ≈ 5 × faster than DataView reads.
        const h = new Uint16Array(bytes.buffer, bytes.byteOffset, count);
        for (let i = 0; i < count; i++) out[i] = f16ToF32(h[i]!);
      } else for (let i = 0; i < count; i++) out[i] = f16ToF32(dv.getUint16(i * 2, true));
      break;
    case 'BF16': {
      const bits = new Uint32Array(out.buffer);
      for (let i = 0; i < count; i++) bits[i] = dv.getUint16(i * 2, true) << 16;
      break;
    }
    case 'Q8_0':
      for (let b = 0, o = 0; b < count; b += 32, o += 34) {
        const d = f16ToF32(dv.getUint16(o, true));
        for (let i = 0; i < 32; i++) out[b + i] = d * dv.getInt8(o + 2 + i);
      }
      break;
    case 'Q4_0':
      for (let b = 0, o = 0; b < count; b += 32, o += 18) {
        const d = f16ToF32(dv.getUint16(o, true));
        for (let j = 0; j < 16; j++) {
          const q = bytes[o + 2 + j]!;
          out[b + j] = d * ((q & 15) - 8);
          out[b + j + 16] = d * ((q >> 4) - 8);
        }
      }
      break;
    default:
      decodeBlocks(type, bytes, count, out);
  }
  return out;
}

/**
 * llama.cpp's RoPE pairs dimension 2i with 2i+1 of a head; Hugging Face's rotate_half pairs i with
 * i+hd/2. Its converter therefore permutes the q and k projection rows of every head:
 * GGUF row h*hd + 2i + j = HF row h*hd + j*hd/2 + i (j in {0, 1}). This is that permutation
 * (HF → GGUF); unpermuteRopeRows undoes it.
 */
export function permuteRopeRows<T extends Float32Array | Uint8Array>(w: T, heads: number, headDim: number, cols: number): T {
  return moveRopeRows(w, heads, headDim, cols, (gguf, hf) => [gguf, hf]);
}

/** GGUF → HF: the inverse of permuteRopeRows. */
export function unpermuteRopeRows<T extends Float32Array | Uint8Array>(w: T, heads: number, headDim: number, cols: number): T {
  return moveRopeRows(w, heads, headDim, cols, (gguf, hf) => [hf, gguf]);
}

/** Copies every row of `w` to its place; `route(gguf row, hf row)` answers [destination, source]. */
function moveRopeRows<T extends Float32Array | Uint8Array>(w: T, heads: number, headDim: number, cols: number, route: (g: number, f: number) => [number, number]): T {
  // cols: elements per row (for encoded bytes, the row's byte size).
  const out = (w instanceof Float32Array ? new Float32Array(w.length) : new Uint8Array(w.length)) as T;
  const half = headDim / 2;
  for (let h = 0; h < heads; h++) {
    for (let i = 0; i < half; i++) {
      for (let j = 0; j < 2; j++) {
        const g = h * headDim + 2 * i + j;
        const f = h * headDim + j * half + i;
        const [dst, src] = route(g, f);
        out.set(w.subarray(src * cols, src * cols + cols), dst * cols);
      }
    }
  }
  return out;
}

/** Hugging Face tensor names → GGUF names (llama architecture). */
export function ggufTensorName(hf: string): string | null {
  const fixed: Record<string, string> = {
    'model.embed_tokens.weight': 'token_embd.weight',
    'model.norm.weight': 'output_norm.weight',
    'lm_head.weight': 'output.weight',
  };
  if (fixed[hf]) return fixed[hf]!;
  const m = /^model\.layers\.(\d+)\.(.+)$/.exec(hf);
  if (!m) return null;
  const per: Record<string, string> = {
    'input_layernorm.weight': 'attn_norm.weight',
    'self_attn.q_proj.weight': 'attn_q.weight',
    'self_attn.k_proj.weight': 'attn_k.weight',
    'self_attn.v_proj.weight': 'attn_v.weight',
    'self_attn.o_proj.weight': 'attn_output.weight',
    'post_attention_layernorm.weight': 'ffn_norm.weight',
    'mlp.gate_proj.weight': 'ffn_gate.weight',
    'mlp.up_proj.weight': 'ffn_up.weight',
    'mlp.down_proj.weight': 'ffn_down.weight',
  };
  const t = per[m[2]!];
  return t ? `blk.${m[1]}.${t}` : null;
}

/** GGUF token types (tokenizer.ggml.token_type). */
export const TOKEN_TYPE = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;
