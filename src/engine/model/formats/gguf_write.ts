// Converts a Hugging Face Llama checkpoint directory (config.json, *.safetensors, tokenizer.json)
// into one GGUF file, the way llama.cpp's own converter lays it out: llama.* hyper-parameters,
// the vocabulary ("llama" for SentencePiece-style tokenizers, "gpt2" for byte-level ones), the
// chat template, Llama 3's RoPE divisors as rope_freqs.weight, q/k projection rows permuted for llama.cpp's RoPE,
// 1-D tensors (norms) in F32 and 2-D weights in the chosen type. Tensors are written one at a
// time at their offsets, so a large checkpoint is never held in memory twice.
import { open, readFile, rename, rm } from 'node:fs/promises';
import { join } from 'node:path';
import { loadModelConfig, type ModelConfig } from '../config.js';
import {
  FILE_TYPE,
  GGML_TYPES,
  GGUF_DEFAULT_ALIGNMENT,
  GGUF_MAGIC,
  GGUF_VERSION,
  GV,
  TOKEN_TYPE,
  ggufTensorName,
  permuteRopeRows,
  quantizeQ4_0,
  quantizeQ8_0,
  TYPE_LAYOUT,
  typeBytes,
  type GgmlTypeName,
} from './gguf_format.js';
import { encodeBlocks } from './gguf_blocks.js';
import { f32ToBf16, f32ToF16 } from '../../../common/half.js';
import { SafetensorsCollection } from './safetensors.js';
import { PRE_TOKENIZERS } from './gguf_tokenizer.js';

export type MetaValue =
  | { type: GV.U32 | GV.I32 | GV.F32 | GV.U64; value: number }
  | { type: GV.BOOL; value: boolean }
  | { type: GV.STRING; value: string }
  | { type: GV.ARRAY; elem: GV.STRING; value: string[] }
  | { type: GV.ARRAY; elem: GV.F32 | GV.I32; value: ArrayLike<number> };

/** Little-endian byte builder for the header. */
class Bytes {
  private buf = Buffer.alloc(1 << 16);
  len = 0;
  private room(n: number): void {
    if (this.len + n <= this.buf.length) return;
    const b = Buffer.alloc(Math.max(this.buf.length * 2, this.len + n));
    this.buf.copy(b, 0, 0, this.len);
    this.buf = b;
  }
  u32(v: number): void {
    this.room(4);
    this.buf.writeUInt32LE(v >>> 0, this.len);
    this.len += 4;
  }
  i32(v: number): void {
    this.room(4);
    this.buf.writeInt32LE(v | 0, this.len);
    this.len += 4;
  }
  f32(v: number): void {
    this.room(4);
    this.buf.writeFloatLE(v, this.len);
    this.len += 4;
  }
  u64(v: number): void {
    this.room(8);
    this.buf.writeBigUInt64LE(BigInt(v), this.len);
    this.len += 8;
  }
  u8(v: number): void {
    this.room(1);
    this.buf[this.len++] = v;
  }
  str(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.room(b.length);
    b.copy(this.buf, this.len);
    this.len += b.length;
  }
  pad(align: number): void {
    const n = (align - (this.len % align)) % align;
    this.room(n);
    this.buf.fill(0, this.len, this.len + n);
    this.len += n;
  }
  bytes(): Buffer {
    return this.buf.subarray(0, this.len);
  }
}

function writeMeta(b: Bytes, key: string, v: MetaValue): void {
  b.str(key);
  b.u32(v.type);
  switch (v.type) {
    case GV.U32:
      b.u32(v.value);
      break;
    case GV.I32:
      b.i32(v.value);
      break;
    case GV.F32:
      b.f32(v.value);
      break;
    case GV.U64:
      b.u64(v.value);
      break;
    case GV.BOOL:
      b.u8(v.value ? 1 : 0);
      break;
    case GV.STRING:
      b.str(v.value);
      break;
    case GV.ARRAY:
      b.u32(v.elem);
      b.u64(v.value.length);
      if (v.elem === GV.STRING) for (const s of v.value as string[]) b.str(s);
      else if (v.elem === GV.F32) for (let i = 0; i < v.value.length; i++) b.f32((v.value as ArrayLike<number>)[i]!);
      else for (let i = 0; i < v.value.length; i++) b.i32((v.value as ArrayLike<number>)[i]!);
      break;
  }
}

export interface GgufTensorSource {
  /** GGUF name. */
  name: string;
  /** Hugging Face shape ([out][in] for 2-D). */
  shape: number[];
  type: GgmlTypeName;
  /** Produces the f32 values (row-major, Hugging Face order, already permuted if needed). */
  data: () => Promise<Float32Array>;
}

