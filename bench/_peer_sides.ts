// The two engines as `npm run bench -- peer` times them (bench/peer.ts): kvc's model and llama.cpp
// through node-llama-cpp, each behind the same prefill / decode / greedy calls, and the helpers
// every timed figure shares (a full GC and an idle pause before it).
import { LlamaModel, type Segment } from '../src/engine/model/model.js';
import type { LlamaCtx, LlamaModelH } from './_peer_setup.js';

export const DECODE_STEPS = 64;
/** A llama.cpp decode run stops after this long (its rate is then taken over the steps done). */
export const PEER_RUN_CAP_MS = 30_000;

// ---- checkpoints ---------------------------------------------------------------------------------

/** Whether two engines gave the same token ids. */
export const sameIds = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((x, i) => x === b[i]);

// ---- measurements --------------------------------------------------------------------------------

export const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
export const prompt = (n: number, salt: number) => [1, ...Array.from({ length: n - 1 }, (_, i) => 1000 + ((i * 7919 + salt * 104729) % 30000))];
export const now = () => performance.now();
// A full collection before every timed region, on both sides: each kvc run allocates a fresh KV
// cache (external memory), and without this V8's external-memory-pressure mark-compact of the
// previous runs' caches lands inside the timed forward. (`npm run bench` runs with --expose-gc.)
export const settle = () => (globalThis as { gc?: () => void }).gc?.();
/** Idle time before every timed figure (see the run loop). */
export const IDLE_MS = 100;

export interface Figures {
  prefill: number;
  decode1: number;
  decode8: number;
}

export class KvcSide {
  private seq = 0;
  /** One cache for the timed runs, kept across them (its pages are touched by the warm-up). */
  private readonly kv;
  constructor(readonly model: LlamaModel) {
    this.kv = model.createKvCache(256 << 20);
  }

  greedy(p: number[], n: number): number[] {
    const kv = this.model.createKvCache(64 << 20);
    const id = ++this.seq;
    const out: number[] = [];
    let seg = p;
    let pos = 0;
    for (let i = 0; i < n; i++) {
      const [lg] = this.model.forward([{ seqId: id, tokens: seg, startPos: pos, wantLogits: true }], kv, { transientLogits: true });
      pos += seg.length;
      const t = this.model.kernel.argmax(lg!);
      out.push(t);
      seg = [t];
    }
    return out;
  }

  prefill(p: number[]): number {
    const kv = this.kv;
    const id = ++this.seq;
    settle();
    const t = now();
    this.model.forward([{ seqId: id, tokens: p, startPos: 0, wantLogits: true }], kv, { transientLogits: true });
    const tps = p.length / ((now() - t) / 1000);
    kv.free(id);
    return tps;
  }

  /** `batch` sequences prefilled together, then DECODE_STEPS steps of all of them at once. */
  decode(batch: number, salt: number): number {
    const kv = this.kv;
    settle();
    const ids = Array.from({ length: batch }, () => ++this.seq);
    let segs: Segment[] = ids.map((id, i) => ({ seqId: id, tokens: prompt(32, salt + i), startPos: 0, wantLogits: true }));
    let t0 = 0;
    // Greedy argmax inside the forward, as the engine's scheduler gets it (src/engine/runtime.ts).
    const next = new Int32Array(batch);
    for (let s = 0; s <= DECODE_STEPS; s++) {
      if (s === 1) t0 = now(); // step 0 is the prefill
      this.model.forward(segs, kv, { transientLogits: true, argmaxOut: next });
      segs = segs.map((sg, i) => ({ seqId: sg.seqId, tokens: [next[i]!], startPos: sg.startPos + sg.tokens.length, wantLogits: true }));
    }
    const tps = (batch * DECODE_STEPS) / ((now() - t0) / 1000);
    for (const id of ids) kv.free(id);
    return tps;
  }
}

/**
 * llama.cpp through node-llama-cpp. Every measurement gets a fresh context sized for it: KV cells
 * left by earlier sequences of a shared context slowed later decode steps by an order of magnitude.
 */
export class PeerSide {
  constructor(
    private readonly model: LlamaModelH,
    readonly threads: number,
  ) {}

  private async withContext<T>(sequences: number, contextSize: number, f: (ctx: LlamaCtx) => Promise<T>): Promise<T> {
    const ctx = await this.model.createContext({ contextSize, batchSize: 512, threads: this.threads, sequences });
    try {
      return await f(ctx);
    } finally {
      await ctx.dispose();
    }
  }

  greedy(p: number[], n: number): Promise<number[]> {
    return this.withContext(1, 1024, async (ctx) => {
      const out: number[] = [];
      for await (const t of ctx.getSequence().evaluate(p, { temperature: 0 })) {
        out.push(t);
        if (out.length >= n) break;
      }
      return out;
    });
  }

  prefill(p: number[]): Promise<number> {
    return this.withContext(1, 1024, async (ctx) => {
      const seq = ctx.getSequence();
      settle();
      const t = now();
      await seq.evaluateWithoutGeneratingNewTokens(p);
      return p.length / ((now() - t) / 1000);
    });
  }

  /** `batch` sequences generating at once (node-llama-cpp batches their steps into one decode). */
  decode(batch: number, salt: number): Promise<number> {
    return this.withContext(batch, 256 * batch, async (ctx) => {
      const seqs = Array.from({ length: batch }, () => ctx.getSequence());
      const firsts: number[] = [];
      const ends: number[] = [];
      let steps = 0;
      settle();
      const t0 = now();
      await Promise.all(
        seqs.map(async (seq, i) => {
          let n = 0;
          for await (const _ of seq.evaluate(prompt(32, salt + i), { temperature: 0 })) {
            void _;
            if (n === 0) firsts.push(now());
            // Bounded: an oversubscribed machine can slow llama.cpp's spinning threads 100-fold.
            if (n++ === DECODE_STEPS || now() - t0 > PEER_RUN_CAP_MS) break;
          }
          steps += n - 1;
          ends.push(now());
        }),
      );
      // From the moment every sequence had its first token (prefill done) to the last one's end.
      return steps / ((Math.max(...ends) - Math.max(...firsts)) / 1000);
    });
  }
}
