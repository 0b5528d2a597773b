// The model's correctness contract: its logits equal an independent float64 reference forward
// pass (below, written from the HF definition); batch invariance and determinism, bitwise: a
// row's logits are identical alone or among other prefills and decodes, whether its prompt is
// computed in one segment, in several, or partly imported from exported KV chunks; the paged KV
// cache respects its budget. The kernels' own bitwise contract: engine_kernels.test.ts.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { ensureBuiltinModel } from '../../src/engine/model/formats/builtin.js';
import { LlamaModel, argmax } from '../../src/engine/model/model.js';
import { WasmKernelPool } from '../../src/engine/model/kernels/wasm_kernel_pool.js';
import { PagedKvCache, KvCacheFullError, BLOCK_TOKENS } from '../../src/engine/model/kv_cache.js';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { SafetensorsCollection, writeSafetensors, type TensorToWrite } from '../../src/engine/model/formats/safetensors.js';
import { f32ToBf16 } from '../../src/common/half.js';
import { tempDir } from '../../harness/temp_dir.js';
import { bitsEqual } from '../../harness/numeric.js';
import { encodeChunk, verifyChunk, chunkPayload, payloadBytes, DType } from '../../src/common/chunk.js';

let model: LlamaModel;
const MiB = 1024 * 1024;

function prompt(n: number, salt: number): number[] {
  return Array.from({ length: n }, (_, i) => 3 + ((i * 7919 + salt * 104729) % 31000));
}

before(async () => {
  model = await LlamaModel.load(await ensureBuiltinModel('tiny'));
});

test('model: logits of a prompt are identical alone and in a mixed batch', () => {
  const A = prompt(37, 1);
  const B = prompt(20, 2);
  const C = prompt(9, 3);
  const kv1 = model.createKvCache(64 * MiB);
  const alone = model.forward([{ seqId: 'a', tokens: A, startPos: 0, wantLogits: true }], kv1);
  const next = argmax(alone[0]!);
  const aloneDecode = model.forward([{ seqId: 'a', tokens: [next], startPos: A.length, wantLogits: true }], kv1);

  const kv2 = model.createKvCache(64 * MiB);
  model.forward([{ seqId: 'c', tokens: C, startPos: 0, wantLogits: false }], kv2);
  // A's prefill batched with another prefill (no logits wanted) and another sequence's decode.
  const batch = model.forward(
    [
      { seqId: 'b', tokens: B, startPos: 0, wantLogits: false },
      { seqId: 'c', tokens: [5], startPos: C.length, wantLogits: true },
      { seqId: 'a', tokens: A, startPos: 0, wantLogits: true },
    ],
    kv2,
  );
  assert.equal(batch.length, 2);
  bitsEqual(batch[1]!, alone[0]!, 'prefill in batch vs alone');
  // Decode step batched with 3 other decodes.
  const batchDecode = model.forward(
    [
      { seqId: 'b', tokens: [7], startPos: B.length, wantLogits: true },
      { seqId: 'a', tokens: [next], startPos: A.length, wantLogits: true },
      { seqId: 'c', tokens: [9], startPos: C.length + 1, wantLogits: true },
    ],
    kv2,
  );
  bitsEqual(batchDecode[1]!, aloneDecode[0]!, 'decode in batch vs alone');
});

