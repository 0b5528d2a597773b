// The kernel's environment settings are checked: a value the engine would not act on is an error
// naming the variable, never silently replaced by the default.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { kernelEnv } from '../src/engine/model/kernel_env.js';

describe('kernel environment', () => {
  it('accepts the documented values and defaults', () => {
    assert.deepEqual(kernelEnv({}), { prefer: 'wasm', threads: undefined });
    assert.deepEqual(kernelEnv({ KVC_GEMM: 'js', KVC_GEMM_THREADS: '1' }), { prefer: 'js', threads: 1 });
    assert.deepEqual(kernelEnv({ KVC_GEMM: 'wasm', KVC_GEMM_THREADS: '2' }), { prefer: 'wasm', threads: 2 });
  });
  it('refuses anything else, naming the variable', () => {
    assert.throws(() => kernelEnv({ KVC_GEMM: 'gpu' }), /^Error: KVC_GEMM must be "wasm" \(default\) or "js"; got "gpu"$/);
    assert.throws(() => kernelEnv({ KVC_GEMM_THREADS: '4' }), /^Error: KVC_GEMM_THREADS must be "1" or "2" \(kernel threads\); got "4"$/);
  });
});
