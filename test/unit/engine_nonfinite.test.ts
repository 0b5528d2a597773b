// A sequence whose logits overflowed (NaN or infinite: the kernels carry a NaN score through to
// them, engine_kernels_nonfinite.test.ts) ends with a 400 numeric_overflow naming the position
// instead of emitting a meaningless token; the other sequence of the same steps goes on. A
// stand-in model gives one request's rows NaN logits (no real time involved).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { KvcError } from '../../src/common/errors.js';
import { EngineMetrics } from '../../src/engine/metrics.js';
import { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { Sampler } from '../../src/engine/sampler.js';
import { Scheduler, type ForwardSegment } from '../../src/engine/scheduler.js';

const VOCAB = 8;

for (const [what, bad, sampling] of [
  ['NaN, greedy', NaN, { temperature: 0 }],
  ['NaN, sampled', NaN, { temperature: 0.8, topP: 0.9, seed: 1 }],
  ['+Inf, greedy', Infinity, { temperature: 0 }],
] as const) {
  test(`logits ${what}: that request ends with 400 numeric_overflow, the other one completes`, async () => {
    const kv = new PagedKvCache({ numLayers: 1, numKvHeads: 1, headDim: 2 }, 1 << 20);
    const poisoned = new Set<string>();
    const model = {
      forward(segs: ForwardSegment[], cache: PagedKvCache) {
        for (const s of segs) cache.setLength(s.seqId, s.startPos + s.tokens.length);
        return segs
          .filter((s) => s.wantLogits)
          .map((s) => {
            const row = Float32Array.from({ length: VOCAB }, (_, i) => (i === 3 ? 2 : 0));
            // the overflowing request's rows: all NaN (or one +Inf), as a NaN attention row makes them
            if (poisoned.has(String(s.seqId))) {
              if (Number.isNaN(bad)) row.fill(NaN);
              else row[0] = bad;
            }
            return row;
          });
      },
    };
    const scheduler = new Scheduler({ model, kv, metrics: new EngineMetrics({ model: 'm' }), connector: null, maxNumSeqs: 4, maxNumBatchedTokens: 64, maxQueue: 16 });
    const run = (id: string, poison: boolean) =>
      new Promise<{ reason: string; err?: Error; tokens: number[] }>((resolve) => {
        const tokens: number[] = [];
        const seq = scheduler.submit({
          requestId: id,
          prompt: [1, 2, 3, 4],
          maxTokens: 4,
          sampler: new Sampler({ maxTokens: 4, ...sampling } as never),
          stopTokenIds: new Set(),
          kvTransferParams: undefined,
          events: { onToken: (t: number) => tokens.push(t), onFinish: (reason: string, err?: Error) => resolve({ reason, err, tokens }) },
        } as never);
        if (poison) poisoned.add(String(seq.id));
      });
    const [bad1, good] = await Promise.all([run('bad', true), run('good', false)]);
    await scheduler.close();
    assert.equal(bad1.reason, 'error');
    assert.ok(bad1.err instanceof KvcError, String(bad1.err));
    assert.equal((bad1.err as KvcError).status, 400);
    assert.equal((bad1.err as KvcError).code, 'numeric_overflow');
    assert.match(bad1.err!.message, /overflowed at position 3/);
    assert.deepEqual(bad1.tokens, [], 'no meaningless token was emitted');
    assert.equal(good.reason, 'length');
    assert.equal(good.tokens.length, 4);
  });
}
