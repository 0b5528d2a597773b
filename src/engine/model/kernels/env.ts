// The kernel's environment settings, parsed in one place for createKernel (create.ts) and
// WasmKernel.create (wasm_kernel.ts), so both act on the same checked values; the variables are
// declared and parsed with every other setting (src/common/flags.ts, src/common/environment.ts).
import { environmentOf } from '../../../common/environment.js';

/**
 * The kernel settings of the environment, checked: KVC_GEMM = "wasm" (default) or "js";
 * KVC_GEMM_THREADS = "1" or "2" (default: 2 on a multi-core machine); KVC_WEIGHTS_4BIT = "q8"
 * (default: Q4_0, Q4_1 and Q4_K weights held as 8-bit, the faster prefill) or "q4" (held as
 * their 4-bit values: 0.75 instead of 1.125 bytes a weight, the faster decode once weights
 * outgrow the caches; needs relaxed SIMD with FMA). Any other value is an error naming the
 * variable, never a silently ignored setting.
 */
export function kernelEnv(env: NodeJS.ProcessEnv = process.env): { prefer: 'wasm' | 'js'; threads: 1 | 2 | undefined; q4: boolean } {
  const e = environmentOf(env);
  return { prefer: e.get('gemm') ?? 'wasm', threads: e.get('gemmThreads'), q4: e.get('weights4bit') === 'q4' };
}
