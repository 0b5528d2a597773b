// The compiled-kernel cache (kernels/wat/compile.ts): a module's binary is kept under the hash of
// its WAT text, features and wabt version; the cached bytes are exactly wabt's, a damaged file
// is recompiled and replaced, and a cache that cannot be written only costs the compile.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { tempDir } from '../../harness/temp_dir.js';
import { compileWat, wasmCacheDir, wasmCacheFile, watToBinary } from '../../src/engine/model/kernels/wat/compile.js';
import { kernelWat } from '../../src/engine/model/kernels/wat/kernel.js';
import { opsWat } from '../../src/engine/model/kernels/wat/ops.js';
import { convertWat } from '../../src/engine/model/kernels/wat/convert.js';

const root = tempDir('kvc-wasm-cache-');
// compileWat reads KVC_CACHE_DIR from the process's environment (this file runs in its own process).
process.env.KVC_CACHE_DIR = root;
const dir = join(root, 'wasm');

const ADD = '(module (func (export "add") (param i32 i32) (result i32) local.get 0 local.get 1 i32.add))';
const add = async (m: WebAssembly.Module) => ((await WebAssembly.instantiate(m)).exports as { add(a: number, b: number): number }).add(2, 3);

test('the cache lives under KVC_CACHE_DIR/wasm; the file name changes with the text and the features', () => {
  assert.equal(wasmCacheDir(), dir);
  assert.equal(wasmCacheDir({ KVC_CACHE_DIR: '/x' }), '/x/wasm');
  const a = wasmCacheFile('add.wat', ADD, {});
  assert.match(a, /\/wasm\/add-[0-9a-f]{32}\.wasm$/);
  assert.notEqual(wasmCacheFile('add.wat', ADD + ' ', {}), a);
  assert.notEqual(wasmCacheFile('add.wat', ADD, { simd: true }), a);
  assert.equal(wasmCacheFile('add.wat', ADD, {}), a);
});

test('a module compiled once is kept with exactly wabt\'s bytes and read back from the cache', async () => {
  const file = wasmCacheFile('add.wat', ADD, {});
  assert.equal(await add(await compileWat('add.wat', ADD, {})), 5);
  assert.deepEqual(new Uint8Array(readFileSync(file)), await watToBinary('add.wat', ADD, {}));
  // Read from the cache: a valid binary of another module under this name is what compiles.
  writeFileSync(file, await watToBinary('sub.wat', ADD.replace('i32.add', 'i32.sub'), {}));
  assert.equal(await add(await compileWat('add.wat', ADD, {})), -1, 'the cached binary was used');
  assert.deepEqual(readdirSync(dir).filter((f) => f.endsWith('.tmp')), [], 'no temporary file left');
});

test('a damaged cache file is recompiled and replaced', async () => {
  const file = wasmCacheFile('add.wat', ADD, {});
  writeFileSync(file, new Uint8Array([0, 0x61, 0x73, 0x6d, 1, 0])); // truncated
  assert.equal(await add(await compileWat('add.wat', ADD, {})), 5);
  assert.deepEqual(new Uint8Array(readFileSync(file)), await watToBinary('add.wat', ADD, {}));
});

test('a cache directory that cannot be created only costs the compile', async () => {
  const blocker = join(root, 'a-file');
  writeFileSync(blocker, 'not a directory');
  process.env.KVC_CACHE_DIR = blocker;
  try {
    assert.equal(await add(await compileWat('add.wat', ADD, {})), 5);
    assert.ok(!existsSync(join(blocker, 'wasm')));
  } finally {
    process.env.KVC_CACHE_DIR = root;
  }
});

test('the kernel modules compile from the cache to the same bytes wabt makes from their text', async () => {
  const modules: [string, string, object][] = [
    ['kernel.wat', kernelWat({ fma: false, q4: false }), { simd: true, threads: true, relaxed_simd: false }],
    ['ops.wat', opsWat(), { simd: true, threads: true }],
    ['convert.wat', convertWat(), { simd: true }],
  ];
  for (const [name, wat, features] of modules) {
    await compileWat(name, wat, features);
    assert.deepEqual(new Uint8Array(readFileSync(wasmCacheFile(name, wat, features))), await watToBinary(name, wat, features), name);
    await compileWat(name, wat, features); // from the cache
  }
});
