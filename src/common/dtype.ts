// KV element types: what a chunk's payload and the engine's paged KV cache hold (chunk.ts header
// field dtype; keys.ts puts it in every chunk key). A module of its own because both chunk.ts and
// keys.ts need it and chunk.ts imports keys.ts.
//
// The 8-bit types (docs/engine.md "KV cache dtype"):
//   int8      symmetric 8-bit with one f16 scale per (K/V, layer, token, KV head): the elements are
//             i8 q, the value q · scale, scale = max|x| / 127 over the head's head_dim elements;
//   fp8_e4m3  OCP E4M3 ("fn": bias 7, no infinities, 0x7f/0xff NaN, largest finite 448), no scale;
//   fp8_e5m2  OCP E5M2 (bias 15, IEEE-like: the high byte of an f16), no scale.
export enum DType {
  f32 = 0,
  f16 = 1,
  bf16 = 2,
  int8 = 3,
  fp8_e4m3 = 4,
  fp8_e5m2 = 5,
}
/** Bytes of one element (an int8 cache also keeps a 2-byte scale per head and token: rowScaleBytes). */
export const DTYPE_BYTES: Record<DType, number> = { [DType.f32]: 4, [DType.f16]: 2, [DType.bf16]: 2, [DType.int8]: 1, [DType.fp8_e4m3]: 1, [DType.fp8_e5m2]: 1 };
export const DTYPE_NAMES: Record<DType, string> = {
  [DType.f32]: 'f32',
  [DType.f16]: 'f16',
  [DType.bf16]: 'bf16',
  [DType.int8]: 'int8',
  [DType.fp8_e4m3]: 'fp8_e4m3',
  [DType.fp8_e5m2]: 'fp8_e5m2',
};
/** Every dtype name, for schemas (the registration message, the engine's /v1/models). */
export const DTYPE_NAME_LIST = Object.values(DTYPE_NAMES) as [string, ...string[]];

/** True for dtypes of one byte an element (int8, fp8_e4m3, fp8_e5m2). */
export function isEightBit(d: DType): boolean {
  return DTYPE_BYTES[d] === 1;
}

/** Bytes of scales per (K/V, layer, token, KV head) row: 2 (one f16) for int8, none for the others. */
export function rowScaleBytes(d: DType): number {
  return d === DType.int8 ? 2 : 0;
}

/** DType from its name (f32, f16, bf16, int8, fp8_e4m3, fp8_e5m2), or undefined. */
export function dtypeByName(name: string): DType | undefined {
  for (const [code, n] of Object.entries(DTYPE_NAMES)) if (n === name) return Number(code) as DType;
  return undefined;
}
