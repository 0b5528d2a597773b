// The engine KV dtypes as tests and benchmarks iterate them: every --kv-cache-dtype value but the
// aliases (`auto` = float16, `fp8` = fp8_e4m3), and the chunk header's dtype each one gives.
import { DType, isEightBit } from '../src/common/dtype.js';
import { KV_CACHE_DTYPE_OF, KV_CACHE_DTYPES } from '../src/common/flags.js';

export const KV_DTYPE_FLAGS = KV_CACHE_DTYPES.filter((d) => d !== 'auto' && d !== 'fp8');

/** The dtypes the tiers' codecs apply to (8-bit KV is stored as held, never re-encoded). */
export const CODEC_DTYPE_FLAGS = KV_DTYPE_FLAGS.filter((d) => !isEightBit(KV_CACHE_DTYPE_OF[d]));

/** The chunk header dtype of a --kv-cache-dtype value (float32 → f32, float16 → f16, int8 → int8, …). */
export function headerDtypeOf(flag: string): DType {
  const d = KV_CACHE_DTYPE_OF[flag as keyof typeof KV_CACHE_DTYPE_OF];
  if (d === undefined) throw new Error(`no chunk dtype for --kv-cache-dtype ${flag}`);
  return d;
}
