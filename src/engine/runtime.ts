// Loads what the engine serves: the model (built-in, a checkpoint directory, or one GGUF file
// named *.gguf) and its tokenizer, through the same model code either way.
import type { KvLayout } from '../common/chunk.js';
import type { ModelConfig } from './model/config.js';
import type { PagedKvCache } from './model/kv_cache.js';
import { resolveModelDir } from './model/formats/builtin.js';
import { loadGguf } from './model/formats/gguf_model.js';
import { LlamaModel } from './model/model.js';
import { LLAMA2_CHAT_TEMPLATE, Tokenizer } from './model/tokenizer.js';
import type { ForwardSegment, Forwarder } from './scheduler.js';

export interface EngineModel extends Forwarder {
  dir: string;
  /** Identity used in chunk keys (same model ⇒ same id on every engine). */
  modelId: string;
  config: ModelConfig;
  layout: KvLayout;
  tokenizer: Tokenizer;
  llama: LlamaModel;
}

/**
 * `env` supplies KVC_CACHE_DIR for built-in models (default process.env); `chatTemplate`
 * (--chat-template) replaces the checkpoint's chat template. The built-in model's template is
 * Llama-2's (its vocabulary is); a checkpoint without one gets none (chat requests are refused).
 */
export async function loadEngineModel(spec: string, env: NodeJS.ProcessEnv = process.env, chatTemplate: string | null = null): Promise<EngineModel> {
  let llama: LlamaModel;
  let tokenizer: Tokenizer;
  if (/\.gguf$/i.test(spec)) ({ model: llama, tokenizer } = await loadGguf(spec));
  else {
    const dir = await resolveModelDir(spec, env);
    [llama, tokenizer] = await Promise.all([LlamaModel.load(dir), Tokenizer.load(dir)]);
  }
  if (chatTemplate !== null) tokenizer.useChatTemplate(chatTemplate, '--chat-template');
  else if (spec.startsWith('builtin:') && tokenizer.chatTemplateSource === null) tokenizer.useChatTemplate(LLAMA2_CHAT_TEMPLATE, "the built-in model's chat template");
  // Greedy argmax of the last forward's rows, computed inside it (both kernel threads, while the
  // helper is awake); argmax() answers from it for those very rows, and computes anything else.
  let rows: Float32Array[] = [];
  let greedy = new Int32Array(8);
  return {
    dir: llama.dir,
    modelId: llama.modelId,
    config: llama.config,
    layout: llama.layout,
    tokenizer,
    llama,
    // The scheduler samples from the logits before its next step, so they may be views of the
    // model's reused buffer (no fresh 128 KiB array per sequence and step).
    forward: (segments: ForwardSegment[], kv: PagedKvCache) => {
      rows = [];
      // At most one logits row per segment.
      if (greedy.length < segments.length) greedy = new Int32Array(segments.length);
      rows = llama.forward(segments, kv, { transientLogits: true, argmaxOut: greedy });
      return rows;
    },
    argmax: (logits: Float32Array) => {
      const i = rows.indexOf(logits);
      return i >= 0 ? greedy[i]! : llama.kernel.argmax(logits);
    },
  };
}
