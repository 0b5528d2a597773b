// The kernel's environment settings are checked: a value the engine would not act on is an error
// naming the variable, never silently replaced by the default.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { kernelEnv } from '../../src/engine/model/kernels/env.js';

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

describe('KVC_WEIGHTS_4BIT=q4', () => {
  it('needs the relaxed-SIMD (FMA) kernel: with KVC_WASM_FMA=0 start-up stops and says why', () => {
    const createKernel = new URL('../../src/engine/model/kernels/create.js', import.meta.url).href;
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', `const { createKernel } = await import(${JSON.stringify(createKernel)}); await createKernel({});`], {
      env: { ...process.env, KVC_WASM_FMA: '0', KVC_WEIGHTS_4BIT: 'q4' },
      encoding: 'utf8',
      timeout: 60_000,
    });
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /4-bit weights held as q4 \(KVC_WEIGHTS_4BIT=q4\) need relaxed SIMD with fused multiply-add: off \(KVC_WASM_FMA=0\)/);
  });
});
