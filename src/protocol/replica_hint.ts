// Replica hints (docs/storage.md "Replica-aware eviction"): the controller tells a cache instance
// which of its chunks another instance of the deployment also holds, and which of them it now
// holds as the last copy, so that its eviction takes duplicates before chunks that exist nowhere
// else. The controller learns both from the admit/evict ops every instance reports.
//
// Transport: the instance's monitor connection (src/protocol/monitor.ts).
//   controller → instance  replicas {location, keys, held_elsewhere}
//     keys            packed 8-byte keys (as in sync and ops) of chunks in `location`
//     held_elsewhere  one byte per key, in the same order: 1 = another instance holds it too
//                     (evict it before chunks this instance alone holds), 0 = this instance holds
//                     the last copy (evict it by plain recency again)
// Hints are applied in order (a key may appear twice in one message: the later one wins). A hint
// is advice: one that names a chunk the instance no longer holds is ignored, and a hint that is
// lost only makes eviction less well informed, never wrong.
import { z } from 'zod';

/** Most keys one hint message carries (the controller splits longer batches). */
export const REPLICA_HINT_MAX_KEYS = 65_536;

const packed = z.custom<Uint8Array>((u) => u instanceof Uint8Array, 'expected packed keys (binary)');

export const replicaHintMsgSchema = z
  .object({
    t: z.literal('replicas'),
    location: z.string().min(1),
    keys: packed.refine((u) => u.byteLength % 8 === 0 && u.byteLength <= REPLICA_HINT_MAX_KEYS * 8, `expected at most ${REPLICA_HINT_MAX_KEYS} packed 8-byte keys`),
    held_elsewhere: packed,
  })
  .refine((m) => m.held_elsewhere.byteLength * 8 === m.keys.byteLength, { message: 'expected one held_elsewhere byte per key', path: ['held_elsewhere'] });
export type ReplicaHintMsg = z.infer<typeof replicaHintMsgSchema>;
