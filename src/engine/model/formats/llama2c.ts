// llama2.c checkpoints (model.bin) and tokenizers (tokenizer.bin) converted into one GGUF file.
//
// model.bin: a header of 7 little-endian int32 — dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size (negative: the output head is stored after the other weights; positive: it is the
// token embedding), seq_len — then f32 weights in this order, each [out][in] row-major:
// token embedding [vocab][dim], attention RMS norms [L][dim], wq [L][H·hd][dim], wk [L][KV·hd][dim],
// wv [L][KV·hd][dim], wo [L][dim][H·hd], FFN RMS norms [L][dim], w1 (gate) [L][hidden][dim],
// w2 (down) [L][dim][hidden], w3 (up) [L][hidden][dim], the final norm [dim], two unused RoPE
// tables [seq_len][hd/2] (cos, sin), and the head [vocab][dim] when not shared. Its RoPE rotates
// adjacent pairs (2i, 2i+1) of each head, which is the order GGUF's llama tensors keep (a Hugging
// Face checkpoint's q/k rows are permuted into it on conversion; these need no permutation).
// RMS norm epsilon 1e-5, RoPE base 10000 (fixed in llama2.c).
//
// tokenizer.bin: int32 max_token_length, then per token an f32 score, an int32 byte length and
// the bytes: SentencePiece's pieces with "▁" written as a space, BOS (1) and EOS (2) written as
// "\n<s>\n" and "\n</s>\n", and the byte-fallback pieces 3..258 as "<0xNN>" (newer exports) or as
// the byte's character itself (older ones). GGUF's "llama" vocabulary wants the pieces back as
// SentencePiece spells them, so "▁" is restored, and the types: unknown, control, byte, normal.
import { TOKEN_TYPE } from './gguf_format.js';
import { llamaMeta, writeGguf, type GgufTensorSource } from './gguf_write.js';
import type { ModelConfig } from '../config.js';

export class Llama2cError extends Error {
  override name = 'Llama2cError';
}

const HEADER_FIELDS = ['dim', 'hidden_dim', 'n_layers', 'n_heads', 'n_kv_heads', 'vocab_size', 'seq_len'] as const;
const HEADER_BYTES = 4 * HEADER_FIELDS.length;

/** The hyper-parameters of a llama2.c checkpoint and where each weight lies in it. */
export interface Llama2cCheckpoint {
  dim: number;
  hiddenDim: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  vocabSize: number;
  seqLen: number;
  /** Whether the output head is the token embedding (vocab_size positive in the header). */
  sharedHead: boolean;
  /** f32 views into the file, in llama2.c's order. */
  weights: Llama2cWeights;
}

export interface Llama2cWeights {
  embed: Float32Array;
  attnNorm: Float32Array;
  wq: Float32Array;
  wk: Float32Array;
  wv: Float32Array;
  wo: Float32Array;
  ffnNorm: Float32Array;
  w1: Float32Array;
  w2: Float32Array;
  w3: Float32Array;
  finalNorm: Float32Array;
  head: Float32Array;
}

