// Half-precision floats: f16 and bf16 bits to and from f32, exactly (round to nearest even).
// Every reader of 16-bit values converts here: 16-bit weights (safetensors, GGUF blocks, the
// kernels' packers), the 16-bit KV cache and the chunks holding it (chunk_codec.ts).

const f32buf = new Float32Array(1);
const u32buf = new Uint32Array(f32buf.buffer);

/** The f32 value of f16 bits (a table lookup: load paths call this once per block or value). */
export function f16ToF32(h: number): number {
  return (f16Lut ?? f16Table())[h & 0xffff]!;
}

function f16Value(h: number): number {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

/** Round-to-nearest-even f32 → f16 bits. */
export function f32ToF16(v: number): number {
  f32buf[0] = v;
  const x = u32buf[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let hm = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && hm & 1)) hm++;
    return sign | hm;
  }
  let hm = mant >>> 13;
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && hm & 1)) {
    hm++;
    if (hm === 0x400) {
      hm = 0;
      e++;
      if (e >= 31) return sign | 0x7c00;
    }
  }
  return sign | (e << 10) | hm;
}

/** Round-to-nearest-even f32 → bf16 bits. */
export function f32ToBf16(v: number): number {
  f32buf[0] = v;
  const x = u32buf[0]!;
  if ((x & 0x7f800000) === 0x7f800000 && x & 0x7fffff) return (x >>> 16) | 0x40;
  return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

let f16Lut: Float32Array | null = null;
/** The f32 value of every f16 bit pattern, built on first use (256 KiB). */
export function f16Table(): Float32Array {
  if (!f16Lut) {
    f16Lut = new Float32Array(65536);
    for (let i = 0; i < 65536; i++) f16Lut[i] = f16Value(i);
  }
  return f16Lut;
}

/** The f32 value of bf16 bits (exact: bf16 is the high half of an f32). */
export function bf16ToF32(h: number): number {
  u32buf[0] = (h & 0xffff) << 16;
  return f32buf[0]!;
}

let bf16Lut: Float32Array | null = null;
/** The f32 value of every bf16 bit pattern, built on first use (256 KiB). */
export function bf16Table(): Float32Array {
  if (!bf16Lut) {
    bf16Lut = new Float32Array(65536);
    for (let i = 0; i < 65536; i++) bf16Lut[i] = bf16ToF32(i);
  }
  return bf16Lut;
}
