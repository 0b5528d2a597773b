// The scheduler bounds a step's prompt tokens by time as well as by --max-num-batched-tokens: a
// long prompt is computed in chunks sized from the measured cost per token, so a decoding
// sequence (and the engine's HTTP) never waits behind a multi-second step. The model here is a
// stand-in whose forward advances a test clock by a fixed cost per token, which makes the sizes
// of the chunks exact (no real time is measured).
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { EngineMetrics } from '../../src/engine/metrics.js';
import { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { MIN_PREFILL_TOKENS, STEP_TARGET_MS, Scheduler, type ForwardSegment } from '../../src/engine/scheduler.js';
import type { Sampler } from '../../src/engine/sampler.js';

const VOCAB = 8;
const greedy = { sample: () => 1 } as unknown as Sampler;

interface Step {
  decodeRows: number;
  /** Tokens of the long prompt computed in this step. */
  longTokens: number;
  /** Every token of the step (prompt chunks and decode rows). */
  total: number;
}

const SHORT_PROMPT = 4;
const LONG_PROMPT = 3000;

/** Runs a long prompt next to a decoding sequence; returns every step's composition. */
async function run(msPerToken: number, opts: { stepTargetMs?: number; maxNumBatchedTokens?: number } = {}): Promise<Step[]> {
  let clock = 0;
  const steps: Step[] = [];
  const kv = new PagedKvCache({ numLayers: 1, numKvHeads: 1, headDim: 2 }, 1 << 22);
  const model = {
    forward(segs: ForwardSegment[], cache: PagedKvCache) {
      const step: Step = { decodeRows: 0, longTokens: 0, total: 0 };
      for (const s of segs) {
        cache.setLength(s.seqId, s.startPos + s.tokens.length);
        step.total += s.tokens.length;
        // Sequence 1 is the short request, 2 the long prompt (ids in order of submission).
        const promptLen = s.seqId === 1 ? SHORT_PROMPT : LONG_PROMPT;
        if (s.startPos >= promptLen) step.decodeRows++;
        else if (s.seqId === 2) step.longTokens += s.tokens.length;
      }
      clock += step.total * msPerToken;
      steps.push(step);
      return segs.filter((s) => s.wantLogits).map(() => new Float32Array(VOCAB));
    },
  };
  const scheduler = new Scheduler({
    model,
    kv,
    metrics: new EngineMetrics({ model: 'm' }),
    connector: null,
    maxNumSeqs: 4,
    maxNumBatchedTokens: opts.maxNumBatchedTokens ?? 512,
    maxQueue: 8,
    stepTargetMs: opts.stepTargetMs,
    now: () => clock,
  });
  const finished = (maxTokens: number, prompt: number[]) =>
    new Promise<void>((resolve, reject) => {
      scheduler.submit({
        requestId: `r${prompt.length}`,
        prompt,
        maxTokens,
        sampler: greedy,
        stopTokenIds: new Set(),
        kvTransferParams: undefined,
        events: { onToken: () => undefined, onFinish: (reason, err) => (reason === 'length' ? resolve() : reject(err ?? new Error(reason))) },
      });
    });
  // A short request decoding for the whole run, then a 3,000-token prompt.
  const short = finished(400, Array.from({ length: SHORT_PROMPT }, (_, i) => 1 + i));
  const long = finished(2, Array.from({ length: LONG_PROMPT }, (_, i) => 1 + (i % 6)));
  await Promise.all([short, long]);
  await scheduler.close();
  return steps;
}

describe('step time budget', () => {
  it('cuts a long prompt into chunks that fit the step target at the measured cost', async () => {
    const steps = await run(2); // 2 ms per token: 100 tokens per 200 ms step
    const prompt = steps.filter((s) => s.longTokens > 0);
    assert.equal(
      prompt.reduce((a, s) => a + s.longTokens, 0),
      LONG_PROMPT,
      'every prompt token is computed exactly once',
    );
    assert.ok(prompt.length >= LONG_PROMPT / 100, `${prompt.length} chunks`);
    // The first prompt step knows no cost yet: it takes at most 4 x MIN_PREFILL_TOKENS.
    assert.ok(prompt[0]!.total <= 4 * MIN_PREFILL_TOKENS, `first step ${prompt[0]!.total}`);
    for (const s of prompt.slice(1)) {
      assert.ok(s.total * 2 <= STEP_TARGET_MS, `a step of ${s.longTokens} prompt tokens + ${s.decodeRows} decode rows takes ${s.total * 2} ms`);
    }
    // Every chunk but the last is at least MIN_PREFILL_TOKENS, and the decoding sequence kept its
    // row in every step that computed the prompt after the first.
    assert.ok(prompt.slice(0, -1).every((s) => s.longTokens >= MIN_PREFILL_TOKENS));
    assert.ok(prompt.slice(1).every((s) => s.decodeRows >= 1));
  });

  it('keeps --max-num-batched-tokens as the upper bound when tokens are cheap', async () => {
    const steps = await run(0.01, { maxNumBatchedTokens: 256 });
    const prompt = steps.filter((s) => s.longTokens > 0);
    assert.ok(prompt.every((s) => s.total <= 256));
    assert.ok(prompt.filter((s) => s.total === 256).length >= prompt.length - 2, 'cheap steps fill the token budget');
  });

  it('never goes below MIN_PREFILL_TOKENS, however slow a token is', async () => {
    const steps = await run(50); // 50 ms per token: the time bound alone would allow 4
    const prompt = steps.filter((s) => s.longTokens > 0).slice(1, -1);
    assert.ok(prompt.length > 0 && prompt.every((s) => s.longTokens === MIN_PREFILL_TOKENS), JSON.stringify(prompt.slice(0, 5)));
  });

  it('uses the token budget alone with stepTargetMs 0', async () => {
    const steps = await run(2, { stepTargetMs: 0 });
    const prompt = steps.filter((s) => s.longTokens > 0);
    assert.ok(prompt.slice(0, -1).every((s) => s.total === 512), JSON.stringify(prompt.slice(0, 3)));
  });
});
