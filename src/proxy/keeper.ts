// Which of a prefiller and its decoder keeps a disaggregated prompt's chunks (the rule:
// docs/storage.md "Who keeps a transferred chunk"; the message: src/protocol/keeper.ts).
//
// Both instances have the chunks once the transfer is done; the deployment needs one copy (the
// other instance fetches it by P2P if it ever needs it). Kept always on the prefiller, the
// decoders' tiers hold copies of what the prefillers hold, and each prefiller's tier turns over
// with every prompt it computes while the decoders' hold older duplicates: measured on the trace
// replay, 23-39 % of all the tiers' chunks were duplicates, and the pooled-LRU bound was missed by
// a fifth. So the chunks go where the room is least in demand, as one LRU cache over both tiers
// would place them: the instance whose tier can take them without evicting a chunk it keeps that
// is still in use, else the one whose next such chunk to go was used longest ago.
import type { Keeper } from '../protocol/keeper.js';

/** A tier's room as its engine's /health reports it (kvc_room). */
export interface Room {
  free_bytes: number;
  /** The prompt tokens free_bytes holds in whole chunks. */
  free_tokens: number;
  /** The prompt tokens the whole tier holds in whole chunks (absent: never split onto it). */
  capacity_tokens?: number | undefined;
  tail_age_ms: number | null;
}

/** The keeper of a disaggregated prompt, and where the other side's part starts (null: none). */
export interface KeeperChoice {
  keeper: Keeper;
  split: number | null;
}

/**
 * The keeper of a `promptTokens` prompt computed on a prefiller with room `p` and sent to a
 * decoder with room `d`: the prefiller while its tier has room for the prompt (or either room is
 * unknown), else the decoder when its tier has room for it or its oldest chunk in use was used
 * longer ago than the prefiller's. Ties keep the prefiller (the rule of an idle deployment).
 */
export function chooseKeeper(promptTokens: number, p: Room | undefined, d: Room | undefined): Keeper {
  if (!p || !d || p.free_tokens >= promptTokens) return 'prefiller';
  if (d.free_tokens >= promptTokens) return 'decoder';
  // Nothing in use at all is the oldest room there is.
  const age = (r: Room) => r.tail_age_ms ?? Number.POSITIVE_INFINITY;
  return age(d) > age(p) ? 'decoder' : 'prefiller';
}

/**
 * The keeper by chooseKeeper(), and a split when the prompt is longer than the keeper's whole
 * tier: a tier can hold a prompt's leading chunks only up to its size (a prompt never evicts its
 * own chunks), so without a split the tail would be stored nowhere, while one pooled cache of
 * both tiers' size keeps it. The head then goes to the side that already holds more of the
 * prompt (`held`: the leading tokens each holds per the controller's index; the prefiller on a
 * tie or when unknown, else the keeper by room), which keeps the chunks that start before its
 * tier's size in tokens, and the other side those that start at or after it. Only when both
 * tiers' sizes are known and the other side has one.
 */
export function chooseKeeperSplit(promptTokens: number, p: Room | undefined, d: Room | undefined, held?: { p: number; d: number }): KeeperChoice {
  let keeper = chooseKeeper(promptTokens, p, d);
  const fits = (r: Room | undefined) => r?.capacity_tokens !== undefined && r.capacity_tokens > 0 && promptTokens <= r.capacity_tokens;
  if (fits(keeper === 'prefiller' ? p : d)) return { keeper, split: null };
  if (held && held.p !== held.d) keeper = held.p > held.d ? 'prefiller' : 'decoder';
  const [mine, other] = keeper === 'prefiller' ? [p, d] : [d, p];
  const at = mine?.capacity_tokens;
  if (at === undefined || !(at > 0) || promptTokens <= at || !((other?.capacity_tokens ?? 0) > 0)) return { keeper, split: null };
  return { keeper, split: at };
}