/** Encodes f32 values as `type` bytes. */
export function encodeTensor(type: GgmlTypeName, x: Float32Array): Uint8Array {
  const out = new Uint8Array(typeBytes(type, x.length));
  const dv = new DataView(out.buffer);
  switch (type) {
    case 'F32':
      out.set(new Uint8Array(x.buffer, x.byteOffset, x.byteLength));
      break;
    case 'F16':
      for (let i = 0; i < x.length; i++) dv.setUint16(i * 2, f32ToF16(x[i]!), true);
      break;
    case 'BF16':
      for (let i = 0; i < x.length; i++) dv.setUint16(i * 2, f32ToBf16(x[i]!), true);
      break;
    case 'Q8_0':
      quantizeQ8_0(x, out);
      break;
    case 'Q4_0':
      quantizeQ4_0(x, out);
      break;
    default:
      encodeBlocks(type, x, out);
  }
  return out;
}

/** Writes a GGUF file (atomically: temp file + rename). */
export async function writeGguf(file: string, meta: [string, MetaValue][], tensors: GgufTensorSource[]): Promise<void> {
  const align = GGUF_DEFAULT_ALIGNMENT;
  const h = new Bytes();
  h.u32(GGUF_MAGIC);
  h.u32(GGUF_VERSION);
  h.u64(tensors.length);
  h.u64(meta.length);
  for (const [k, v] of meta) writeMeta(h, k, v);
  const offsets: number[] = [];
  let off = 0;
  for (const t of tensors) {
    const count = t.shape.reduce((a, x) => a * x, 1);
    const innermost = t.shape[t.shape.length - 1]!;
    const block = TYPE_LAYOUT[t.type].block;
    if (innermost % block !== 0) throw new Error(`${t.name}: ${t.type} needs rows of a multiple of ${block} values, got ${innermost}`);
    h.str(t.name);
    h.u32(t.shape.length);
    for (let i = t.shape.length - 1; i >= 0; i--) h.u64(t.shape[i]!); // innermost first
    h.u32(GGML_TYPES[t.type]);
    h.u64(off);
    offsets.push(off);
    off += typeBytes(t.type, count);
    off += (align - (off % align)) % align;
  }
  h.pad(align);
  const dataStart = h.len;
  const tmp = `${file}.tmp-${process.pid}-${Date.now()}`;
  const fh = await open(tmp, 'w');
  try {
    await fh.write(h.bytes(), 0, h.len, 0);
    for (const [i, t] of tensors.entries()) {
      const bytes = encodeTensor(t.type, await t.data());
      await fh.write(bytes, 0, bytes.length, dataStart + offsets[i]!);
    }
    // Pad the file to the end of the last tensor's aligned slot.
    await fh.truncate(dataStart + off);
  } catch (e) {
    await fh.close();
    await rm(tmp, { force: true });
    throw e;
  }
  await fh.close();
  await rename(tmp, file);
}

interface TokenizerJson {
  model?: { type?: string; vocab?: Record<string, number>; merges?: (string | [string, string])[]; byte_fallback?: boolean; unk_token?: string; ignore_merges?: boolean };
  added_tokens?: { id: number; content: string; special?: boolean }[];
  pre_tokenizer?: unknown;
  decoder?: { type?: string } | null;
}

/** A GGUF vocabulary: "llama" (SentencePiece, with scores) or "gpt2" (byte-level, with merges and the pre-tokenizer's name). */
export type GgufVocab =
  | { kind: 'llama'; tokens: string[]; scores: Float32Array; types: Int32Array }
  | { kind: 'gpt2'; pre: string; tokens: string[]; types: Int32Array; merges: string[] };

type BpeModel = NonNullable<TokenizerJson['model']> & { vocab: Record<string, number>; merges: (string | [string, string])[] };

/** tokenizer.json's model, which must be a BPE with its vocabulary and merges (both GGUF kinds are). */
function bpeModel(tj: TokenizerJson): BpeModel {
  const m = tj.model;
  if (!m || m.type !== 'BPE' || !m.vocab || !Array.isArray(m.merges)) throw new Error('tokenizer.json: only BPE vocabularies (model.type "BPE" with vocab and merges) convert to GGUF');
  return m as BpeModel;
}

