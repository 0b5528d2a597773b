// What the proxy checks of a client's request before any engine computes: the few fields it
// relies on (the prompt's form, `stream`, the answer length) and, once the decoder has counted
// the prompt's tokens, the context-length rule (src/protocol/context_limit.ts, the engine's own),
// so a request that cannot fit is refused before a prefiller spends a prefill on it. The engine
// validates every other field.
import { badRequest, ERRORS, kvcError } from '../common/errors.js';
import { answerLength, answerOverContext, promptOverContext } from '../protocol/context_limit.js';
import { MAX_TOKENS_FIELDS, PREFILL_DROPS, PREFILL_SETS } from '../protocol/engine_request.js';

export type Kind = 'completion' | 'chat';
const MAX_TOKEN_ID = 0xffff_ffff;
export const PATHS: Record<Kind, string> = { completion: '/v1/completions', chat: '/v1/chat/completions' };

const isIds = (p: unknown): p is number[] =>
  Array.isArray(p) && p.length > 0 && p.every((t) => Number.isInteger(t) && (t as number) >= 0);

/** One prompt per request: a string or token ids, also as a one-element list (OpenAI's batch form). */
export function promptForm(p: unknown): { text: string } | { ids: number[] } | null {
  if (typeof p === 'string') return { text: p };
  if (isIds(p)) return { ids: p };
  if (Array.isArray(p) && p.length === 1) {
    if (typeof p[0] === 'string') return { text: p[0] };
    if (isIds(p[0])) return { ids: p[0] };
  }
  return null;
}

/** Checks the few fields the proxy itself relies on; the engine validates the rest. */
export function checkRequest(kind: Kind, body: Record<string, unknown>): void {
  if (kind === 'completion') {
    const form = promptForm(body.prompt);
    if (form === null) throw badRequest('field `prompt`: expected a string or an array of token ids (one prompt per request)');
    // Chunk keys hash token ids as 32-bit words (src/common/keys.ts): a larger id has no key, so
    // it is refused here, by position, rather than routed blind (the engine would refuse it too).
    if ('ids' in form) {
      const i = form.ids.findIndex((t) => t > MAX_TOKEN_ID);
      if (i >= 0) {
        const at = Array.isArray(body.prompt) && Array.isArray(body.prompt[0]) ? `prompt[0][${i}]` : `prompt[${i}]`;
        throw badRequest(`field \`${at}\`: token id ${form.ids[i]} is out of range (token ids are below 2^32)`);
      }
    }
  } else if (!Array.isArray(body.messages) || body.messages.length === 0) {
    throw badRequest('field `messages`: expected a non-empty array of messages');
  }
  if (body.stream !== undefined && typeof body.stream !== 'boolean') throw badRequest('field `stream`: expected a boolean');
  // The proxy owns the prefill→decode transfer and writes kv_transfer_params itself; a client's
  // value would be replaced, so it is refused by name rather than dropped unseen.
  if (body.kv_transfer_params !== undefined) {
    throw badRequest('field `kv_transfer_params`: set by the proxy for the prefill→decode transfer; a client may not send it (send the request to an engine directly to use it)');
  }
  for (const f of MAX_TOKENS_FIELDS) {
    const v = body[f];
    if (v !== undefined && v !== null && !(Number.isInteger(v) && (v as number) >= 1)) {
      throw badRequest(`field \`${f}\`: expected an integer >= 1`);
    }
  }
}

/**
 * The engine's context rule on the decoder's token count: a prompt that leaves no room to
 * generate, or prompt + max_tokens beyond the context, is refused here, before any prefill.
 */
export function checkContext(kind: Kind, body: Record<string, unknown>, promptTokens: number, maxModelLen: number): void {
  const field = kind === 'chat' ? 'messages' : 'prompt';
  const msg = promptOverContext({ field, promptTokens, maxModelLen }) ?? answerOverContext({ field, promptTokens, maxModelLen, ...answerLength(kind, body) });
  if (msg) throw kvcError(ERRORS.context_length_exceeded, msg);
}

/**
 * The prefill request's body: the client's fields except those about the answer's shape (the
 * decoder's: it validates every field of the client's body), as one sequence of one token. Built
 * by copying the kept fields rather than spreading the body and deleting fields: a `delete`
 * turns the object into a dictionary, several times slower to build and to JSON.stringify, and
 * this is on every request's path.
 */
export function prefillBody(body: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const k in body) if (!PREFILL_DROPS.has(k)) out[k] = body[k];
  out.max_tokens = PREFILL_SETS.max_tokens;
  out.stream = PREFILL_SETS.stream;
  out.n = PREFILL_SETS.n;
  return out;
}
