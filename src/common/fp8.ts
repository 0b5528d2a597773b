// 8-bit floats of the KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2, vLLM's names): f32 to and
// from the OCP FP8 formats, exactly, rounding to nearest even and saturating to the largest
// finite value (as vLLM's fp8 KV conversion does) instead of overflowing to Inf.
//   E4M3 ("fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN;
//                largest finite 448, smallest subnormal 2^-9.
//   E5M2:        1 sign, 5 exponent (bias 15), 2 mantissa bits: the high byte of an f16, with
//                Inf and NaN; largest finite 57344, smallest subnormal 2^-16.
// The kernels widen the bytes with the same arithmetic (kernels/wat/gather.ts) or these tables.

interface Fp8Format {
  mant: number;
  bias: number;
  /** Bits of the largest finite value (positive). */
  maxBits: number;
  /** Bits of NaN (positive). */
  nan: number;
}
const E4M3: Fp8Format = { mant: 3, bias: 7, maxBits: 0x7e, nan: 0x7f };
const E5M2: Fp8Format = { mant: 2, bias: 15, maxBits: 0x7b, nan: 0x7e };

const f32buf = new Float32Array(1);
const u32buf = new Uint32Array(f32buf.buffer);

/** f32 (a value read as f32) → fp8 bits from its f32 bits, the way half.ts's f32ToF16 does it. */
function encode(f: Fp8Format, v: number): number {
  f32buf[0] = v;
  const x = u32buf[0]!;
  const sign = (x >>> 24) & 0x80;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return mant ? f.nan : sign | f.maxBits; // NaN; ±Inf saturates
  if (exp === 0) return sign; // f32 zero or subnormal: below half the smallest fp8 subnormal
  let e = exp - 127 + f.bias;
  if (e <= 0) {
    // A subnormal of the format (or zero): the 24-bit significand shifted into its quantum.
    mant |= 0x800000;
    const shift = 24 - f.mant - e;
    if (shift > 24) return sign;
    let hm = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && hm & 1)) hm++;
    return sign | hm; // a carry into 1 << mant is the smallest normal's bits
  }
  const shift = 23 - f.mant;
  let hm = mant >>> shift;
  const rem = mant & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  if (rem > half || (rem === half && hm & 1)) {
    hm++;
    if (hm === 1 << f.mant) {
      hm = 0;
      e++;
    }
  }
  const bits = (e << f.mant) | hm;
  return sign | (bits > f.maxBits ? f.maxBits : bits);
}

function decode(f: Fp8Format, b: number): number {
  const s = b & 0x80 ? -1 : 1;
  const expAll = 0x7f >> f.mant;
  const e = (b >> f.mant) & expAll;
  const m = b & ((1 << f.mant) - 1);
  if (f === E4M3 && (b & 0x7f) === 0x7f) return NaN;
  if (f === E5M2 && e === expAll) return m ? NaN : s * Infinity;
  if (e === 0) return s * m * 2 ** (1 - f.bias - f.mant);
  return s * (1 + m / (1 << f.mant)) * 2 ** (e - f.bias);
}

/** f32 → E4M3 bits (nearest even, saturating to ±448; NaN → 0x7f). */
export const f32ToE4m3 = (v: number): number => encode(E4M3, v);
/** f32 → E5M2 bits (nearest even, saturating to ±57344; NaN → 0x7e). */
export const f32ToE5m2 = (v: number): number => encode(E5M2, v);

let e4m3Lut: Float32Array | null = null;
let e5m2Lut: Float32Array | null = null;
/** The f32 value of every E4M3 byte. */
export function e4m3Table(): Float32Array {
  if (!e4m3Lut) e4m3Lut = Float32Array.from({ length: 256 }, (_, b) => decode(E4M3, b));
  return e4m3Lut;
}
/** The f32 value of every E5M2 byte. */
export function e5m2Table(): Float32Array {
  if (!e5m2Lut) e5m2Lut = Float32Array.from({ length: 256 }, (_, b) => decode(E5M2, b));
  return e5m2Lut;
}
