// What a cache instance reports with each heartbeat (monitor protocol `hb {stats}`): its usage per
// location and, when it lives in an engine, a snapshot of the engine's own Prometheus counters.
// The controller keeps the latest usage per worker and a bounded history of engine samples; its
// dashboard (GET /) turns consecutive samples into hit-rate and TTFT charts.
//
// Engine figures are cumulative since the engine started (counters), so a reader takes
// differences between samples; a decrease means the engine restarted.
import { z } from 'zod';
import { MISS_REASONS } from './ledger.js';

const count = (what: string) => z.number(`expected a number (${what})`).nonnegative(`expected a non-negative number (${what})`);
/** Counts by ledger reason (src/protocol/ledger.ts); reasons with none may be left out. */
export const computedChunksSchema = z.partialRecord(z.enum(MISS_REASONS), count('computed chunks'));

export const locationUsageSchema = z.object({
  /** Bytes of the chunks stored (headers included). */
  bytes: count('bytes'),
  capacity_bytes: count('capacity_bytes'),
  chunks: count('chunks'),
  pinned: count('pinned'),
});
export type LocationUsage = z.infer<typeof locationUsageSchema>;

export const engineSampleSchema = z.object({
  /** Prompt tokens of admitted requests (kvc_engine_prompt_tokens_total). */
  prompt_tokens: count('prompt_tokens'),
  /**
   * Prompt tokens looked up in the cache instance (kvc_cache_query_tokens_total): counted when the
   * lookup happens, like cached_tokens, so the two make a hit rate over any interval.
   */
  query_tokens: count('query_tokens'),
  /** Prompt tokens whose KV came from the cache instance (kvc_cache_hit_tokens_total). */
  cached_tokens: count('cached_tokens'),
  /** Prompt tokens whose KV came from a prefiller's transfer. */
  transferred_tokens: count('transferred_tokens'),
  generation_tokens: count('generation_tokens'),
  /** Sum and count of kvc_engine_time_to_first_token_seconds. */
  ttft_sum_seconds: count('ttft_sum_seconds'),
  ttft_count: count('ttft_count'),
  requests_running: count('requests_running'),
  requests_waiting: count('requests_waiting'),
  kv_usage_ratio: count('kv_usage_ratio'),
  /** Prompt chunks computed, by why they were not reused (kvc_engine_computed_chunks_total; docs/ledger.md). */
  computed_chunks: computedChunksSchema.optional(),
});
export type EngineSample = z.infer<typeof engineSampleSchema>;

export const instanceStatsSchema = z.object({
  locations: z.record(z.string(), locationUsageSchema),
  engine: engineSampleSchema.optional(),
});
export type InstanceStats = z.infer<typeof instanceStatsSchema>;
