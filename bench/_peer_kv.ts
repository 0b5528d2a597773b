// Part `kv` of `npm run bench -- peer`: kvc's KV dtypes against llama.cpp's own KV types (-ctk/-ctv,
// node-llama-cpp's experimentalKvCacheKeyType/ValueType) on the same GGUF weights.
//   greedy  on the peer prompts (20 and 200 tokens, 16 generated), kvc float16 KV against
//           llama.cpp F16 KV, and kvc float32 against llama.cpp F32: the same tokens (target);
//   quality on the kv_quality prompts (bench/_kv_quality.ts), the reference being kvc with f32 KV
//           generating 200 tokens greedily: llama.cpp with F32, F16 and Q8_0 KV and kvc with each
//           of its dtypes fed the same tokens (llama.cpp in one teacher-forced batch, its
//           next-token probabilities at every position), top-1 agreement, mean KL and greedy
//           agreement; and llama.cpp's F16 and Q8_0 against llama.cpp's own F32 KV (what its KV
//           type costs it, apart from the two engines' f32 rounding differences).
// llama.cpp's quantized V cache needs flash attention: its Q8_0 contexts use it, the others do not.
import { existsSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { Codec, DType } from '../src/common/chunk.js';
import { codecName } from '../src/common/chunk_codec.js';
import { DTYPE_NAMES } from '../src/common/dtype.js';
import { convertToGguf } from '../src/engine/model/formats/gguf_write.js';
import { PagedKvCache } from '../src/engine/model/kv_cache.js';
import { LlamaModel } from '../src/engine/model/model.js';
import { argmaxOf, configName, CONTINUATION, kvcReference, qualityPrompts, runKvc, Tally, type QualityFigures, type Reference } from './_kv_quality.js';
import { PEER_DIR, type Llama, type LlamaModelH } from './_peer_setup.js';

/** llama.cpp's KV types compared (GGML type names, as -ctk/-ctv take them in lower case). */
export const PEER_KV_TYPES = ['F32', 'F16', 'Q8_0'] as const;
type PeerKv = (typeof PEER_KV_TYPES)[number];

export interface PeerKvResult {
  /** kvc float16 vs llama.cpp F16, and kvc float32 vs llama.cpp F32, on the peer prompts. */
  greedyF16Match: boolean;
  greedyF32Match: boolean;
  /** Against kvc f32 KV: each llama.cpp KV type and each kvc dtype. */
  vsKvcF32: Record<string, QualityFigures>;
  /** llama.cpp F16 and Q8_0 against llama.cpp F32. */
  vsPeerF32: Record<string, QualityFigures>;
  prompts: number;
  /** llama.cpp KV types not measured on this model, and why. */
  skipped: Record<string, string>;
}

/** Log-probabilities from llama.cpp's token → probability map (a floor for underflowed entries). */
function logProbs(map: Map<number, number>, vocab: number): Float32Array {
  const out = new Float32Array(vocab).fill(Math.log(1e-30));
  for (const [t, p] of map) out[t] = Math.log(Math.max(p, 1e-30));
  return out;
}

async function withPeerContext<T>(pm: LlamaModelH, kv: PeerKv, contextSize: number, f: (ctx: Awaited<ReturnType<LlamaModelH['createContext']>>) => Promise<T>): Promise<T> {
  // Flash attention only where it is needed (a quantized V cache): with it, llama.cpp's CPU path
  // gave F32 KV exactly F16's distributions.
  const ctx = await pm.createContext({ contextSize, batchSize: 512, threads: 2, sequences: 1, experimentalKvCacheKeyType: kv, experimentalKvCacheValueType: kv, flashAttention: kv === 'Q8_0' });
  try {
    return await f(ctx);
  } finally {
    await ctx.dispose();
  }
}

async function peerGreedy(pm: LlamaModelH, kv: PeerKv, p: number[], n: number, contextSize: number): Promise<number[]> {
  return withPeerContext(pm, kv, contextSize, async (ctx) => {
    const out: number[] = [];
    for await (const t of ctx.getSequence().evaluate(p, { temperature: 0 })) {
      out.push(t);
      if (out.length >= n) break;
    }
    return out;
  });
}

function kvcGreedy(m: LlamaModel, dtype: DType, p: number[], n: number): number[] {
  const cache = new PagedKvCache({ ...m.layout, dtype }, 64 << 20);
  const out: number[] = [];
  let seg = p;
  let pos = 0;
  for (let i = 0; i < n; i++) {
    const [lg] = m.forward([{ seqId: 1, tokens: seg, startPos: pos, wantLogits: true }], cache, { transientLogits: true });
    pos += seg.length;
    const t = argmaxOf(lg!);
    out.push(t);
    seg = [t];
  }
  return out;
}

/** llama.cpp's distributions before each reference token, teacher-forced in one evaluation. */
async function peerRows(pm: LlamaModelH, kv: PeerKv, ref: Reference, vocab: number, contextSize: number): Promise<Float32Array[]> {
  return withPeerContext(pm, kv, contextSize, async (ctx) => {
    const input = [...ref.prompt, ...ref.tokens.slice(0, -1)];
    const first = ref.prompt.length - 1;
    const res = await ctx.getSequence().controlledEvaluate(input.map((t, j) => (j >= first ? [t, { generateNext: { probabilities: true } }] : t)));
    return ref.tokens.map((_, s) => {
      const probs = res[first + s]?.next?.probabilities;
      if (!probs) throw new Error(`llama.cpp (${kv} KV) gave no next-token probabilities at position ${first + s}`);
      return logProbs(probs, vocab);
    });
  });
}

/**
 * What the kv part runs on: a checkpoint directory (converted to an F32 GGUF by kvc's converter,
 * kept; greedy on prompts of 20 and 200 tokens, 16 generated; quality on qualityPrompts), or a
 * GGUF file with its own prompts (the trained model: story openings, 200 tokens generated).
 */
export type PeerKvSource =
  | { kind: 'dir'; dir: string; promptOf: (n: number, salt: number) => number[] }
  | { kind: 'gguf'; file: string; model: LlamaModel; greedyPrompts: number[][]; greedyTokens: number; qualityPrompts: (count: number) => number[][] };

/** The kv part on one model. */
export async function peerKvCompare(llama: Llama, label: string, src: PeerKvSource, promptCount: number): Promise<PeerKvResult> {
  let gguf: string;
  let m: LlamaModel;
  if (src.kind === 'dir') {
    gguf = join(PEER_DIR, 'gguf', `${label}-f32.gguf`);
    if (!existsSync(gguf)) {
      await mkdir(dirname(gguf), { recursive: true });
      await convertToGguf(src.dir, gguf, 'F32', { name: label });
    }
    m = await LlamaModel.load(src.dir);
  } else {
    gguf = src.file;
    m = src.model;
  }
  const greedyPrompts = src.kind === 'dir' ? [20, 200].map((n) => src.promptOf(n, n)) : src.greedyPrompts;
  const greedyTokens = src.kind === 'dir' ? 16 : src.greedyTokens;
  const contextSize = Math.min(1024, m.config.maxPositionEmbeddings);
  const pm = await llama.loadModel({ modelPath: gguf, gpuLayers: 0 });
  try {
    let f16 = true;
    let f32 = true;
    for (const p of greedyPrompts) {
      const n = p.length;
      for (const [dtype, peerKv] of [
        [DType.f16, 'F16'],
        [DType.f32, 'F32'],
      ] as const) {
        const a = kvcGreedy(m, dtype, p, greedyTokens);
        const b = await peerGreedy(pm, peerKv, p, greedyTokens, contextSize);
        const same = a.length === b.length && a.every((x, i) => x === b[i]);
        if (dtype === DType.f16) f16 &&= same;
        else f32 &&= same;
        console.log(`[${label} kv] greedy, ${n}-token prompt, ${greedyTokens} tokens, kvc ${DTYPE_NAMES[dtype]} KV vs llama.cpp ${peerKv} KV: ${same ? 'identical' : 'DIFFERENT'} (kvc ${a.slice(0, 6).join(',')}… llama.cpp ${b.slice(0, 6).join(',')}…)`);
      }
    }
    const vocab = m.config.vocabSize;
    // llama.cpp quantizes K in blocks of 32 along a head: a head_dim it does not divide has no Q8_0 KV.
    const skipped: Record<string, string> = {};
    const kvTypes = PEER_KV_TYPES.filter((kv) => {
      if (kv !== 'Q8_0' || m.config.headDim % 32 === 0) return true;
      skipped[`llama.cpp ${kv}`] = `llama.cpp refuses a Q8_0 K cache when its block of 32 does not divide head_dim (${m.config.headDim})`;
      console.log(`[${label} kv] llama.cpp Q8_0 KV: not measured: ${skipped[`llama.cpp ${kv}`]}`);
      return false;
    });
    const vsKvc = new Map<string, Tally>();
    const vsPeer = new Map<string, Tally>();
    const tally = (t: Map<string, Tally>, k: string) => t.get(k) ?? t.set(k, new Tally()).get(k)!;
    const dtypes = (Object.keys(DTYPE_NAMES).map(Number) as DType[]).filter((d) => d !== DType.f32);
    for (const [i, p] of (src.kind === 'dir' ? qualityPrompts(promptCount, 23) : src.qualityPrompts(promptCount)).entries()) {
      const [ref] = kvcReference(m, [p]);
      const rows = new Map<PeerKv, Float32Array[]>();
      for (const kv of kvTypes) rows.set(kv, await peerRows(pm, kv, ref!, vocab, contextSize));
      for (const kv of kvTypes) rows.get(kv)!.forEach((r, s) => tally(vsKvc, `llama.cpp ${kv}`).add(ref!, s, r));
      const peerRef: Reference = { prompt: p, tokens: rows.get('F32')!.map(argmaxOf), logits: rows.get('F32')! };
      for (const kv of kvTypes.filter((x) => x !== 'F32')) rows.get(kv)!.forEach((r, s) => tally(vsPeer, `llama.cpp ${kv}`).add(peerRef, s, r));
      for (const d of dtypes) runKvc(m, { dtype: d, codec: Codec.naive }, [p], [ref!], (_, s, lg) => tally(vsKvc, `kvc ${configName({ dtype: d, codec: Codec.naive }, codecName)}`).add(ref!, s, lg));
      console.log(`[${label} kv] prompt ${i + 1}/${promptCount} (${p.length} tokens) done`);
    }
    const summary = (t: Map<string, Tally>) => Object.fromEntries([...t].map(([k, v]) => [k, v.summary()]));
    const out: PeerKvResult = { greedyF16Match: f16, greedyF32Match: f32, vsKvcF32: summary(vsKvc), vsPeerF32: summary(vsPeer), prompts: promptCount, skipped };
    const line = (name: string, q: QualityFigures) =>
      `  ${name.padEnd(16)} top-1 ${(100 * q.top1).toFixed(2).padStart(6)} %  mean KL ${q.meanKl.toExponential(2)}  max KL ${q.maxKl.toExponential(2)}  greedy identical ${q.greedyIdentical}/${q.prompts}, mean tokens to 1st diff ${q.greedyMeanPrefix.toFixed(1)}`;
    console.log(`[${label} kv] against kvc f32 KV (${promptCount} prompts × ${CONTINUATION} tokens):`);
    for (const [k, q] of Object.entries(out.vsKvcF32)) console.log(line(k, q));
    console.log(`[${label} kv] against llama.cpp F32 KV:`);
    for (const [k, q] of Object.entries(out.vsPeerF32)) console.log(line(k, q).replace(/, mean tokens.*$/, ''));
    return out;
  } finally {
    m.close();
    await pm.dispose();
  }
}
