// Part `stories` of `npm run bench -- peer`: the trained stories15M model (npm run model --
// stories15m; src/engine/model/formats/stories.ts), its GGUF written by kvc's llama2.c converter,
// in llama.cpp. First the vocabulary: llama.cpp must tokenize the story openings and a few
// harder texts into the ids kvc's tokenizer (rebuilt from the same file) gives. Then the kv part
// (bench/_peer_kv.ts) on it: kvc float16 KV against llama.cpp F16 KV (and float32 against F32),
// greedy over 200 tokens after each of 8 story openings (the float16 target on a model
// whose choices are decided), and the quality figures on --kv-prompts story openings.
import { loadGguf } from '../src/engine/model/formats/gguf_model.js';
import { ensureStories15m } from '../src/engine/model/formats/stories.js';
import { CONTINUATION, storyPrompts, storyText } from './_kv_quality.js';
import { peerKvCompare, type PeerKvResult } from './_peer_kv.js';
import type { Llama, LlamaModelTok } from './_peer_setup.js';
import { sameIds } from './_peer_sides.js';

const GREEDY_PROMPTS = 8;
const TOKENIZER_TEXTS = 64;
const HARD_TEXTS = ['Hello world', '  two  spaces and a\ttab', 'café déjà vu', 'He said: "3.14159 is pi!"', '\n\nNew lines\n', 'Emoji 🦙 and 中文', "don't won't can't", '<s> is not BOS here'];

export interface PeerStoriesResult {
  tokensMatch: boolean;
  kv: PeerKvResult;
}

export async function peerStories(llama: Llama, promptCount: number): Promise<PeerStoriesResult> {
  const file = await ensureStories15m(process.env, (s) => console.log(s));
  const { model, tokenizer } = await loadGguf(file, { threads: 2 });
  const pm = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  let tokensMatch = true;
  try {
    const tok = pm as unknown as LlamaModelTok;
    const texts = [...Array.from({ length: TOKENIZER_TEXTS }, (_, k) => storyText(k)), ...HARD_TEXTS];
    for (const text of texts) {
      const a = tokenizer.encode(text, { addBos: false });
      const b = tok.tokenize(text, true); // kvc's encode reads special tokens' text as those tokens, as Hugging Face's does
      if (!sameIds(a, b)) {
        tokensMatch = false;
        console.log(`[stories] ${JSON.stringify(text)}: kvc ${JSON.stringify(a)} | llama.cpp ${JSON.stringify(b)}`);
      }
    }
    console.log(`[stories] tokenization of ${texts.length} texts, kvc vs llama.cpp: ${tokensMatch ? 'identical' : 'DIFFERENT'}`);
  } finally {
    await pm.dispose();
  }
  const encode = (t: string) => tokenizer.encode(t, { addBos: true });
  const kv = await peerKvCompare(
    llama,
    'stories',
    { kind: 'gguf', file, model, greedyPrompts: storyPrompts(GREEDY_PROMPTS, encode), greedyTokens: CONTINUATION, qualityPrompts: (n) => storyPrompts(n, encode) },
    promptCount,
  );
  return { tokensMatch, kv };
}
