// Chunk keys (src/common/keys.ts): agreement across processes, sensitivity to seed/model/chunk size,
// partial-chunk handling both ways.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { chunkKeys, seedFromEnv } from '../../src/common/keys.js';
import { CLI } from '../../harness/proc.js';
import { DType } from '../../src/common/dtype.js';

const tokens = Array.from({ length: 10 }, (_, i) => 1000 + i * 7);

function cliKeys(seed: string, args: string[]): string {
  return execFileSync(process.execPath, [CLI, 'keys', ...args, ...tokens.map(String)], {
    env: { ...process.env, PYTHONHASHSEED: seed },
    encoding: 'utf8',
  });
}

test('two processes with the same PYTHONHASHSEED derive identical keys', () => {
  const a = cliKeys('0', ['--model', 'builtin:tiny', '--chunk-size', '4']);
  const b = cliKeys('0', ['--model', 'builtin:tiny', '--chunk-size', '4']);
  assert.equal(a, b);
  const lines = a.trim().split('\n').map((l) => l.split('\t'));
  assert.deepEqual(lines.map((l) => [l[0], l[1]]), [['0', '4'], ['1', '4'], ['2', '2']]);
  for (const l of lines) assert.match(l[2]!, /^[0-9a-f]{16}$/);
  // The in-process derivation agrees with the CLI's, for the model id the engine keys
  // builtin:tiny with (its directory name, builtin-tiny-v2: what stored chunks use).
  const inProc = chunkKeys(tokens, { modelId: 'builtin-tiny-v2', chunkSize: 4, seed: 0n });
  assert.deepEqual(inProc.map((s) => s.key), lines.map((l) => l[2]));
});

test('another seed, model or chunk size gives different keys', () => {
  const base = chunkKeys(tokens, { modelId: 'm', chunkSize: 4, seed: 0n }).map((s) => s.key);
  const seed = chunkKeys(tokens, { modelId: 'm', chunkSize: 4, seed: 1n }).map((s) => s.key);
  const model = chunkKeys(tokens, { modelId: 'm2', chunkSize: 4, seed: 0n }).map((s) => s.key);
  const size = chunkKeys(tokens, { modelId: 'm', chunkSize: 5, seed: 0n }).map((s) => s.key);
  for (const other of [seed, model, size]) for (const k of other) assert.ok(!base.includes(k));
  const otherSeedCli = cliKeys('7', ['--model', 'm', '--chunk-size', '4']).trim().split('\n').map((l) => l.split('\t')[2]);
  assert.notDeepEqual(otherSeedCli, base);
});

test('keys chain: a chunk key depends on the whole prefix', () => {
  const a = chunkKeys([1, 2, 3, 4, 5, 6, 7, 8], { modelId: 'm', chunkSize: 4, seed: 0n });
  const b = chunkKeys([9, 2, 3, 4, 5, 6, 7, 8], { modelId: 'm', chunkSize: 4, seed: 0n });
  assert.notEqual(a[1]!.key, b[1]!.key, 'same second chunk after a different first chunk must differ');
  const prefix = chunkKeys([1, 2, 3, 4, 5, 6], { modelId: 'm', chunkSize: 4, seed: 0n });
  assert.equal(prefix[0]!.key, a[0]!.key, 'a shared first chunk has the same key');
});

test('partial last chunk: kept by default, dropped with discardPartialChunks', () => {
  const keep = chunkKeys(tokens, { modelId: 'm', chunkSize: 4, seed: 0n });
  const drop = chunkKeys(tokens, { modelId: 'm', chunkSize: 4, seed: 0n, discardPartialChunks: true });
  assert.equal(keep.length, 3);
  assert.deepEqual([keep[2]!.start, keep[2]!.end], [8, 10]);
  assert.equal(drop.length, 2);
  assert.deepEqual(drop.map((s) => s.key), keep.slice(0, 2).map((s) => s.key));
  assert.equal(chunkKeys(tokens.slice(0, 8), { modelId: 'm', chunkSize: 4, seed: 0n, discardPartialChunks: true }).length, 2);
  assert.equal(chunkKeys([], { modelId: 'm', chunkSize: 4, seed: 0n }).length, 0);
  const cli = cliKeys('0', ['--model', 'm', '--chunk-size', '4', '--discard-partial-chunks']).trim().split('\n');
  assert.equal(cli.length, 2);
});

test('PYTHONHASHSEED parsing: unset is 0, garbage is refused', () => {
  assert.equal(seedFromEnv({}), 0n);
  assert.equal(seedFromEnv({ PYTHONHASHSEED: '42' }), 42n);
  assert.throws(() => seedFromEnv({ PYTHONHASHSEED: 'random' }), /PYTHONHASHSEED must be a non-negative integer/);
});

