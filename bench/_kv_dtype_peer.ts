// The peer reference of the KV-dtype decode bench (bench/_kv_dtype.ts): llama.cpp (node-llama-cpp,
// installed by the peer bench into bench/.peer) decoding batch 1 on the same model kvc runs there
// (the built-in tiny model, as the F32 GGUF kvc's converter writes, the file the peer bench uses),
// at the same contexts, with its own KV types (-ctk/-ctv, the binding's
// experimentalKvCacheKeyType/ValueType): F32 and F16 without flash attention (llama.cpp's default
// CPU path), and F32, F16 and Q8_0 with it (a quantized V cache needs it). Per round, every
// configuration is prefilled in a fresh context, then its decode steps are interleaved RUN steps at
// a time (the order rotating), as kvc's are: the median ms a step per round and F16's and Q8_0's
// speed ÷ F32's of the same round and flash-attention setting. A step feeds one fixed token and
// has llama.cpp compute the logits and pick the next token (kvc's step computes the logits too).
// Not installed: the part says so and is skipped; the bench never installs the peer.
import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { convertToGguf } from '../src/engine/model/formats/gguf_write.js';
import { ensureBuiltinModel } from '../src/engine/model/formats/builtin.js';
import { PEER_DIR, peer, peerInstalled, type LlamaCtx, type LlamaModelH, type LlamaSeq } from './_peer_setup.js';

/** llama.cpp's threads: kvc's kernel runs two on a multi-core machine. */
const THREADS = 2;
const CONFIGS = [
  { name: 'F32', kv: 'F32', fa: false },
  { name: 'F16', kv: 'F16', fa: false },
  { name: 'F32_fa', kv: 'F32', fa: true },
  { name: 'F16_fa', kv: 'F16', fa: true },
  { name: 'Q8_0_fa', kv: 'Q8_0', fa: true },
] as const;

export interface PeerDecode {
  /** Per configuration (and F32_best, the faster F32 of the round), the median ms a step of each round. */
  ms: Record<string, number[]>;
  /** Per round: F16 ÷ F32 without flash attention, F16 and Q8_0 ÷ F32 with it, and the faster F16 and Q8_0 ÷ the faster F32. */
  ratios: Record<string, number[]>;
}

export type PeerDecodeSetup = { ok: true; model: LlamaModelH; close: () => Promise<void> } | { ok: false; why: string };

/** llama.cpp with the tiny model's GGUF loaded, or why not (never throws: the part is a reference). */
export async function peerDecodeSetup(): Promise<PeerDecodeSetup> {
  if (!peerInstalled()) return { ok: false, why: `the llama.cpp peer (node-llama-cpp) is not installed in ${PEER_DIR} (\`npm run bench -- peer\` installs it)` };
  try {
    const gguf = join(PEER_DIR, 'gguf', 'tiny-f32.gguf');
    if (!existsSync(gguf)) {
      await mkdir(dirname(gguf), { recursive: true });
      await convertToGguf(await ensureBuiltinModel('tiny'), gguf, 'F32', { name: 'tiny' });
    }
    const llama = await peer();
    const model = await llama.loadModel({ modelPath: gguf, gpuLayers: 0 });
    return { ok: true, model, close: async () => (await model.dispose(), await llama.dispose()) };
  } catch (e) {
    return { ok: false, why: `the llama.cpp peer failed to start: ${(e as Error).message}` };
  }
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[s.length >> 1]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

/** One decode step: token 5 in, logits computed and a next token picked. */
async function step(seq: LlamaSeq): Promise<void> {
  const [r] = await seq.controlledEvaluate([[5, { generateNext: { token: true } }]]);
  if (r?.next?.token === undefined) throw new Error('llama.cpp returned no next token for a decode step');
}

/** llama.cpp's decode steps at `ctx` tokens per KV configuration, `rounds` rounds of `steps` steps. */
export async function peerDecode(model: LlamaModelH, prompt: number[], rounds: number, steps: number, run: number): Promise<PeerDecode> {
  const ms: Record<string, number[]> = {};
  for (let r = 0; r < rounds; r++) {
    const ctxs: LlamaCtx[] = [];
    try {
      const seqs: LlamaSeq[] = [];
      for (const c of CONFIGS) {
        const ctx = await model.createContext({ contextSize: prompt.length + steps + 64, batchSize: 512, threads: THREADS, sequences: 1, experimentalKvCacheKeyType: c.kv, experimentalKvCacheValueType: c.kv, flashAttention: c.fa });
        ctxs.push(ctx);
        const seq = ctx.getSequence();
        await seq.evaluateWithoutGeneratingNewTokens(prompt);
        seqs.push(seq);
      }
      const times: number[][] = CONFIGS.map(() => []);
      for (let b = 0; b < steps / run; b++) {
        for (let k = 0; k < CONFIGS.length; k++) {
          const i = (k + b) % CONFIGS.length;
          for (let t = 0; t < run; t++) {
            const t0 = performance.now();
            await step(seqs[i]!);
            times[i]!.push(performance.now() - t0);
          }
        }
      }
      CONFIGS.forEach((c, i) => (ms[c.name] ??= []).push(median(times[i]!)));
    } finally {
      for (const c of ctxs) await c.dispose();
    }
  }
  const ratio = (num: string, den: string) => ms[den]!.map((x, i) => +(x / ms[num]![i]!).toFixed(2));
  // llama.cpp's flash-attention path is slow with an F32 cache (its CPU kernel is built around
  // F16 K/V), so against F32 with flash attention a narrow type looks better than it is: also
  // each type against llama.cpp's faster F32 step of the round, with or without it.
  ms.F32_best = ms.F32!.map((x, i) => Math.min(x, ms.F32_fa![i]!));
  return {
    ms,
    ratios: { f16: ratio('F16', 'F32'), f16_fa: ratio('F16_fa', 'F32_fa'), q8_0_fa: ratio('Q8_0_fa', 'F32_fa'), f16_best_vs_best_f32: ms.F32_best.map((x, i) => +(x / Math.min(ms.F16![i]!, ms.F16_fa![i]!)).toFixed(2)), q8_0_vs_best_f32: ratio('Q8_0_fa', 'F32_best') },
  };
}
