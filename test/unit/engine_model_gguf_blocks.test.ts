// GGUF block formats read by re-quantizing to Q8_0 at load (gguf_blocks.ts): Q4_1, Q5_0, Q5_1
// and the k-quants Q4_K, Q5_K, Q6_K. Pinned here: each decoder against blocks built by hand from
// ggml's layout (so an encoder and decoder that agree with each other but not with the format
// fail), each encoder's round trip within its bit width's error, and a GGUF in llama.cpp's
// Q4_K_M mix (Q4_K, Q6_K for the output head, attn_v and ffn_down) loaded as a model held in
// Q8 and within the documented logit tolerance of its f32 weights; a layer stacked from Q4_0 and
// Q8_0 parts held as one Q8 weight. (That llama.cpp reads these
// files as kvc does is checked against llama.cpp itself by `npm run bench -- peer`.)
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync, copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { builtinConfigJson, builtinTensors, type BuiltinSpec } from '../../src/engine/model/formats/builtin.js';
import { fmaSupport } from '../../src/engine/model/kernels/fma.js';
import { BLOCK_LAYOUT, decodeBlocks, encodeBlocks, type RequantizedType } from '../../src/engine/model/formats/gguf_blocks.js';
import { loadGguf } from '../../src/engine/model/formats/gguf_model.js';
import { dequantize, type GgmlTypeName } from '../../src/engine/model/formats/gguf_format.js';
import { GgufFile } from '../../src/engine/model/formats/gguf_read.js';
import { convertToGguf, encodeTensor } from '../../src/engine/model/formats/gguf_write.js';
import { LlamaModel } from '../../src/engine/model/model.js';
import { f32ToF16 } from '../../src/common/half.js';
import { writeSafetensors } from '../../src/engine/model/formats/safetensors.js';
import { q4_0AsQ8_0 } from '../../src/engine/model/kernels/weight_pack.js';
import { relativeRms } from '../../harness/numeric.js';
import { tempDir } from '../../harness/temp_dir.js';

const decode = (type: RequantizedType, bytes: Uint8Array, count: number) => {
  const out = new Float32Array(count);
  decodeBlocks(type, bytes, count, out);
  return out;
};

test('Q4_1, Q5_0, Q5_1: hand-built blocks decode to d·q + m (value j in nibble j mod 16, bit 4 in qh bit j)', () => {
  // Value j: q = j (0..31); Q4_1 keeps q & 15.
  const nib = (q: (j: number) => number) => Array.from({ length: 16 }, (_, j) => (q(j) & 15) | ((q(j + 16) & 15) << 4));
  const qh = (q: (j: number) => number) => {
    let h = 0;
    for (let j = 0; j < 32; j++) h |= ((q(j) >> 4) & 1) << j;
    return h >>> 0;
  };
  const q = (j: number) => j;
  const b41 = new Uint8Array(20);
  const v41 = new DataView(b41.buffer);
  v41.setUint16(0, f32ToF16(0.5), true);
  v41.setUint16(2, f32ToF16(-2), true);
  b41.set(nib(q), 4);
  assert.deepEqual([...decode('Q4_1', b41, 32)], Array.from({ length: 32 }, (_, j) => 0.5 * (j & 15) - 2));
  const b50 = new Uint8Array(22);
  const v50 = new DataView(b50.buffer);
  v50.setUint16(0, f32ToF16(0.25), true);
  v50.setUint32(2, qh(q), true);
  b50.set(nib(q), 6);
  assert.deepEqual([...decode('Q5_0', b50, 32)], Array.from({ length: 32 }, (_, j) => 0.25 * (j - 16)));
  const b51 = new Uint8Array(24);
  const v51 = new DataView(b51.buffer);
  v51.setUint16(0, f32ToF16(0.125), true);
  v51.setUint16(2, f32ToF16(1), true);
  v51.setUint32(4, qh(q), true);
  b51.set(nib(q), 8);
  assert.deepEqual([...decode('Q5_1', b51, 32)], Array.from({ length: 32 }, (_, j) => 0.125 * j + 1));
});

