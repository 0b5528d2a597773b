// Where a request goes: which decoder serves it, whether it is disaggregated, and in which
// order the prefillers are tried. docs/routing.md describes the rules with their defaults.
//
// round-robin (the default): the decoder is the one that tokenized the request (decoders in
//   turn), prefillers in turn; every request is disaggregated unless the conditional flags say
//   otherwise.
// kv-aware: from the controller's index, each instance's cached prefix of the request's token
//   ids (`cached`), combined with the load the proxy has placed on it into one cost in tokens
//   of prefill work,
//       work(x) = (prompt − best) + f(x) × (best − cached(x))
//       cost(x) = work(x) + queued(x) + REQUEST_WEIGHT × in_flight(x)
//   where best is the longest prefix any healthy instance holds, f(x) = P2P_FETCH_WEIGHT when x
//   fetches what it lacks from its peers (its /health says kvc_p2p) and 1 otherwise (it would
//   recompute those tokens), queued(x) the work x still has to do for requests in flight and
//   in_flight(x) its requests in flight. The lowest cost wins; equal costs rotate. A popular
//   prefix spreads because its holder's queued work and in-flight requests grow with every
//   request it takes: once they exceed what fetching (or, without P2P, recomputing) the prefix
//   elsewhere costs, the next request goes elsewhere (and that instance then holds it too).
//
// Conditional disaggregation (both modes): the request goes straight to its decoder, which
// prefills locally, when the part of the prompt the decoder itself lacks is at most
// maxLocalPrefillTokens (kv-aware: and the decoder's cost, its load included, is no higher than
// the first prefiller's), or when every healthy prefiller has more than maxPrefillQueue prefill
// calls in flight; otherwise it is disaggregated, and under kv-aware its decoder is the one that
// receives the KV cheapest (receiveCost: what it lacks at P2P_FETCH_WEIGHT, plus its load). What the decoder could fetch by P2P counts as
// lacking here (unlike in the cost): a decoder that fetches a prefix and computes on it shares
// its CPU with decoding, while a prefiller that holds it (or fetches it) does not (measured:
// docs/history.md, Routing, "Local prefill only of what the decoder holds"). null disables a rule
// (round-robin's default).
import type { Backend, RoundRobin } from './backend.js';
import type { LoadBook } from './load.js';

import { KV_AWARE_DEFAULTS, ROUTING_MODES } from '../common/flags.js';

export type RoutingMode = (typeof ROUTING_MODES)[number];
// The modes and kv-aware's defaults are settings of `kvc proxy` (src/common/flags.ts).
export { KV_AWARE_DEFAULTS, ROUTING_MODES };

/**
 * Weight of one request in flight, in prompt tokens. A request in flight costs its backend
 * batch slots and decode steps beyond its prompt; 128 makes eight more requests in flight worth
 * recomputing a 1,024-token prefix, which bounds how far one holder's lead can grow.
 */
export const REQUEST_WEIGHT = 128;

/**
 * What fetching a prompt token from a peer (P2P) costs, as a fraction of computing it. Measured
 * with `npm run bench -- routing`: a 1,024-token prefix fetched by P2P gave a TTFT of 0.14 ×
 * recomputing it on the built-in model (rounded up: the fetch also stores the chunks).
 */
export const P2P_FETCH_WEIGHT = 0.15;

/**
 * The anti-hot-spot rule: of the last SHARE_WINDOW kv-aware decisions, an instance that computed
 * at least HOT_SHARE × its fair share (1 / the number of healthy instances that can compute a
 * prompt, prefillers and decoders) is passed over while another can take the request. Cache
 * affinity alone sends every request of a popular tenant to its holder whenever that holder is
 * idle, which at a moderate rate is almost always, so the load terms never see it; 1.5 keeps every
 * instance well under twice its fair share while leaving affinity free below that.
 */
export const SHARE_WINDOW = 32;
export const HOT_SHARE = 1.5;


