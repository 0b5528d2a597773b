// The context-length rule of a generation request, written once for the engine
// (src/engine/routes/prompt_rules.ts) and the proxy (src/proxy/request_rules.ts), so a request
// over the context gets the same code (`context_length_exceeded`) and the same message whichever
// process refuses it. The proxy applies it to the decoder's token count before any prefill.

/** Generation needs prompt < max_model_len; /tokenize only refuses what is beyond max_model_len. */
export const GEN_LIMIT = 'leaving no room to generate';

export interface ContextUse {
  /** The prompt's field (`prompt` or `messages`). */
  field: string;
  promptTokens: number;
  /** The answer-length field the client set, and its value; null when it set none. */
  maxField: string;
  maxTokens: number | null;
  maxModelLen: number;
}

/** The prompt alone leaves no room to generate: the message, or null. */
export function promptOverContext(u: Pick<ContextUse, 'field' | 'promptTokens' | 'maxModelLen'>): string | null {
  if (u.promptTokens < u.maxModelLen) return null;
  return `field \`${u.field}\`: the prompt has ${u.promptTokens} tokens; this model's maximum context length is ${u.maxModelLen} tokens, ${GEN_LIMIT}`;
}

/** Prompt + max_tokens beyond the context: the message, or null. */
export function answerOverContext(u: ContextUse): string | null {
  if (u.maxTokens === null || u.promptTokens + u.maxTokens <= u.maxModelLen) return null;
  return `field \`${u.maxField}\`: ${u.maxTokens} tokens requested with a ${u.promptTokens}-token prompt; this model's maximum context length is ${u.maxModelLen} tokens`;
}

/** Which answer-length field a request sets (chat: max_completion_tokens wins over max_tokens, as in the engine). */
export function answerLength(kind: 'completion' | 'chat', body: Record<string, unknown>): { maxField: string; maxTokens: number | null } {
  const mct = body.max_completion_tokens;
  if (kind === 'chat' && typeof mct === 'number') return { maxField: 'max_completion_tokens', maxTokens: mct };
  const mt = body.max_tokens;
  return { maxField: 'max_tokens', maxTokens: typeof mt === 'number' ? mt : null };
}
