// `kv_transfer_params` and its `disagg_spec`: what the proxy (src/proxy/flow.ts) adds to the
// requests it sends to a prefiller and a decoder, naming the decoder's xfer receiver. The
// prefiller's xfer sender (src/xfer/sender.ts, through src/xfer/engine_plugin.ts) validates it
// once, with `parseDisaggSpec`, before any byte moves; the decoder reads `req_id` from it to find
// what it received. The prefiller answers with its own kv_transfer_params (e.g. `xfer` results),
// which the proxy forwards to the decoder beside the same disagg_spec.
import { z } from 'zod';
import { KEEPER_KEY, KEEPER_SPLIT_KEY, keeperSchema, keeperSplitSchema } from './keeper.js';
import { PROMPT_IDS_KEY, promptIdsSchema } from './prompt_ids.js';

const PORT = 'expected a port between 1 and 65535';
const port = () => z.number(PORT).int(PORT).min(1, PORT).max(65535, PORT);

export const disaggSpecSchema = z.object(
  {
    req_id: z.string('expected a non-empty string').min(1, 'expected a non-empty string'),
    receiver_host: z.string('expected a host name').min(1, 'expected a host name'),
    receiver_init_port: port(),
    receiver_alloc_port: port(),
  },
  'expected an object',
);
export type DisaggSpec = z.infer<typeof disaggSpecSchema>;

/**
 * The key a prefiller adds to the kv_transfer_params it answers with: how many of the prompt's
 * tokens it loaded from its cache (KV reused from an earlier request) rather than computed. The
 * decoder counts those of the transferred tokens as cached (usage.prompt_tokens_details).
 */
export const REUSED_TOKENS = 'reused_tokens';

/** The prefiller's reused-token count in kv_transfer_params (0 when absent or not a count). */
export function reusedTokens(params: Record<string, unknown> | undefined): number {
  const v = params?.[REUSED_TOKENS];
  return typeof v === 'number' && Number.isInteger(v) && v > 0 ? v : 0;
}

/**
 * kv_transfer_params: an object; `disagg_spec` is the one key the transfer reads, `kvc_keeper`
 * and `kvc_keeper_split` (src/protocol/keeper.ts) and `kvc_prompt_token_ids` (src/protocol/prompt_ids.ts)
 * are checked here, others pass through.
 */
export const kvTransferParamsSchema = z.record(z.string(), z.unknown(), 'expected an object').superRefine((v, ctx) => {
  for (const [key, schema] of [[KEEPER_KEY, keeperSchema], [KEEPER_SPLIT_KEY, keeperSplitSchema], [PROMPT_IDS_KEY, promptIdsSchema]] as const) {
    if (v[key] === undefined) continue;
    const r = schema.safeParse(v[key]);
    if (!r.success) ctx.addIssue({ code: 'custom', path: [key, ...r.error.issues[0]!.path], message: r.error.issues[0]!.message });
  }
});
export type KvTransferParams = Record<string, unknown> & { disagg_spec?: DisaggSpec };

export type DisaggSpecResult = { ok: true; spec: DisaggSpec } | { ok: false; error: string };

/**
 * The one validation of a disagg_spec: returns the spec, or an error naming the bad field
 * (`kv_transfer_params.disagg_spec.receiver_init_port: expected a port between 1 and 65535`).
 */
export function parseDisaggSpec(v: unknown): DisaggSpecResult {
  const r = disaggSpecSchema.safeParse(v);
  if (r.success) return { ok: true, spec: r.data };
  const issue = r.error.issues[0]!;
  const field = ['kv_transfer_params', 'disagg_spec', ...issue.path.map(String)].join('.');
  return { ok: false, error: `${field}: ${issue.message}` };
}

/** kv_transfer_params naming `spec`, on top of `extra` (the prefiller's own params, forwarded to the decoder). */
export function kvTransferParams(spec: DisaggSpec, extra?: Record<string, unknown> | null): KvTransferParams {
  return { ...(extra ?? {}), disagg_spec: spec };
}

/** The request id a decoder looks its received chunks up by, when the params carry a usable one. */
export function transferReqId(params: Record<string, unknown> | undefined): string | undefined {
  const spec = params?.disagg_spec as { req_id?: unknown } | undefined;
  return typeof spec?.req_id === 'string' && spec.req_id ? spec.req_id : undefined;
}
