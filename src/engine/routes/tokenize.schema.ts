// Request schemas of /tokenize ({prompt} or {messages}) and /detokenize. Strict: an unknown field
// is a 400 naming it.
import { z } from 'zod';
import { tokenIds } from '../../common/validate.js';
import { chatMessages } from './messages.schema.js';

export const tokenizePromptRequest = z.strictObject({
  model: z.string('expected a string').optional(),
  prompt: z.string('expected a string'),
  add_special_tokens: z.boolean('expected a boolean').optional(),
});

export const tokenizeChatRequest = z.strictObject({
  model: z.string('expected a string').optional(),
  messages: chatMessages,
  add_special_tokens: z.boolean('expected a boolean').optional(),
});

export const detokenizeRequest = z.strictObject({
  model: z.string('expected a string').optional(),
  tokens: tokenIds,
});
