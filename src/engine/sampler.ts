// Token sampling from one row of logits, with the logits processors OpenAI and vLLM clients
// use. Order, as in vLLM: logit_bias, min_tokens (stop ids masked), repetition penalty (prompt
// and output tokens), frequency and presence penalties (output tokens), then temperature,
// min_p, top_k and top_p over the resulting distribution.
//
// Greedy (temperature 0, or top_k 1) is an argmax of the processed logits with the lowest
// index winning ties, so it is exactly reproducible and, since every step only reads this
// request's own row and history, independent of what else is in the batch. With a temperature
// the request's own PRNG (seeded from `seed` when given) drives the draw: the same seed gives
// the same tokens whatever else the engine is running at the time.
//
// Logprobs are those of the model's own distribution (a log-softmax of the raw logits, before
// any processor or temperature), as vLLM reports them by default.
import { argmaxJs } from './model/kernels/kernel.js';

export interface SamplingParams {
  temperature: number;
  topP: number;
  /** 0 or negative: no top-k cut. */
  topK: number;
  seed: number | null;
  /** Keep tokens whose probability is at least min_p times the top one's (0: off). */
  minP?: number;
  presencePenalty?: number;
  frequencyPenalty?: number;
  /** 1: off. > 1 discourages tokens already in the prompt or output. */
  repetitionPenalty?: number;
  /** token id → bias added to its logit. */
  logitBias?: ReadonlyMap<number, number> | null;
  /** These ids cannot be sampled before `minTokens` tokens were generated. */
  minTokens?: number;
  minTokensStopIds?: ReadonlySet<number>;
  /** null: no logprobs; k >= 0: the sampled token's logprob and the k most likely alternatives. */
  logprobs?: number | null;
}

export interface TokenLogprob {
  token: number;
  logprob: number;
  /** The `logprobs` most likely tokens at this step, most likely first (ties by id). */
  top: { token: number; logprob: number }[];
}

/** splitmix32-style generator: tiny, fast, and good enough for sampling. */
export class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0;
  }
  /** Uniform in [0, 1). */
  next(): number {
    this.s = (this.s + 0x9e3779b9) >>> 0;
    let z = this.s;
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
    z = (z ^ (z >>> 16)) >>> 0;
    return z / 4294967296;
  }
}

/** log-softmax of x at every index in `ids` (float64 sums). */
function logSoftmaxAt(x: Float32Array): (id: number) => number {
  let max = -Infinity;
  for (let i = 0; i < x.length; i++) if (x[i]! > max) max = x[i]!;
  let sum = 0;
  for (let i = 0; i < x.length; i++) sum += Math.exp(x[i]! - max);
  const norm = max + Math.log(sum);
  return (id) => x[id]! - norm;
}

/** The k largest entries of x, largest first, ties by lower index (k is small: <= 20). */
export function topIndices(x: Float32Array, k: number): number[] {
  const out: number[] = [];
  if (k <= 0) return out;
  for (let i = 0; i < x.length; i++) {
    const v = x[i]!;
    if (out.length === k && v <= x[out[k - 1]!]!) continue;
    let j = out.length < k ? out.length : k - 1;
    while (j > 0 && x[out[j - 1]!]! < v) j--;
    out.splice(j, 0, i);
    if (out.length > k) out.pop();
  }
  return out;
}

export class Sampler {
  private readonly rng: Rng;
  /** How often each token was generated so far (frequency / presence penalties). */
  private readonly counts = new Map<number, number>();
  /** Prompt tokens, for the repetition penalty (null when it is off). */
  private readonly promptSet: Set<number> | null;
  private readonly processes: boolean;
  private work: Float32Array | null = null;
  private generated = 0;
  /** Logprobs of the token the last sample() returned (when `logprobs` was asked for). */
  last: TokenLogprob | null = null;
  /** Sum of the sampled tokens' logprobs (when `logprobs` was asked for). */
  cumulativeLogprob = 0;

  constructor(
    readonly params: SamplingParams,
    prompt: readonly number[] = [],
  ) {
    const seed = params.seed ?? Math.floor(Math.random() * 0x100000000);
    this.rng = new Rng(seed);
    const rep = params.repetitionPenalty ?? 1;
    this.promptSet = rep !== 1 ? new Set(prompt) : null;
    this.processes =
      rep !== 1 ||
      (params.presencePenalty ?? 0) !== 0 ||
      (params.frequencyPenalty ?? 0) !== 0 ||
      (params.logitBias?.size ?? 0) > 0 ||
      ((params.minTokens ?? 0) > 0 && (params.minTokensStopIds?.size ?? 0) > 0);
  }

