// The hit-rate ledger (docs/ledger.md): for every request, the prompt tokens the proxy's router
// predicted cached on the engine it chose, the tokens that engine actually reused, and one reason
// for every prompt chunk that was computed.
//
// Who knows what:
//   - the engine that computed the prompt knows which chunks it reused and which it computed, and
//     for a computed chunk whether it was the prompt's partial last one (`partial`) or a chunk it
//     found under the right key but stored with another KV layout (`mismatch`);
//   - the controller knows where every chunk is held now (its index) and which keys were stored
//     anywhere before (a bounded history, STORED_HISTORY_KEYS), so it names the reason of every
//     other computed chunk: `stale_index` (its index says the computing instance holds it),
//     `not_fetched` (another instance holds it), `evicted` (stored before, held nowhere now),
//     `cold` (never stored, as far as the history reaches).
// Messages, on the engine's monitor connection (src/protocol/monitor.ts):
//   instance → controller  miss_lookup  {id, keys}     packed keys of the computed chunks
//   controller → instance  miss_reasons {id, reasons}  one reason code per key (MISS_CODES)
// Between proxy and engines, in kv_transfer_params: `kvc_predicted_cached_tokens` (proxy → the
// engine that computes) and `kvc_ledger` (the prefiller's ledger, returned with its params and
// forwarded by the proxy to the decoder, which answers it in usage.kvc).
import { z } from 'zod';

export const MISS_REASONS = ['cold', 'evicted', 'not_fetched', 'stale_index', 'mismatch', 'partial', 'unexplained'] as const;
export type MissReason = (typeof MISS_REASONS)[number];
/** The reasons the controller answers, by code (index). */
export const MISS_CODES: readonly MissReason[] = ['cold', 'evicted', 'not_fetched', 'stale_index'];

/** Keys the controller remembers as "stored before" (two generations; docs/ledger.md). */
export const STORED_HISTORY_KEYS = 1 << 21;

export const missLookupMsgSchema = z.object({
  t: z.literal('miss_lookup'),
  id: z.number().int().min(0),
  keys: z
    .custom<Uint8Array>((u) => u instanceof Uint8Array, 'expected packed keys (binary)')
    .refine((u) => u.byteLength % 8 === 0 && u.byteLength >= 8 && u.byteLength <= 4096 * 8, 'expected 1 to 4096 packed 8-byte keys'),
});
export type MissLookupMsg = z.infer<typeof missLookupMsgSchema>;

export const missReasonsMsgSchema = z.object({
  t: z.literal('miss_reasons'),
  id: z.number().int().min(0),
  /** One code per key of the query, an index into MISS_CODES. */
  reasons: z.custom<Uint8Array>((u) => u instanceof Uint8Array, 'expected one byte per key'),
});
export type MissReasonsMsg = { t: 'miss_reasons'; id: number; reasons: Uint8Array };

/** Computed chunks by reason; reasons with none are left out. */
export type ReasonCounts = Partial<Record<MissReason, number>>;

/** `usage.kvc` of a response (docs/ledger.md). */
export interface KvcLedger {
  /** Tokens the proxy's router predicted cached on the engine that computed the prompt (null: not routed with a lookup). */
  predicted_cached_tokens: number | null;
  /** Prompt tokens that engine reused from a cache (its tiers and P2P), not computed. */
  reused_tokens: number;
  /** Prompt tokens it computed. */
  computed_tokens: number;
  /** Computed chunks by reason. */
  computed_chunks: ReasonCounts;
  /** The instance that computed the prompt. */
  instance: string | null;
}

const counts = z.partialRecord(z.enum(MISS_REASONS), z.number().int().min(0));
export const kvcLedgerSchema = z.object({
  predicted_cached_tokens: z.number().int().min(0).nullable(),
  reused_tokens: z.number().int().min(0),
  computed_tokens: z.number().int().min(0),
  computed_chunks: counts,
  instance: z.string().nullable(),
});

/** The proxy's prediction from kv_transfer_params, if one was given (anything else: null). */
export function predictedOf(params: Record<string, unknown> | undefined): number | null {
  const v = params?.kvc_predicted_cached_tokens;
  return typeof v === 'number' && Number.isInteger(v) && v >= 0 ? v : null;
}

/** The prefiller's ledger forwarded in kv_transfer_params, if well formed. */
export function forwardedLedger(params: Record<string, unknown> | undefined): KvcLedger | null {
  const r = kvcLedgerSchema.safeParse(params?.kvc_ledger);
  return r.success ? (r.data as KvcLedger) : null;
}
