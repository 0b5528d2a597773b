// How far a KV representation moves the model's output from f32 KV (docs/engine.md "KV cache
// dtype", "KV quality"): the measurement shared by `npm run bench -- kv_quality` (kvc's engine KV
// dtypes and tier codecs) and the peer benchmark's `kv` part (llama.cpp's own KV types).
//
// The reference is kvc with f32 KV: on each prompt it generates CONTINUATION tokens greedily and
// keeps every next-token distribution on the way. A candidate is then fed the same prompt and the
// reference's tokens (teacher forcing, one decode step a token, so its KV is written and read in
// its own representation exactly as in serving), and each of its next-token distributions is
// compared with the reference's at the same position:
//   top-1   the candidate's argmax is the reference's (greedy) token;
//   KL      KL(P_ref ‖ P_cand) in nats, from log-softmax in f64;
//   greedy  tokens the candidate would generate on its own before its first difference from the
//           reference. Exact, not an estimate: the engine's forward is deterministic and batch
//           invariant (src/engine/model/model.ts), so a greedy run of the candidate produces the
//           reference's tokens up to the first position whose teacher-forced argmax differs.
import { Codec, DType, chunkPayload, encodeChunk, encodedPayloadBytes, type KvLayout } from '../src/common/chunk.js';
import { decodeChunk, recodeChunk } from '../src/common/chunk_codec.js';
import { DTYPE_NAMES } from '../src/common/dtype.js';
import type { LlamaModel } from '../src/engine/model/model.js';
import { PagedKvCache } from '../src/engine/model/kv_cache.js';
import { argmaxOf, type Reference } from '../harness/kv_quality_metrics.js';

export { argmaxOf, GAP_EDGES, klDivergence, perturbation, referenceMargins, Tally, top2Gap, type QualityFigures, type Reference } from '../harness/kv_quality_metrics.js';

/** Generated tokens per prompt (the 200-token continuations). */
export const CONTINUATION = 200;

/** `count` prompts of varied lengths (48 to 300 tokens, so chunk boundaries fall differently), BOS first. */
export function qualityPrompts(count: number, salt: number): number[][] {
  return Array.from({ length: count }, (_, k) => {
    const n = 48 + ((k * 89 + salt) % 253);
    return [1, ...Array.from({ length: n - 1 }, (_, i) => 1000 + ((i * 7919 + (k + salt) * 104729) % 30000))];
  });
}

/** Tokens of each story opening, BOS included (40 + 200 generated fit the trained model's 256-token context). */
export const STORY_PROMPT_TOKENS = 40;

const NAMES = { She: ['Lily', 'Sara', 'Mia', 'Anna', 'Lucy', 'Emma'], He: ['Tom', 'Ben', 'Max', 'Sam', 'Jack', 'Tim'] };
const BEINGS = ['little girl', 'little boy', 'small dog', 'curious cat', 'friendly bird', 'tiny bunny', 'brave mouse', 'happy frog'];
const PLACES = ['a big house near the woods', 'a small town by the sea', 'a farm with many animals', 'a busy city', 'a quiet village', 'a garden full of flowers'];
const LIKES = ['play with a red ball', 'look at the stars', 'help mom in the kitchen', 'run in the park', 'read books with pictures', 'build towers with blocks', 'sing songs', 'draw pictures of trees'];
const TURNS = [
  'One day, something strange happened.',
  'But one morning, the sky was dark and grey.',
  'One day, a new friend came to visit.',
  'Then, a loud noise came from the garden.',
  'One day, the toy was gone and nobody knew where.',
  'Suddenly, there was a knock at the door.',
];

/** Story opening `k` (deterministic): a character, a place, a habit and a turn of events. */
export function storyText(k: number): string {
  const being = BEINGS[(k * 5 + 1) % BEINGS.length]!;
  const she = being === 'little girl' ? 'She' : being === 'little boy' ? 'He' : k % 2 ? 'She' : 'He';
  const name = NAMES[she][(k >> 1) % 6]!;
  return (
    `Once upon a time, there was a ${being} named ${name}. ${she} lived in ${PLACES[(k * 7 + 2) % PLACES.length]!}. ` +
    `Every day, ${name} liked to ${LIKES[(k * 3 + k / 8) % LIKES.length | 0]!}. ${TURNS[(k * 11 + 3) % TURNS.length]!} ${name} felt ${k % 2 ? 'sad' : 'surprised'} and went to see what it was. There`
  );
}

/**
 * `count` story openings in the style of the trained model's training text (children's stories),
 * each cut to STORY_PROMPT_TOKENS tokens by the model's own tokenizer (`encode` adds BOS).
 */
export function storyPrompts(count: number, encode: (text: string) => number[]): number[][] {
  return Array.from({ length: count }, (_, k) => {
    const ids = encode(storyText(k));
    if (ids.length < STORY_PROMPT_TOKENS) throw new Error(`story prompt ${k} has ${ids.length} tokens, fewer than ${STORY_PROMPT_TOKENS}`);
    return ids.slice(0, STORY_PROMPT_TOKENS);
  });
}

/** A kvc KV representation: the engine's KV dtype, and the tier codec the prompt's KV came back through. */
export interface KvcConfig {
  dtype: DType;
  codec: Codec;
}

export const configName = (c: KvcConfig, codecName: (c: Codec) => string) => (c.codec === Codec.naive ? DTYPE_NAMES[c.dtype] : `${DTYPE_NAMES[c.dtype]}+${codecName(c.codec)}`);

/** Bytes a token's KV takes in this representation (all layers, K and V). */
export function bytesPerToken(layout: KvLayout, c: KvcConfig): number {
  return encodedPayloadBytes({ ...layout, dtype: c.dtype }, 1, c.codec);
}