test('model: split prefill and imported KV give the same logits and the same KV', () => {
  const P = prompt(53, 4);
  const kvFull = model.createKvCache(64 * MiB);
  const full = model.forward([{ seqId: 1, tokens: P, startPos: 0, wantLogits: true }], kvFull)[0]!;

  // Three segments over three calls.
  const kvSplit = model.createKvCache(64 * MiB);
  model.forward([{ seqId: 1, tokens: P.slice(0, 5), startPos: 0, wantLogits: false }], kvSplit);
  model.forward([{ seqId: 1, tokens: P.slice(5, 33), startPos: 5, wantLogits: true }], kvSplit);
  const split = model.forward([{ seqId: 1, tokens: P.slice(33), startPos: 33, wantLogits: true }], kvSplit)[0]!;
  bitsEqual(split, full, 'split prefill vs full');

  // Longer than one attention row block (128), split off the block grid.
  const Q = prompt(300, 6);
  const kvQ1 = model.createKvCache(64 * MiB);
  const q1 = model.forward([{ seqId: 'q', tokens: Q, startPos: 0, wantLogits: true }], kvQ1)[0]!;
  const kvQ2 = model.createKvCache(64 * MiB);
  model.forward([{ seqId: 'q', tokens: Q.slice(0, 130), startPos: 0, wantLogits: false }], kvQ2);
  const q2 = model.forward([{ seqId: 'q', tokens: Q.slice(130), startPos: 130, wantLogits: true }], kvQ2)[0]!;
  bitsEqual(q2, q1, 'long split prefill vs full');

  // The KV written is identical too (export both and compare bytes).
  const n = P.length;
  const e1 = new Uint8Array(kvFull.payloadBytes(n));
  const e2 = new Uint8Array(kvSplit.payloadBytes(n));
  kvFull.exportRange(1, 0, n, e1);
  kvSplit.exportRange(1, 0, n, e2);
  assert.deepEqual(e1, e2);

  // Export the first 32 positions as two sealed chunks, import them elsewhere, compute the rest.
  const layout = kvFull.layout;
  assert.equal(layout.dtype, DType.f32);
  const chunks: Uint8Array[] = [];
  for (const [s, e] of [[0, 16], [16, 32]] as const) {
    const buf = new Uint8Array(64 + payloadBytes(layout, e - s));
    kvFull.exportRange(1, s, e, buf.subarray(64));
    chunks.push(encodeChunk(layout, e - s, (s + 1).toString(16).padStart(16, '0'), buf.subarray(64)));
  }
  const kvImp = model.createKvCache(64 * MiB);
  kvImp.importRange('x', 0, chunkPayload(chunks[0]!), verifyChunk(chunks[0]!).numTokens);
  kvImp.importRange('x', 16, chunkPayload(chunks[1]!), 16);
  assert.equal(kvImp.length('x'), 32);
  const imported = model.forward([{ seqId: 'x', tokens: P.slice(32), startPos: 32, wantLogits: true }], kvImp)[0]!;
  bitsEqual(imported, full, 'imported prefix + rest vs full');

  // Greedy continuation is deterministic and not a constant token.
  const gen: number[] = [];
  let logits = full;
  for (let i = 0; i < 12; i++) {
    const t = argmax(logits);
    gen.push(t);
    logits = model.forward([{ seqId: 1, tokens: [t], startPos: n + i, wantLogits: true }], kvFull)[0]!;
  }
  assert.ok(new Set(gen).size >= 4, `greedy output should vary, got ${gen}`);
});

test('model: the JS kernel path gives the same logits as WASM', async () => {
  const jsModel = await LlamaModel.load(model.dir, { kernel: 'js' });
  assert.equal(jsModel.kernel.kind, 'js');
  assert.equal(model.kernel.kind, 'wasm-simd');
  const P = prompt(11, 5);
  const a = model.forward([{ seqId: 1, tokens: P, startPos: 0, wantLogits: true }], model.createKvCache(8 * MiB))[0]!;
  const b = jsModel.forward([{ seqId: 1, tokens: P, startPos: 0, wantLogits: true }], jsModel.createKvCache(8 * MiB))[0]!;
  bitsEqual(a, b, 'js vs wasm');
});

test('model: bad segments are rejected before anything is written', () => {
  const kv = model.createKvCache(8 * MiB);
  assert.throws(() => model.forward([{ seqId: 1, tokens: [], startPos: 0, wantLogits: true }], kv), /segments\[0\]\.tokens must be a non-empty array/);
  assert.throws(() => model.forward([{ seqId: 1, tokens: [1, 32000], startPos: 0, wantLogits: true }], kv), /32000 is not a token id/);
  assert.throws(() => model.forward([{ seqId: 1, tokens: [1], startPos: 3, wantLogits: true }], kv), /startPos 3 is invalid: sequence 1 has KV for 0 positions/);
  assert.throws(
    () =>
      model.forward(
        [
          { seqId: 1, tokens: [1], startPos: 0, wantLogits: true },
          { seqId: 1, tokens: [2], startPos: 0, wantLogits: true },
        ],
        kv,
      ),
    /appears twice/,
  );
  const small = model.createKvCache(4 * kv.blockBytes);
  assert.throws(() => model.forward([{ seqId: 1, tokens: prompt(5 * BLOCK_TOKENS, 1), startPos: 0, wantLogits: true }], small), KvCacheFullError);
  assert.equal(small.usedBlocks, 0);
});