export interface RoutingOptions {
  mode: RoutingMode;
  /** Prefill on the decoder when its uncached part is at most this many tokens; null: never for this reason. */
  maxLocalPrefillTokens: number | null;
  /** Prefill on the decoder when every prefiller has more than this many prefills in flight; null: never for this reason. */
  maxPrefillQueue: number | null;
}

/** Why a request went to the instance that computes its prompt (label of kvc_proxy_routing_decisions_total). */
export type RouteReason = 'round_robin' | 'prefix_hit' | 'p2p_fetch' | 'load_spread' | 'share_cap' | 'no_prefix' | 'lookup_failed';
/** Where its prompt is computed and why (label of kvc_proxy_prefills_total). */
export type PrefillWhere = 'remote' | 'local_short_uncached' | 'local_prefill_queue_full' | 'local_no_prefiller';

export interface RouteInput {
  /** Prompt length in tokens. */
  promptTokens: number;
  /** The decoder that tokenized the request (round-robin's decoder). */
  tokenizer: Backend;
  /** kvc_instance_id → cached prefix tokens, from the controller; null when the lookup was not made or failed. */
  cached: Record<string, number> | null;
  lookupFailed: boolean;
}

export interface Route {
  decoder: Backend;
  /** Prefillers to try in order; empty when the decoder prefills locally. */
  prefillers: Backend[];
  where: PrefillWhere;
  reason: RouteReason;
  /** Cached prefix tokens of the instance that computes the prompt (first prefiller, or the decoder). */
  cachedTokens: number;
  /**
   * The decoder's prefill work in tokens: its uncached part, with what it can fetch by P2P priced
   * at P2P_FETCH_WEIGHT under kv-aware (round-robin: the plain uncached part).
   */
  decoderUncached: number;
  /** The longest prefix any healthy instance holds (0 without a lookup). */
  best: number;
  promptTokens: number;
  /** What the lookup said (null: no lookup). */
  cached: Record<string, number> | null;
}

export class Router {
  private rot = { prefiller: 0, decoder: 0 };
  /** The instances that computed the last SHARE_WINDOW kv-aware decisions (a ring), and their counts. */
  private readonly recent: (Backend | undefined)[] = new Array<Backend | undefined>(SHARE_WINDOW);
  private recentAt = 0;
  private readonly recentCount = new Map<Backend, number>();

  constructor(
    readonly opts: RoutingOptions,
    private readonly prefillers: RoundRobin,
    private readonly decoders: RoundRobin,
    private readonly load: LoadBook,
    /** Backend → its kvc_instance_id (learnt from its /health), when known. */
    private readonly instanceOf: (b: Backend) => string | undefined,
    /** Backend → whether its cache instance fetches what it lacks by P2P (its /health), when known. */
    private readonly p2pOf: (b: Backend) => boolean = () => false,
  ) {}

  cachedOn(b: Backend, cached: Record<string, number> | null): number {
    if (!cached) return 0;
    const id = this.instanceOf(b);
    return id === undefined ? 0 : (cached[id] ?? 0);
  }

  /** The longest prefix any healthy instance holds. */
  best(cached: Record<string, number> | null): number {
    if (!cached) return 0;
    let best = 0;
    for (const b of this.prefillers.backends) if (b.up) best = Math.max(best, this.cachedOn(b, cached));
    for (const b of this.decoders.backends) if (b.up) best = Math.max(best, this.cachedOn(b, cached));
    return best;
  }

  /**
   * Prefill work of the request on `b`, in tokens: what it computes, plus what it fetches from a
   * peer at P2P_FETCH_WEIGHT per token when it fetches by P2P (else those tokens are computed).
   */
  work(b: Backend, promptTokens: number, cached: Record<string, number> | null, best: number): number {
    const own = this.cachedOn(b, cached);
    const fetchable = this.p2pOf(b) && best > own ? best - own : 0;
    return promptTokens - own - fetchable + P2P_FETCH_WEIGHT * fetchable;
  }

  cost(b: Backend, promptTokens: number, cached: Record<string, number> | null, best = this.best(cached)): number {
    const l = this.load.of(b);
    return this.work(b, promptTokens, cached, best) + l.queuedTokens + REQUEST_WEIGHT * l.inFlight;
  }

