// The tokenizer of a GGUF file, from its metadata, rebuilt as the Hugging Face tokenizer.json it
// corresponds to, so it runs through the same tokenizer code as a checkpoint directory. Two
// vocabulary kinds (tokenizer.ggml.model):
//   "llama": SentencePiece BPE — tokenizer.ggml.tokens / scores / token_type; byte fallback, "▁"
//     for spaces, BPE merges ordered by the score of the piece they produce, as the Hugging Face
//     SentencePiece converter orders them (Llama 1/2, Mistral 7B, TinyLlama...).
//   "gpt2": byte-level BPE — tokens, token_type and tokenizer.ggml.merges, split into words first
//     by the pre-tokenizer tokenizer.ggml.pre names (Llama 3.x, SmolLM...). PRE_TOKENIZERS lists
//     the names this engine knows; any other is an error at load, never a silently different split.
import type { GgufFile, GgufValue } from './gguf_read.js';
import { GgufError } from './gguf_read.js';
import { TOKEN_TYPE } from './gguf_format.js';
import { Tokenizer } from '../tokenizer.js';

function arr(g: GgufFile, key: string): GgufValue[] {
  const v = g.meta.get(key);
  if (!Array.isArray(v)) throw new GgufError(`${g.file}: metadata "${key}" is missing or not an array`);
  return v;
}

function optId(g: GgufFile, key: string, n: number): number | null {
  const v = g.meta.get(key);
  if (v === undefined) return null;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v >= n) throw new GgufError(`${g.file}: metadata "${key}" must be a token id in [0, ${n}), got ${String(v)}`);
  return v;
}

/** Llama 3's word split (its tokenizer.json's Split pattern; oniguruma syntax, as the library reads it). */
export const LLAMA3_SPLIT = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/** GPT-2's byte-to-character mapping applied after the word split (use_regex: GPT-2's own split first). */
const byteLevel = (useRegex: boolean) => ({ type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: useRegex });

interface PreTokenizer {
  /** The tokenizer.json pre_tokenizer. */
  json: Record<string, unknown>;
  /** A word that is itself a vocabulary piece is that piece, without merging (Llama 3). */
  ignoreMerges: boolean;
  /** BOS when the file has no tokenizer.ggml.add_bos_token (llama.cpp's default for this name). */
  addBos: boolean;
}

const LLAMA3_PRE: PreTokenizer = {
  json: { type: 'Sequence', pretokenizers: [{ type: 'Split', pattern: { Regex: LLAMA3_SPLIT }, behavior: 'Isolated', invert: false }, byteLevel(false)] },
  ignoreMerges: true,
  addBos: true,
};

/**
 * tokenizer.ggml.pre values this engine splits words for, by the tokenizer.json pre-tokenizer
 * each stands for (the names llama.cpp's converter writes for these tokenizers).
 */
export const PRE_TOKENIZERS: Record<string, PreTokenizer> = {
  'llama-bpe': LLAMA3_PRE,
  llama3: LLAMA3_PRE,
  'llama-v3': LLAMA3_PRE,
  'gpt-2': { json: byteLevel(true), ignoreMerges: false, addBos: false },
  smollm: { json: { type: 'Sequence', pretokenizers: [{ type: 'Digits', individual_digits: true }, byteLevel(true)] }, ignoreMerges: false, addBos: false },
};

/** Token texts, types and the special ids shared by both vocabulary kinds. */
function vocabulary(g: GgufFile): { toks: string[]; types: number[]; bos: number | null; eos: number | null } {
  const tokens = arr(g, 'tokenizer.ggml.tokens');
  const n = tokens.length;
  if (n === 0 || !tokens.every((t) => typeof t === 'string')) throw new GgufError(`${g.file}: tokenizer.ggml.tokens must be a non-empty array of strings`);
  const typesV = g.meta.has('tokenizer.ggml.token_type') ? arr(g, 'tokenizer.ggml.token_type') : new Array<number>(n).fill(TOKEN_TYPE.NORMAL);
  if (typesV.length !== n) throw new GgufError(`${g.file}: tokenizer.ggml.token_type must have one entry per token (${n}), has ${typesV.length}`);
  const types = typesV.map((v) => (typeof v === 'number' ? v : TOKEN_TYPE.NORMAL));
  return { toks: tokens as string[], types, bos: optId(g, 'tokenizer.ggml.bos_token_id', n), eos: optId(g, 'tokenizer.ggml.eos_token_id', n) };
}

function tokenizerConfig(g: GgufFile, toks: string[], bos: number | null, eos: number | null, addBosDefault: boolean): Record<string, unknown> {
  const addBos = g.meta.get('tokenizer.ggml.add_bos_token');
  const tpl = g.meta.get('tokenizer.chat_template');
  return {
    bos_token: bos !== null ? toks[bos] : null,
    eos_token: eos !== null ? toks[eos] : null,
    add_bos_token: typeof addBos === 'boolean' ? addBos : addBosDefault,
    ...(typeof tpl === 'string' ? { chat_template: tpl } : {}),
  };
}

/**
 * Piece → first id, in an object without a prototype: pieces such as "valueOf", "constructor"
 * or "__proto__" are vocabulary entries like any other (an ordinary object would answer `in`
 * for the first two and take the third as its prototype).
 */
function pieceIds(toks: string[]): Record<string, number> {
  const vocab = Object.create(null) as Record<string, number>;
  for (let i = 0; i < toks.length; i++) if (vocab[toks[i]!] === undefined) vocab[toks[i]!] = i;
  return vocab;
}