/** Parses and checks a llama2.c model.bin (the header against the file's exact size). */
export function parseLlama2cCheckpoint(bytes: Uint8Array, label = 'model.bin'): Llama2cCheckpoint {
  if (bytes.byteLength < HEADER_BYTES) throw new Llama2cError(`${label}: ${bytes.byteLength} bytes, shorter than the ${HEADER_BYTES}-byte llama2.c header`);
  const dv = new DataView(bytes.buffer, bytes.byteOffset, HEADER_BYTES);
  const h = HEADER_FIELDS.map((_, i) => dv.getInt32(4 * i, true));
  const [dim, hiddenDim, numLayers, numHeads, numKvHeads, rawVocab, seqLen] = h as [number, number, number, number, number, number, number];
  for (const [i, v] of [dim, hiddenDim, numLayers, numHeads, numKvHeads, seqLen].entries()) {
    const name = HEADER_FIELDS[i < 5 ? i : 6];
    if (!(v > 0 && v <= 1 << 20)) throw new Llama2cError(`${label}: header field ${name} must be a positive integer of at most ${1 << 20}, got ${v}`);
  }
  const vocabSize = Math.abs(rawVocab);
  if (!(vocabSize > 0 && vocabSize <= 1 << 20)) throw new Llama2cError(`${label}: header field vocab_size must be a non-zero integer of magnitude at most ${1 << 20}, got ${rawVocab}`);
  if (dim % numHeads !== 0) throw new Llama2cError(`${label}: dim (${dim}) must be a multiple of n_heads (${numHeads})`);
  if (numHeads % numKvHeads !== 0) throw new Llama2cError(`${label}: n_heads (${numHeads}) must be a multiple of n_kv_heads (${numKvHeads})`);
  const headDim = dim / numHeads;
  if (headDim % 2 !== 0) throw new Llama2cError(`${label}: head size dim / n_heads (${headDim}) must be even for rotary embeddings`);
  const kvDim = numKvHeads * headDim;
  const sharedHead = rawVocab > 0;
  const L = numLayers;
  const sizes: [keyof Llama2cWeights | 'ropeTables', number][] = [
    ['embed', vocabSize * dim],
    ['attnNorm', L * dim],
    ['wq', L * dim * dim],
    ['wk', L * kvDim * dim],
    ['wv', L * kvDim * dim],
    ['wo', L * dim * dim],
    ['ffnNorm', L * dim],
    ['w1', L * hiddenDim * dim],
    ['w2', L * dim * hiddenDim],
    ['w3', L * hiddenDim * dim],
    ['finalNorm', dim],
    ['ropeTables', seqLen * headDim],
  ];
  if (!sharedHead) sizes.push(['head', vocabSize * dim]);
  const floats = sizes.reduce((a, [, n]) => a + n, 0);
  const expected = HEADER_BYTES + 4 * floats;
  if (bytes.byteLength !== expected) {
    throw new Llama2cError(
      `${label}: ${bytes.byteLength} bytes, but its header (${HEADER_FIELDS.map((f, i) => `${f} ${h[i]}`).join(', ')}) describes ${expected} bytes of llama2.c checkpoint`,
    );
  }
  // One aligned copy of the weights (the file's are at offset 28, and a slice of a larger buffer may be anywhere).
  const all = new Float32Array(floats);
  new Uint8Array(all.buffer).set(bytes.subarray(HEADER_BYTES));
  const w: Partial<Llama2cWeights> = {};
  let off = 0;
  for (const [name, n] of sizes) {
    if (name !== 'ropeTables') w[name] = all.subarray(off, off + n);
    off += n;
  }
  if (sharedHead) w.head = w.embed;
  const weights = w as Llama2cWeights;
  for (const [name, x] of Object.entries(weights)) {
    for (let i = 0; i < x.length; i++) if (!Number.isFinite(x[i]!)) throw new Llama2cError(`${label}: weight ${name}[${i}] is ${x[i]}, not a finite number`);
  }
  return { dim, hiddenDim, numLayers, numHeads, numKvHeads, headDim, vocabSize, seqLen, sharedHead, weights };
}

/** A "llama" GGUF vocabulary: SentencePiece pieces, their scores and token types. */
export interface Llama2cVocab {
  tokens: string[];
  scores: Float32Array;
  types: Int32Array;
}

/** The ids llama2.c's tokenizer fixes: <unk> 0, BOS 1, EOS 2, then the 256 byte-fallback pieces. */
export const LLAMA2C_UNK = 0;
export const LLAMA2C_BOS = 1;
export const LLAMA2C_EOS = 2;
const FIRST_BYTE = 3;

/** Parses a llama2.c tokenizer.bin of `vocabSize` tokens into GGUF's "llama" vocabulary. */
export function parseLlama2cTokenizer(bytes: Uint8Array, vocabSize: number, label = 'tokenizer.bin'): Llama2cVocab {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const need = (off: number, n: number, what: string) => {
    if (off + n > bytes.byteLength) throw new Llama2cError(`${label}: ends at byte ${bytes.byteLength} inside ${what} (a llama2.c tokenizer of ${vocabSize} tokens, as the checkpoint's vocab_size says)`);
  };
  need(0, 4, 'the max_token_length header');
  const maxLen = dv.getInt32(0, true);
  if (!(maxLen > 0 && maxLen <= 1 << 16)) throw new Llama2cError(`${label}: max_token_length must be a positive integer of at most 65536, got ${maxLen}`);
  if (vocabSize < FIRST_BYTE + 256) throw new Llama2cError(`${label}: a vocabulary of ${vocabSize} tokens has no room for <unk>, BOS, EOS and the 256 byte pieces llama2.c's tokenizer places at ids 0..258`);
  const utf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });
  const tokens: string[] = [];
  const scores = new Float32Array(vocabSize);
  const types = new Int32Array(vocabSize);
  let off = 4;
  for (let id = 0; id < vocabSize; id++) {
    need(off, 8, `token ${id}'s score and length`);
    const score = dv.getFloat32(off, true);
    const len = dv.getInt32(off + 4, true);
    off += 8;
    if (!Number.isFinite(score)) throw new Llama2cError(`${label}: token ${id}'s score is ${score}, not a finite number`);
    if (len < 0 || len > maxLen) throw new Llama2cError(`${label}: token ${id}'s length is ${len}, expected 0..${maxLen} (max_token_length)`);
    need(off, len, `token ${id}'s ${len} bytes`);
    let text: string;
    try {
      text = utf8.decode(bytes.subarray(off, off + len));
    } catch {
      throw new Llama2cError(`${label}: token ${id}'s bytes are not UTF-8`);
    }
    off += len;
    scores[id] = score;
    if (id === LLAMA2C_UNK) {
      tokens.push('<unk>');
      types[id] = TOKEN_TYPE.UNKNOWN;
    } else if (id === LLAMA2C_BOS || id === LLAMA2C_EOS) {
      tokens.push(id === LLAMA2C_BOS ? '<s>' : '</s>');
      types[id] = TOKEN_TYPE.CONTROL;
    } else if (id < FIRST_BYTE + 256) {
      const b = id - FIRST_BYTE;
      const hex = `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`;
      if (text !== hex && text !== String.fromCharCode(b)) throw new Llama2cError(`${label}: token ${id} must be the byte piece ${hex} (or its character), got ${JSON.stringify(text)}`);
      tokens.push(hex);
      types[id] = TOKEN_TYPE.BYTE;
    } else {
      if (text === '') throw new Llama2cError(`${label}: token ${id} is empty`);
      tokens.push(text.replaceAll(' ', '\u2581'));
      types[id] = TOKEN_TYPE.NORMAL;
    }
  }
  if (off !== bytes.byteLength) throw new Llama2cError(`${label}: ${bytes.byteLength - off} bytes follow the ${vocabSize} tokens the checkpoint's vocab_size says it has`);
  return { tokens, scores, types };
}