test('Q4_K and Q5_K: hand-built super-blocks decode with the 6-bit scales/mins split over 12 bytes', () => {
  // Sub-block s: scale s + 40 and min 2s + 1 (both above 15 for s ≥ 4, so the high bits matter);
  // value l of sub-block s: q = (l + s) mod 16 (Q5_K: plus 16 when l is odd).
  const sc = (s: number) => s + 40;
  const mn = (s: number) => 2 * s + 1;
  const scales = new Uint8Array(12);
  for (let j = 0; j < 8; j++) {
    if (j < 4) {
      scales[j] = sc(j);
      scales[j + 4] = mn(j);
    } else {
      scales[j + 4] = (sc(j) & 15) | ((mn(j) & 15) << 4);
      scales[j - 4]! |= (sc(j) >> 4) << 6;
      scales[j]! |= (mn(j) >> 4) << 6;
    }
  }
  const d = 0.5;
  const dmin = 0.25;
  for (const five of [false, true]) {
    const type = five ? 'Q5_K' : 'Q4_K';
    const q = (s: number, l: number) => ((l + s) & 15) + (five && l % 2 === 1 ? 16 : 0);
    const b = new Uint8Array(BLOCK_LAYOUT[type].bytes);
    const v = new DataView(b.buffer);
    v.setUint16(0, f32ToF16(d), true);
    v.setUint16(2, f32ToF16(dmin), true);
    b.set(scales, 4);
    const ql = five ? 48 : 16;
    for (let c = 0; c < 4; c++) {
      for (let l = 0; l < 32; l++) {
        b[ql + 32 * c + l] = (q(2 * c, l) & 15) | ((q(2 * c + 1, l) & 15) << 4);
        if (five) b[16 + l]! |= ((q(2 * c, l) >> 4) << (2 * c)) | ((q(2 * c + 1, l) >> 4) << (2 * c + 1));
      }
    }
    const got = decode(type, b, 256);
    for (let s = 0; s < 8; s++) {
      for (let l = 0; l < 32; l++) assert.equal(got[32 * s + l], d * sc(s) * q(s, l) - dmin * mn(s), `${type} sub-block ${s} value ${l}`);
    }
  }
});

test('Q6_K: a hand-built super-block decodes value 128n + 32i + l from ql, qh bits 2i and scale 8n + 2i + l/16', () => {
  const b = new Uint8Array(210);
  const v = new DataView(b.buffer);
  v.setUint16(208, f32ToF16(0.5), true);
  const scale = (k: number) => (k % 2 === 0 ? k + 1 : -(k + 1)); // 16 scales, signed
  for (let k = 0; k < 16; k++) v.setInt8(192 + k, scale(k));
  const qOf = (idx: number) => (idx * 37 + 11) % 64; // stored q in [0, 63] of value idx
  for (let n = 0; n < 2; n++) {
    for (let l = 0; l < 32; l++) {
      const [a, c, e, g] = [0, 1, 2, 3].map((i) => qOf(128 * n + 32 * i + l)) as [number, number, number, number];
      b[64 * n + l] = (a & 15) | ((e & 15) << 4);
      b[64 * n + l + 32] = (c & 15) | ((g & 15) << 4);
      b[128 + 32 * n + l] = (a >> 4) | ((c >> 4) << 2) | ((e >> 4) << 4) | ((g >> 4) << 6);
    }
  }
  const got = decode('Q6_K', b, 256);
  for (let n = 0; n < 2; n++) {
    for (let i = 0; i < 4; i++) {
      for (let l = 0; l < 32; l++) {
        const idx = 128 * n + 32 * i + l;
        assert.equal(got[idx], 0.5 * scale(8 * n + 2 * i + (l >> 4)) * (qOf(idx) - 32), `value ${idx}`);
      }
    }
  }
});

test('block encoders: the round trip is within each width\'s error, all-zero blocks stay zero', () => {
  let s = 12345;
  const rnd = () => {
    s = (Math.imul(s, 1103515245) + 12345) >>> 0;
    return s / 2 ** 32;
  };
  const n = 256 * 32;
  const x = Float32Array.from({ length: n }, () => (rnd() - 0.5) * 0.2 + (rnd() < 0.01 ? 0.5 : 0));
  x.fill(0, 0, 256); // one all-zero super-block
  // Fixed data (seeded), so these are not flaky: ~4-bit widths ~8 %, 5-bit ~4-6 %, Q6_K ~2 %.
  const bound: Record<RequantizedType, number> = { Q4_1: 0.12, Q4_K: 0.12, Q5_0: 0.08, Q5_1: 0.06, Q5_K: 0.06, Q6_K: 0.035 };
  for (const type of Object.keys(BLOCK_LAYOUT) as RequantizedType[]) {
    const L = BLOCK_LAYOUT[type];
    const bytes = new Uint8Array((n / L.block) * L.bytes);
    encodeBlocks(type, x, bytes);
    const y = decode(type, bytes, n);
    const rel = relativeRms(y, x);
    assert.ok(rel > 0 && rel < bound[type], `${type}: relative RMS error ${rel} (bound ${bound[type]})`);
    for (let i = 0; i < 256; i++) assert.equal(Math.abs(y[i]!), 0, `${type}: zero block value ${i}`);
  }
  assert.throws(() => encodeBlocks('Q4_K', new Float32Array(32), new Uint8Array(144)), /multiple of 256/);
});

