// The tokenizer of a GGUF file, from its metadata: a "llama" (SentencePiece BPE) vocabulary —
// tokenizer.ggml.tokens / scores / token_type — rebuilt as the Hugging Face tokenizer.json it
// corresponds to (byte fallback, "▁" for spaces, BPE merges ordered by the score of the piece
// they produce, as the Hugging Face SentencePiece converter orders them), so it runs through the
// same tokenizer code as a checkpoint directory.
import type { GgufFile, GgufValue } from './gguf_read.js';
import { GgufError } from './gguf_read.js';
import { TOKEN_TYPE } from './gguf_format.js';
import { Tokenizer } from './tokenizer.js';

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

/** tokenizer.json and tokenizer_config.json objects equivalent to the GGUF vocabulary. */
export function tokenizerJsonFromGguf(g: GgufFile): { tj: Record<string, unknown>; cfg: Record<string, unknown> } {
  const model = g.meta.get('tokenizer.ggml.model');
  if (model !== 'llama') throw new GgufError(`${g.file}: tokenizer.ggml.model is ${JSON.stringify(model)}; only "llama" (SentencePiece BPE) vocabularies are supported`);
  const tokens = arr(g, 'tokenizer.ggml.tokens');
  const n = tokens.length;
  if (n === 0 || !tokens.every((t) => typeof t === 'string')) throw new GgufError(`${g.file}: tokenizer.ggml.tokens must be a non-empty array of strings`);
  const scoresV = g.meta.has('tokenizer.ggml.scores') ? arr(g, 'tokenizer.ggml.scores') : new Array<number>(n).fill(0);
  const typesV = g.meta.has('tokenizer.ggml.token_type') ? arr(g, 'tokenizer.ggml.token_type') : new Array<number>(n).fill(TOKEN_TYPE.NORMAL);
  if (scoresV.length !== n || typesV.length !== n) throw new GgufError(`${g.file}: tokenizer.ggml.scores / token_type must have one entry per token (${n})`);
  const scores = scoresV.map((v) => (typeof v === 'number' ? v : 0));
  const types = typesV.map((v) => (typeof v === 'number' ? v : TOKEN_TYPE.NORMAL));
  const toks = tokens as string[];
  const vocab: Record<string, number> = {};
  for (let i = 0; i < n; i++) if (!(toks[i]! in vocab)) vocab[toks[i]!] = i;

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
  const bos = optId(g, 'tokenizer.ggml.bos_token_id', n);
  const eos = optId(g, 'tokenizer.ggml.eos_token_id', n);
  const added = [];
  for (let i = 0; i < n; i++) {
    if (types[i] === TOKEN_TYPE.CONTROL || types[i] === TOKEN_TYPE.UNKNOWN || i === bos || i === eos) {
      added.push({ id: i, content: toks[i]!, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
    }
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
  const addBos = g.meta.get('tokenizer.ggml.add_bos_token');
  const tpl = g.meta.get('tokenizer.chat_template');
  const cfg: Record<string, unknown> = {
    bos_token: bos !== null ? toks[bos] : null,
    eos_token: eos !== null ? toks[eos] : null,
    add_bos_token: typeof addBos === 'boolean' ? addBos : bos !== null,
    ...(typeof tpl === 'string' ? { chat_template: tpl } : {}),
  };
  return { tj, cfg };
}

export function tokenizerFromGguf(g: GgufFile): Tokenizer {
  const { tj, cfg } = tokenizerJsonFromGguf(g);
  return Tokenizer.fromJson(tj, cfg, g.file);
}
