// The agreement measures of the KV quality benchmarks (bench/_kv_quality.ts says what is compared
// with what): top-1, KL(P_ref ‖ P_cand), greedy prefix, and where the flips are — a candidate's
// argmax differs from the reference's choice a only where its perturbation max_j (Δ_j − Δ_a)
// (Δ = cand − ref logits) exceeds the reference's top-1 − top-2 gap. Pure arithmetic over logits,
// shared with the unit test that checks it (test/unit/kv_quality_metrics.test.ts).

/** The reference on one prompt: its greedy continuation and the distribution before each token (as logits). */
export interface Reference {
  prompt: number[];
  tokens: number[];
  logits: Float32Array[];
}

export function argmaxOf(x: ArrayLike<number>): number {
  let a = 0;
  for (let i = 1; i < x.length; i++) if (x[i]! > x[a]!) a = i;
  return a;
}

/**
 * How decided the reference's greedy choices are: the gap between its largest and second-largest
 * logit at each position (a random-weight model's are nearly flat, so a tiny change of the KV
 * flips the argmax where the gap is tiny). Median gap, and the share of positions under 0.05.
 */
export function referenceMargins(refs: Reference[]): { medianGap: number; under005: number } {
  const gaps = refs.flatMap((r) => r.logits.map(top2Gap)).sort((x, y) => x - y);
  return { medianGap: gaps[Math.floor(gaps.length / 2)]!, under005: gaps.filter((g) => g < 0.05).length / gaps.length };
}

/** log Σ exp(x), in f64. */
function logSumExp(x: ArrayLike<number>): number {
  let m = -Infinity;
  for (let i = 0; i < x.length; i++) if (x[i]! > m) m = x[i]!;
  let s = 0;
  for (let i = 0; i < x.length; i++) s += Math.exp(x[i]! - m);
  return m + Math.log(s);
}

/** KL(P ‖ Q) in nats for P and Q given as logits (or log-probabilities) over the same vocabulary. */
export function klDivergence(p: ArrayLike<number>, q: ArrayLike<number>): number {
  const lp = logSumExp(p);
  const lq = logSumExp(q);
  let kl = 0;
  for (let i = 0; i < p.length; i++) {
    const a = p[i]! - lp;
    const pa = Math.exp(a);
    if (pa > 0) kl += pa * (a - (q[i]! - lq));
  }
  return Math.max(0, kl);
}

/** The largest minus the second-largest of x. */
export function top2Gap(x: ArrayLike<number>): number {
  let a = -Infinity;
  let b = -Infinity;
  for (let i = 0; i < x.length; i++) {
    const v = x[i]!;
    if (v > a) (b = a), (a = v);
    else if (v > b) b = v;
  }
  return a - b;
}

/**
 * How far a candidate's logits moved against the reference's choice `a`: max_j (Δ_j − Δ_a), with
 * Δ = cand − ref. The candidate's argmax differs from `a` exactly when this exceeds the reference's
 * lead of `a` over some token, so a position flips only if it exceeds the top-1 − top-2 gap: the
 * flips are where the perturbation (the representation's) outgrows the gap (the model's).
 */
export function perturbation(ref: ArrayLike<number>, cand: ArrayLike<number>, a: number): number {
  let m = -Infinity;
  for (let j = 0; j < ref.length; j++) {
    const d = cand[j]! - ref[j]!;
    if (d > m) m = d;
  }
  return m - (cand[a]! - ref[a]!);
}

/** Upper edges of the reference-gap classes top-1 is broken down by (logits; the last class is open). */
export const GAP_EDGES = [0.05, 0.2, 0.5, 1] as const;

const quantile = (sorted: number[], q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;

/** The agreement of one candidate with the reference, accumulated position by position. */
export class Tally {
  positions = 0;
  top1 = 0;
  klSum = 0;
  klMax = 0;
  prompts = 0;
  identical = 0;
  private prefixSum = 0;
  /** Per prompt under way (a batch interleaves its prompts' steps): reference tokens matched before its first difference so far. */
  private readonly prefix = new Map<Reference, number>();
  /** Per position: the reference's top-1 − top-2 gap, the candidate's perturbation, and whether the argmax agreed. */
  private readonly gaps: number[] = [];
  private readonly moves: number[] = [];
  private readonly agreed: boolean[] = [];

  /** The candidate's distribution before reference token `step` of a prompt (steps in order from 0). */
  add(ref: Reference, step: number, cand: ArrayLike<number>): void {
    if (step === 0) this.prefix.set(ref, 0);
    const same = argmaxOf(cand) === ref.tokens[step];
    const kl = klDivergence(ref.logits[step]!, cand);
    this.positions++;
    if (same) this.top1++;
    this.klSum += kl;
    if (kl > this.klMax) this.klMax = kl;
    this.gaps.push(top2Gap(ref.logits[step]!));
    this.moves.push(perturbation(ref.logits[step]!, cand, ref.tokens[step]!));
    this.agreed.push(same);
    const before = this.prefix.get(ref)!;
    if (before === step) this.prefix.set(ref, same ? step + 1 : step);
    if (step === ref.tokens.length - 1) {
      const n = this.prefix.get(ref)!;
      this.prompts++;
      this.prefixSum += n;
      if (n === ref.tokens.length) this.identical++;
      this.prefix.delete(ref);
    }
  }

  /** Top-1 over the positions whose reference gap passes `keep`, and their share of all positions. */
  private top1Where(keep: (gap: number) => boolean): { share: number; top1: number } {
    let n = 0;
    let same = 0;
    for (let i = 0; i < this.gaps.length; i++) {
      if (!keep(this.gaps[i]!)) continue;
      n++;
      if (this.agreed[i]) same++;
    }
    return { share: n / this.gaps.length, top1: n ? same / n : NaN };
  }

  summary(): QualityFigures {
    const moves = [...this.moves].sort((x, y) => x - y);
    const p99 = quantile(moves, 0.99);
    const edges = [0, ...GAP_EDGES, Infinity];
    return {
      top1: this.top1 / this.positions,
      meanKl: this.klSum / this.positions,
      maxKl: this.klMax,
      greedyIdentical: this.identical,
      prompts: this.prompts,
      greedyMeanPrefix: this.prefixSum / this.prompts,
      perturbation: { p50: quantile(moves, 0.5), p99 },
      byGap: edges.slice(1).map((hi, i) => ({ from: edges[i]!, to: hi, ...this.top1Where((g) => g >= edges[i]! && g < hi) })),
      beyondP99: this.top1Where((g) => g > p99),
    };
  }
}

export interface QualityFigures {
  /** Share of positions whose argmax is the reference's token. */
  top1: number;
  /** Mean and largest KL(P_ref ‖ P_cand) over the positions, nats. */
  meanKl: number;
  maxKl: number;
  /** Prompts whose whole greedy continuation is the reference's, of `prompts`. */
  greedyIdentical: number;
  prompts: number;
  /** Mean tokens generated before the first difference (the continuation's length when identical). */
  greedyMeanPrefix: number;
  /** The candidate's perturbation of the reference's choice (see perturbation()): median and 99th percentile, logits. */
  perturbation: { p50: number; p99: number };
  /** Top-1 per class of the reference's top-1 − top-2 gap [from, to) and the class's share of the positions. */
  byGap: { from: number; to: number; share: number; top1: number }[];
  /** Top-1 over the positions whose reference gap exceeds the candidate's own 99th-percentile perturbation, and their share. */
  beyondP99: { share: number; top1: number };
}