test('kv cache: budget, growth, free, range checks', () => {
  const kv = new PagedKvCache({ numLayers: 2, numKvHeads: 2, headDim: 4 }, 10 * 2 * 2 * BLOCK_TOKENS * 8 * 4 + 100);
  assert.equal(kv.totalBlocks, 10);
  assert.equal(kv.blockBytes, 2 * 2 * BLOCK_TOKENS * 8 * 4);
  assert.ok(kv.canAllocate(160));
  assert.ok(!kv.canAllocate(161));
  kv.allocate('s', 17);
  assert.equal(kv.usedBlocks, 2);
  kv.allocate('s', 32); // still 2 blocks
  assert.equal(kv.usedBlocks, 2);
  assert.ok(kv.canAllocate(160, 's'));
  assert.ok(!kv.canAllocate(145));
  assert.throws(() => kv.allocate('t', 161), KvCacheFullError);
  // import/export round trip through the chunk payload layout
  const n = 20;
  const payload = new Float32Array(2 * 2 * n * 8).map((_, i) => i + 0.5);
  const bytes = new Uint8Array(payload.buffer);
  kv.importRange('t', 0, bytes, n);
  const out = new Uint8Array(bytes.length + 3).subarray(3); // unaligned destination
  kv.exportRange('t', 0, n, out);
  assert.deepEqual(out, bytes);
  const part = new Uint8Array(kv.payloadBytes(5));
  kv.exportRange('t', 10, 15, part);
  const pf = new Float32Array(part.slice().buffer);
  // layout [2][layers][tokens][kvDim]: V of layer 1, token 12, element 3
  assert.equal(pf[((1 * 2 + 1) * 5 + 2) * 8 + 3], payload[((1 * 2 + 1) * n + 12) * 8 + 3]);
  assert.throws(() => kv.exportRange('t', 0, 21, out), /not within the 20 valid positions/);
  assert.throws(() => kv.importRange('u', 4, bytes, n), /leaves a gap/);
  assert.throws(() => kv.importRange('u', 0, bytes.subarray(4), n), /does not match/);
  kv.free('s');
  kv.free('t');
  kv.free('never');
  assert.equal(kv.usedBlocks, 0);
  assert.throws(() => new PagedKvCache({ numLayers: 2, numKvHeads: 2, headDim: 4 }, 10), /smaller than one block/);
});

