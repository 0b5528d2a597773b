// The fields of an engine's OpenAI request (POST /v1/completions, /v1/chat/completions) that the
// proxy (src/proxy) reads or rewrites, named once: the prompt fields it tokenizes and routes on,
// the answer-length fields it checks against the context before any prefill, and the fields of
// the answer's shape that a prefill request leaves to the decoder.

/** The answer-length fields, in the order the engine reads them (max_tokens first). */
export const MAX_TOKENS_FIELDS = ['max_tokens', 'max_completion_tokens'] as const;

/**
 * Fields of the client's body a prefill request leaves out or sets itself: the answer's shape is
 * the decoder's (it validates every field of the client's body); the prefiller computes the
 * prompt's KV as one sequence of one token. (`__proto__` is never copied.)
 */
export const PREFILL_DROPS: ReadonlySet<string> = new Set([
  '__proto__',
  ...MAX_TOKENS_FIELDS,
  'stream',
  'n',
  'kv_transfer_params',
  'stream_options',
  'best_of',
  'min_tokens',
  'echo',
  'logprobs',
  'top_logprobs',
]);

/** What a prefill request sets in place of the dropped fields. */
export const PREFILL_SETS = { max_tokens: 1, stream: false, n: 1 } as const;