  get greedy(): boolean {
    return this.params.temperature === 0 || this.params.topK === 1;
  }

  /** `fastArgmax`: a kernel's argmax with argmaxJs's answer (the engine passes the model's SIMD one). */
  sample(logits: Float32Array, fastArgmax: (x: Float32Array) => number = argmaxJs): number {
    const x = this.processes ? this.process(logits) : logits;
    const token = this.greedy ? (x === logits ? fastArgmax(x) : argmaxJs(x)) : this.draw(x);
    const k = this.params.logprobs;
    if (k !== null && k !== undefined) {
      const lp = logSoftmaxAt(logits);
      const logprob = lp(token);
      this.last = { token, logprob, top: topIndices(logits, k).map((t) => ({ token: t, logprob: lp(t) })) };
      this.cumulativeLogprob += logprob;
    }
    // Only the penalties read the counts (and they turn `processes` on).
    if (this.processes) this.counts.set(token, (this.counts.get(token) ?? 0) + 1);
    this.generated++;
    return token;
  }

  /** A copy of the logits with bias, min_tokens and penalties applied (the model's row is left as is). */
  private process(logits: Float32Array): Float32Array {
    const p = this.params;
    if (!this.work || this.work.length !== logits.length) this.work = new Float32Array(logits.length);
    const x = this.work;
    x.set(logits);
    const n = x.length;
    if (p.logitBias) for (const [id, b] of p.logitBias) if (id < n) x[id] = x[id]! + b;
    if (this.generated < (p.minTokens ?? 0) && p.minTokensStopIds) for (const id of p.minTokensStopIds) if (id < n) x[id] = -Infinity;
    const rep = p.repetitionPenalty ?? 1;
    if (rep !== 1) {
      // vLLM's (CTRL's) rule: divide a positive logit, multiply a negative one.
      const seen = new Set(this.promptSet);
      for (const t of this.counts.keys()) seen.add(t);
      for (const t of seen) if (t < n) x[t] = x[t]! > 0 ? x[t]! / rep : x[t]! * rep;
    }
    const fp = p.frequencyPenalty ?? 0;
    const pp = p.presencePenalty ?? 0;
    if (fp !== 0 || pp !== 0) for (const [t, c] of this.counts) if (t < n) x[t] = x[t]! - fp * c - pp;
    return x;
  }

  private draw(logits: Float32Array): number {
    const { temperature, topP, topK } = this.params;
    const minP = this.params.minP ?? 0;
    const n = logits.length;
    // Softmax with temperature, in float64 for stable sums.
    let max = -Infinity;
    for (let i = 0; i < n; i++) if (logits[i]! > max) max = logits[i]!;
    const probs = new Float64Array(n);
    let sum = 0;
    for (let i = 0; i < n; i++) {
      const p = Math.exp((logits[i]! - max) / temperature);
      probs[i] = p;
      sum += p;
    }
    if (minP > 0) {
      // The top token has probability 1/sum (its unnormalised weight is exp(0) = 1).
      const floor = minP;
      sum = 0;
      for (let i = 0; i < n; i++) {
        if (probs[i]! < floor) probs[i] = 0;
        sum += probs[i]!;
      }
    }
    const needCut = topP < 1 || (topK > 0 && topK < n);
    if (!needCut) {
      let r = this.rng.next() * sum;
      let lastNonZero = 0;
      for (let i = 0; i < n; i++) {
        if (probs[i]! > 0) lastNonZero = i;
        r -= probs[i]!;
        if (r < 0) return i;
      }
      return lastNonZero;
    }
    // Nucleus / top-k: order candidates by probability (ties by index, for determinism),
    // keep the smallest prefix whose mass reaches top_p (and at most top_k of them).
    const order = Array.from({ length: n }, (_, i) => i);
    order.sort((a, b) => probs[b]! - probs[a]! || a - b);
    const limit = topK > 0 ? Math.min(topK, n) : n;
    let kept = 0;
    let mass = 0;
    while (kept < limit && probs[order[kept]!]! > 0) {
      mass += probs[order[kept]!]!;
      kept++;
      if (mass >= topP * sum) break;
    }
    let r = this.rng.next() * mass;
    for (let j = 0; j < kept; j++) {
      r -= probs[order[j]!]!;
      if (r < 0) return order[j]!;
    }
    return order[kept - 1]!;
  }
}
