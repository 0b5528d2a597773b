// The logits processors of src/engine/sampler.ts on hand-made logits, where the right token is
// known: penalties, logit_bias, min_tokens, min_p, top_k, seeds and logprobs.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { Sampler, topIndices, type SamplingParams } from '../../src/engine/sampler.js';

const greedy = (extra: Partial<SamplingParams> = {}, prompt: number[] = []) => new Sampler({ temperature: 0, topP: 1, topK: -1, seed: null, ...extra }, prompt);
const row = (...x: number[]) => Float32Array.from(x);

describe('sampler: logits processors', () => {
  it('presence_penalty lowers every token generated before, once', () => {
    const s = greedy({ presencePenalty: 1 });
    assert.equal(s.sample(row(2, 1.5, 0)), 0);
    // 2 - 1 = 1 < 1.5: the other token wins now
    assert.equal(s.sample(row(2, 1.5, 0)), 1);
    // both were seen once: 1 vs 0.5 → token 0 again (presence does not grow with the count)
    assert.equal(s.sample(row(2, 1.5, 0)), 0);
    assert.equal(s.sample(row(2, 1.5, 0)), 0);
  });

  it('frequency_penalty grows with the count', () => {
    const s = greedy({ frequencyPenalty: 0.3 });
    const x = row(2, 1.5, 0);
    assert.deepEqual([s.sample(x), s.sample(x), s.sample(x), s.sample(x)], [0, 0, 1, 0]);
  });

  it('repetition_penalty covers the prompt: divides positive logits, multiplies negative ones', () => {
    assert.equal(greedy({ repetitionPenalty: 2 }, [0]).sample(row(2, 1.5)), 1); // 2/2 = 1 < 1.5
    assert.equal(greedy({ repetitionPenalty: 2 }, [1]).sample(row(-1, -0.6)), 0); // -0.6*2 = -1.2 < -1
    assert.equal(greedy({ repetitionPenalty: 1 }, [0]).sample(row(2, 1.5)), 0);
  });

  it('logit_bias is added before the argmax; the model row is not changed', () => {
    const x = row(1, 2, 3);
    assert.equal(greedy({ logitBias: new Map([[2, -100]]) }).sample(x), 1);
    assert.equal(greedy({ logitBias: new Map([[0, 5]]) }).sample(x), 0);
    assert.deepEqual([...x], [1, 2, 3]);
  });

  it('min_tokens masks the stop ids until that many tokens were generated', () => {
    const s = greedy({ minTokens: 2, minTokensStopIds: new Set([0]) });
    const x = row(5, 1, 0);
    assert.deepEqual([s.sample(x), s.sample(x), s.sample(x)], [1, 1, 0]);
  });

  it('min_p keeps only tokens at least min_p times as likely as the top one', () => {
    // probabilities ∝ e^0, e^-1, e^-5: with min_p 0.2 token 2 (0.0067 of the top) never comes
    const s = new Sampler({ temperature: 1, topP: 1, topK: -1, seed: 7, minP: 0.2 });
    const seen = new Set<number>();
    for (let i = 0; i < 2000; i++) seen.add(s.sample(row(0, -1, -5)));
    assert.deepEqual([...seen].sort(), [0, 1]);
    const all = new Sampler({ temperature: 1, topP: 1, topK: -1, seed: 7 });
    const seenAll = new Set<number>();
    for (let i = 0; i < 2000; i++) seenAll.add(all.sample(row(0, -1, -5)));
    assert.ok(seenAll.has(2), 'without min_p the unlikely token does come up');
  });

  it('top_k keeps the k most likely tokens', () => {
    const s = new Sampler({ temperature: 1, topP: 1, topK: 2, seed: 3 });
    const seen = new Set<number>();
    for (let i = 0; i < 500; i++) seen.add(s.sample(row(0, 0.1, 0.2, 0.3)));
    assert.deepEqual([...seen].sort(), [2, 3]);
  });

  it('the same seed draws the same tokens; another seed other tokens', () => {
    const draw = (seed: number) => {
      const s = new Sampler({ temperature: 1, topP: 1, topK: -1, seed });
      return Array.from({ length: 32 }, () => s.sample(row(0, 0, 0, 0, 0, 0, 0, 0)));
    };
    assert.deepEqual(draw(42), draw(42));
    assert.notDeepEqual(draw(42), draw(43));
  });

  it('logprobs: a log-softmax of the raw logits, alternatives most likely first', () => {
    const s = greedy({ logprobs: 2, logitBias: new Map([[0, 10]]) });
    const t = s.sample(row(1, 3, 2));
    assert.equal(t, 0, 'the bias picks token 0');
    const z = Math.log(Math.exp(1) + Math.exp(3) + Math.exp(2));
    assert.ok(Math.abs(s.last!.logprob - (1 - z)) < 1e-6, 'the logprob is the model distribution, before the bias');
    assert.deepEqual(s.last!.top.map((x) => x.token), [1, 2]);
    assert.ok(Math.abs(s.last!.top[0]!.logprob - (3 - z)) < 1e-6);
    assert.ok(Math.abs(s.cumulativeLogprob - (1 - z)) < 1e-6);
    assert.equal(greedy().sample(row(1, 2)), 1);
  });

  it('topIndices: largest first, ties by lower index', () => {
    assert.deepEqual(topIndices(row(1, 5, 5, 3, 9), 3), [4, 1, 2]);
    assert.deepEqual(topIndices(row(1, 2), 0), []);
    assert.deepEqual(topIndices(row(1, 2), 5), [1, 0]);
  });
});
