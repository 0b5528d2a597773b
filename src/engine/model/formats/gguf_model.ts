// A Llama model from one GGUF file: hyper-parameters from the llama.* metadata, weights mapped to
// the Hugging Face names the model code uses (q/k projection rows un-permuted back to the
// rotate_half convention), the tokenizer from the tokenizer.ggml.* metadata. Everything is
// validated before any weight is read, so an unsupported or malformed file fails at start with a
// GgufError naming the key or tensor.
import { basename, resolve } from 'node:path';
import type { ModelConfig } from '../config.js';
import { wasmConverter } from '../kernels/convert_wasm.js';
import { TOKEN_TYPE, dequantize, ggufTensorName, isHeldBlockType, isRequantized, quantizeQ8_0, typeBytes, unpermuteRopeRows } from './gguf_format.js';
import { GgufError, GgufFile, type GgufValue } from './gguf_read.js';
import { tokenizerFromGguf } from './gguf_tokenizer.js';
import { LlamaModel, type LoadOptions, type WeightSource } from '../model.js';
import type { Tokenizer } from '../tokenizer.js';
import { rowBytes } from '../kernels/weight_pack.js';

function num(g: GgufFile, key: string, def?: number): number {
  const v: GgufValue | undefined = g.meta.get(key);
  if (v === undefined) {
    if (def !== undefined) return def;
    throw new GgufError(`${g.file}: missing metadata "${key}"`);
  }
  const n = typeof v === 'bigint' ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isFinite(n)) throw new GgufError(`${g.file}: metadata "${key}" must be a number, got ${JSON.stringify(String(v))}`);
  return n;
}

function posInt(g: GgufFile, key: string, def?: number): number {
  const n = num(g, key, def);
  if (!Number.isInteger(n) || n <= 0) throw new GgufError(`${g.file}: metadata "${key}" must be a positive integer, got ${n}`);
  return n;
}

/**
 * GGUF stores these hyper-parameters as f32 (1e-5 becomes 9.99999974e-6); the model computes
 * with doubles, so take the shortest decimal that rounds to the stored f32: the value the
 * checkpoint's config.json had, and the same logits as the safetensors form of the model.
 */
function shortestF32(v: number): number {
  for (let p = 1; p <= 9; p++) {
    const d = Number(v.toPrecision(p));
    if (Math.fround(d) === v) return d;
  }
  return v;
}

/**
 * Texts of control tokens that end a turn in the chat formats of Llama-architecture models. A
 * GGUF file names one eos_token_id, and an instruct model's file often names the base model's
 * (Llama 3: <|end_of_text|>) while its chat template ends every turn with another
 * (<|eot_id|>): generation stops on these too, as llama.cpp does, when they are control tokens.
 */
const END_OF_TURN_TEXTS = new Set(['<|eot_id|>', '<|eom_id|>', '<|end_of_text|>', '<|im_end|>', '<|endoftext|>', '<|end|>', '</s>']);

/** The ids that end generation: eos, then eot/eom when given, then control tokens of END_OF_TURN_TEXTS. */
function endOfGeneration(g: GgufFile, eos: number | null, more: (number | null)[]): number[] {
  const ids = new Set<number>();
  if (eos !== null) ids.add(eos);
  for (const m of more) if (m !== null) ids.add(m);
  const tokens = g.meta.get('tokenizer.ggml.tokens');
  const types = g.meta.get('tokenizer.ggml.token_type');
  if (Array.isArray(tokens) && Array.isArray(types) && types.length === tokens.length) {
    for (let i = 0; i < tokens.length; i++) {
      if (types[i] === TOKEN_TYPE.CONTROL && typeof tokens[i] === 'string' && END_OF_TURN_TEXTS.has(tokens[i] as string)) ids.add(i);
    }
  }
  return [...ids];
}

/**
 * Llama 3 RoPE scaling: the divisors (config.ts ropeFreqFactors) a GGUF file stores as the
 * rope_freqs.weight tensor, checked to be positive and finite; undefined when it has none.
 */
async function readRopeFactors(g: GgufFile, headDim: number): Promise<number[] | undefined> {
  const t = g.tensors.get('rope_freqs.weight');
  if (!t) return undefined;
  if (t.type !== 'F32' || t.dims.length !== 1 || t.dims[0] !== headDim / 2) {
    throw new GgufError(`${g.file}: tensor "rope_freqs.weight" must be F32 with dims [${headDim / 2}], is ${t.type} [${t.dims}]`);
  }
  const b = await g.read(t.name);
  const f = Array.from(new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)));
  const bad = f.findIndex((v) => !(v > 0 && Number.isFinite(v)));
  if (bad >= 0) throw new GgufError(`${g.file}: tensor "rope_freqs.weight" value ${bad} must be a positive finite number, got ${f[bad]}`);
  return f;
}

