// vLLM's `priority` request field in the engine's scheduler: waiting requests are admitted lower
// value first, equal values in arrival order (the default 0 everywhere keeps the FIFO queue). One
// slot (--max-num-seqs 1) makes the admission order the order the requests start, with a stand-in
// model (no real time involved).
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { EngineMetrics } from '../../src/engine/metrics.js';
import { PagedKvCache } from '../../src/engine/model/kv_cache.js';
import { Scheduler, type ForwardSegment } from '../../src/engine/scheduler.js';
import type { Sampler } from '../../src/engine/sampler.js';

const greedy = { sample: () => 1 } as unknown as Sampler;

async function startOrder(requests: { id: string; priority?: number }[]): Promise<string[]> {
  const kv = new PagedKvCache({ numLayers: 1, numKvHeads: 1, headDim: 2 }, 1 << 20);
  const model = {
    forward(segs: ForwardSegment[], cache: PagedKvCache) {
      for (const s of segs) cache.setLength(s.seqId, s.startPos + s.tokens.length);
      return segs.filter((s) => s.wantLogits).map(() => new Float32Array(4));
    },
  };
  const scheduler = new Scheduler({ model, kv, metrics: new EngineMetrics({ model: 'm' }), connector: null, maxNumSeqs: 1, maxNumBatchedTokens: 64, maxQueue: 16 });
  const started: string[] = [];
  // Submitted in one synchronous run: the first takes the slot, the others wait together.
  const done = requests.map(
    (r) =>
      new Promise<void>((resolve, reject) => {
        let first = true;
        scheduler.submit({
          requestId: r.id,
          prompt: [1, 2, 3],
          maxTokens: 2,
          sampler: greedy,
          stopTokenIds: new Set(),
          kvTransferParams: undefined,
          priority: r.priority,
          events: {
            onToken: () => {
              if (first) started.push(r.id);
              first = false;
            },
            onFinish: (reason, err) => (reason === 'length' ? resolve() : reject(err ?? new Error(reason))),
          },
        });
      }),
  );
  await Promise.all(done);
  await scheduler.close();
  return started;
}

describe('priority', () => {
  it('admits waiting requests lower priority first, ties in arrival order', async () => {
    const order = await startOrder([{ id: 'running' }, { id: 'late', priority: 5 }, { id: 'zero-a' }, { id: 'urgent', priority: -1 }, { id: 'zero-b', priority: 0 }, { id: 'late-2', priority: 5 }]);
    assert.deepEqual(order, ['running', 'urgent', 'zero-a', 'zero-b', 'late', 'late-2']);
  });

  it('without priorities the queue is FIFO', async () => {
    assert.deepEqual(await startOrder([{ id: 'a' }, { id: 'b' }, { id: 'c' }]), ['a', 'b', 'c']);
  });
});
