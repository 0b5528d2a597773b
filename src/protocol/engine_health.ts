// An engine's GET /health answer. The proxy's health loop reads it to learn which cache
// instance (kvc_instance_id, the name the controller's index uses) serves behind each backend
// address, so kv-aware routing needs no second list of names that could disagree with the
// engines' own configuration. Sender: the engine (src/engine/routes/status.ts); receiver: the
// proxy (src/proxy/server.ts). Engines without a cache instance answer `kvc_instance_id: null`.
// `kvc_p2p` says whether the instance fetches what it lacks from its peers; `max_model_len` is the
// model's context length.
import { z } from 'zod';
import { computedChunksSchema } from './instance_stats.js';

export const keySettingsSchema = z.object({
  model_id: z.string(),
  chunk_size: z.number().int().min(1),
  /** PYTHONHASHSEED, decimal. */
  seed: z.string(),
  kv_dtype: z.string(),
});
export type KeySettings = z.infer<typeof keySettingsSchema>;

export const engineHealthSchema = z.object({
  status: z.literal('ok'),
  kvc_instance_id: z.string().min(1).nullable().optional(),
  /**
   * True when the engine's cache instance fetches chunks it lacks from other instances (P2P,
   * docs/p2p.md): kv-aware routing then prices a prefix another instance holds as a fetch, not a
   * recompute. Absent (older engines) counts as false.
   */
  kvc_p2p: z.boolean().optional(),
  /**
   * The model's context length: the proxy refuses a token-id prompt that cannot fit before any
   * prefill (a text prompt's length comes with its /tokenize answer). Absent: not checked there.
   */
  max_model_len: z.number().int().min(1).optional(),
  /**
   * The engine's hit-rate ledger so far: prompt chunks it computed, by reason (docs/ledger.md).
   * The proxy adds the differences between probes into kvc_proxy_computed_chunks_total and its
   * statistics line. Absent on an engine without a cache connector.
   */
  kvc_computed_chunks: computedChunksSchema.optional(),
  /**
   * What the engine's chunk keys and chunks depend on. The controller refuses an instance whose
   * settings differ from the deployment's; the proxy compares each engine's with the controller's
   * GET /deployment and routes no cache affinity to one that differs (docs/controller.md "Registration").
   */
  kvc_key_settings: keySettingsSchema.optional(),
  /**
   * The room its CPU tier has for chunks it would keep (docs/storage.md "Who keeps a transferred
   * chunk"): `free_bytes` without evicting a chunk it keeps that is still in use (`free_tokens`:
   * the prompt tokens that room holds in whole chunks; `capacity_tokens`: those the whole tier
   * holds), `tail_age_ms` since the next such chunk to
   * go was last used (null: none in use). The proxy picks from it
   * which of a prefiller and its decoder keeps a disaggregated prompt's chunks. Absent without a
   * CPU tier.
   */
  kvc_room: z.object({ free_bytes: z.number().min(0), free_tokens: z.number().int().min(0), capacity_tokens: z.number().int().min(0).optional(), tail_age_ms: z.number().min(0).nullable() }).optional(),
});
export type EngineHealth = z.infer<typeof engineHealthSchema>;