/** Tokens by id from tokenizer.json's vocabulary and added tokens; ids without one stay ''. */
function tokensById(tj: TokenizerJson, vocabSize: number): string[] {
  const tokens: string[] = new Array<string>(vocabSize).fill('');
  for (const [t, id] of Object.entries(bpeModel(tj).vocab)) if (id >= 0 && id < vocabSize) tokens[id] = t;
  for (const a of tj.added_tokens ?? []) if (a.id >= 0 && a.id < vocabSize) tokens[a.id] = a.content;
  return tokens;
}

const mergePair = (mg: string | [string, string]): [string, string] => (typeof mg === 'string' ? (mg.split(' ') as [string, string]) : mg);

/**
 * The "llama" GGUF vocabulary from a SentencePiece-style BPE tokenizer.json: tokens by id, a
 * score per token (llama.cpp merges the adjacent pair whose concatenation scores highest, so the
 * score of the token a merge produces is minus that merge's rank: the same merge order as the
 * BPE merges list) and a type (control for special added tokens, byte for <0xNN>).
 */
export function llamaVocabFromTokenizerJson(tj: TokenizerJson, vocabSize: number): { tokens: string[]; scores: Float32Array; types: Int32Array } {
  const m = bpeModel(tj);
  const tokens = tokensById(tj, vocabSize);
  const rank = new Map<string, number>();
  m.merges.forEach((mg, r) => {
    const [a, b] = mergePair(mg);
    const t = a + b;
    if (!rank.has(t)) rank.set(t, r);
  });
  const special = new Set((tj.added_tokens ?? []).filter((a) => a.special).map((a) => a.id));
  const scores = new Float32Array(vocabSize);
  const types = new Int32Array(vocabSize);
  for (let id = 0; id < vocabSize; id++) {
    const t = tokens[id]!;
    if (t === '') {
      tokens[id] = `[PAD${id}]`;
      types[id] = TOKEN_TYPE.UNUSED;
    } else if (t === m.unk_token) types[id] = TOKEN_TYPE.UNKNOWN;
    else if (special.has(id)) types[id] = TOKEN_TYPE.CONTROL;
    else if (/^<0x[0-9A-F]{2}>$/.test(t)) types[id] = TOKEN_TYPE.BYTE;
    else {
      types[id] = TOKEN_TYPE.NORMAL;
      scores[id] = -(rank.get(t) ?? 0);
    }
  }
  return { tokens, scores, types };
}

/**
 * A pre-tokenizer reduced to what decides the split (tokenizer.json spells the same one with
 * varying extra fields): Split's pattern and behaviour, ByteLevel's prefix space and own regex,
 * Digits' grouping, in order.
 */
function preSignature(p: unknown): string {
  if (p === null || p === undefined) return 'none';
  const o = p as Record<string, unknown>;
  switch (o.type) {
    case 'Sequence':
      return Array.isArray(o.pretokenizers) ? o.pretokenizers.map(preSignature).join(' + ') : 'invalid';
    case 'Split':
      return `split(${JSON.stringify((o.pattern as Record<string, unknown> | undefined)?.Regex ?? (o.pattern as Record<string, unknown> | undefined)?.String)}, ${String(o.behavior)}, ${String(o.invert ?? false)})`;
    case 'ByteLevel':
      return `bytelevel(${String(o.add_prefix_space ?? true)}, ${String(o.use_regex ?? true)})`;
    case 'Digits':
      return `digits(${String(o.individual_digits ?? false)})`;
    default:
      return `${String(o.type)}(?)`;
  }
}

/** Whether tokenizer.json describes a byte-level (GPT-2 style) BPE, which GGUF calls "gpt2". */
export function isByteLevel(tj: TokenizerJson): boolean {
  return tj.decoder?.type === 'ByteLevel';
}

/**
 * The "gpt2" GGUF vocabulary from a byte-level BPE tokenizer.json: tokens by id (ids without a
 * piece become "[PADn]", unused), types (control for special added tokens, user-defined for the
 * other added ones), the merges as "a b" strings, and tokenizer.ggml.pre: the name of the
 * pre-tokenizer (gguf_tokenizer.ts PRE_TOKENIZERS) whose split is this file's. A split this
 * engine has no name for is an error: llama.cpp would split words by another rule.
 */
