// 16-bit floats in JavaScript (Node 20 has no Float16Array): IEEE binary16 ("f16", vLLM's
// float16) and bfloat16 ("bf16"), converted to and from f32 with round-to-nearest-even, NaN kept a
// NaN and infinities kept infinite. Used for the engine's 16-bit KV cache, the chunk payloads
// holding it and the chunk codecs (src/common/chunk_codec.ts).

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** f32 value → f16 bits (round to nearest, ties to even; overflow → ±Inf; NaN → a quiet NaN). */
export function f32ToF16Bits(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  const sign = (b >>> 16) & 0x8000;
  const exp = (b >>> 23) & 0xff;
  let mant = b & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0); // Inf or NaN
  // Unbiased exponent e = exp - 127; f16 normal range is e in [-14, 15].
  let e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00; // overflow → Inf
  if (e <= 0) {
    // Subnormal f16 (or zero): shift the implicit-1 mantissa right, rounding to nearest even.
    if (e < -10) return sign; // below half the smallest subnormal: ±0
    mant |= 0x800000;
    const shift = 14 - e; // 14..24
    const half = 1 << (shift - 1);
    const rest = mant & ((1 << shift) - 1);
    let m = mant >>> shift;
    if (rest > half || (rest === half && (m & 1))) m++;
    return sign | m; // m may carry into the exponent field: 0x400 is the smallest normal, as it should be
  }
  const rest = mant & 0x1fff;
  let h = (e << 10) | (mant >>> 13);
  if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++; // a carry into the exponent is the right rounding (up to Inf)
  return sign | h;
}

/** f16 bits → f32 value (exact). */
export function f16BitsToF32(h: number): number {
  const sign = (h & 0x8000) << 16;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) {
    if (mant === 0) {
      u32[0] = sign;
      return f32[0]!;
    }
    // Subnormal: mant · 2^-24, exactly representable in f32.
    const v = mant * 5.960464477539063e-8;
    return sign ? -v : v;
  }
  if (exp === 0x1f) u32[0] = sign | 0x7f800000 | (mant << 13);
  else u32[0] = sign | ((exp + 112) << 23) | (mant << 13);
  return f32[0]!;
}

/** f32 value → bf16 bits (round to nearest, ties to even; NaN stays a quiet NaN). */
export function f32ToBf16Bits(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  if ((b & 0x7f800000) === 0x7f800000 && (b & 0x7fffff)) return ((b >>> 16) | 0x40) & 0xffff;
  return ((b + 0x7fff + ((b >>> 16) & 1)) >>> 16) & 0xffff;
}

/** bf16 bits → f32 value (exact). */
export function bf16BitsToF32(h: number): number {
  u32[0] = (h & 0xffff) << 16;
  return f32[0]!;
}

// Decode tables: 65,536 f32 each (256 KiB), built on first use. A table lookup is several times
// faster than the bit arithmetic, and every chunk decode and KV export goes through it.
let f16Table: Float32Array | null = null;
let bf16Table: Float32Array | null = null;

/** f16 bits → f32, as a table indexed by the 16 bits. */
export function f16Table32(): Float32Array {
  if (!f16Table) {
    f16Table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) f16Table[h] = f16BitsToF32(h);
  }
  return f16Table;
}

/** bf16 bits → f32, as a table indexed by the 16 bits. */
export function bf16Table32(): Float32Array {
  if (!bf16Table) {
    bf16Table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) bf16Table[h] = bf16BitsToF32(h);
  }
  return bf16Table;
}

/** Narrows `src` into 16-bit `dest` (f16 or bf16 bits), element by element. */
export function narrowInto(src: ArrayLike<number>, dest: Uint16Array, bf16: boolean, srcOff = 0, destOff = 0, n = src.length - srcOff): void {
  if (bf16) for (let i = 0; i < n; i++) dest[destOff + i] = f32ToBf16Bits(src[srcOff + i]!);
  else for (let i = 0; i < n; i++) dest[destOff + i] = f32ToF16Bits(src[srcOff + i]!);
}
