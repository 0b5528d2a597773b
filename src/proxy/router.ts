// Where a request goes: which decoder serves it, whether it is disaggregated, and in which
// order the prefillers are tried. docs/routing.md describes the rules with their defaults.
//
// round-robin (the default): the decoder is the one that tokenized the request (decoders in
//   turn), prefillers in turn; every request is disaggregated unless the conditional flags say
//   otherwise.
// kv-aware: from the controller's index, each instance's cached prefix of the request's token
//   ids (`cached`), combined with the load the proxy has placed on it into one cost in tokens
//   of prefill work,
//       cost(x) = (prompt − cached(x)) + queued(x) + REQUEST_WEIGHT × in_flight(x)
//   where queued(x) is the uncached prompt tokens x still has to compute for requests in flight
//   and in_flight(x) its requests in flight. The lowest cost wins; equal costs rotate. A popular
//   prefix spreads because its holder's queued work and in-flight requests grow with every
//   request it takes: once they exceed what recomputing the prefix elsewhere costs, the next
//   request goes elsewhere (and that instance then holds the prefix too).
//
// Conditional disaggregation (both modes): the request goes straight to its decoder, which
// prefills locally, when the decoder's uncached part (prompt − cached(decoder)) is at most
// maxLocalPrefillTokens, or when every healthy prefiller has more than maxPrefillQueue prefill
// calls in flight; otherwise it is disaggregated. null disables a rule (round-robin's default).
import type { Backend, RoundRobin } from './backend.js';
import type { LoadBook } from './load.js';

export type RoutingMode = 'round-robin' | 'kv-aware';
export const ROUTING_MODES: readonly RoutingMode[] = ['round-robin', 'kv-aware'];

/**
 * Weight of one request in flight, in prompt tokens. A request in flight costs its backend
 * batch slots and decode steps beyond its prompt; 128 makes eight more requests in flight worth
 * recomputing a 1,024-token prefix, which bounds how far one holder's lead can grow.
 */
export const REQUEST_WEIGHT = 128;

/** Defaults of the conditional-disaggregation rules under kv-aware routing. */
export const KV_AWARE_DEFAULTS = { maxLocalPrefillTokens: 256, maxPrefillQueue: 8 } as const;

export interface RoutingOptions {
  mode: RoutingMode;
  /** Prefill on the decoder when its uncached part is at most this many tokens; null: never for this reason. */
  maxLocalPrefillTokens: number | null;
  /** Prefill on the decoder when every prefiller has more than this many prefills in flight; null: never for this reason. */
  maxPrefillQueue: number | null;
}

/** Why a request went to the instance that computes its prompt (label of kvc_proxy_routing_decisions_total). */
export type RouteReason = 'round_robin' | 'prefix_hit' | 'load_spread' | 'no_prefix' | 'lookup_failed';
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
  /** Uncached prompt tokens on the decoder. */
  decoderUncached: number;
  promptTokens: number;
  /** What the lookup said (null: no lookup). */
  cached: Record<string, number> | null;
}

export class Router {
  private rot = { prefiller: 0, decoder: 0 };

  constructor(
    readonly opts: RoutingOptions,
    private readonly prefillers: RoundRobin,
    private readonly decoders: RoundRobin,
    private readonly load: LoadBook,
    /** Backend → its kvc_instance_id (learnt from its /health), when known. */
    private readonly instanceOf: (b: Backend) => string | undefined,
  ) {}

  cachedOn(b: Backend, cached: Record<string, number> | null): number {
    if (!cached) return 0;
    const id = this.instanceOf(b);
    return id === undefined ? 0 : (cached[id] ?? 0);
  }

  cost(b: Backend, promptTokens: number, cached: Record<string, number> | null): number {
    const l = this.load.of(b);
    return promptTokens - this.cachedOn(b, cached) + l.queuedTokens + REQUEST_WEIGHT * l.inFlight;
  }

  /**
   * The healthy backends ordered by cost, lowest first; equal costs keep the rotation order,
   * which starts one past the previous winner of this role.
   */
  private byCost(role: 'prefiller' | 'decoder', all: readonly Backend[], promptTokens: number, cached: Record<string, number> | null): Backend[] {
    const n = all.length;
    const start = this.rot[role] % Math.max(1, n);
    const ranked: { b: Backend; c: number; i: number }[] = [];
    for (let k = 0; k < n; k++) {
      const b = all[(start + k) % n]!;
      if (b.up) ranked.push({ b, c: this.cost(b, promptTokens, cached), i: k });
    }
    ranked.sort((x, y) => x.c - y.c || x.i - y.i);
    if (ranked.length) this.rot[role] = (all.indexOf(ranked[0]!.b) + 1) % n;
    return ranked.map((r) => r.b);
  }

  route(r: RouteInput): Route {
    const kv = this.opts.mode === 'kv-aware';
    const { promptTokens, cached } = r;
    let decoder = r.tokenizer;
    if (kv) decoder = this.byCost('decoder', this.decoders.backends, promptTokens, cached)[0] ?? r.tokenizer;
    const decoderCached = this.cachedOn(decoder, cached);
    const decoderUncached = promptTokens - decoderCached;
    const prefillers = kv ? this.byCost('prefiller', this.prefillers.backends, promptTokens, cached) : this.prefillers.order();
    let where: PrefillWhere = 'remote';
    const { maxLocalPrefillTokens: maxLocal, maxPrefillQueue: maxQueue } = this.opts;
    if (prefillers.length === 0) where = 'local_no_prefiller';
    else if (maxLocal !== null && decoderUncached <= maxLocal) where = 'local_short_uncached';
    else if (maxQueue !== null && prefillers.every((p) => this.load.of(p).inFlight > maxQueue)) where = 'local_prefill_queue_full';
    const local = where !== 'remote';
    const computes = local ? decoder : prefillers[0]!;
    const cachedTokens = local ? decoderCached : this.cachedOn(computes, cached);
    let reason: RouteReason;
    if (!kv) reason = 'round_robin';
    else if (r.lookupFailed) reason = 'lookup_failed';
    else {
      // The best prefix any healthy instance holds: computing elsewhere than on it is a load decision.
      let best = 0;
      for (const b of this.prefillers.backends) if (b.up) best = Math.max(best, this.cachedOn(b, cached));
      for (const b of this.decoders.backends) if (b.up) best = Math.max(best, this.cachedOn(b, cached));
      reason = best === 0 ? 'no_prefix' : cachedTokens >= best ? 'prefix_hit' : 'load_spread';
    }
    return { decoder, prefillers: local ? [] : prefillers, where, reason, cachedTokens, decoderUncached, promptTokens, cached };
  }
}
