// WAT of the whole kernel module: every export the WASM kernel (wasm_kernel.ts) and its worker
// thread call, assembled from the generators of each operation.
import { argmaxColsFunc, argmaxFunc, argmaxRowsFunc } from './argmax.js';
import { attendHeadsFunc, attendRowsFunc, attGroupsFunc } from './attention.js';
import { narrowAttentionFuncs } from './attention_narrow.js';
import { f16Func, gatherFunc } from './gather.js';
import { gemmFunc } from './gemm.js';
import { q4GemmFunc, q8GemmFunc, quantQ8Func } from './quantized.js';
import { softmaxFunc } from './softmax.js';
import { swigluFunc, swigluRowsFunc } from './swiglu.js';

/**
 * The module: shared memory is imported so a worker thread can run the same kernel on it.
 * `fma`: the f32 and 16-bit GEMMs (model weights and attention's dense products) accumulate with
 * relaxed_madd (needs relaxed SIMD; fma.ts decides). Q8 (integer dots), softmax, SwiGLU and the
 * rest are the same in both.
 */
export function kernelWat(opts: { fma: boolean; q4?: boolean } = { fma: false }): string {
  const fma = opts.fma;
  // gemmpq4 (and its int8 activations) only in the module that holds 4-bit weights as q4: it
  // needs relaxed SIMD, and that module is compiled without V8's baseline tier (wasm_modules.ts).
  const q4 = opts.q4 === true;
  return `(module
  (import "env" "mem" (memory 1 65536 shared))
${gemmFunc('gemm', false, 'f32', fma)}
${gemmFunc('gemms', false, 'f32', fma, true)}
${gemmFunc('gemmsp', true, 'f32', fma, true)}
${gemmFunc('gemmp', true, 'f32', fma)}
${gemmFunc('gemmpbf16', true, 'bf16', fma)}
${gemmFunc('gemmpf16', true, 'f16', fma)}
${gemmFunc('gemmpglu', true, 'f32', fma, false, true)}
${q8GemmFunc()}
${q4 ? q4GemmFunc() : ''}
${quantQ8Func()}
${q4 ? quantQ8Func(true) : ''}
${softmaxFunc()}
${swigluFunc()}
${swigluRowsFunc()}
${f16Func()}
${gatherFunc()}
${argmaxFunc()}
${argmaxFunc('argmaxany', false)}
${argmaxRowsFunc()}
${argmaxColsFunc()}
${attGroupsFunc()}
${attendHeadsFunc()}
${attendRowsFunc()}
${narrowAttentionFuncs(fma)}
)`;
}
