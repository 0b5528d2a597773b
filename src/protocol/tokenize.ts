// The answer of an engine's POST /tokenize (src/engine/routes/tokenize.ts), as the proxy
// (src/proxy/flow.ts) reads it before a disaggregated request: the token count of the prompt and
// the model's context length, so a prompt longer than the context is refused with a 400 before
// any prefill work. `count` may exceed `max_model_len`: a client may ask how long a text is.
import { z } from 'zod';

const count = z.number().int().min(0);

export const tokenizeReplySchema = z.object({
  tokens: z.array(count),
  count,
  max_model_len: count,
});
export type TokenizeReply = z.infer<typeof tokenizeReplySchema>;

/** The part of the reply the proxy reads, per request: checking every token id there would cost for nothing. */
export const tokenizeLengthSchema = tokenizeReplySchema.pick({ count: true, max_model_len: true });
