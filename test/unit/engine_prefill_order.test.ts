// The order in which a step's prompt budget serves waiting prompts (prefillOrder in
// src/engine/scheduler.ts): a prompt that finishes within the step goes before a long prompt
// admitted earlier, so a short request is not held behind a burst of long ones; the long prompt
// still gets MIN_PREFILL_TOKENS of every step. A stand-in model records each step's composition;
// the assertions are about order and token counts, no time is measured.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { EngineMetrics } from '../../src/engine/metrics.js';
import { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { MIN_PREFILL_TOKENS, Scheduler, type ForwardSegment } from '../../src/engine/scheduler.js';
import type { Sampler } from '../../src/engine/sampler.js';

const greedy = { sample: () => 1 } as unknown as Sampler;
const BUDGET = 64;
const LONG = 1000;
const SHORT = 16;

interface Run {
  /** Per step: prompt tokens computed, by request id. */
  steps: Map<string, number>[];
  /** Request ids in the order of their first token. */
  firstTokens: string[];
}

/** Submits `longs` long prompts, then (after the first step) `shorts` short ones; runs all to the end. */
async function run(longs: number, shorts: number): Promise<Run> {
  const kv = new PagedKvCache({ numLayers: 1, numKvHeads: 1, headDim: 2 }, 1 << 22);
  const names = new Map<number, { id: string; prompt: number }>();
  const out: Run = { steps: [], firstTokens: [] };
  let afterFirstStep: (() => void) | null = null;
  const firstStep = new Promise<void>((r) => (afterFirstStep = r));
  const model = {
    forward(segs: ForwardSegment[], cache: PagedKvCache) {
      const step = new Map<string, number>();
      for (const s of segs) {
        cache.setLength(s.seqId, s.startPos + s.tokens.length);
        const n = names.get(s.seqId)!;
        if (s.startPos < n.prompt) step.set(n.id, (step.get(n.id) ?? 0) + s.tokens.length);
      }
      out.steps.push(step);
      afterFirstStep?.();
      afterFirstStep = null;
      return segs.filter((s) => s.wantLogits).map(() => new Float32Array(4));
    },
  };
  const scheduler = new Scheduler({ model, kv, metrics: new EngineMetrics({ model: 'm' }), connector: null, maxNumSeqs: 16, maxNumBatchedTokens: BUDGET, maxQueue: 16, stepTargetMs: 0 });
  const submit = (id: string, length: number) =>
    new Promise<void>((resolve, reject) => {
      let first = true;
      const seq = scheduler.submit({
        requestId: id,
        prompt: Array.from({ length }, (_, i) => 1 + (i % 5)),
        // One token: done at the end of its prompt, so no decode row takes from the step budget.
        maxTokens: 1,
        sampler: greedy,
        stopTokenIds: new Set(),
        kvTransferParams: undefined,
        events: {
          onToken: () => {
            if (first) out.firstTokens.push(id);
            first = false;
          },
          onFinish: (reason, err) => (reason === 'length' ? resolve() : reject(err ?? new Error(reason))),
        },
      });
      names.set(seq.id, { id, prompt: length });
    });
  const done = Array.from({ length: longs }, (_, i) => submit(`long${i}`, LONG));
  await firstStep;
  done.push(...Array.from({ length: shorts }, (_, i) => submit(`short${i}`, SHORT)));
  await Promise.all(done);
  await scheduler.close();
  return out;
}

describe('prefill order', () => {
  it('computes a short prompt that arrives behind long ones in the next step', async () => {
    const r = await run(2, 1);
    // The first step took the first long prompt's chunk; the short one went in the second step.
    assert.equal(r.steps[1]!.get('short0'), SHORT, JSON.stringify([...r.steps[1]!]));
    assert.deepEqual(r.firstTokens, ['short0', 'long0', 'long1']);
    // Every prompt token computed exactly once.
    const total = (id: string) => r.steps.reduce((a, s) => a + (s.get(id) ?? 0), 0);
    assert.equal(total('long0'), LONG);
    assert.equal(total('long1'), LONG);
    assert.equal(total('short0'), SHORT);
  });

  it('leaves the oldest long prompt MIN_PREFILL_TOKENS of every step while short ones go first', async () => {
    const shorts = 8;
    const r = await run(1, shorts);
    // Two 16-token prompts fit beside the long prompt's reserved 32 tokens of a 64-token step.
    assert.equal(BUDGET - MIN_PREFILL_TOKENS, 2 * SHORT);
    const withShorts = r.steps.slice(1).filter((s) => [...s.keys()].some((k) => k.startsWith('short')));
    assert.equal(withShorts.length, shorts / 2);
    for (const s of withShorts) assert.equal(s.get('long0'), MIN_PREFILL_TOKENS, JSON.stringify([...s]));
    // The short prompts start in arrival order, all before the long one.
    assert.deepEqual(r.firstTokens, [...Array.from({ length: shorts }, (_, i) => `short${i}`), 'long0']);
  });
});