/** The model configuration a GGUF file describes (llama architecture only). */
export function configFromGguf(g: GgufFile): ModelConfig {
  const arch = g.meta.get('general.architecture');
  if (arch !== 'llama') throw new GgufError(`${g.file}: general.architecture is ${JSON.stringify(arch)}; this engine computes the "llama" architecture`);
  const scaling = g.meta.get('llama.rope.scaling.type');
  if (scaling !== undefined && scaling !== 'none') throw new GgufError(`${g.file}: llama.rope.scaling.type ${JSON.stringify(scaling)} is not supported`);
  const dim = posInt(g, 'llama.embedding_length');
  const numLayers = posInt(g, 'llama.block_count');
  const hiddenDim = posInt(g, 'llama.feed_forward_length');
  const numHeads = posInt(g, 'llama.attention.head_count');
  const numKvHeads = posInt(g, 'llama.attention.head_count_kv', numHeads);
  if (numHeads % numKvHeads !== 0) throw new GgufError(`${g.file}: llama.attention.head_count (${numHeads}) must be a multiple of head_count_kv (${numKvHeads})`);
  const headDim = posInt(g, 'llama.attention.key_length', dim % numHeads === 0 ? dim / numHeads : undefined);
  if (headDim % 2 !== 0) throw new GgufError(`${g.file}: head dimension must be even for rotary embeddings, got ${headDim}`);
  const ropeDim = posInt(g, 'llama.rope.dimension_count', headDim);
  if (ropeDim !== headDim) throw new GgufError(`${g.file}: llama.rope.dimension_count (${ropeDim}) differs from the head dimension (${headDim}); partial rotary embeddings are not supported`);
  const vLen = posInt(g, 'llama.attention.value_length', headDim);
  if (vLen !== headDim) throw new GgufError(`${g.file}: llama.attention.value_length (${vLen}) differs from key_length (${headDim})`);
  const tokens = g.meta.get('tokenizer.ggml.tokens');
  const vocabSize = Array.isArray(tokens) ? tokens.length : posInt(g, 'llama.vocab_size');
  const normEps = shortestF32(num(g, 'llama.attention.layer_norm_rms_epsilon', 1e-5));
  const ropeTheta = shortestF32(num(g, 'llama.rope.freq_base', 10000));
  if (!(normEps > 0) || !(ropeTheta > 0)) throw new GgufError(`${g.file}: layer_norm_rms_epsilon and rope.freq_base must be positive`);
  const id = (key: string): number | null => {
    const v = g.meta.get(key);
    if (v === undefined) return null;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v >= vocabSize) throw new GgufError(`${g.file}: metadata "${key}" must be a token id in [0, ${vocabSize}), got ${String(v)}`);
    return v;
  };
  const bos = id('tokenizer.ggml.bos_token_id');
  const eos = id('tokenizer.ggml.eos_token_id');
  const eog = endOfGeneration(g, eos, [id('tokenizer.ggml.eot_token_id'), id('tokenizer.ggml.eom_token_id')]);
  return {
    vocabSize,
    dim,
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    hiddenDim,
    ropeTheta,
    normEps,
    maxPositionEmbeddings: posInt(g, 'llama.context_length', 2048),
    tieWordEmbeddings: !g.tensors.has('output.weight'),
    bosTokenId: bos,
    eosTokenIds: eog,
    eosTokenId: eos,
  };
}