/** The engine's model configuration of a llama2.c checkpoint (its fixed epsilon and RoPE base). */
export function llama2cConfig(c: Llama2cCheckpoint): ModelConfig {
  return {
    vocabSize: c.vocabSize,
    dim: c.dim,
    numLayers: c.numLayers,
    numHeads: c.numHeads,
    numKvHeads: c.numKvHeads,
    headDim: c.headDim,
    hiddenDim: c.hiddenDim,
    ropeTheta: 10000,
    normEps: 1e-5,
    maxPositionEmbeddings: c.seqLen,
    tieWordEmbeddings: c.sharedHead,
    bosTokenId: LLAMA2C_BOS,
    eosTokenIds: [LLAMA2C_EOS],
    eosTokenId: LLAMA2C_EOS,
  };
}

/**
 * Writes a llama2.c checkpoint and its tokenizer as one GGUF file (F32 weights, llama
 * architecture, "llama" vocabulary, BOS added): loadable by this engine and by llama.cpp.
 */
export async function convertLlama2cToGguf(model: Uint8Array, tokenizer: Uint8Array, file: string, name: string): Promise<ModelConfig> {
  const c = parseLlama2cCheckpoint(model);
  const vocab = parseLlama2cTokenizer(tokenizer, c.vocabSize);
  const cfg = llama2cConfig(c);
  const { dim, hiddenDim, numLayers: L, headDim } = c;
  const qDim = c.numHeads * headDim;
  const kvDim = c.numKvHeads * headDim;
  const w = c.weights;
  const tensors: GgufTensorSource[] = [];
  const add = (ggufName: string, shape: number[], x: Float32Array) => tensors.push({ name: ggufName, shape, type: 'F32', data: async () => x });
  const layer = (x: Float32Array, l: number, n: number) => x.subarray(l * n, (l + 1) * n);
  add('token_embd.weight', [c.vocabSize, dim], w.embed);
  for (let l = 0; l < L; l++) {
    add(`blk.${l}.attn_norm.weight`, [dim], layer(w.attnNorm, l, dim));
    add(`blk.${l}.attn_q.weight`, [qDim, dim], layer(w.wq, l, qDim * dim));
    add(`blk.${l}.attn_k.weight`, [kvDim, dim], layer(w.wk, l, kvDim * dim));
    add(`blk.${l}.attn_v.weight`, [kvDim, dim], layer(w.wv, l, kvDim * dim));
    add(`blk.${l}.attn_output.weight`, [dim, qDim], layer(w.wo, l, dim * qDim));
    add(`blk.${l}.ffn_norm.weight`, [dim], layer(w.ffnNorm, l, dim));
    add(`blk.${l}.ffn_gate.weight`, [hiddenDim, dim], layer(w.w1, l, hiddenDim * dim));
    add(`blk.${l}.ffn_up.weight`, [hiddenDim, dim], layer(w.w3, l, hiddenDim * dim));
    add(`blk.${l}.ffn_down.weight`, [dim, hiddenDim], layer(w.w2, l, dim * hiddenDim));
  }
  add('output_norm.weight', [dim], w.finalNorm);
  // Written even when shared, so llama.cpp needs no tying logic (as convertToGguf does).
  add('output.weight', [c.vocabSize, dim], w.head);
  await writeGguf(file, llamaMeta(cfg, name, 'F32', { kind: 'llama', ...vocab }, true), tensors);
  return cfg;
}