test('loader: an untied, sharded BF16 checkpoint equals its F32 copy', async () => {
  // A small random Llama whose values are exactly representable in bf16, written twice:
  // once as one F32 file, once as two BF16 shards with an index. Same logits, bit for bit.
  const cfg = {
    architectures: ['LlamaForCausalLM'],
    vocab_size: 300,
    hidden_size: 64,
    intermediate_size: 96,
    num_hidden_layers: 2,
    num_attention_heads: 4,
    num_key_value_heads: 1,
    rms_norm_eps: 1e-5,
    rope_theta: 500000,
    tie_word_embeddings: false,
    max_position_embeddings: 256,
    bos_token_id: 1,
    eos_token_id: 2,
  };
  let seed = 12345;
  const rnd = (n: number, std: number) =>
    Float32Array.from({ length: n }, () => {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      const v = (seed / 4294967296 - 0.5) * 2 * std;
      return new Float32Array(new Uint32Array([f32ToBf16(v) << 16]).buffer)[0]!;
    });
  const t: TensorToWrite[] = [];
  const add = (name: string, shape: number[], std: number) => t.push({ name, shape, data: rnd(shape[0]! * (shape[1] ?? 1), std), dtype: 'F32' });
  add('model.embed_tokens.weight', [300, 64], 0.5);
  for (let l = 0; l < 2; l++) {
    const p = `model.layers.${l}.`;
    add(`${p}input_layernorm.weight`, [64], 1);
    add(`${p}self_attn.q_proj.weight`, [64, 64], 0.2);
    add(`${p}self_attn.k_proj.weight`, [16, 64], 0.2);
    add(`${p}self_attn.v_proj.weight`, [16, 64], 0.2);
    add(`${p}self_attn.o_proj.weight`, [64, 64], 0.2);
    add(`${p}post_attention_layernorm.weight`, [64], 1);
    add(`${p}mlp.gate_proj.weight`, [96, 64], 0.2);
    add(`${p}mlp.up_proj.weight`, [96, 64], 0.2);
    add(`${p}mlp.down_proj.weight`, [64, 96], 0.2);
  }
  add('model.norm.weight', [64], 1);
  add('lm_head.weight', [300, 64], 0.2);
  const f32Dir = tempDir();
  const bfDir = tempDir();
  for (const d of [f32Dir, bfDir]) writeFileSync(join(d, 'config.json'), JSON.stringify(cfg));
  await writeSafetensors(join(f32Dir, 'model.safetensors'), t);
  const half = Math.floor(t.length / 2);
  const bf = t.map((x) => ({ ...x, dtype: 'BF16' as const }));
  await writeSafetensors(join(bfDir, 'model-00001-of-00002.safetensors'), bf.slice(0, half));
  await writeSafetensors(join(bfDir, 'model-00002-of-00002.safetensors'), bf.slice(half));
  const weightMap: Record<string, string> = {};
  bf.forEach((x, i) => (weightMap[x.name] = i < half ? 'model-00001-of-00002.safetensors' : 'model-00002-of-00002.safetensors'));
  writeFileSync(join(bfDir, 'model.safetensors.index.json'), JSON.stringify({ metadata: {}, weight_map: weightMap }));

  const m1 = await LlamaModel.load(f32Dir, { modelId: 'small' });
  const m2 = await LlamaModel.load(bfDir);
  assert.equal(m1.modelId, 'small');
  assert.deepEqual(m2.layout, { dtype: DType.f32, numLayers: 2, numKvHeads: 1, headDim: 16 });
  const P = [1, 5, 77, 200, 299, 3, 3, 42];
  const a = m1.forward([{ seqId: 0, tokens: P, startPos: 0, wantLogits: true }], m1.createKvCache(MiB))[0]!;
  const b = m2.forward([{ seqId: 0, tokens: P, startPos: 0, wantLogits: true }], m2.createKvCache(MiB))[0]!;
  assert.equal(a.length, 300);
  bitsEqual(a, b, 'bf16 shards vs f32');
  assert.ok(a.some((x) => x !== a[0]));

  // Weights spread over several WASM instances (how checkpoints beyond 4 GiB of f32 are held).
  const m3 = await LlamaModel.load(bfDir, { wasmWeightCapBytes: 96 * 1024 });
  try {
    assert.ok(m3.kernel instanceof WasmKernelPool && m3.kernel.size >= 3, 'pooled kernel');
    const c = m3.forward([{ seqId: 0, tokens: P, startPos: 0, wantLogits: true }], m3.createKvCache(MiB))[0]!;
    bitsEqual(c, a, 'pooled WASM instances vs one');
  } finally {
    m3.close();
  }
  m1.close();
  m2.close();

  // Missing lm_head with tie_word_embeddings=false is a clear load error.
  const broken = tempDir();
  writeFileSync(join(broken, 'config.json'), JSON.stringify(cfg));
  await writeSafetensors(join(broken, 'model.safetensors'), t.filter((x) => x.name !== 'lm_head.weight'));
  await assert.rejects(LlamaModel.load(broken), /missing tensor "lm_head.weight"/);
  const badShape = tempDir();
  writeFileSync(join(badShape, 'config.json'), JSON.stringify({ ...cfg, intermediate_size: 128 }));
  await writeSafetensors(join(badShape, 'model.safetensors'), t);
  await assert.rejects(LlamaModel.load(badShape), /tensor "model.layers.0.mlp.gate_proj.weight" has shape \[96,64\], expected \[128,64\]/);
});

// ---------------------------------------------------------------------------------------------
// An independent float64 reference of the Llama forward pass, written from the Hugging Face
// definition (LlamaRMSNorm, apply_rotary_pos_emb with rotate_half, repeat_kv, eager causal
// softmax attention, LlamaMLP with SiLU, tied or untied lm_head), recomputing the whole sequence
// for every position. Nothing here shares code with model.ts or the kernels.

