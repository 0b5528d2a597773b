// The logprobs of generated tokens in the two OpenAI shapes: completions
// ({tokens, token_logprobs, top_logprobs, text_offset}) and chat ({content: [{token, logprob,
// bytes, top_logprobs}]}). One entry per token whose text is part of the answer (an EOS that
// ends generation is not shown, so it is not listed either).
import type { Tokenizer } from './model/tokenizer.js';
import type { TokenLogprob } from './sampler.js';

export interface LogprobEntry {
  lp: TokenLogprob;
  /** The token's text as it appears in the output (from the incremental decoder). */
  text: string;
  /** Where that text starts in the choice's text (completions' text_offset). */
  offset: number;
}

// JSON has no -Infinity: a token the model gives no chance at all is reported with the
// lowest finite float32 logprob, as OpenAI-compatible servers do.
const finite = (x: number) => (Number.isFinite(x) ? x : -9999);

/** How a token is named in logprobs: its text, or "token_id:<id>" (return_tokens_as_token_ids). */
export type TokenNamer = (id: number, text?: string) => string;

export function tokenNamer(tok: Tokenizer, asIds: boolean): TokenNamer {
  return asIds ? (id) => `token_id:${id}` : (id, text) => text ?? tok.tokenText(id);
}

export function completionLogprobs(entries: LogprobEntry[], name: TokenNamer) {
  return {
    tokens: entries.map((e) => name(e.lp.token, e.text)),
    token_logprobs: entries.map((e) => finite(e.lp.logprob)),
    // The sampled token is listed among the alternatives too (as vLLM does), so a client can
    // always find its own token there.
    top_logprobs: entries.map((e) => {
      const top: Record<string, number> = {};
      for (const t of e.lp.top) top[name(t.token)] ??= finite(t.logprob);
      top[name(e.lp.token, e.text)] ??= finite(e.lp.logprob);
      return top;
    }),
    text_offset: entries.map((e) => e.offset),
  };
}

const bytesOf = (s: string) => [...Buffer.from(s, 'utf8')];

export function chatLogprobs(entries: LogprobEntry[], name: TokenNamer) {
  return {
    content: entries.map((e) => ({
      token: name(e.lp.token, e.text),
      logprob: finite(e.lp.logprob),
      bytes: bytesOf(name(e.lp.token, e.text)),
      top_logprobs: e.lp.top.map((t) => {
        const s = name(t.token);
        return { token: s, logprob: finite(t.logprob), bytes: bytesOf(s) };
      }),
    })),
  };
}
