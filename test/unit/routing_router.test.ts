// The routing rules of src/proxy/router.ts on their own (no processes): the cost, ties rotating,
// a popular prefix spreading once its holder is loaded, the conditional-disaggregation rules and
// their defaults per mode, and the flags' errors.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { Backend, RoundRobin } from '../../src/proxy/backend.js';
import { LoadBook } from '../../src/proxy/load.js';
import { REQUEST_WEIGHT, Router, type RoutingOptions } from '../../src/proxy/router.js';
import { parseRoutingFlags } from '../../src/proxy/routing_flags.js';

const P = [0, 1].map((i) => new Backend('prefiller', i, { host: '127.0.0.1', port: 1000 + i }));
const D = [0, 1].map((i) => new Backend('decoder', i, { host: '127.0.0.1', port: 2000 + i }));
after(async () => {
  await Promise.all([...P, ...D].map((b) => b.close()));
});
const ids = new Map<Backend, string>([[P[0]!, 'prefiller-0'], [P[1]!, 'prefiller-1'], [D[0]!, 'decoder-0'], [D[1]!, 'decoder-1']]);

function router(o: Partial<RoutingOptions> = {}) {
  const load = new LoadBook();
  const r = new Router({ mode: 'kv-aware', maxLocalPrefillTokens: 256, maxPrefillQueue: 8, ...o }, new RoundRobin(P), new RoundRobin(D), load, (b) => ids.get(b));
  return { r, load };
}

test('the lowest cost wins: the holder of the prefix, prefilled locally when only a little is uncached', () => {
  const { r } = router();
  const route = r.route({ promptTokens: 1100, tokenizer: D[0]!, cached: { 'decoder-1': 1024, 'prefiller-0': 1024 }, lookupFailed: false });
  assert.equal(route.decoder, D[1]);
  assert.equal(route.where, 'local_short_uncached');
  assert.equal(route.reason, 'prefix_hit');
  assert.equal(route.cachedTokens, 1024);
  assert.deepEqual(route.prefillers, []);
});

test('a large uncached part is disaggregated to the prefiller holding most of it', () => {
  const { r } = router();
  const route = r.route({ promptTokens: 1100, tokenizer: D[0]!, cached: { 'prefiller-1': 768 }, lookupFailed: false });
  assert.equal(route.where, 'remote');
  assert.deepEqual(route.prefillers, [P[1], P[0]], 'the holder first, the other as failover');
  assert.equal(route.reason, 'prefix_hit');
});

test('equal costs rotate', () => {
  const { r } = router();
  const picks = Array.from({ length: 4 }, () => r.route({ promptTokens: 1000, tokenizer: D[0]!, cached: {}, lookupFailed: false }));
  assert.deepEqual(picks.map((p) => p.decoder.name), [D[0]!.name, D[1]!.name, D[0]!.name, D[1]!.name]);
  assert.deepEqual(picks.map((p) => p.prefillers[0]!.name), [P[0]!.name, P[1]!.name, P[0]!.name, P[1]!.name]);
  assert.ok(picks.every((p) => p.reason === 'no_prefix'));
});

test('a popular prefix spreads once its holder is loaded, and the cost says when', () => {
  const { r, load } = router();
  const cached = { 'decoder-0': 1024 };
  const ask = () => r.route({ promptTokens: 1088, tokenizer: D[0]!, cached, lookupFailed: false });
  const held: { end(): void }[] = [];
  let n = 0;
  for (;;) {
    const route = ask();
    if (route.decoder !== D[0]) {
      assert.equal(route.reason, 'load_spread');
      break;
    }
    // The request stays in flight on its holder (it prefills the 64 uncached tokens locally).
    held.push(load.begin(D[0]!, route.decoderUncached));
    n++;
    assert.ok(n < 100, 'never spread');
  }
  // decoder-0: 64 + n·64 + 128·n > decoder-1: 1088 → n = 6 requests in flight before spreading.
  assert.equal(n, Math.ceil((1088 - 64) / (64 + REQUEST_WEIGHT)));
  for (const h of held) h.end();
  assert.equal(ask().decoder, D[0], 'back to the holder once its load is gone');
});

test('every prefiller queue full: prefilled on the decoder; no prefiller up: on the decoder too', () => {
  const { r, load } = router({ maxPrefillQueue: 1 });
  const hold = [P[0], P[0], P[1], P[1]].map((p) => load.begin(p!, 100));
  let route = r.route({ promptTokens: 2000, tokenizer: D[0]!, cached: {}, lookupFailed: false });
  assert.equal(route.where, 'local_prefill_queue_full');
  hold.forEach((h) => h.end());
  route = r.route({ promptTokens: 2000, tokenizer: D[0]!, cached: {}, lookupFailed: false });
  assert.equal(route.where, 'remote');
  P.forEach((p) => p.markDown('test'));
  route = r.route({ promptTokens: 2000, tokenizer: D[0]!, cached: {}, lookupFailed: false });
  assert.equal(route.where, 'local_no_prefiller');
  P.forEach((p) => p.markUp());
});

test('round-robin keeps the tokenizing decoder and disaggregates everything by default; a failed lookup is named', () => {
  const rr = parseRoutingFlags({}).routing;
  assert.deepEqual(rr, { mode: 'round-robin', maxLocalPrefillTokens: null, maxPrefillQueue: null });
  const { r } = router(rr);
  const route = r.route({ promptTokens: 10, tokenizer: D[1]!, cached: { 'decoder-0': 8 }, lookupFailed: false });
  assert.equal(route.decoder, D[1]);
  assert.equal(route.where, 'remote');
  assert.equal(route.reason, 'round_robin');
  const kv = router().r.route({ promptTokens: 10, tokenizer: D[1]!, cached: null, lookupFailed: true });
  assert.equal(kv.reason, 'lookup_failed');
});

test('routing flags: defaults per mode, explicit values honoured in both, errors name the flag', () => {
  assert.deepEqual(parseRoutingFlags({ routing: 'kv-aware', controllerUrl: 'http://127.0.0.1:9000' }), {
    routing: { mode: 'kv-aware', maxLocalPrefillTokens: 256, maxPrefillQueue: 8 },
    controllerUrl: 'http://127.0.0.1:9000',
  });
  assert.deepEqual(parseRoutingFlags({ maxLocalPrefillTokens: '64', maxPrefillQueue: '0' }).routing, { mode: 'round-robin', maxLocalPrefillTokens: 64, maxPrefillQueue: 0 });
  assert.throws(() => parseRoutingFlags({ routing: 'random' }), /--routing: expected one of round-robin, kv-aware, found "random"/);
  assert.throws(() => parseRoutingFlags({ routing: 'kv-aware' }), /needs --controller-url/);
  assert.throws(() => parseRoutingFlags({ maxPrefillQueue: '1.5' }), /--max-prefill-queue: expected an integer >= 0, found "1.5"/);
  assert.throws(() => parseRoutingFlags({ controllerUrl: 'http://h:9000/x' }), /--controller-url: expected http:\/\/host:port/);
});