  /**
   * The healthy backends ordered by cost, lowest first; equal costs keep the rotation order,
   * which starts one past the previous winner of this role.
   */
  private byCost(role: 'prefiller' | 'decoder', all: readonly Backend[], promptTokens: number, cached: Record<string, number> | null, best: number): Backend[] {
    const n = all.length;
    const start = this.rot[role] % Math.max(1, n);
    const ranked: { b: Backend; c: number; i: number }[] = [];
    for (let k = 0; k < n; k++) {
      const b = all[(start + k) % n]!;
      if (b.up) ranked.push({ b, c: this.cost(b, promptTokens, cached, best), i: k });
    }
    ranked.sort((x, y) => x.c - y.c || x.i - y.i);
    if (ranked.length) this.rot[role] = (all.indexOf(ranked[0]!.b) + 1) % n;
    return ranked.map((r) => r.b);
  }

  /** The instance computed at least HOT_SHARE × its fair share of the recent decisions. */
  hot(b: Backend): boolean {
    let n = 0;
    for (const x of this.prefillers.backends) if (x.up) n++;
    for (const x of this.decoders.backends) if (x.up) n++;
    return n > 1 && (this.recentCount.get(b) ?? 0) >= (HOT_SHARE * SHARE_WINDOW) / n;
  }

  /** How many of the last SHARE_WINDOW kv-aware decisions each instance computed (only those with any). */
  recentShares(): Map<Backend, number> {
    return new Map([...this.recentCount].filter(([, n]) => n > 0));
  }

  /**
   * Forgets the routing memory: the share window (every instance back under its share) and the
   * rotation of equal costs (the scan starts at the first instance of each role again). What is in
   * flight (the load book) is real work and stays. Returns how many decisions were forgotten.
   */
  forget(): number {
    let n = 0;
    for (const c of this.recentCount.values()) n += c;
    this.recent.fill(undefined);
    this.recentAt = 0;
    this.recentCount.clear();
    this.rot = { prefiller: 0, decoder: 0 };
    return n;
  }

  private remember(b: Backend): void {
    const old = this.recent[this.recentAt];
    if (old) this.recentCount.set(old, this.recentCount.get(old)! - 1);
    this.recent[this.recentAt] = b;
    this.recentAt = (this.recentAt + 1) % SHARE_WINDOW;
    this.recentCount.set(b, (this.recentCount.get(b) ?? 0) + 1);
  }

  /** Stable partition: instances under their share first (in cost order), then the hot ones. */
  private coolFirst(ranked: Backend[]): Backend[] {
    const cool = ranked.filter((b) => !this.hot(b));
    return cool.length === ranked.length || cool.length === 0 ? ranked : [...cool, ...ranked.filter((b) => this.hot(b))];
  }

  /**
   * Cost of `b` as the decoder of a disaggregated request: it receives by xfer the prompt's KV it
   * lacks (priced as a fetch, P2P_FETCH_WEIGHT a token) and computes nothing, plus its load. A
   * decoder holding the prompt still wins when the decoders are equally loaded (it is sent less);
   * one that is busy prefilling or decoding for others is passed over for one that is not.
   */
  receiveCost(b: Backend, promptTokens: number, cached: Record<string, number> | null): number {
    const l = this.load.of(b);
    return P2P_FETCH_WEIGHT * (promptTokens - this.cachedOn(b, cached)) + l.queuedTokens + REQUEST_WEIGHT * l.inFlight;
  }

