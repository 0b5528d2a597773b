// Request schemas of /v1/completions and /v1/chat/completions. Unknown fields are ignored
// (clients send many optional ones); known fields are type-checked and every violation becomes
// a 400 that names the field. Features this engine does not implement (n > 1, logprobs,
// penalties, echo, suffix, tools) are refused explicitly rather than silently ignored.
import { z } from 'zod';
import { tokenIds } from '../../common/validate.js';
import { kvTransferParamsSchema } from '../../protocol/disagg_spec.js';
import { chatMessages } from './messages.schema.js';

const tokenList = tokenIds.min(1, 'expected at least one token id');

const samplingFields = {
  model: z.string('expected a string').optional(),
  max_tokens: z.number('expected an integer').int('expected an integer').min(1, 'expected an integer >= 1').nullish(),
  temperature: z.number('expected a number').min(0, 'expected a number in [0, 2]').max(2, 'expected a number in [0, 2]').nullish(),
  top_p: z.number('expected a number').gt(0, 'expected a number in (0, 1]').max(1, 'expected a number in (0, 1]').nullish(),
  top_k: z.number('expected an integer').int('expected an integer').min(-1, 'expected -1 (off) or a positive integer').nullish(),
  seed: z.number('expected an integer').int('expected an integer').nullish(),
  stop: z.union([z.string(), z.array(z.string('expected a string')).max(16, 'expected at most 16 stop strings')], 'expected a string or an array of strings').nullish(),
  stop_token_ids: z.array(z.number().int('expected an integer token id').min(0)).nullish(),
  ignore_eos: z.boolean('expected a boolean').nullish(),
  stream: z.boolean('expected a boolean').nullish(),
  stream_options: z.object({ include_usage: z.boolean('expected a boolean').nullish() }, 'expected an object').nullish(),
  n: z.literal(1, 'only n = 1 is supported').nullish(),
  presence_penalty: z.literal(0, 'penalties are not supported (expected 0)').nullish(),
  frequency_penalty: z.literal(0, 'penalties are not supported (expected 0)').nullish(),
  kv_transfer_params: kvTransferParamsSchema.nullish(),
  user: z.string('expected a string').nullish(),
};

export const completionRequest = z.object({
  ...samplingFields,
  prompt: z.union([z.string(), tokenList, z.tuple([z.string()]), z.tuple([tokenList])], 'expected a string or an array of token ids (one prompt per request)'),
  logprobs: z.null('logprobs are not supported').optional(),
  echo: z.literal(false, 'echo is not supported').nullish(),
  best_of: z.literal(1, 'best_of > 1 is not supported').nullish(),
  suffix: z.null('suffix is not supported').optional(),
});
export type CompletionRequest = z.infer<typeof completionRequest>;

export const chatRequest = z.object({
  ...samplingFields,
  messages: chatMessages,
  max_completion_tokens: z.number('expected an integer').int('expected an integer').min(1, 'expected an integer >= 1').nullish(),
  logprobs: z.literal(false, 'logprobs are not supported').nullish(),
  tools: z.array(z.unknown()).max(0, 'tools are not supported').nullish(),
});
export type ChatRequest = z.infer<typeof chatRequest>;