test('kvc keys rejects bad arguments with a clear message', () => {
  assert.throws(
    () => execFileSync(process.execPath, [CLI, 'keys', '--model', 'm', '--chunk-size', '0', '1'], { encoding: 'utf8', stdio: 'pipe' }),
    (e: any) => /--chunk-size: expected an integer between 1 and 1048576, found "0"/.test(String(e.stderr)),
  );
  assert.throws(
    () => execFileSync(process.execPath, [CLI, 'keys', '--model', 'm', '1', 'x'], { encoding: 'utf8', stdio: 'pipe' }),
    (e: any) => /token #1: expected a non-negative 32-bit integer/.test(String(e.stderr)),
  );
});

// An independent, deliberately naive rendering of the key chaining formula of src/common/keys.ts: one fresh buffer per
// chunk, per-token writes. The fast in-place implementation must agree with it bit for bit.
import xxhash from 'xxhash-wasm';
import { keyHalves, halvesToHex } from '../../src/common/keys.js';
const { h64Raw } = await xxhash();
function naiveKeys(tokens: number[], modelId: string, chunkSize: number, seed: bigint): string[] {
  const name = Buffer.from(modelId, 'utf8');
  const root = Buffer.alloc(8 + name.length);
  root.writeBigUInt64LE(seed, 0);
  name.copy(root, 8);
  let prev = h64Raw(root);
  const out: string[] = [];
  for (let s = 0; s < tokens.length; s += chunkSize) {
    const chunk = tokens.slice(s, s + chunkSize);
    const b = Buffer.alloc(8 + 4 * chunk.length);
    b.writeBigUInt64LE(prev, 0);
    chunk.forEach((t, i) => b.writeUInt32LE(t, 8 + 4 * i));
    prev = h64Raw(b);
    out.push(prev.toString(16).padStart(16, '0'));
  }
  return out;
}

test('the fast key derivation equals the naive formula for many shapes, seeds and lengths', () => {
  let x = 7;
  const rand = () => ((x = (x * 1103515245 + 12345) >>> 0), x);
  for (const chunkSize of [1, 3, 16, 256]) {
    for (const len of [0, 1, chunkSize - 1, chunkSize, 3 * chunkSize + 5, 9000]) {
      const tokens = Array.from({ length: Math.max(0, len) }, () => rand());
      for (const seed of [0n, 12345n]) {
        const ref = naiveKeys(tokens, 'model-x', chunkSize, seed);
        assert.deepEqual(chunkKeys(tokens, { modelId: 'model-x', chunkSize, seed }).map((s) => s.key), ref);
        const h = keyHalves(tokens, { modelId: 'model-x', chunkSize, seed });
        assert.deepEqual(Array.from({ length: h.count }, (_, i) => halvesToHex(h.hi[i]!, h.lo[i]!)), ref);
      }
    }
  }
});

test('kvc keys --kv-cache-dtype gives the keys of chunks held in that dtype; fp8 is fp8_e4m3; others are refused', () => {
  const f16 = cliKeys('0', ['--model', 'builtin:tiny', '--chunk-size', '4', '--kv-cache-dtype', 'float16']).trim().split('\n').map((l) => l.split('\t')[2]);
  assert.deepEqual(f16, chunkKeys(tokens, { modelId: 'builtin-tiny-v2', chunkSize: 4, seed: 0n, kvDtype: DType.f16 }).map((s) => s.key));
  const auto = cliKeys('0', ['--model', 'builtin:tiny', '--chunk-size', '4', '--kv-cache-dtype', 'auto']).trim().split('\n').map((l) => l.split('\t')[2]);
  assert.deepEqual(auto, f16, 'auto is float16');
  const f32 = cliKeys('0', ['--model', 'builtin:tiny', '--chunk-size', '4']).trim().split('\n').map((l) => l.split('\t')[2]);
  for (const k of f16) assert.ok(!f32.includes(k));
  const e4m3 = cliKeys('0', ['--model', 'builtin:tiny', '--chunk-size', '4', '--kv-cache-dtype', 'fp8_e4m3']).trim().split('\n').map((l) => l.split('\t')[2]);
  assert.deepEqual(e4m3, chunkKeys(tokens, { modelId: 'builtin-tiny-v2', chunkSize: 4, seed: 0n, kvDtype: DType.fp8_e4m3 }).map((s) => s.key));
  assert.deepEqual(cliKeys('0', ['--model', 'builtin:tiny', '--chunk-size', '4', '--kv-cache-dtype', 'fp8']).trim().split('\n').map((l) => l.split('\t')[2]), e4m3, 'fp8 is fp8_e4m3, as in vLLM');
  assert.throws(() => cliKeys('0', ['--model', 'builtin:tiny', '--chunk-size', '4', '--kv-cache-dtype', 'fp4']), /--kv-cache-dtype/);
});