  route(r: RouteInput): Route {
    const kv = this.opts.mode === 'kv-aware';
    const { promptTokens, cached } = r;
    const best = this.best(cached);
    const ranked = kv ? this.byCost('prefiller', this.prefillers.backends, promptTokens, cached, best) : this.prefillers.order();
    const prefillers = kv ? this.coolFirst(ranked) : ranked;
    const { maxLocalPrefillTokens: maxLocal, maxPrefillQueue: maxQueue } = this.opts;
    /** Short enough for decoder `d` to prefill locally: what it lacks itself (see the top). */
    const couldBeLocal = (d: Backend) => maxLocal !== null && promptTokens - this.cachedOn(d, cached) <= maxLocal;
    let decoder = r.tokenizer;
    let capped = false;
    /** The cheapest decoder, when the share rule passed it over. */
    let passedOver: Backend | undefined;
    let where: PrefillWhere = 'remote';
    if (kv) {
      // The decoder that would prefill the prompt: the cheapest by the cost, under its share.
      const byWork = this.byCost('decoder', this.decoders.backends, promptTokens, cached, best);
      const cool = this.coolFirst(byWork);
      capped = cool[0] !== byWork[0];
      if (capped) passedOver = byWork[0];
      decoder = cool[0] ?? r.tokenizer;
      const p0 = prefillers[0];
      const shortHere = couldBeLocal(decoder);
      /** The share rule declines local prefill on a decoder over its share while a prefiller under its share can take it. */
      const shareDeclines = p0 !== undefined && this.hot(decoder) && !this.hot(p0);
      if (!p0) where = 'local_no_prefiller';
      // Local prefill when it is short, the share rule allows it, and the decoder with its load
      // costs no more than the first prefiller with its own: a decoder busy with other requests'
      // prefills or decode steps leaves the prompt to a less loaded prefiller (every step it spends
      // on a prompt delays its streams' tokens, other requests' first tokens included).
      else if (shortHere && !shareDeclines && this.cost(decoder, promptTokens, cached, best) <= this.cost(p0, promptTokens, cached, best)) where = 'local_short_uncached';
      else if (maxQueue !== null && prefillers.every((p) => this.load.of(p).inFlight > maxQueue)) where = 'local_prefill_queue_full';
      if (where === 'remote') {
        // share_cap when the share rule changed where the prompt is computed: the cheapest
        // prefiller was passed over, or a decoder that would have prefilled it locally was.
        capped = prefillers[0] !== ranked[0] || (shortHere && shareDeclines) || (passedOver !== undefined && couldBeLocal(passedOver));
        // Disaggregated: the decoder only receives, so it is ranked on receiving and its load.
        const recv = this.coolFirst(this.decoders.backends.filter((b) => b.up).sort((x, y) => this.receiveCost(x, promptTokens, cached) - this.receiveCost(y, promptTokens, cached)));
        if (recv[0] && this.receiveCost(recv[0], promptTokens, cached) < this.receiveCost(decoder, promptTokens, cached)) decoder = recv[0];
      }
    } else {
      if (prefillers.length === 0) where = 'local_no_prefiller';
      else if (couldBeLocal(decoder)) where = 'local_short_uncached';
      else if (maxQueue !== null && prefillers.every((p) => this.load.of(p).inFlight > maxQueue)) where = 'local_prefill_queue_full';
    }
    const decoderCached = this.cachedOn(decoder, cached);
    // The decoder's work for this request (what it lacks, fetchable tokens priced as a fetch under
    // kv-aware): its queued tokens if it prefills. Whether it prefills locally is decided on what
    // it lacks, fetchable or not (see the top).
    const decoderUncached = kv ? this.work(decoder, promptTokens, cached, best) : promptTokens - decoderCached;
    const local = where !== 'remote';
    const computes = local ? decoder : prefillers[0]!;
    if (kv) this.remember(computes);
    const cachedTokens = local ? decoderCached : this.cachedOn(computes, cached);
    let reason: RouteReason;
    if (!kv) reason = 'round_robin';
    else if (r.lookupFailed) reason = 'lookup_failed';
    else {
      // Computing elsewhere than on the best holder is a load decision; with P2P the rest is fetched.
      // share_cap: the cheapest instance was passed over by the anti-hot-spot rule.
      reason = best === 0 ? 'no_prefix' : capped ? 'share_cap' : cachedTokens >= best ? 'prefix_hit' : this.p2pOf(computes) ? 'p2p_fetch' : 'load_spread';
    }
    return { decoder, prefillers: local ? [] : prefillers, where, reason, cachedTokens, decoderUncached, best, promptTokens, cached };
  }
}
