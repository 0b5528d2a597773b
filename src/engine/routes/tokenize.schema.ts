// Request schemas of /tokenize ({prompt} or {messages}) and /detokenize.
import { z } from 'zod';
import { tokenIds } from '../../common/validate.js';
import { chatMessages } from './messages.schema.js';

export const tokenizePromptRequest = z.object({
  model: z.string('expected a string').optional(),
  prompt: z.string('expected a string'),
  add_special_tokens: z.boolean('expected a boolean').optional(),
});

export const tokenizeChatRequest = z.object({
  model: z.string('expected a string').optional(),
  messages: chatMessages,
});

export const detokenizeRequest = z.object({
  model: z.string('expected a string').optional(),
  tokens: tokenIds,
});
