// Request schemas of /v1/completions and /v1/chat/completions. No field is silently ignored:
// every field is either honoured (listed in the schemas below and in docs/api.md) or refused
// with a 400 that names it — OpenAI features this engine does not implement (tools,
// response_format other than text, audio, …) with the reason, and any other unknown field
// with a did-you-mean when it looks like a typo of a supported one.
import { z } from 'zod';
import { ERRORS, kvcError } from '../../common/errors.js';
import { didYouMean } from '../../common/did_you_mean.js';
import { tokenIds } from '../../common/validate.js';
import { kvTransferParamsSchema } from '../../protocol/disagg_spec.js';
import { chatMessages } from './messages.schema.js';

const tokenList = tokenIds.min(1, 'expected at least one token id');

/** A request id a client may choose (body `request_id` or X-Request-Id): safe in logs and headers. */
export const REQUEST_ID = /^[\w.:-]{1,128}$/;

/** Most alternatives a request may ask logprobs for (vLLM's default max_logprobs). */
export const MAX_LOGPROBS = 20;
/** Most choices one request may ask for (`n`). */
export const MAX_N = 16;

const num = (lo: number, hi: number, what = `a number in [${lo}, ${hi}]`) => z.number(`expected ${what}`).min(lo, `expected ${what}`).max(hi, `expected ${what}`);
const int = (lo: number, hi: number, what: string) => z.number(`expected ${what}`).int(`expected ${what}`).min(lo, `expected ${what}`).max(hi, `expected ${what}`);

const samplingFields = {
  model: z.string('expected a string').optional(),
  max_tokens: z.number('expected an integer').int('expected an integer').min(1, 'expected an integer >= 1').nullish(),
  temperature: num(0, 2).nullish(),
  top_p: z.number('expected a number').gt(0, 'expected a number in (0, 1]').max(1, 'expected a number in (0, 1]').nullish(),
  top_k: z.number('expected an integer').int('expected an integer').min(-1, 'expected -1 or 0 (off) or a positive integer').nullish(),
  min_p: num(0, 1).nullish(),
  seed: z.number('expected an integer').int('expected an integer').min(Number.MIN_SAFE_INTEGER).max(Number.MAX_SAFE_INTEGER).nullish(),
  presence_penalty: num(-2, 2).nullish(),
  frequency_penalty: num(-2, 2).nullish(),
  repetition_penalty: z.number('expected a number > 0').gt(0, 'expected a number > 0').max(10, 'expected a number in (0, 10]').nullish(),
  logit_bias: z
    .record(z.string().regex(/^\d{1,10}$/, 'expected token ids as keys'), num(-100, 100), 'expected an object of token id → bias in [-100, 100]')
    .nullish(),
  stop: z.union([z.string(), z.array(z.string('expected a string')).max(16, 'expected at most 16 stop strings')], 'expected a string or an array of strings').nullish(),
  stop_token_ids: z.array(z.number().int('expected an integer token id').min(0)).nullish(),
  include_stop_str_in_output: z.boolean('expected a boolean').nullish(),
  ignore_eos: z.boolean('expected a boolean').nullish(),
  min_tokens: z.number('expected an integer >= 0').int('expected an integer >= 0').min(0, 'expected an integer >= 0').nullish(),
  stream: z.boolean('expected a boolean').nullish(),
  stream_options: z
    .strictObject({ include_usage: z.boolean('expected a boolean').nullish(), continuous_usage_stats: z.boolean('expected a boolean').nullish() }, 'expected an object')
    .nullish(),
  n: int(1, MAX_N, `an integer between 1 and ${MAX_N}`).nullish(),
  // vLLM's: logprobs name tokens "token_id:<id>" instead of their text (exact ids for clients).
  return_tokens_as_token_ids: z.boolean('expected a boolean').nullish(),
  kv_transfer_params: kvTransferParamsSchema.nullish(),
  // An end-user identifier (OpenAI uses it for abuse monitoring); it does not change generation.
  user: z.string('expected a string').nullish(),
  // vLLM's extra fields (docs/coming-from-lmcache-vllm.md):
  // the prompt's chunk keys are salted with it, so its KV is reused only by requests of the same salt.
  cache_salt: z.string('expected a string').min(1, 'expected a non-empty string').max(1024, 'expected at most 1024 characters').nullish(),
  // Admission order in the engine's queue: lower first, ties by arrival.
  priority: z.number('expected an integer').int('expected an integer').min(-(2 ** 31), 'expected a 32-bit integer').max(2 ** 31 - 1, 'expected a 32-bit integer').nullish(),
  // The request id (logs, the answer's id and X-Request-Id); an X-Request-Id header wins, as in vLLM.
  request_id: z.string('expected a string').regex(REQUEST_ID, 'expected 1 to 128 letters, digits or . _ : -').nullish(),
  // Whether the tokenizer adds its special tokens (BOS) to the prompt: completions default true;
  // chat default: only what the template writes (plus BOS where the tokenizer asks for it).
  add_special_tokens: z.boolean('expected a boolean').nullish(),
};