const addedToken = (id: number, content: string, special: boolean) => ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special });

function sentencePieceJson(g: GgufFile): { tj: Record<string, unknown>; cfg: Record<string, unknown> } {
  const { toks, types, bos, eos } = vocabulary(g);
  const n = toks.length;
  const scoresV = g.meta.has('tokenizer.ggml.scores') ? arr(g, 'tokenizer.ggml.scores') : new Array<number>(n).fill(0);
  if (scoresV.length !== n) throw new GgufError(`${g.file}: tokenizer.ggml.scores must have one entry per token (${n}), has ${scoresV.length}`);
  const scores = scoresV.map((v) => (typeof v === 'number' ? v : 0));
  const vocab = pieceIds(toks);

  // Merges: every split of a normal piece into two pieces of the vocabulary, highest score first.
  const merges: { a: string; b: string; s: number; ia: number; ib: number }[] = [];
  for (let i = 0; i < n; i++) {
    if (types[i] !== TOKEN_TYPE.NORMAL && types[i] !== TOKEN_TYPE.USER_DEFINED) continue;
    const cps = Array.from(toks[i]!);
    for (let c = 1; c < cps.length; c++) {
      const a = cps.slice(0, c).join('');
      const b = cps.slice(c).join('');
      const ia = vocab[a];
      const ib = vocab[b];
      if (ia !== undefined && ib !== undefined) merges.push({ a, b, s: scores[i]!, ia, ib });
    }
  }
  merges.sort((x, y) => y.s - x.s || x.ia - y.ia || x.ib - y.ib);

  const unkId = types.indexOf(TOKEN_TYPE.UNKNOWN);
  const added = [];
  for (let i = 0; i < n; i++) {
    if (types[i] === TOKEN_TYPE.CONTROL || types[i] === TOKEN_TYPE.UNKNOWN || i === bos || i === eos) added.push(addedToken(i, toks[i]!, true));
  }
  const tj: Record<string, unknown> = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] },
    pre_tokenizer: null,
    post_processor: null,
    decoder: {
      type: 'Sequence',
      decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }],
    },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: unkId >= 0 ? toks[unkId] : null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: true,
      vocab,
      merges: merges.map((m) => [m.a, m.b]),
    },
  };
  return { tj, cfg: tokenizerConfig(g, toks, bos, eos, bos !== null) };
}

function byteLevelJson(g: GgufFile): { tj: Record<string, unknown>; cfg: Record<string, unknown> } {
  const preName = g.meta.get('tokenizer.ggml.pre');
  const pre = typeof preName === 'string' && Object.hasOwn(PRE_TOKENIZERS, preName) ? PRE_TOKENIZERS[preName]! : null;
  if (!pre) {
    throw new GgufError(
      `${g.file}: tokenizer.ggml.pre is ${JSON.stringify(preName ?? null)}; the "gpt2" vocabularies this engine splits words for are ${Object.keys(PRE_TOKENIZERS).map((k) => JSON.stringify(k)).join(', ')}`,
    );
  }
  const { toks, types, bos, eos } = vocabulary(g);
  const n = toks.length;
  const vocab = pieceIds(toks);
  const mergesV = arr(g, 'tokenizer.ggml.merges');
  const merges: [string, string][] = new Array(mergesV.length);
  for (let i = 0; i < mergesV.length; i++) {
    // Byte-level pieces carry spaces as "Ġ": the one space in a merge separates its two pieces.
    const m = mergesV[i];
    const sp = typeof m === 'string' ? m.indexOf(' ') : -1;
    if (typeof m !== 'string' || sp <= 0 || sp === m.length - 1 || m.indexOf(' ', sp + 1) >= 0) {
      throw new GgufError(`${g.file}: tokenizer.ggml.merges[${i}] must be two pieces separated by one space, got ${JSON.stringify(m)}`);
    }
    merges[i] = [m.slice(0, sp), m.slice(sp + 1)];
  }
  // Added tokens are matched whole in the input text before the word split: control tokens
  // (<|begin_of_text|>, <|eot_id|>...) as special (left out of decoded text), user-defined ones
  // as ordinary text.
  const added = [];
  for (let i = 0; i < n; i++) {
    const special = types[i] === TOKEN_TYPE.CONTROL || i === bos || i === eos;
    if (special || types[i] === TOKEN_TYPE.USER_DEFINED) added.push(addedToken(i, toks[i]!, special));
  }
  const tj: Record<string, unknown> = {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: pre.json,
    post_processor: null,
    decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE',
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: pre.ignoreMerges,
      vocab,
      merges,
    },
  };
  return { tj, cfg: tokenizerConfig(g, toks, bos, eos, pre.addBos) };
}

/** tokenizer.json and tokenizer_config.json objects equivalent to the GGUF vocabulary. */
export function tokenizerJsonFromGguf(g: GgufFile): { tj: Record<string, unknown>; cfg: Record<string, unknown> } {
  const model = g.meta.get('tokenizer.ggml.model');
  if (model === 'llama') return sentencePieceJson(g);
  if (model === 'gpt2') return byteLevelJson(g);
  throw new GgufError(`${g.file}: tokenizer.ggml.model is ${JSON.stringify(model ?? null)}; supported are "llama" (SentencePiece BPE) and "gpt2" (byte-level BPE)`);
}

export function tokenizerFromGguf(g: GgufFile): Tokenizer {
  const { tj, cfg } = tokenizerJsonFromGguf(g);
  return Tokenizer.fromJson(tj, cfg, g.file);
}
