// Model configuration: the subset of a Hugging Face LlamaForCausalLM `config.json` that the
// CPU engine needs, parsed and validated up front so that a bad checkpoint fails at load time
// with a message naming the file and the key, never mid-request.
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';

export interface ModelConfig {
  vocabSize: number;
  dim: number;
  numLayers: number;
  numHeads: number;
  numKvHeads: number;
  headDim: number;
  hiddenDim: number;
  ropeTheta: number;
  /**
   * Llama 3 RoPE scaling: one divisor per rotary frequency (headDim / 2 of them, f32 values),
   * frequency i being ropeTheta^(-2i/headDim) / ropeFreqFactors[i]. Absent: no scaling.
   */
  ropeFreqFactors?: readonly number[];
  normEps: number;
  maxPositionEmbeddings: number;
  tieWordEmbeddings: boolean;
  bosTokenId: number | null;
  /** All ids that end generation (HF allows a list). The first is the canonical one. */
  eosTokenIds: number[];
  eosTokenId: number | null;
}

export class ModelConfigError extends Error {
  override name = 'ModelConfigError';
}

type Json = Record<string, unknown>;

function need(raw: Json, file: string, key: string): unknown {
  if (!(key in raw) || raw[key] === null || raw[key] === undefined) throw new ModelConfigError(`${file}: missing required key "${key}"`);
  return raw[key];
}

function posInt(v: unknown, file: string, key: string): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) throw new ModelConfigError(`${file}: "${key}" must be a positive integer, got ${JSON.stringify(v)}`);
  return v;
}

function posNum(v: unknown, file: string, key: string): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v <= 0) throw new ModelConfigError(`${file}: "${key}" must be a positive number, got ${JSON.stringify(v)}`);
  return v;
}

function tokenId(v: unknown, file: string, key: string, vocab: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v >= vocab) {
    throw new ModelConfigError(`${file}: "${key}" must be a token id in [0, ${vocab}), got ${JSON.stringify(v)}`);
  }
  return v;
}

/** The parameters of Llama 3's RoPE scaling (config.json "rope_scaling" with rope_type "llama3"). */
export interface Llama3RopeScaling {
  factor: number;
  lowFreqFactor: number;
  highFreqFactor: number;
  originalMaxPositionEmbeddings: number;
}

/**
 * Llama 3's per-frequency divisors: a frequency whose wavelength (2π / frequency, in positions)
 * is shorter than originalMax / highFreqFactor is kept (1); one longer than originalMax /
 * lowFreqFactor is divided by `factor`; in between the divisor moves smoothly from one to the
 * other, 1 / ((1 − s) / factor + s) with s = (originalMax / wavelength − low) / (high − low).
 * Rounded to f32: a GGUF file stores them so (its rope_freqs.weight tensor), and both forms of a
 * checkpoint then rotate by the same angles.
 */
export function llama3RopeFactors(headDim: number, theta: number, s: Llama3RopeScaling): number[] {
  const lowWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor;
  const highWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor;
  const out: number[] = [];
  for (let i = 0; i < headDim / 2; i++) {
    const wavelen = (2 * Math.PI) / (1 / Math.pow(theta, (2 * i) / headDim));
    let f: number;
    if (wavelen < highWavelen) f = 1;
    else if (wavelen > lowWavelen) f = s.factor;
    else {
      const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
      f = 1 / ((1 - smooth) / s.factor + smooth);
    }
    out.push(Math.fround(f));
  }
  return out;
}

/** config.json "rope_scaling": only Llama 3's kind is computed; any other is an error naming it. */
function llama3Factors(v: unknown, file: string, headDim: number, theta: number): number[] {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new ModelConfigError(`${file}: "rope_scaling" must be an object or null, got ${JSON.stringify(v)}`);
  const o = v as Json;
  const kind = o.rope_type ?? o.type;
  if (kind !== 'llama3') throw new ModelConfigError(`${file}: "rope_scaling" of type ${JSON.stringify(kind)} is not supported by this engine (only "llama3")`);
  const s: Llama3RopeScaling = {
    factor: posNum(o.factor, file, 'rope_scaling.factor'),
    lowFreqFactor: posNum(o.low_freq_factor, file, 'rope_scaling.low_freq_factor'),
    highFreqFactor: posNum(o.high_freq_factor, file, 'rope_scaling.high_freq_factor'),
    originalMaxPositionEmbeddings: posInt(o.original_max_position_embeddings, file, 'rope_scaling.original_max_position_embeddings'),
  };
  if (!(s.highFreqFactor > s.lowFreqFactor)) throw new ModelConfigError(`${file}: "rope_scaling.high_freq_factor" (${s.highFreqFactor}) must be greater than "low_freq_factor" (${s.lowFreqFactor})`);
  return llama3RopeFactors(headDim, theta, s);
}

