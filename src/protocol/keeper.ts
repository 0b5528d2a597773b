// Who keeps a disaggregated prompt's chunks (docs/storage.md "Who keeps a transferred chunk").
// A prefiller computes a prompt and sends its KV to the decoder; both then have the bytes, and
// one copy is enough for the deployment (the other instance fetches it by P2P when it needs it).
// The proxy (src/proxy/keeper.ts) names the keeper in the kv_transfer_params it sends to both:
//   `kvc_keeper: "prefiller"` (also when absent): the prefiller stores what it computed as its
//       own; the decoder stores the copies it received evict-first (peer_copy_admission);
//   `kvc_keeper: "decoder"`: the decoder stores the received chunks as its own, and the prefiller
//       does not store the chunks it computed once the transfer succeeded (when it failed, it
//       stores them as usual: no chunk is lost to the rule).
//   `kvc_keeper_split: N` (optional, a token position > 0): the prompt is longer than the named
//       keeper's tier can hold, so the chunks that start at token N or later are kept by the other
//       side instead, and each side stores only the chunks it keeps (no copy of the rest).
// Read by the engine's connector (src/engine/connector.ts); validated by the engine's request
// schema, so a bad value is refused naming the field.
import { z } from 'zod';

export const KEEPER_KEY = 'kvc_keeper';
export const KEEPERS = ['prefiller', 'decoder'] as const;
export type Keeper = (typeof KEEPERS)[number];

export const keeperSchema = z.enum(KEEPERS, `expected one of ${KEEPERS.join(', ')}`);

export const KEEPER_SPLIT_KEY = 'kvc_keeper_split';
export const keeperSplitSchema = z.number('expected a token position (an integer > 0)').int('expected a token position (an integer > 0)').positive('expected a token position (an integer > 0)');

/** The keeper kv_transfer_params name (validated at the engine's door); "prefiller" when absent. */
export function keeperOf(params: Record<string, unknown> | undefined): Keeper {
  return params?.[KEEPER_KEY] === 'decoder' ? 'decoder' : 'prefiller';
}

/** The token position from which the other side keeps the chunks (kvc_keeper_split), or null. */
export function keeperSplitOf(params: Record<string, unknown> | undefined): number | null {
  const v = params?.[KEEPER_SPLIT_KEY];
  return typeof v === 'number' && Number.isInteger(v) && v > 0 ? v : null;
}

/** Who keeps the chunk that starts at token `start`: the named keeper, or past the split the other side. */
export function keeperAt(params: Record<string, unknown> | undefined, start: number): Keeper {
  const k = keeperOf(params);
  const split = keeperSplitOf(params);
  return split !== null && start >= split ? (k === 'decoder' ? 'prefiller' : 'decoder') : k;
}