interface RefConfig {
  vocab: number;
  dim: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  hidden: number;
  eps: number;
  theta: number;
  tied: boolean;
}

type Weights = (name: string) => Float32Array;

/** y[j] = Σ_i W[j][i]·x[i] for W stored [out][in] (HF nn.Linear, no bias). */
function linear64(W: Float32Array, x: Float64Array, out: number, inp: number): Float64Array {
  const y = new Float64Array(out);
  for (let j = 0; j < out; j++) {
    let s = 0;
    for (let i = 0; i < inp; i++) s += W[j * inp + i]! * x[i]!;
    y[j] = s;
  }
  return y;
}

function rmsNorm64(x: Float64Array, w: Float32Array, eps: number): Float64Array {
  let ss = 0;
  for (const v of x) ss += v * v;
  const inv = 1 / Math.sqrt(ss / x.length + eps);
  return x.map((v, i) => v * inv * w[i]!);
}

/** HF apply_rotary_pos_emb on one head vector: x·cos + rotate_half(x)·sin, cos/sin = cat(freqs, freqs). */
function rope64(x: Float64Array, pos: number, theta: number): Float64Array {
  const d = x.length;
  const half = d / 2;
  const rot = new Float64Array(d); // rotate_half: cat(-x2, x1)
  for (let i = 0; i < half; i++) {
    rot[i] = -x[i + half]!;
    rot[i + half] = x[i]!;
  }
  const out = new Float64Array(d);
  for (let i = 0; i < d; i++) {
    const invFreq = 1 / Math.pow(theta, (2 * (i % half)) / d);
    const ang = pos * invFreq;
    out[i] = x[i]! * Math.cos(ang) + rot[i]! * Math.sin(ang);
  }
  return out;
}

/** Logits (f64) at every position of `tokens`. */
function referenceLogits(c: RefConfig, W: Weights, tokens: number[]): Float64Array[] {
  const T = tokens.length;
  const nRep = c.heads / c.kvHeads;
  const emb = W('model.embed_tokens.weight');
  let xs: Float64Array[] = tokens.map((t) => Float64Array.from(emb.subarray(t * c.dim, (t + 1) * c.dim)));
  for (let l = 0; l < c.layers; l++) {
    const p = `model.layers.${l}.`;
    const hs = xs.map((x) => rmsNorm64(x, W(`${p}input_layernorm.weight`), c.eps));
    const qs = hs.map((h) => linear64(W(`${p}self_attn.q_proj.weight`), h, c.heads * c.headDim, c.dim));
    const ks = hs.map((h) => linear64(W(`${p}self_attn.k_proj.weight`), h, c.kvHeads * c.headDim, c.dim));
    const vs = hs.map((h) => linear64(W(`${p}self_attn.v_proj.weight`), h, c.kvHeads * c.headDim, c.dim));
    const head = (v: Float64Array, h: number) => v.slice(h * c.headDim, (h + 1) * c.headDim);
    const qr = qs.map((q, t) => Array.from({ length: c.heads }, (_, h) => rope64(head(q, h), t, c.theta)));
    const kr = ks.map((k, t) => Array.from({ length: c.kvHeads }, (_, h) => rope64(head(k, h), t, c.theta)));
    const attnOut = xs.map(() => new Float64Array(c.heads * c.headDim));
    for (let t = 0; t < T; t++) {
      for (let h = 0; h < c.heads; h++) {
        const g = Math.floor(h / nRep); // repeat_kv: KV head g serves query heads g·nRep … g·nRep+nRep-1
        const scores: number[] = [];
        for (let s = 0; s <= t; s++) {
          let d = 0;
          for (let e = 0; e < c.headDim; e++) d += qr[t]![h]![e]! * kr[s]![g]![e]!;
          scores.push(d / Math.sqrt(c.headDim));
        }
        const mx = Math.max(...scores);
        const ex = scores.map((v) => Math.exp(v - mx));
        const sum = ex.reduce((a, b) => a + b, 0);
        for (let s = 0; s <= t; s++) {
          const v = head(vs[s]!, g);
          for (let e = 0; e < c.headDim; e++) attnOut[t]![h * c.headDim + e]! += (ex[s]! / sum) * v[e]!;
        }
      }
    }
    xs = xs.map((x, t) => {
      const o = linear64(W(`${p}self_attn.o_proj.weight`), attnOut[t]!, c.dim, c.heads * c.headDim);
      const x1 = x.map((v, i) => v + o[i]!);
      const h2 = rmsNorm64(x1, W(`${p}post_attention_layernorm.weight`), c.eps);
      const gate = linear64(W(`${p}mlp.gate_proj.weight`), h2, c.hidden, c.dim);
      const up = linear64(W(`${p}mlp.up_proj.weight`), h2, c.hidden, c.dim);
      const act = gate.map((gv, i) => (gv / (1 + Math.exp(-gv))) * up[i]!);
      const down = linear64(W(`${p}mlp.down_proj.weight`), act, c.dim, c.hidden);
      return x1.map((v, i) => v + down[i]!);
    });
  }
  const headW = c.tied ? emb : W('lm_head.weight');
  return xs.map((x) => linear64(headW, rmsNorm64(x, W('model.norm.weight'), c.eps), c.vocab, c.dim));
}