export const completionRequest = z.object({
  ...samplingFields,
  prompt: z.union([z.string(), tokenList, z.tuple([z.string()]), z.tuple([tokenList])], 'expected a string or an array of token ids (one prompt per request)'),
  logprobs: int(0, MAX_LOGPROBS, `an integer between 0 and ${MAX_LOGPROBS}`).nullish(),
  echo: z.boolean('expected a boolean').nullish(),
  best_of: int(1, MAX_N, `an integer between 1 and ${MAX_N}`).nullish(),
  suffix: z.null('suffix (insertion) is not supported by this engine').optional(),
});
export type CompletionRequest = z.infer<typeof completionRequest>;

const NO_TOOLS = 'tools (function calling) are not supported by this engine';

export const chatRequest = z.object({
  ...samplingFields,
  messages: chatMessages,
  max_completion_tokens: z.number('expected an integer').int('expected an integer').min(1, 'expected an integer >= 1').nullish(),
  logprobs: z.boolean('expected a boolean').nullish(),
  top_logprobs: int(0, MAX_LOGPROBS, `an integer between 0 and ${MAX_LOGPROBS}`).nullish(),
  tools: z.array(z.unknown()).max(0, NO_TOOLS).nullish(),
  tool_choice: z.literal('none', `${NO_TOOLS}; only "none" is accepted`).nullish(),
  response_format: z.object({ type: z.literal('text', 'only {"type": "text"} is supported (no JSON mode or JSON schema)') }, 'expected {"type": "text"}').nullish(),
  store: z.literal(false, 'stored completions are not supported by this engine (expected false)').nullish(),
});
export type ChatRequest = z.infer<typeof chatRequest>;

/** OpenAI / vLLM fields this engine knows and does not implement, with the reason given in the 400. */
const REFUSED: Record<string, string> = {
  functions: NO_TOOLS,
  function_call: NO_TOOLS,
  parallel_tool_calls: NO_TOOLS,
  audio: 'audio output is not supported by this engine',
  modalities: 'only text output is supported by this engine',
  prediction: 'predicted outputs are not supported by this engine',
  reasoning_effort: 'this engine serves no reasoning models',
  web_search_options: 'web search is not supported by this engine',
  metadata: 'stored completions are not supported by this engine',
  service_tier: 'service tiers are not supported by this engine',
  guided_json: 'guided decoding is not supported by this engine',
  guided_regex: 'guided decoding is not supported by this engine',
  guided_choice: 'guided decoding is not supported by this engine',
  guided_grammar: 'guided decoding is not supported by this engine',
  structured_outputs: 'guided decoding is not supported by this engine',
  prompt_logprobs: 'prompt logprobs are not supported by this engine',
  use_beam_search: 'beam search is not supported by this engine',
  length_penalty: 'beam search is not supported by this engine',
  skip_special_tokens: 'special tokens are always left out of the text',
  spaces_between_special_tokens: 'special tokens are always left out of the text',
  truncate_prompt_tokens: 'prompts are never truncated; a prompt too long is a 400',
  chat_template: 'the chat template comes from the checkpoint (tokenizer_config.json)',
  chat_template_kwargs: 'the chat template comes from the checkpoint (tokenizer_config.json)',
  add_generation_prompt: 'the generation prompt is always added',
  continue_final_message: 'the generation prompt is always added',
};

/**
 * Refuses fields outside `schema` before it is parsed: a known-unsupported one with its reason,
 * anything else as unknown (with the closest supported name when it looks like a typo).
 */
export function refuseUnknownFields(schema: z.ZodObject, body: Record<string, unknown>): void {
  const known = Object.keys(schema.shape);
  for (const k of Object.keys(body)) {
    if (known.includes(k)) continue;
    const reason = REFUSED[k];
    if (reason) throw kvcError(ERRORS.unsupported_field, `field \`${k}\`: ${reason}`);
    throw kvcError(ERRORS.unknown_field, `field \`${k}\`: unknown field${didYouMean(k, known)}; the supported fields are listed in docs/api.md`);
  }
}