/** Validates an already-parsed config.json object. `file` is only used in error messages. */
export function parseModelConfig(raw: unknown, file = 'config.json'): ModelConfig {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new ModelConfigError(`${file}: expected a JSON object`);
  const r = raw as Json;
  const archs = r.architectures;
  if (archs !== undefined && (!Array.isArray(archs) || !archs.some((a) => typeof a === 'string' && /^(Llama|Mistral)ForCausalLM$/.test(a)))) {
    throw new ModelConfigError(`${file}: "architectures" is ${JSON.stringify(archs)}; this engine computes the Llama architecture (LlamaForCausalLM)`);
  }
  if (r.model_type !== undefined && r.model_type !== 'llama' && r.model_type !== 'mistral') {
    throw new ModelConfigError(`${file}: "model_type" is ${JSON.stringify(r.model_type)}; only "llama" is supported`);
  }
  const vocabSize = posInt(need(r, file, 'vocab_size'), file, 'vocab_size');
  const dim = posInt(need(r, file, 'hidden_size'), file, 'hidden_size');
  const hiddenDim = posInt(need(r, file, 'intermediate_size'), file, 'intermediate_size');
  const numLayers = posInt(need(r, file, 'num_hidden_layers'), file, 'num_hidden_layers');
  const numHeads = posInt(need(r, file, 'num_attention_heads'), file, 'num_attention_heads');
  const numKvHeads = r.num_key_value_heads === undefined || r.num_key_value_heads === null ? numHeads : posInt(r.num_key_value_heads, file, 'num_key_value_heads');
  if (numHeads % numKvHeads !== 0) throw new ModelConfigError(`${file}: "num_attention_heads" (${numHeads}) must be a multiple of "num_key_value_heads" (${numKvHeads})`);
  let headDim: number;
  if (r.head_dim === undefined || r.head_dim === null) {
    if (dim % numHeads !== 0) throw new ModelConfigError(`${file}: "hidden_size" (${dim}) is not divisible by "num_attention_heads" (${numHeads}) and no "head_dim" is given`);
    headDim = dim / numHeads;
  } else headDim = posInt(r.head_dim, file, 'head_dim');
  if (headDim % 2 !== 0) throw new ModelConfigError(`${file}: "head_dim" must be even for rotary embeddings, got ${headDim}`);
  const ropeTheta = r.rope_theta === undefined ? 10000 : posNum(r.rope_theta, file, 'rope_theta');
  const ropeFreqFactors = r.rope_scaling === undefined || r.rope_scaling === null ? undefined : llama3Factors(r.rope_scaling, file, headDim, ropeTheta);
  const normEps = r.rms_norm_eps === undefined ? 1e-6 : posNum(r.rms_norm_eps, file, 'rms_norm_eps');
  const maxPositionEmbeddings = r.max_position_embeddings === undefined ? 2048 : posInt(r.max_position_embeddings, file, 'max_position_embeddings');
  const tie = r.tie_word_embeddings === undefined ? false : r.tie_word_embeddings;
  if (typeof tie !== 'boolean') throw new ModelConfigError(`${file}: "tie_word_embeddings" must be a boolean, got ${JSON.stringify(tie)}`);
  if (r.hidden_act !== undefined && r.hidden_act !== 'silu') throw new ModelConfigError(`${file}: "hidden_act" must be "silu", got ${JSON.stringify(r.hidden_act)}`);
  const bosTokenId = r.bos_token_id === undefined || r.bos_token_id === null ? null : tokenId(r.bos_token_id, file, 'bos_token_id', vocabSize);
  let eosTokenIds: number[] = [];
  if (Array.isArray(r.eos_token_id)) eosTokenIds = r.eos_token_id.map((v, i) => tokenId(v, file, `eos_token_id[${i}]`, vocabSize));
  else if (r.eos_token_id !== undefined && r.eos_token_id !== null) eosTokenIds = [tokenId(r.eos_token_id, file, 'eos_token_id', vocabSize)];
  return {
    vocabSize,
    dim,
    numLayers,
    numHeads,
    numKvHeads,
    headDim,
    hiddenDim,
    ropeTheta,
    ...(ropeFreqFactors ? { ropeFreqFactors } : {}),
    normEps,
    maxPositionEmbeddings,
    tieWordEmbeddings: tie,
    bosTokenId,
    eosTokenIds,
    eosTokenId: eosTokenIds[0] ?? null,
  };
}

/**
 * A JSON file's parsed content, or undefined when `optional` and the file does not exist; an
 * unreadable file or invalid JSON is a ModelConfigError naming the file (`what` names its role).
 */
async function readJsonFile(file: string, what: string, optional = false): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e) {
    if (optional && (e as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw new ModelConfigError(`${file}: cannot read${what ? ` ${what}` : ''} (${(e as Error).message})`);
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ModelConfigError(`${file}: not valid JSON (${(e as Error).message})`);
  }
}

/** Reads and validates `<dir>/config.json`. */
export async function loadModelConfig(dir: string): Promise<ModelConfig> {
  const file = join(dir, 'config.json');
  const raw = await readJsonFile(file, 'model config');
  return withGenerationEos(parseModelConfig(raw, file), join(dir, 'generation_config.json'));
}

/**
 * The end ids of `generation_config.json`, when the checkpoint has one, joined to config.json's
 * (as vLLM does): Llama 3 Instruct's config.json names <|end_of_text|> only, its generation
 * config also <|eot_id|>, which ends every chat turn. A missing file changes nothing; an
 * unreadable one or a bad id is an error naming the file and the key.
 */
async function withGenerationEos(cfg: ModelConfig, file: string): Promise<ModelConfig> {
  const raw = await readJsonFile(file, '', true);
  if (raw === undefined) return cfg;
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new ModelConfigError(`${file}: expected a JSON object`);
  const v = (raw as Json).eos_token_id;
  if (v === undefined || v === null) return cfg;
  const ids = Array.isArray(v) ? v.map((x, i) => tokenId(x, file, `eos_token_id[${i}]`, cfg.vocabSize)) : [tokenId(v, file, 'eos_token_id', cfg.vocabSize)];
  const eosTokenIds = [...new Set([...cfg.eosTokenIds, ...ids])];
  return { ...cfg, eosTokenIds, eosTokenId: eosTokenIds[0] ?? null };
}
