// The prompt's token ids, carried in kv_transfer_params from the proxy to the engines it sends a
// text prompt to (`kvc_prompt_token_ids`). The proxy has a text prompt tokenized once, by the
// engine it asks for the count (src/proxy/flow.ts: a prefiller when the deployment has one), and
// hands the ids to the prefiller and to the decoder: neither tokenizes the text again, so a long
// document costs a decoder no tokenizer CPU beside its streams (a 3,000-token text is 75–100 ms
// of it). The ids are what the engine's own tokenizer gave for this request's text (completions:
// the prompt with the request's add_special_tokens; chat: the rendered template), so the answer
// is the same either way; the text still serves `echo`. An engine given ids uses them as the
// prompt after the checks a prompt of ids gets (vocabulary, context); a malformed value is
// refused naming the field (src/protocol/disagg_spec.ts validates it at the engine's door).
import { z } from 'zod';

export const PROMPT_IDS_KEY = 'kvc_prompt_token_ids';

const ID = 'expected a non-empty array of token ids (integers >= 0)';
export const promptIdsSchema = z.array(z.number(ID).int(ID).min(0, ID), ID).min(1, ID);

/** The prompt ids kv_transfer_params carry (already validated by the request schema), if any. */
export function promptIdsOf(params: Record<string, unknown> | null | undefined): number[] | undefined {
  const v = params?.[PROMPT_IDS_KEY];
  return Array.isArray(v) && v.length > 0 ? (v as number[]) : undefined;
}
