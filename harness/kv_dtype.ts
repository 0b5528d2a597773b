// The engine KV dtypes as tests and benchmarks iterate them: every --kv-cache-dtype value but
// `auto` (an alias of float16), and the chunk header's dtype each one gives.
import { DType, dtypeByName } from '../src/common/dtype.js';
import { KV_CACHE_DTYPES } from '../src/common/flags.js';

export const KV_DTYPE_FLAGS = KV_CACHE_DTYPES.filter((d) => d !== 'auto');

/** The chunk header dtype of a --kv-cache-dtype value (float32 → f32, float16 → f16, bfloat16 → bf16). */
export function headerDtypeOf(flag: string): DType {
  const d = dtypeByName(flag.replace(/^float/, 'f').replace(/^bfloat/, 'bf'));
  if (d === undefined) throw new Error(`no chunk dtype for --kv-cache-dtype ${flag}`);
  return d;
}
