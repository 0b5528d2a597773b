// The KV quality benchmarks' measures (harness/kv_quality_metrics.ts): KL against a closed form,
// the flip rule the per-gap breakdown rests on (an argmax changes only where the perturbation of
// the reference's choice exceeds its top-1 − top-2 gap, and always changes where some token gains
// more than its lead), and the Tally's top-1, greedy prefix and per-class figures on a known
// sequence of positions.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { argmaxOf, klDivergence, perturbation, Tally, top2Gap, type Reference } from '../../harness/kv_quality_metrics.js';
import { propertyParams } from '../../harness/property.js';

test('KL(P ‖ Q) of two-token distributions matches the closed form; KL(P ‖ P) = 0 and logits shift-invariant', () => {
  const p = [Math.log(0.8), Math.log(0.2)];
  const q = [Math.log(0.5), Math.log(0.5)];
  const want = 0.8 * Math.log(0.8 / 0.5) + 0.2 * Math.log(0.2 / 0.5);
  assert.ok(Math.abs(klDivergence(p, q) - want) < 1e-12);
  assert.ok(Math.abs(klDivergence(p.map((x) => x + 7), q.map((x) => x - 3)) - want) < 1e-12);
  assert.equal(klDivergence(p, p), 0);
});

test('an argmax flips only where the perturbation exceeds the gap, and exactly where a token overtakes the reference choice', () => {
  const logits = fc.array(fc.double({ min: -4, max: 4, noNaN: true }), { minLength: 2, maxLength: 40 });
  const noise = fc.array(fc.double({ min: -0.5, max: 0.5, noNaN: true }), { minLength: 40, maxLength: 40 });
  let flips = 0;
  let kept = 0;
  fc.assert(
    fc.property(logits, noise, (ref, n) => {
      const cand = ref.map((x, i) => x + n[i]!);
      const a = argmaxOf(ref);
      const flipped = argmaxOf(cand) !== a;
      if (flipped) flips++;
      else kept++;
      // Below the gap, every other token stays strictly under the reference's choice.
      if (perturbation(ref, cand, a) < top2Gap(ref)) assert.ok(!flipped, `perturbation ${perturbation(ref, cand, a)} under gap ${top2Gap(ref)} yet the argmax moved`);
      // argmaxOf takes the first of equal maxima: a flip is a larger token, or an equal one before a.
      assert.equal(flipped, cand.some((x, j) => j !== a && (x > cand[a]! || (x === cand[a]! && j < a))));
    }),
    propertyParams({ numRuns: 500 }),
  );
  assert.ok(flips > 0 && kept > 0, `both outcomes exercised (flips ${flips}, kept ${kept})`);
});

test('Tally: top-1, KL, greedy prefix and the per-gap classes of a known sequence', () => {
  // One prompt, three positions: gaps 0.01, 0.3 and 2 (classes < 0.05, 0.2–0.5, ≥ 1).
  const ref: Reference = {
    prompt: [1],
    tokens: [0, 1, 2],
    logits: [Float32Array.from([1, 0.99, 0]), Float32Array.from([0, 1.3, 1]), Float32Array.from([0, 0, 2])],
  };
  const t = new Tally();
  t.add(ref, 0, [0.98, 1, 0]); // flips the near-tie
  t.add(ref, 1, [0, 1.3, 1]); // same as the reference
  t.add(ref, 2, [0, 0.5, 2]); // same argmax, moved
  const s = t.summary();
  assert.equal(s.top1, 2 / 3);
  assert.equal(s.greedyIdentical, 0);
  assert.equal(s.greedyMeanPrefix, 0); // the first position already differs
  assert.equal(s.prompts, 1);
  assert.ok(s.meanKl > 0 && s.maxKl >= s.meanKl);
  const cls = Object.fromEntries(s.byGap.map((b) => [`${b.from}-${b.to}`, b]));
  assert.deepEqual([cls['0-0.05']!.share, cls['0-0.05']!.top1], [1 / 3, 0]);
  assert.deepEqual([cls['0.2-0.5']!.share, cls['0.2-0.5']!.top1], [1 / 3, 1]);
  assert.deepEqual([cls['1-Infinity']!.share, cls['1-Infinity']!.top1], [1 / 3, 1]);
  assert.equal(cls['0.05-0.2']!.share, 0);
  assert.ok(Number.isNaN(cls['0.05-0.2']!.top1));
  // Perturbations 0.03 (position 0), 0 and 0.5: the 99th percentile is 0.5, and only position 2's gap exceeds it.
  assert.ok(Math.abs(s.perturbation.p99 - 0.5) < 1e-6);
  assert.deepEqual(s.beyondP99, { share: 1 / 3, top1: 1 });
});