function assertClose(got: Float32Array, ref: Float64Array, what: string, rel = 1e-4): void {
  assert.equal(got.length, ref.length, `${what}: lengths differ`);
  let scale = 0;
  for (const v of ref) scale = Math.max(scale, Math.abs(v));
  assert.ok(scale > 0.1, `${what}: reference logits are degenerate (max |logit| ${scale})`);
  let worst = 0;
  let at = 0;
  for (let i = 0; i < ref.length; i++) {
    const d = Math.abs(got[i]! - ref[i]!);
    if (d > worst) [worst, at] = [d, i];
  }
  assert.ok(worst <= rel * scale, `${what}: logit ${at} is ${got[at]} vs reference ${ref[at]} (|diff| ${worst.toExponential(2)} > ${rel} x ${scale.toFixed(3)})`);
}

/** Writes a small random checkpoint (F32) with the given shape; returns its directory and tensors. */
async function writeRefCheckpoint(c: RefConfig, seed: number): Promise<{ dir: string; W: Weights }> {
  let st = seed >>> 0;
  const uni = () => {
    st = (Math.imul(st, 1664525) + 1013904223) >>> 0;
    return st / 4294967296 - 0.5;
  };
  const tensors = new Map<string, Float32Array>();
  const shapes = new Map<string, number[]>();
  const add = (name: string, shape: number[], f: () => number) => {
    shapes.set(name, shape);
    tensors.set(name, Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, f));
  };
  const qDim = c.heads * c.headDim;
  const kvDim = c.kvHeads * c.headDim;
  add('model.embed_tokens.weight', [c.vocab, c.dim], () => uni() * 2);
  for (let l = 0; l < c.layers; l++) {
    const p = `model.layers.${l}.`;
    add(`${p}input_layernorm.weight`, [c.dim], () => 1 + uni() * 0.6); // not all ones: the weight must be applied
    add(`${p}self_attn.q_proj.weight`, [qDim, c.dim], () => (uni() * 6) / Math.sqrt(c.dim)); // sharp attention
    add(`${p}self_attn.k_proj.weight`, [kvDim, c.dim], () => (uni() * 6) / Math.sqrt(c.dim));
    add(`${p}self_attn.v_proj.weight`, [kvDim, c.dim], () => (uni() * 3) / Math.sqrt(c.dim));
    add(`${p}self_attn.o_proj.weight`, [c.dim, qDim], () => (uni() * 3) / Math.sqrt(qDim));
    add(`${p}post_attention_layernorm.weight`, [c.dim], () => 1 + uni() * 0.6);
    add(`${p}mlp.gate_proj.weight`, [c.hidden, c.dim], () => (uni() * 3) / Math.sqrt(c.dim));
    add(`${p}mlp.up_proj.weight`, [c.hidden, c.dim], () => (uni() * 3) / Math.sqrt(c.dim));
    add(`${p}mlp.down_proj.weight`, [c.dim, c.hidden], () => (uni() * 3) / Math.sqrt(c.hidden));
  }
  add('model.norm.weight', [c.dim], () => 1 + uni() * 0.6);
  if (!c.tied) add('lm_head.weight', [c.vocab, c.dim], () => (uni() * 3) / Math.sqrt(c.dim));
  const dir = tempDir('kvc-ref-model-');
  writeFileSync(
    join(dir, 'config.json'),
    JSON.stringify({
      architectures: ['LlamaForCausalLM'],
      model_type: 'llama',
      vocab_size: c.vocab,
      hidden_size: c.dim,
      intermediate_size: c.hidden,
      num_hidden_layers: c.layers,
      num_attention_heads: c.heads,
      num_key_value_heads: c.kvHeads,
      head_dim: c.headDim,
      rms_norm_eps: c.eps,
      rope_theta: c.theta,
      tie_word_embeddings: c.tied,
      max_position_embeddings: 512,
      hidden_act: 'silu',
    }),
  );
  await writeSafetensors(
    join(dir, 'model.safetensors'),
    [...tensors].map(([name, data]) => ({ name, shape: shapes.get(name)!, data, dtype: 'F32' as const })),
  );
  return { dir, W: (name) => tensors.get(name) ?? assert.fail(`no tensor ${name}`) };
}