const CHUNK_KEY = '0123456789abcdef';

/**
 * Runs kvc on a group of prompts in one batch (KV in `c.dtype`), feeding the reference tokens
 * when `refs` is given, else its own greedy tokens; calls `row(i, step, logits)` with the
 * distribution before token `step` of prompt i (logits valid during the call only). With a codec,
 * the prompt's KV (all but its last token) is computed, encoded into a chunk with the codec,
 * decoded and imported into a fresh cache, as a cache hit from a tier holding that codec gives it
 * to the engine; the last prompt token is then recomputed (as the engine does on a full hit).
 * Returns the tokens fed after each prompt.
 */
export function runKvc(m: LlamaModel, c: KvcConfig, prompts: number[][], refs: Reference[] | null, row: (i: number, step: number, logits: Float32Array) => void): number[][] {
  const layout: KvLayout = { ...m.layout, dtype: c.dtype };
  const tokensTotal = prompts.reduce((s, p) => s + p.length + CONTINUATION, 0);
  const budget = encodedPayloadBytes(layout, tokensTotal + 16 * 2 * prompts.length, Codec.naive) + (8 << 20);
  const kv = new PagedKvCache(layout, budget);
  const ids = prompts.map((_, i) => `q${i}`);
  let segs;
  if (c.codec === Codec.naive) {
    segs = prompts.map((p, i) => ({ seqId: ids[i]!, tokens: p, startPos: 0, wantLogits: true }));
  } else {
    const scratch = new PagedKvCache(layout, budget);
    m.forward(prompts.map((p, i) => ({ seqId: ids[i]!, tokens: p.slice(0, -1), startPos: 0, wantLogits: false })), scratch);
    for (const [i, p] of prompts.entries()) {
      const n = p.length - 1;
      const payload = new Uint8Array(encodedPayloadBytes(layout, n, Codec.naive));
      scratch.exportRange(ids[i]!, 0, n, payload);
      const back = decodeChunk(recodeChunk(encodeChunk(layout, n, CHUNK_KEY, payload), c.codec));
      kv.importRange(ids[i]!, 0, chunkPayload(back).slice(), n);
    }
    segs = prompts.map((p, i) => ({ seqId: ids[i]!, tokens: p.slice(-1), startPos: p.length - 1, wantLogits: true }));
  }
  const fed: number[][] = prompts.map(() => []);
  for (let step = 0; step < CONTINUATION; step++) {
    const out = m.forward(segs, kv, { transientLogits: true });
    const next: number[] = [];
    for (let i = 0; i < prompts.length; i++) {
      row(i, step, out[i]!);
      const t = refs ? refs[i]!.tokens[step]! : argmaxOf(out[i]!);
      fed[i]!.push(t);
      next.push(t);
    }
    if (step === CONTINUATION - 1) break;
    segs = segs.map((s, i) => ({ seqId: s.seqId, tokens: [next[i]!], startPos: s.startPos + s.tokens.length, wantLogits: true }));
  }
  return fed;
}

/** The f32-KV reference on a group of prompts. */
export function kvcReference(m: LlamaModel, prompts: number[][]): Reference[] {
  const logits: Float32Array[][] = prompts.map(() => []);
  const tokens = runKvc(m, { dtype: DType.f32, codec: Codec.naive }, prompts, null, (i, _s, lg) => logits[i]!.push(lg.slice()));
  return prompts.map((p, i) => ({ prompt: p, tokens: tokens[i]!, logits: logits[i]! }));
}

/** Largest ÷ median channel RMS over a (layer, KV head)'s head_dim channels: median and max over the (layer, head) pairs, for K and V. */
export interface ChannelSpread {
  k: { median: number; max: number };
  v: { median: number; max: number };
}

/**
 * Whether the model's K has outlier channels (a few of a head's head_dim channels far larger than
 * the rest across tokens), the premise of quantising K per channel (KIVI): the f32 KV of `prompt`,
 * per (K/V, layer, KV head), the RMS of each channel over the tokens, largest ÷ median.
 */
export function channelSpread(m: LlamaModel, prompt: number[]): ChannelSpread {
  const layout: KvLayout = { ...m.layout, dtype: DType.f32 };
  const n = prompt.length;
  const kv = new PagedKvCache(layout, encodedPayloadBytes(layout, n + 32, Codec.naive) + (8 << 20));
  m.forward([{ seqId: 's', tokens: prompt, startPos: 0, wantLogits: false }], kv);
  const payload = new Uint8Array(encodedPayloadBytes(layout, n, Codec.naive));
  kv.exportRange('s', 0, n, payload);
  const x = new Float32Array(payload.buffer);
  const { numLayers: L, numKvHeads: H, headDim: D } = layout;
  const ratios: number[][] = [[], []];
  for (let part = 0; part < 2; part++) {
    for (let l = 0; l < L; l++) {
      for (let h = 0; h < H; h++) {
        const rms: number[] = [];
        for (let e = 0; e < D; e++) {
          let s = 0;
          for (let t = 0; t < n; t++) s += x[(((part * L + l) * n + t) * H + h) * D + e]! ** 2;
          rms.push(Math.sqrt(s / n));
        }
        rms.sort((a, b) => a - b);
        ratios[part]!.push(rms[D - 1]! / rms[D >> 1]!);
      }
    }
  }
  const stat = (r: number[]) => {
    const s = [...r].sort((a, b) => a - b);
    return { median: s[s.length >> 1]!, max: s[s.length - 1]! };
  };
  return { k: stat(ratios[0]!), v: stat(ratios[1]!) };
}