export function gpt2VocabFromTokenizerJson(tj: TokenizerJson, vocabSize: number): { pre: string; tokens: string[]; types: Int32Array; merges: string[] } {
  const m = bpeModel(tj);
  const sig = preSignature(tj.pre_tokenizer);
  const pre = Object.entries(PRE_TOKENIZERS).find(([, p]) => preSignature(p.json) === sig && p.ignoreMerges === (m.ignore_merges === true));
  if (!pre) throw new Error(`tokenizer.json: byte-level pre-tokenizer ${sig} (ignore_merges ${m.ignore_merges === true}) is none of the ones GGUF names here (${Object.keys(PRE_TOKENIZERS).join(', ')})`);
  const tokens = tokensById(tj, vocabSize);
  const added = new Map((tj.added_tokens ?? []).map((a) => [a.id, a.special === true]));
  const types = new Int32Array(vocabSize);
  for (let id = 0; id < vocabSize; id++) {
    if (tokens[id] === '') {
      tokens[id] = `[PAD${id}]`;
      types[id] = TOKEN_TYPE.UNUSED;
    } else {
      const special = added.get(id);
      types[id] = special === undefined ? TOKEN_TYPE.NORMAL : special ? TOKEN_TYPE.CONTROL : TOKEN_TYPE.USER_DEFINED;
    }
  }
  const merges = m.merges.map((mg) => mergePair(mg).join(' '));
  return { pre: pre[0], tokens, types, merges };
}

/** The GGUF vocabulary of a tokenizer.json: byte-level ones as "gpt2", SentencePiece-style ones as "llama". */
export function vocabFromTokenizerJson(tj: TokenizerJson, vocabSize: number): GgufVocab {
  return isByteLevel(tj) ? { kind: 'gpt2', ...gpt2VocabFromTokenizerJson(tj, vocabSize) } : { kind: 'llama', ...llamaVocabFromTokenizerJson(tj, vocabSize) };
}

/** The tokenizer's GGUF metadata: its kind's arrays, the special ids, BOS, and the chat template when there is one. */
function vocabMeta(cfg: ModelConfig, vocab: GgufVocab, addBos: boolean, chatTemplate: string | null): [string, MetaValue][] {
  const meta: [string, MetaValue][] = [
    ['tokenizer.ggml.model', { type: GV.STRING, value: vocab.kind }],
    ...(vocab.kind === 'gpt2' ? ([['tokenizer.ggml.pre', { type: GV.STRING, value: vocab.pre }]] as [string, MetaValue][]) : []),
    ['tokenizer.ggml.tokens', { type: GV.ARRAY, elem: GV.STRING, value: vocab.tokens }],
  ];
  if (vocab.kind === 'llama') meta.push(['tokenizer.ggml.scores', { type: GV.ARRAY, elem: GV.F32, value: vocab.scores }]);
  meta.push(['tokenizer.ggml.token_type', { type: GV.ARRAY, elem: GV.I32, value: vocab.types }]);
  if (vocab.kind === 'gpt2') meta.push(['tokenizer.ggml.merges', { type: GV.ARRAY, elem: GV.STRING, value: vocab.merges }]);
  meta.push(['tokenizer.ggml.add_bos_token', { type: GV.BOOL, value: addBos }], ['tokenizer.ggml.add_eos_token', { type: GV.BOOL, value: false }]);
  if (cfg.bosTokenId !== null) meta.push(['tokenizer.ggml.bos_token_id', { type: GV.U32, value: cfg.bosTokenId }]);
  if (cfg.eosTokenId !== null) meta.push(['tokenizer.ggml.eos_token_id', { type: GV.U32, value: cfg.eosTokenId }]);
  const unk = vocab.types.indexOf(TOKEN_TYPE.UNKNOWN);
  if (unk >= 0) meta.push(['tokenizer.ggml.unknown_token_id', { type: GV.U32, value: unk }]);
  if (chatTemplate !== null) meta.push(['tokenizer.chat_template', { type: GV.STRING, value: chatTemplate }]);
  return meta;
}

/** The GGUF metadata of a Llama model. */
export function llamaMeta(cfg: ModelConfig, name: string, fileType: GgmlTypeName, vocab: GgufVocab, addBos: boolean, chatTemplate: string | null = null): [string, MetaValue][] {
  return [
    ['general.architecture', { type: GV.STRING, value: 'llama' }],
    ['general.name', { type: GV.STRING, value: name }],
    ['general.file_type', { type: GV.U32, value: FILE_TYPE[fileType] }],
    ['llama.context_length', { type: GV.U32, value: cfg.maxPositionEmbeddings }],
    ['llama.embedding_length', { type: GV.U32, value: cfg.dim }],
    ['llama.block_count', { type: GV.U32, value: cfg.numLayers }],
    ['llama.feed_forward_length', { type: GV.U32, value: cfg.hiddenDim }],
    ['llama.rope.dimension_count', { type: GV.U32, value: cfg.headDim }],
    ['llama.attention.head_count', { type: GV.U32, value: cfg.numHeads }],
    ['llama.attention.head_count_kv', { type: GV.U32, value: cfg.numKvHeads }],
    ['llama.attention.key_length', { type: GV.U32, value: cfg.headDim }],
    ['llama.attention.value_length', { type: GV.U32, value: cfg.headDim }],
    ['llama.attention.layer_norm_rms_epsilon', { type: GV.F32, value: cfg.normEps }],
    ['llama.rope.freq_base', { type: GV.F32, value: cfg.ropeTheta }],
    ['llama.vocab_size', { type: GV.U32, value: cfg.vocabSize }],
    ...vocabMeta(cfg, vocab, addBos, chatTemplate),
  ];
}