/** The file's tensors under Hugging Face names: as f32 (decoded), or 2-D ones in their stored encoding. */
export function ggufWeights(g: GgufFile, cfg: ModelConfig): WeightSource {
  const tensor = (hf: string, shape: number[]) => {
    const name = ggufTensorName(hf);
    const t = name ? g.tensors.get(name) : undefined;
    if (!name || !t) throw new GgufError(`${g.file}: missing tensor "${name ?? hf}"`);
    const dims = [...shape].reverse();
    if (t.dims.length !== dims.length || t.dims.some((d, i) => d !== dims[i])) {
      throw new GgufError(`${g.file}: tensor "${name}" has dims [${t.dims}], expected [${dims}]`);
    }
    return t;
  };
  const qkHeads = (hf: string) => (/self_attn\.q_proj\.weight$/.test(hf) ? cfg.numHeads : /self_attn\.k_proj\.weight$/.test(hf) ? cfg.numKvHeads : 0);
  return {
    label: g.file,
    has: (hf) => {
      const n = ggufTensorName(hf);
      return n !== null && g.tensors.has(n);
    },
    get: async (hf, shape) => {
      const t = tensor(hf, shape);
      const count = shape.reduce((a, x) => a * x, 1);
      const bytes = await g.read(t.name);
      const conv = isRequantized(t.type) ? await wasmConverter() : null;
      let data: Float32Array;
      if (conv && isRequantized(t.type)) conv.decode(t.type, bytes, count, (data = new Float32Array(count)));
      else data = dequantize(t.type, bytes, count);
      const heads = qkHeads(hf);
      return heads ? unpermuteRopeRows(data, heads, cfg.headDim, shape[1]!) : data;
    },
    getEncoded: async (hf, shape) => {
      const t = tensor(hf, shape);
      if (t.type === 'F32' || shape.length !== 2) return null;
      const bytes = await g.read(t.name);
      const heads = qkHeads(hf);
      if (isRequantized(t.type) && !isHeldBlockType(t.type)) {
        // Decoded and re-quantized to Q8_0 (gguf_blocks.ts), in the WASM converter when it is
        // there (the same bytes, ≈ 8 × faster). Rows are whole blocks of 32, as every such
        // type's block is a multiple of 32 values, so the q/k rows can be reordered after.
        const count = shape[0]! * shape[1]!;
        const conv = await wasmConverter();
        let q8: Uint8Array;
        if (conv) q8 = conv.requantize(t.type, bytes, count);
        else {
          q8 = new Uint8Array(typeBytes('Q8_0', count));
          quantizeQ8_0(dequantize(t.type, bytes, count), q8);
        }
        return { type: 'Q8_0', bytes: heads ? unpermuteRopeRows(q8, heads, cfg.headDim, rowBytes('Q8_0', shape[1]!)) : q8 };
      }
      return { type: t.type, bytes: heads ? unpermuteRopeRows(bytes, heads, cfg.headDim, rowBytes(t.type, shape[1]!)) : bytes };
    },
  };
}

/** Checks that every tensor the model needs is present with the right dims, before reading any. */
function checkTensors(g: GgufFile, cfg: ModelConfig): void {
  const { dim, numHeads, numKvHeads, headDim, hiddenDim, vocabSize, numLayers } = cfg;
  const need: [string, number[]][] = [['token_embd.weight', [dim, vocabSize]], ['output_norm.weight', [dim]]];
  for (let l = 0; l < numLayers; l++) {
    const p = `blk.${l}.`;
    need.push(
      [`${p}attn_norm.weight`, [dim]],
      [`${p}attn_q.weight`, [dim, numHeads * headDim]],
      [`${p}attn_k.weight`, [dim, numKvHeads * headDim]],
      [`${p}attn_v.weight`, [dim, numKvHeads * headDim]],
      [`${p}attn_output.weight`, [numHeads * headDim, dim]],
      [`${p}ffn_norm.weight`, [dim]],
      [`${p}ffn_gate.weight`, [dim, hiddenDim]],
      [`${p}ffn_up.weight`, [dim, hiddenDim]],
      [`${p}ffn_down.weight`, [hiddenDim, dim]],
    );
  }
  if (g.tensors.has('output.weight')) need.push(['output.weight', [dim, vocabSize]]);
  for (const [name, dims] of need) {
    const t = g.tensors.get(name);
    if (!t) throw new GgufError(`${g.file}: missing tensor "${name}"`);
    if (t.dims.length !== dims.length || t.dims.some((d, i) => d !== dims[i])) throw new GgufError(`${g.file}: tensor "${name}" has dims [${t.dims}], expected [${dims}]`);
  }
  if (g.tensors.has('blk.0.attn_q.bias') || g.tensors.has('blk.0.attn_k.bias')) throw new GgufError(`${g.file}: attention biases are not supported`);
}

/** Model and tokenizer from a GGUF file; the model id defaults to the file name without ".gguf". */
export async function loadGguf(file: string, opts: LoadOptions = {}): Promise<{ model: LlamaModel; tokenizer: Tokenizer }> {
  const g = await GgufFile.open(file);
  let cfg = configFromGguf(g);
  checkTensors(g, cfg);
  const ropeFreqFactors = await readRopeFactors(g, cfg.headDim);
  if (ropeFreqFactors) cfg = { ...cfg, ropeFreqFactors };
  const tokenizer = tokenizerFromGguf(g);
  if (tokenizer.vocabSize > cfg.vocabSize) throw new GgufError(`${file}: tokenizer has ${tokenizer.vocabSize} tokens, the model ${cfg.vocabSize}`);
  const abs = resolve(file);
  const model = await LlamaModel.fromWeights(cfg, ggufWeights(g, cfg), abs, opts.modelId ?? basename(abs).replace(/\.gguf$/i, ''), opts);
  return { model, tokenizer };
}

/** The model of a GGUF file (benchmarks; the engine uses loadGguf for the tokenizer too). */
export async function loadGgufModel(file: string, opts: LoadOptions = {}): Promise<LlamaModel> {
  return (await loadGguf(file, opts)).model;
}
