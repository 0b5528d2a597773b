// The kernel's environment settings are checked: a value the engine would not act on is an error
// naming the variable, never silently replaced by the default.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { kernelEnv } from '../src/engine/model/kernel_env.js';

describe('kernel environment', () => {
  it('accepts the documented values and defaults', () => {
    assert.deepEqual(kernelEnv({}), { prefer: 'wasm', threads: undefined, q4: false });
    assert.deepEqual(kernelEnv({ KVC_GEMM: 'js', KVC_GEMM_THREADS: '1', KVC_WEIGHTS_4BIT: 'q8' }), { prefer: 'js', threads: 1, q4: false });
    assert.deepEqual(kernelEnv({ KVC_GEMM: 'wasm', KVC_GEMM_THREADS: '2', KVC_WEIGHTS_4BIT: 'q4' }), { prefer: 'wasm', threads: 2, q4: true });
  });
  it('refuses anything else, naming the variable', () => {
    assert.throws(() => kernelEnv({ KVC_GEMM: 'gpu' }), /^Error: KVC_GEMM must be "wasm" \(default\) or "js"; got "gpu"$/);
    assert.throws(() => kernelEnv({ KVC_GEMM_THREADS: '4' }), /^Error: KVC_GEMM_THREADS must be "1" or "2" \(kernel threads\); got "4"$/);
    assert.throws(() => kernelEnv({ KVC_WEIGHTS_4BIT: '4' }), /^Error: KVC_WEIGHTS_4BIT must be "q8" \(default\) or "q4" \(how 4-bit weights are held\); got "4"$/);
  });
});
