// Token sampling from one row of logits. Greedy (temperature 0) is a plain argmax with the
// lowest index winning ties, so it is exactly reproducible. With a temperature the request's
// own PRNG (seeded from `seed` when given) drives the draw: the same seed gives the same
// tokens whatever else the engine is running at the time.
import { argmaxJs } from './model/kernel.js';

export interface SamplingParams {
  temperature: number;
  topP: number;
  /** 0 or negative: no top-k cut. */
  topK: number;
  seed: number | null;
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

export class Sampler {
  private readonly rng: Rng;
  constructor(readonly params: SamplingParams) {
    const seed = params.seed ?? Math.floor(Math.random() * 0x100000000);
    this.rng = new Rng(seed);
  }

  get greedy(): boolean {
    return this.params.temperature === 0 || this.params.topK === 1;
  }

  /** `fastArgmax`: a kernel's argmax with argmaxJs's answer (the engine passes the model's SIMD one). */
  sample(logits: Float32Array, fastArgmax: (x: Float32Array) => number = argmaxJs): number {
    if (this.greedy) return fastArgmax(logits);
    const { temperature, topP, topK } = this.params;
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
    const needCut = topP < 1 || (topK > 0 && topK < n);
    if (!needCut) {
      let r = this.rng.next() * sum;
      for (let i = 0; i < n; i++) {
        r -= probs[i]!;
        if (r < 0) return i;
      }
      return n - 1;
    }
    // Nucleus / top-k: order candidates by probability (ties by index, for determinism),
    // keep the smallest prefix whose mass reaches top_p (and at most top_k of them).
    const order = Array.from({ length: n }, (_, i) => i);
    order.sort((a, b) => probs[b]! - probs[a]! || a - b);
    const limit = topK > 0 ? Math.min(topK, n) : n;
    let kept = 0;
    let mass = 0;
    while (kept < limit) {
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
