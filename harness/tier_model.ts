// A model of a deployment's CPU tiers replaying a trace window (harness/trace_model.ts), to see
// what keeps a cluster of per-instance LRU tiers from one pooled LRU cache of the same size and
// what a storage rule changes, without processes or timing (`node dist/bench/_trace_policy.js`,
// docs/routing.md "Replaying request traces").
//
// The model: P prefillers and D decoders, each with an LRU tier of `perTier` chunks. A request's
// decoder is the one holding the longest prefix of it (ties rotate), likewise its prefiller; it is
// prefilled on the decoder when the decoder lacks at most `maxLocalChunks` chunks, else on the
// prefiller. It reuses the longest leading run of chunks held anywhere (P2P brings what the
// computing instance lacks) and computes the rest (at least its last token, as the engines do).
// Then every chunk of the prompt is used head last: a chunk held somewhere is refreshed where it
// is held (the computing instance's copy first); a chunk held nowhere is stored on the keeper:
//   'prefiller': the instance that computed the prompt (a decoder's received copies are only
//                evict-first duplicates, so not counted);
//   'room':      a prompt prefilled on its decoder stays there; a disaggregated one goes to the one
//                of its prefiller and decoder whose least recently used chunk is older (a tier
//                with room counts as oldest; ties: the prefiller): src/proxy/keeper.ts.
import { promptTokens, type ReplayRequest } from './trace_model.js';

export type KeeperPolicy = 'prefiller' | 'room';

export interface TierModelOptions {
  prefillers: number;
  decoders: number;
  perTier: number;
  maxLocalChunks: number;
  keeper: KeeperPolicy;
}

export interface TierModelResult {
  sent: number;
  computed: number;
  /** Chunks stored on each instance (prefillers first). */
  stored: number[];
}

export function modelTiers(reqs: readonly ReplayRequest[], o: TierModelOptions): TierModelResult {
  const n = o.prefillers + o.decoders;
  if (o.decoders < 1 || o.prefillers < 0 || !(o.perTier >= 1)) throw new Error('tier model: expected at least one decoder and tiers of at least one chunk');
  // Each tier: chunk → last use (a Map iterates oldest first).
  const tiers = Array.from({ length: n }, () => new Map<string, number>());
  const stored = new Array<number>(n).fill(0);
  const rot = { p: 0, d: 0 };
  let clock = 0;
  let sent = 0;
  let computed = 0;
  const held = (k: string) => tiers.findIndex((t) => t.has(k));
  const prefixOn = (r: ReplayRequest, j: number) => {
    let c = 0;
    while (c < r.chunks.length && tiers[j]!.has(r.chunks[c]!)) c++;
    return c;
  };
  const pick = (r: ReplayRequest, first: number, count: number, role: 'p' | 'd') => {
    let best = -1;
    let at = first;
    for (let k = 0; k < count; k++) {
      const j = first + ((rot[role] + k) % count);
      const c = prefixOn(r, j);
      if (c > best) [best, at] = [c, j];
    }
    rot[role] = (at - first + 1) % count;
    return at;
  };
  /** Last use of the tier's LRU chunk; -1 while it has room. */
  const tail = (j: number) => (tiers[j]!.size < o.perTier ? -1 : tiers[j]!.values().next().value!);
  for (const r of reqs) {
    const d = pick(r, o.prefillers, o.decoders, 'd');
    const local = o.prefillers === 0 || r.chunks.length - prefixOn(r, d) <= o.maxLocalChunks;
    const x = local ? d : pick(r, 0, o.prefillers, 'p');
    let run = 0;
    while (run < r.chunks.length && held(r.chunks[run]!) >= 0) run++;
    let reused = 0;
    for (let c = 0; c < run; c++) reused += r.chunkTokens[c]!;
    const total = promptTokens(r);
    sent += total;
    computed += Math.max(1, total - reused);
    const keeper = o.keeper === 'room' && !local && tail(d) < tail(x) ? d : x;
    for (let c = r.chunks.length - 1; c >= 0; c--) {
      const k = r.chunks[c]!;
      const h = tiers[x]!.has(k) ? x : held(k);
      const at = h >= 0 ? h : keeper;
      if (h < 0) stored[at]!++;
      const t = tiers[at]!;
      t.delete(k);
      t.set(k, ++clock);
      while (t.size > o.perTier) t.delete(t.keys().next().value!);
    }
  }
  return { sent, computed, stored };
}
