// The P2P holder query (LMCache's enable_p2p; docs/p2p.md): an engine's cache instance that
// misses a prefix asks the controller which OTHER instances hold the chunks that follow what it
// has, then pulls them from the best holder's peer port (FETCH, src/protocol/peer_frames.ts).
//
// Transport: the instance's monitor connection (src/protocol/monitor.ts), which the controller
// only serves for a registration authenticated with the deployment secret. The controller answers
// from its chunk index alone (no worker is asked), so the answer costs microseconds.
//   instance → controller  p2p_lookup  {id, keys}     keys: packed 8-byte keys, in prompt order,
//                                                     starting at the first chunk the asker lacks
//   controller → instance  p2p_holders {id, holders}  first the holders of the query's leading
//                                                     keys, best first (`chunks`: how many of them
//                                                     the holder has, ≥ 1); then the runs that
//                                                     continue the longest of those, in key order
//                                                     (`from`: the query index the run starts at;
//                                                     an instance can hold a prefix's later chunks
//                                                     without its head). Keys the asker holds
//                                                     itself are stepped over between runs.
// `peer_url` is the holder's distributed_url as it registered it (its advertised address), never
// a guess: the asker connects to exactly that.
import { z } from 'zod';

/** Most keys one query may carry (a prompt of 2,048 chunks). */
export const P2P_LOOKUP_MAX_KEYS = 2048;
/** Most holders one answer names for the leading keys (the alternatives if one fails). */
export const P2P_LEADING_HOLDERS = 4;
/** Most holders one answer names in all (leading alternatives and continuing runs). */
export const P2P_MAX_HOLDERS = 8;

export const p2pLookupMsgSchema = z.object({
  t: z.literal('p2p_lookup'),
  /** Chosen by the asker; echoed in the answer. */
  id: z.number().int().min(0),
  /** Packed keys: 8 bytes each, big-endian (as in the monitor's sync and ops messages). */
  keys: z
    .custom<Uint8Array>((u) => u instanceof Uint8Array, 'expected packed keys (binary)')
    .refine((u) => u.byteLength % 8 === 0 && u.byteLength >= 8 && u.byteLength <= P2P_LOOKUP_MAX_KEYS * 8, `expected 1 to ${P2P_LOOKUP_MAX_KEYS} packed 8-byte keys`),
});
export type P2pLookupMsg = z.infer<typeof p2pLookupMsgSchema>;

export const p2pHolderSchema = z.object({
  instance_id: z.string().min(1),
  /** host:port of the holder's peer port (its registered distributed_url). */
  peer_url: z.string().min(1),
  /** The holder's location with the longest run (the CPU tier on a tie). */
  location: z.string().min(1),
  /** Keys of the query the holder has, from `from` on. */
  chunks: z.number().int().min(1),
  /** Index of the query's key the run starts at; absent (0) for the holders of the leading keys. */
  from: z.number().int().min(1).optional(),
});
export type P2pHolder = z.infer<typeof p2pHolderSchema>;

export const p2pHoldersMsgSchema = z.object({
  t: z.literal('p2p_holders'),
  id: z.number().int().min(0),
  holders: z.array(p2pHolderSchema).max(P2P_MAX_HOLDERS),
});
export type P2pHoldersMsg = z.infer<typeof p2pHoldersMsgSchema>;
