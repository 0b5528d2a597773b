// `kvc keys`: prints the chunk keys of a token list, one line per chunk, so a user can
// check by hand that two processes (same PYTHONHASHSEED, model, chunk size) agree.
// Keys are bound to the model id the engine uses (a checkpoint directory's name, or the
// built-in model's directory name such as builtin-tiny-v2), not to the name clients send:
// `--model` takes what `kvc engine --model` took, or a model id, and `--engine` asks a running
// engine (which knows its served name). The id used is printed to stderr first.
import type { Command } from 'commander';
import { existsSync, statSync } from 'node:fs';
import { chunkKeys, seedFromEnv } from '../common/keys.js';
import { modelIdOf } from '../engine/model_spec.js';
import { addSettings } from './flags.js';
import { DType, DTYPE_NAMES, dtypeByName } from '../common/dtype.js';
import { kvCacheDtypeOf } from '../common/flags.js';

/** The model id for `--model`: a built-in model, a directory or a .gguf file maps to its id; anything else is taken as the id. */
export function keyModelId(model: string): string {
  if (model.startsWith('builtin:')) return modelIdOf(model);
  if (existsSync(model) && (statSync(model).isDirectory() || /\.gguf$/i.test(model))) return modelIdOf(model);
  return model;
}

/** Asks a running engine which model id its keys use (its /v1/models lists it as kvc_model_id). */
async function engineModelId(url: string, served: string | undefined): Promise<{ modelId: string; kvDtype: DType }> {
  const base = url.replace(/\/+$/, '');
  let body: { data?: { id: string; kvc_model_id?: string; kvc_kv_dtype?: string }[] };
  try {
    const r = await fetch(`${base}/v1/models`, { signal: AbortSignal.timeout(10_000) });
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    body = (await r.json()) as typeof body;
  } catch (e) {
    throw new Error(`--engine ${url}: cannot read /v1/models (${(e as Error).message})`);
  }
  const cards = body.data ?? [];
  const card = served === undefined ? cards[0] : cards.find((c) => c.id === served);
  if (!card) throw new Error(`--engine ${url}: serves ${cards.map((c) => `"${c.id}"`).join(', ') || 'no model'}${served === undefined ? '' : `, not "${served}"`}`);
  if (!card.kvc_model_id) throw new Error(`--engine ${url}: its /v1/models does not give kvc_model_id (not a kvc engine?)`);
  return { modelId: card.kvc_model_id, kvDtype: dtypeByName(card.kvc_kv_dtype ?? 'f32') ?? DType.f32 };
}

export function registerKeys(program: Command): void {
  const cmd = program
    .command('keys')
    .description('print the chunk keys (index, tokens, key) of a list of token ids; the model id used goes to stderr')
    .argument('<tokens...>', 'token ids (non-negative integers)');
  addSettings(cmd, 'keys').action(async (tokens: string[], opts: { model?: string; engine?: string; chunkSize: number; discardPartialChunks?: boolean; kvCacheDtype: string }, c: Command) => {
      const chunkSize = opts.chunkSize;
      const ids = tokens.map((t, i) => {
        if (!/^\d+$/.test(t) || Number(t) > 0xffffffff) throw new Error(`token #${i}: expected a non-negative 32-bit integer, found "${t}"`);
        return Number(t);
      });
      if (opts.engine === undefined && opts.model === undefined) throw new Error('give --model (builtin:tiny, a checkpoint directory or a model id) or --engine <url>');
      const given = kvCacheDtypeOf(opts.kvCacheDtype);
      const asked = opts.engine !== undefined ? await engineModelId(opts.engine, opts.model) : null;
      const modelId = asked ? asked.modelId : keyModelId(opts.model!);
      // An engine says its own KV dtype; a --kv-cache-dtype given as well must agree with it.
      if (asked && c.getOptionValueSource('kvCacheDtype') === 'cli' && asked.kvDtype !== given) {
        throw new Error(`--kv-cache-dtype ${opts.kvCacheDtype}: the engine at ${opts.engine} holds ${DTYPE_NAMES[asked.kvDtype]} KV; omit the flag or give its dtype`);
      }
      const kvDtype = asked ? asked.kvDtype : given;
      process.stderr.write(`kvc keys: model id "${modelId}"${opts.model !== undefined && opts.model !== modelId ? ` (for ${opts.model})` : ''}, chunk size ${chunkSize}, KV ${DTYPE_NAMES[kvDtype]}\n`);
      const spans = chunkKeys(ids, { modelId, chunkSize, seed: seedFromEnv(), discardPartialChunks: opts.discardPartialChunks === true, kvDtype });
      for (const s of spans) process.stdout.write(`${s.index}\t${s.end - s.start}\t${s.key}\n`);
  });
}
