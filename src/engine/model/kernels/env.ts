// The kernel's environment settings, parsed in one place for createKernel (create.ts) and
// WasmKernel.create (wasm_kernel.ts), so both act on the same checked values.

/**
 * The kernel settings of the environment, checked: KVC_GEMM = "wasm" (default) or "js";
 * KVC_GEMM_THREADS = "1" or "2" (default: 2 on a multi-core machine); KVC_WEIGHTS_4BIT = "q8"
 * (default: Q4_0, Q4_1 and Q4_K weights held as 8-bit, the faster prefill) or "q4" (held as
 * their 4-bit values: 0.75 instead of 1.125 bytes a weight, the faster decode once weights
 * outgrow the caches; needs relaxed SIMD with FMA). Any other value is an error naming the
 * variable, never a silently ignored setting.
 */
export function kernelEnv(env: NodeJS.ProcessEnv): { prefer: 'wasm' | 'js'; threads: 1 | 2 | undefined; q4: boolean } {
  const g = env.KVC_GEMM ?? '';
  if (g !== '' && g !== 'js' && g !== 'wasm') throw new Error(`KVC_GEMM must be "wasm" (default) or "js"; got ${JSON.stringify(g)}`);
  const t = env.KVC_GEMM_THREADS ?? '';
  if (t !== '' && t !== '1' && t !== '2') throw new Error(`KVC_GEMM_THREADS must be "1" or "2" (kernel threads); got ${JSON.stringify(t)}`);
  const w = env.KVC_WEIGHTS_4BIT ?? '';
  if (w !== '' && w !== 'q8' && w !== 'q4') throw new Error(`KVC_WEIGHTS_4BIT must be "q8" (default) or "q4" (how 4-bit weights are held); got ${JSON.stringify(w)}`);
  return { prefer: g === 'js' ? 'js' : 'wasm', threads: t === '' ? undefined : (Number(t) as 1 | 2), q4: w === 'q4' };
}
