// The kernel's environment settings, parsed in one place for createGemm (gemm.ts) and
// WasmGemm.create (kernel_wasm.ts), so both act on the same checked values.

/**
 * The kernel settings of the environment, checked: KVC_GEMM = "wasm" (default) or "js";
 * KVC_GEMM_THREADS = "1" or "2" (default: 2 on a multi-core machine). Any other value is an
 * error naming the variable, never a silently ignored setting.
 */
export function kernelEnv(env: NodeJS.ProcessEnv): { prefer: 'wasm' | 'js'; threads: 1 | 2 | undefined } {
  const g = env.KVC_GEMM ?? '';
  if (g !== '' && g !== 'js' && g !== 'wasm') throw new Error(`KVC_GEMM must be "wasm" (default) or "js"; got ${JSON.stringify(g)}`);
  const t = env.KVC_GEMM_THREADS ?? '';
  if (t !== '' && t !== '1' && t !== '2') throw new Error(`KVC_GEMM_THREADS must be "1" or "2" (kernel threads); got ${JSON.stringify(t)}`);
  return { prefer: g === 'js' ? 'js' : 'wasm', threads: t === '' ? undefined : (Number(t) as 1 | 2) };
}
