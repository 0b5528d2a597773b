// Who keeps a disaggregated prompt's chunks (docs/storage.md "Who keeps a transferred chunk").
// A prefiller computes a prompt and sends its KV to the decoder; both then have the bytes, and
// one copy is enough for the deployment (the other instance fetches it by P2P when it needs it).
// The proxy (src/proxy/keeper.ts) names the keeper in the kv_transfer_params it sends to both:
//   `kvc_keeper: "prefiller"` (also when absent): the prefiller stores what it computed as its
//       own; the decoder stores the copies it received evict-first (peer_copy_admission);
//   `kvc_keeper: "decoder"`: the decoder stores the received chunks as its own, and the prefiller
//       does not store the chunks it computed once the transfer succeeded (when it failed, it
//       stores them as usual: no chunk is lost to the rule).
// Read by the engine's connector (src/engine/connector.ts); validated by the engine's request
// schema, so a bad value is refused naming the field.
import { z } from 'zod';

export const KEEPER_KEY = 'kvc_keeper';
export const KEEPERS = ['prefiller', 'decoder'] as const;
export type Keeper = (typeof KEEPERS)[number];

export const keeperSchema = z.enum(KEEPERS, `expected one of ${KEEPERS.join(', ')}`);

/** The keeper kv_transfer_params name (validated at the engine's door); "prefiller" when absent. */
export function keeperOf(params: Record<string, unknown> | undefined): Keeper {
  return params?.[KEEPER_KEY] === 'decoder' ? 'decoder' : 'prefiller';
}
