// KV element types: what a chunk's payload and the engine's paged KV cache hold (chunk.ts header
// field dtype; keys.ts puts it in every chunk key). A module of its own because both chunk.ts and
// keys.ts need it and chunk.ts imports keys.ts.
export enum DType {
  f32 = 0,
  f16 = 1,
  bf16 = 2,
}
export const DTYPE_BYTES: Record<DType, number> = { [DType.f32]: 4, [DType.f16]: 2, [DType.bf16]: 2 };
export const DTYPE_NAMES: Record<DType, string> = { [DType.f32]: 'f32', [DType.f16]: 'f16', [DType.bf16]: 'bf16' };

/** DType from its name (f32, f16, bf16), or undefined. */
export function dtypeByName(name: string): DType | undefined {
  for (const [code, n] of Object.entries(DTYPE_NAMES)) if (n === name) return Number(code) as DType;
  return undefined;
}