/** Prefill of the first `split` tokens, then one decode step per remaining token; every logits row vs the reference. */
function checkAgainstReference(m: LlamaModel, c: RefConfig, W: Weights, tokens: number[], split: number, what: string): void {
  const ref = referenceLogits(c, W, tokens);
  const kv = m.createKvCache(4 * MiB);
  const pre = m.forward([{ seqId: 0, tokens: tokens.slice(0, split), startPos: 0, wantLogits: true }], kv)[0]!;
  assertClose(pre, ref[split - 1]!, `${what}: prefill logits at position ${split - 1}`);
  for (let t = split; t < tokens.length; t++) {
    const got = m.forward([{ seqId: 0, tokens: [tokens[t]!], startPos: t, wantLogits: true }], kv)[0]!;
    assertClose(got, ref[t]!, `${what}: decode logits at position ${t}`);
  }
  // Greedy choice agrees wherever the reference's top two logits are not a near tie.
  const top2 = (r: Float64Array) => [...r].map((v, i) => [v, i] as const).sort((a, b) => b[0] - a[0]).slice(0, 2);
  const [best, second] = top2(ref[split - 1]!);
  if (best![0] - second![0] > 1e-3) assert.equal(argmax(pre), best![1], `${what}: greedy token`);
}

test('model: logits equal an independent float64 reference (untied GQA, tied with head_dim != dim/heads, built-in)', async () => {
  const untied: RefConfig = { vocab: 300, dim: 64, layers: 2, heads: 4, kvHeads: 2, headDim: 16, hidden: 96, eps: 1e-5, theta: 10000, tied: false };
  const tied: RefConfig = { vocab: 200, dim: 48, layers: 3, heads: 8, kvHeads: 2, headDim: 8, hidden: 80, eps: 1e-6, theta: 500000, tied: true };
  const toks = (n: number, vocab: number, salt: number) => Array.from({ length: n }, (_, i) => (i * 37 + salt * 11 + ((i * i) % 13)) % vocab);
  for (const [c, seed] of [[untied, 7], [tied, 99]] as const) {
    const { dir, W } = await writeRefCheckpoint(c, seed);
    for (const kernel of ['wasm', 'js'] as const) {
      const m = await LlamaModel.load(dir, { kernel });
      try {
        checkAgainstReference(m, c, W, toks(40, c.vocab, seed), 33, `${c.tied ? 'tied' : 'untied'} ${kernel}`);
      } finally {
        m.close();
      }
    }
  }
  // The built-in model itself (8 heads over 2 KV heads, 32000-token tied head), read back from its files.
  const cfg = model.config;
  const st = await SafetensorsCollection.openDir(model.dir);
  const cache = new Map<string, Float32Array>();
  for (const name of st.names()) cache.set(name, (await st.get(name)).data);
  const bc: RefConfig = { vocab: cfg.vocabSize, dim: cfg.dim, layers: cfg.numLayers, heads: cfg.numHeads, kvHeads: cfg.numKvHeads, headDim: cfg.headDim, hidden: cfg.hiddenDim, eps: cfg.normEps, theta: cfg.ropeTheta, tied: cfg.tieWordEmbeddings };
  checkAgainstReference(model, bc, (n) => cache.get(n)!, prompt(12, 9), 10, 'builtin');
});