/**
 * Converts the checkpoint in `dir` to `file`. `type` is the type of the 2-D weights (norms stay
 * F32), `opts.typeOf` may name another for some of them by GGUF name (mixes such as llama.cpp's
 * Q4_K_M: Q6_K for the output head and some attn_v / ffn_down). The output head is written even
 * when tied, so llama.cpp needs no tying logic.
 */
export async function convertToGguf(dir: string, file: string, type: GgmlTypeName = 'F32', opts: { name?: string; typeOf?: (ggufName: string) => GgmlTypeName | undefined } = {}): Promise<void> {
  const cfg = await loadModelConfig(dir);
  const st = await SafetensorsCollection.openDir(dir);
  const tj = JSON.parse(await readFile(join(dir, 'tokenizer.json'), 'utf8')) as TokenizerJson;
  let addBos = cfg.bosTokenId !== null;
  let chatTemplate: string | null = null;
  try {
    const tc = JSON.parse(await readFile(join(dir, 'tokenizer_config.json'), 'utf8')) as { add_bos_token?: boolean; chat_template?: unknown };
    if (typeof tc.add_bos_token === 'boolean') addBos = tc.add_bos_token;
    if (typeof tc.chat_template === 'string') chatTemplate = tc.chat_template;
  } catch {
    // no tokenizer_config.json: BOS when the model has one, no chat template
  }
  const vocab = vocabFromTokenizerJson(tj, cfg.vocabSize);
  const { dim, numHeads, numKvHeads, headDim, hiddenDim, vocabSize, numLayers } = cfg;
  const tensors: GgufTensorSource[] = [];
  const add = (hf: string, shape: number[], permuteHeads = 0) => {
    const name = ggufTensorName(hf);
    if (!name) throw new Error(`no GGUF name for tensor "${hf}"`);
    tensors.push({
      name,
      shape,
      type: shape.length === 1 ? 'F32' : (opts.typeOf?.(name) ?? type),
      data: async () => {
        const d = (await st.get(hf, shape)).data;
        return permuteHeads ? permuteRopeRows(d, permuteHeads, headDim, shape[1]!) : d;
      },
    });
  };
  // Llama 3 RoPE scaling travels as llama.cpp's converter writes it: the divisors as a tensor.
  const factors = cfg.ropeFreqFactors;
  if (factors) tensors.push({ name: 'rope_freqs.weight', shape: [factors.length], type: 'F32', data: async () => Float32Array.from(factors) });
  add('model.embed_tokens.weight', [vocabSize, dim]);
  for (let l = 0; l < numLayers; l++) {
    const p = `model.layers.${l}.`;
    add(`${p}input_layernorm.weight`, [dim]);
    add(`${p}self_attn.q_proj.weight`, [numHeads * headDim, dim], numHeads);
    add(`${p}self_attn.k_proj.weight`, [numKvHeads * headDim, dim], numKvHeads);
    add(`${p}self_attn.v_proj.weight`, [numKvHeads * headDim, dim]);
    add(`${p}self_attn.o_proj.weight`, [dim, numHeads * headDim]);
    add(`${p}post_attention_layernorm.weight`, [dim]);
    add(`${p}mlp.gate_proj.weight`, [hiddenDim, dim]);
    add(`${p}mlp.up_proj.weight`, [hiddenDim, dim]);
    add(`${p}mlp.down_proj.weight`, [dim, hiddenDim]);
  }
  add('model.norm.weight', [dim]);
  if (st.has('lm_head.weight') && !cfg.tieWordEmbeddings) add('lm_head.weight', [vocabSize, dim]);
  else tensors.push({ name: 'output.weight', shape: [vocabSize, dim], type: opts.typeOf?.('output.weight') ?? type, data: async () => (await st.get('model.embed_tokens.weight', [vocabSize, dim])).data });
  await writeGguf(file, llamaMeta(cfg, opts.name ?? 'kvc-converted', type, vocab, addBos, chatTemplate), tensors);
}