const SPEC: BuiltinSpec = {
  name: 'gguf-kquant-test',
  version: 1,
  seed: 4242,
  dim: 256,
  numLayers: 2,
  numHeads: 4,
  numKvHeads: 2,
  headDim: 64,
  hiddenDim: 512,
  vocabSize: 32000,
  maxPositionEmbeddings: 512,
  embedStd: 0.2,
};

let root: string | undefined;
/** The random model as an f32 Hugging Face directory (written once). */
async function modelDir(): Promise<string> {
  if (root) return join(root, 'f32');
  root = tempDir('kvc-gguf-kq-');
  const dir = join(root, 'f32');
  mkdirSync(dir, { recursive: true });
  await writeSafetensors(join(dir, 'model.safetensors'), builtinTensors(SPEC));
  writeFileSync(join(dir, 'config.json'), JSON.stringify(builtinConfigJson(SPEC)));
  const tok = join('node_modules', '@lenml', 'tokenizer-llama2', 'models');
  copyFileSync(join(tok, 'tokenizer.json'), join(dir, 'tokenizer.json'));
  copyFileSync(join(tok, 'tokenizer_config.json'), join(dir, 'tokenizer_config.json'));
  return dir;
}

test('Q4_0 as Q8_0: the same values, bit for bit', () => {
  const n = 32 * 40;
  const x = Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37) * (1 + (i % 97)) * 0.01);
  const q4 = encodeTensor('Q4_0', x);
  assert.deepEqual([...dequantize('Q8_0', q4_0AsQ8_0(q4), n)], [...dequantize('Q4_0', q4, n)]);
  assert.throws(() => q4_0AsQ8_0(new Uint8Array(17)), /whole 18-byte blocks/);
});

type Mix = [string, GgmlTypeName, ((n: string) => GgmlTypeName | undefined) | undefined, number, string[], string[]];

test('gguf: Q4_K_M-style (Q4_K, Q6_K head/attn_v/ffn_down), Q4_K, Q4_1, Q5_K and Q4_0 with Q8_0 attn_v files load with no layer widened to f32 — held in Q8, or with KVC_WEIGHTS_4BIT=q4 their 4-bit layers as q4 — within the documented tolerance', async () => {
  const dir = await modelDir();
  const ref = await LlamaModel.load(dir);
  const p = [1, ...Array.from({ length: 29 }, (_, i) => 3 + ((i * 7919) % 31000))];
  const logits = (m: LlamaModel) => m.forward([{ seqId: 1, tokens: p, startPos: 0, wantLogits: true }], m.createKvCache(16 << 20))[0]!;
  try {
    const exact = logits(ref);
    // The last column: the formats held with q4 on, in layer order (q|k|v, o, gate|up, down, then
    // the head), distinct; by default every one is 'q8'.
    const mixes: Mix[] = [
      // q|k|v stacks Q4_K with a Q6_K attn_v (re-quantized): held as Q8; o and gate|up as q4.
      ['q4_k_m', 'Q4_K', (n) => (/^output\.weight$|attn_v|ffn_down/.test(n) ? 'Q6_K' : undefined), 0.9, ['Q4_K', 'Q6_K'], ['q8', 'q4']],
      ['q4_k', 'Q4_K', undefined, 0.9, ['Q4_K'], ['q4']],
      ['q4_1', 'Q4_1', undefined, 0.9, ['Q4_1'], ['q4']],
      ['q5_k', 'Q5_K', undefined, 0.6, ['Q5_K'], ['q8']],
      // q, k in Q4_0 and v in Q8_0 are one stacked layer: held as one Q8 weight.
      ['q4_0+q8_0', 'Q4_0', (n) => (/attn_v/.test(n) ? 'Q8_0' : undefined), 0.9, ['Q4_0', 'Q8_0'], ['q8', 'q4']],
    ];
    for (const [name, type, typeOf, tol, fileTypes, heldQ4] of mixes) {
      const file = join(root!, `${name}.gguf`);
      await convertToGguf(dir, file, type, { typeOf });
      const g = await GgufFile.open(file);
      const types = new Set([...g.tensors.values()].filter((t) => t.dims.length === 2).map((t) => t.type));
      assert.deepEqual([...types].sort(), fileTypes, `${name}: the file's 2-D types`);
      for (const q4 of fmaSupport().fma ? [false, true] : [false]) {
        const m = (await loadGguf(file, { q4 })).model;
        try {
          assert.deepEqual(m.weightFormats(), q4 ? heldQ4 : ['q8'], `${name}: the formats held (q4 ${q4})`);
          const rel = relativeRms(logits(m), exact);
          console.log(`${name}${q4 ? ' (q4)' : ''}: relative RMS logit error ${rel.toFixed(4)} (tolerance ${tol})`);
          assert.ok(rel > 0 && rel <= tol, `${name} (q4 ${q4}): relative RMS logit error ${rel} (tolerance ${tol})`);
        } finally {
          m.close();
        }
      }
    }
  } finally {
    ref.close();
  }
});
