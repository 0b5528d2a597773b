// The engine's 16- and 8-bit KV caches (--kv-cache-dtype float16 / bfloat16 / int8 / fp8_e4m3 /
// fp8_e5m2): the WASM kernel (widening inside its gather) and the JS kernel compute the same bits;
// a narrow cache stays close to f32 (the built-in model's logits); its chunk payloads round-trip
// exactly (export → import → the same next logits as the sequence that never left the cache); the
// pool takes half (16-bit), a quarter (fp8) or a quarter plus the scales (int8) of the bytes.
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { DType } from '../../src/common/dtype.js';
import { payloadPrefix } from '../../src/common/chunk.js';
import { LlamaModel } from '../../src/engine/model/model.js';
import { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { ensureBuiltinModel } from '../../src/engine/model/formats/builtin.js';

const MiB = 1 << 20;
let wasm: LlamaModel;
let js: LlamaModel;

before(async () => {
  const dir = await ensureBuiltinModel('tiny');
  wasm = await LlamaModel.load(dir);
  js = await LlamaModel.load(dir, { kernel: 'js' });
});

function cache(m: LlamaModel, dtype: DType): PagedKvCache {
  return new PagedKvCache({ ...m.layout, dtype }, 32 * MiB);
}

const prompt = Array.from({ length: 70 }, (_, i) => 3 + ((i * 7919) % 31000));

/** Logits of the prompt's last position, then of `steps` decode steps (greedy, or the `forced` tokens). */
function run(m: LlamaModel, kv: PagedKvCache, steps: number, forced?: number[]): Float32Array[] {
  const out: Float32Array[] = [];
  let logits = m.forward([{ seqId: 's', tokens: prompt, startPos: 0, wantLogits: true }], kv)[0]!;
  out.push(Float32Array.from(logits));
  for (let t = 0; t < steps; t++) {
    let best = 0;
    for (let i = 1; i < logits.length; i++) if (logits[i]! > logits[best]!) best = i;
    if (forced) best = forced[t]!;
    logits = m.forward([{ seqId: 's', tokens: [best], startPos: prompt.length + t, wantLogits: true }], kv)[0]!;
    out.push(Float32Array.from(logits));
  }
  return out;
}

/** Largest |Δlogit| ÷ max |logit| against f32 KV allowed per dtype (measured: f16 0.003, bf16 0.024, int8 0.049, E4M3 0.26, E5M2 0.52: 3 and 2 mantissa bits). */
const CLOSE: Partial<Record<DType, number>> = { [DType.f16]: 0.01, [DType.bf16]: 0.08, [DType.int8]: 0.1, [DType.fp8_e4m3]: 0.4, [DType.fp8_e5m2]: 0.8 };

for (const dtype of [DType.f16, DType.bf16, DType.int8, DType.fp8_e4m3, DType.fp8_e5m2]) {
  const name = DType[dtype];
  test(`${name} KV: WASM (widened in the gather) and JS kernels give the same logits bit for bit`, () => {
    const a = run(wasm, cache(wasm, dtype), 6);
    const b = run(js, cache(js, dtype), 6);
    for (let s = 0; s < a.length; s++) assert.deepEqual(new Uint32Array(a[s]!.buffer), new Uint32Array(b[s]!.buffer), `step ${s}`);
  });

  test(`${name} KV: close to f32 KV, a half / quarter of the pool bytes`, () => {
    const kv16 = cache(wasm, dtype);
    const kv32 = cache(wasm, DType.f32);
    const { numLayers, numKvHeads, headDim } = wasm.layout;
    // int8 adds one f16 scale per (K/V, layer, position, KV head).
    const scales = dtype === DType.int8 ? 2 * numLayers * 16 * numKvHeads * 2 : 0;
    assert.equal(kv16.blockBytes, kv32.blockBytes / (4 / kv16.elemBytes) + scales);
    assert.equal(kv16.payloadBytes(3), 2 * numLayers * 3 * numKvHeads * (headDim * kv16.elemBytes + (dtype === DType.int8 ? 2 : 0)));
    const forced = [11, 230, 4051, 17];
    const a = run(wasm, kv16, 4, forced);
    const b = run(wasm, kv32, 4, forced);
    let maxDiff = 0;
    let maxAbs = 0;
    for (let s = 0; s < a.length; s++) {
      for (let i = 0; i < a[s]!.length; i++) {
        maxDiff = Math.max(maxDiff, Math.abs(a[s]![i]! - b[s]![i]!));
        maxAbs = Math.max(maxAbs, Math.abs(b[s]![i]!));
      }
    }
    assert.ok(maxDiff > 0, 'a narrow cache rounds: the logits cannot be identical');
    assert.ok(maxDiff < CLOSE[dtype]! * maxAbs, `max |Δlogit| ${maxDiff} against max |logit| ${maxAbs}`);
  });

  test(`${name} KV: a chunk payload exported and imported continues with identical logits`, () => {
    const kv = cache(wasm, dtype);
    wasm.forward([{ seqId: 'a', tokens: prompt, startPos: 0, wantLogits: false }], kv);
    const payload = new Uint8Array(kv.payloadBytes(prompt.length));
    kv.exportRange('a', 0, prompt.length, payload);
    kv.importRange('b', 0, payload, prompt.length);
    const next = [5, 6, 7];
    const x = wasm.forward([{ seqId: 'a', tokens: next, startPos: prompt.length, wantLogits: true }], kv)[0]!;
    const y = wasm.forward([{ seqId: 'b', tokens: next, startPos: prompt.length, wantLogits: true }], kv)[0]!;
    assert.deepEqual(new Uint32Array(x.buffer, x.byteOffset, x.length), new Uint32Array(y.buffer, y.byteOffset, y.length));
  });
}

test('int8 KV: the first tokens of a chunk payload (scales and values cut alike) import as that prefix', () => {
  const kv = cache(wasm, DType.int8);
  wasm.forward([{ seqId: 'a', tokens: prompt, startPos: 0, wantLogits: false }], kv);
  const full = new Uint8Array(kv.payloadBytes(prompt.length));
  kv.exportRange('a', 0, prompt.length, full);
  const keep = 37;
  const want = new Uint8Array(kv.payloadBytes(keep));
  kv.exportRange('a', 0, keep, want);
  assert.deepEqual(payloadPrefix(kv.layout, full, prompt.length, keep), want);
});
