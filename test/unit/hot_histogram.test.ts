// HotHistogram (common/hot_histogram.ts) stands in for prom-client's Histogram on the engine's hot
// path. Its promise: /metrics reads exactly as if prom-client had counted. Checked here by
// feeding the same observations to both, in registries with the same default labels, and
// comparing the text exposition and the JSON, for any values, buckets and label sets.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { Histogram, Registry } from 'prom-client';
import { HotHistogram } from '../../src/common/hot_histogram.js';
import { propertyParams } from '../../harness/property.js';

// SameValueZero: -0 and 0 are one bucket bound (strictly ascending is required), so they must
// not both be drawn.
const buckets = fc.uniqueArray(fc.double({ min: -1e6, max: 1e6, noNaN: true, noDefaultInfinity: true }), { minLength: 1, maxLength: 20, comparator: 'SameValueZero' }).map((b) => [...b].sort((x, y) => x - y));
const value = fc.oneof(fc.double({ min: -2e6, max: 2e6, noNaN: true, noDefaultInfinity: true }), fc.constantFrom(0, 1, -0, 1e-9));

test('HotHistogram: the same exposition as prom-client Histogram, unlabelled and labelled', async () => {
  await fc.assert(
    fc.asyncProperty(buckets, fc.array(fc.tuple(fc.constantFrom('decode', 'prefill', 'mixed'), value), { maxLength: 60 }), fc.boolean(), async (bs, obs, labelled) => {
      const a = new Registry();
      const b = new Registry();
      a.setDefaultLabels({ model_name: 'm' });
      b.setDefaultLabels({ model_name: 'm' });
      const cfg = { name: 'h_seconds', help: 'a histogram', buckets: bs };
      if (labelled) {
        const lib = new Histogram({ ...cfg, labelNames: ['phase'], registers: [a] });
        const hot = new HotHistogram({ ...cfg, labelNames: ['phase'], registers: [b] });
        for (const [phase, v] of obs) {
          lib.observe({ phase }, v);
          hot.series({ phase }).observe(v);
        }
      } else {
        const lib = new Histogram({ ...cfg, registers: [a] });
        const hot = new HotHistogram({ ...cfg, registers: [b] });
        for (const [, v] of obs) {
          lib.observe(v);
          hot.observe(v);
        }
      }
      assert.equal(await b.metrics(), await a.metrics());
      assert.deepEqual(JSON.parse(JSON.stringify(await b.getMetricsAsJSON())), JSON.parse(JSON.stringify(await a.getMetricsAsJSON())));
    }),
    propertyParams({ numRuns: 300 }),
  );
});

test('HotHistogram: reset, bad values and bad labels are refused the way prom-client refuses them', async () => {
  const r = new Registry();
  const h = new HotHistogram({ name: 'x_seconds', help: 'x', buckets: [0.1, 1], registers: [r] });
  h.observe(0.5);
  assert.throws(() => h.observe(Number.NaN), /not a valid number/);
  assert.throws(() => h.observe(Number.POSITIVE_INFINITY), /not a valid number/);
  assert.match(await r.metrics(), /x_seconds_count\{\} 1|x_seconds_count 1/);
  h.reset();
  assert.match(await r.metrics(), /x_seconds_count 0/);
  assert.throws(() => (h as unknown as HotHistogram<'phase'>).series({ phase: 'decode' }), /unknown label "phase"/);
  const l = new HotHistogram({ name: 'y_seconds', help: 'y', buckets: [1], labelNames: ['phase'], registers: [r] });
  assert.throws(() => l.observe(1), /observe through series/);
  assert.equal(l.labels('decode'), l.series({ phase: 'decode' }), 'labels() in labelNames order is the same series');
  assert.throws(() => l.labels('decode', 'extra'), /expected 1 label values \(phase\), found 2/);
  assert.throws(() => new HotHistogram({ name: 'z', help: 'z', buckets: [1, 1], registers: [r] }), /ascending/);
  assert.throws(() => new HotHistogram({ name: 'x_seconds', help: 'x', buckets: [1], registers: [r] }), /already been registered/);
});
