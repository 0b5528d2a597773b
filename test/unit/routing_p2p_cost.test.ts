// The P2P-aware cost and the anti-hot-spot share rule of src/proxy/router.ts on their own (no
// processes): a prefix another instance holds costs an instance that fetches by P2P a fetch
// (P2P_FETCH_WEIGHT per token), not a recompute, in the ranking and in the local-prefill rule;
// an instance that computed HOT_SHARE × its fair share of the recent decisions is passed over.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { Backend, RoundRobin } from '../../src/proxy/backend.js';
import { LoadBook } from '../../src/proxy/load.js';
import { HOT_SHARE, P2P_FETCH_WEIGHT, REQUEST_WEIGHT, Router, SHARE_WINDOW, type RoutingOptions } from '../../src/proxy/router.js';

const P = [0, 1].map((i) => new Backend('prefiller', i, { host: '127.0.0.1', port: 1000 + i }));
const D = [0, 1].map((i) => new Backend('decoder', i, { host: '127.0.0.1', port: 2000 + i }));
after(async () => {
  await Promise.all([...P, ...D].map((b) => b.close()));
});
const ids = new Map<Backend, string>([[P[0]!, 'prefiller-0'], [P[1]!, 'prefiller-1'], [D[0]!, 'decoder-0'], [D[1]!, 'decoder-1']]);

function router(p2p: boolean, o: Partial<RoutingOptions> = {}) {
  const load = new LoadBook();
  const r = new Router({ mode: 'kv-aware', maxLocalPrefillTokens: 256, maxPrefillQueue: 8, ...o }, new RoundRobin(P), new RoundRobin(D), load, (b) => ids.get(b), () => p2p);
  return { r, load };
}

test('with P2P a prefix held elsewhere costs a fetch: work = (prompt - best) + w x (best - cached)', () => {
  const { r } = router(true);
  const cached = { 'prefiller-0': 1024 };
  assert.equal(r.work(D[1]!, 1088, cached, 1024), 64 + P2P_FETCH_WEIGHT * 1024);
  assert.equal(r.work(P[0]!, 1088, cached, 1024), 64, 'the holder computes only the rest');
  assert.equal(router(false).r.work(D[1]!, 1088, cached, 1024), 1088, 'without P2P the prefix is recomputed');
});

test('a decoder prefills locally only what it lacks itself: a prefix a prefiller holds goes to that prefiller, with P2P or without', () => {
  const cached = { 'prefiller-1': 1024 };
  for (const p2p of [true, false]) {
    const route = router(p2p).r.route({ promptTokens: 1088, tokenizer: D[0]!, cached, lookupFailed: false });
    assert.equal(route.where, 'remote', `p2p=${p2p}`);
    assert.equal(route.prefillers[0], P[1], `p2p=${p2p}: the holder first`);
    assert.equal(route.reason, 'prefix_hit');
    assert.equal(route.best, 1024);
    // The decoder's work (its queued tokens, were it to prefill) still prices a fetch as a fetch.
    assert.equal(route.decoderUncached, p2p ? 64 + P2P_FETCH_WEIGHT * 1024 : 1088);
  }
  // A decoder that holds the prefix prefills the question itself.
  const own = router(true).r.route({ promptTokens: 1088, tokenizer: D[0]!, cached: { 'decoder-1': 1024, 'prefiller-1': 1024 }, lookupFailed: false });
  assert.equal(own.where, 'local_short_uncached');
  assert.equal(own.decoder, D[1]);
  assert.equal(own.reason, 'prefix_hit');
  // Held only by the other decoder, which is busy: this decoder does not fetch it to prefill;
  // the request is disaggregated, and the prefiller chosen fetches it by P2P.
  const { r, load } = router(true);
  const busy = load.begin(D[1]!, 64);
  for (let i = 0; i < 3; i++) load.begin(D[1]!, 64);
  const elsewhere = r.route({ promptTokens: 1088, tokenizer: D[0]!, cached: { 'decoder-1': 1024 }, lookupFailed: false });
  assert.equal(elsewhere.decoder, D[0]);
  assert.equal(elsewhere.where, 'remote');
  assert.equal(elsewhere.reason, 'p2p_fetch');
  busy.end();
});

test('with P2P a popular prefix spreads after one request in flight on its holder (without: after six)', () => {
  for (const p2p of [true, false]) {
    const { r, load } = router(p2p);
    const cached = { 'decoder-0': 1024 };
    const held: { end(): void }[] = [];
    let n = 0;
    for (;;) {
      const route = r.route({ promptTokens: 1088, tokenizer: D[0]!, cached, lookupFailed: false });
      if (route.decoder !== D[0]) {
        assert.equal(route.reason, p2p ? 'p2p_fetch' : 'load_spread');
        break;
      }
      held.push(load.begin(D[0]!, route.decoderUncached));
      n++;
    }
    // Holder: 64 + n·(64 + 128); other decoder: 64 + w·1024 with P2P, 1088 without.
    const other = p2p ? 64 + P2P_FETCH_WEIGHT * 1024 : 1088;
    assert.equal(n, Math.ceil((other - 64) / (64 + REQUEST_WEIGHT)), `p2p=${p2p}`);
    held.forEach((h) => h.end());
  }
});

test('the share rule: an idle holder of a hot prefix is passed over once it computed HOT_SHARE x its fair share', () => {
  const { r } = router(true);
  const cached = { 'decoder-0': 1024 };
  const limit = Math.ceil((HOT_SHARE * SHARE_WINDOW) / 4);
  const where = new Map<string, number>();
  const reasons = new Map<string, number>();
  for (let i = 0; i < 4 * SHARE_WINDOW; i++) {
    // Nothing stays in flight: affinity alone would send every request to decoder-0.
    const route = r.route({ promptTokens: 1088, tokenizer: D[0]!, cached, lookupFailed: false });
    const computes = (route.prefillers[0] ?? route.decoder).name;
    where.set(computes, (where.get(computes) ?? 0) + 1);
    reasons.set(route.reason, (reasons.get(route.reason) ?? 0) + 1);
    if (i < limit) assert.equal(computes, D[0]!.name, `decision ${i}: the holder while under its share`);
  }
  for (const [name, n] of where) assert.ok(n / (4 * SHARE_WINDOW) < 2 / 4, `${name} computed ${n} of ${4 * SHARE_WINDOW}: above twice its fair share`);
  assert.ok((where.get(D[0]!.name) ?? 0) >= SHARE_WINDOW, 'the holder keeps its share');
  assert.ok((reasons.get('share_cap') ?? 0) > 0, 'the passed-over decisions are counted as share_cap');
});

test('forget() empties the share window and the rotation: a hot holder takes its prefix again, ties start at the first instance', () => {
  const { r } = router(true);
  const cached = { 'decoder-0': 1024 };
  const ask = () => r.route({ promptTokens: 1088, tokenizer: D[0]!, cached, lookupFailed: false });
  let route = ask();
  for (let i = 0; i < SHARE_WINDOW && route.reason !== 'share_cap'; i++) route = ask();
  assert.equal(route.reason, 'share_cap', 'the holder became hot');
  assert.ok(r.hot(D[0]!));
  const shares = r.recentShares();
  const total = [...shares.values()].reduce((a, n) => a + n, 0);
  assert.ok((shares.get(D[0]!) ?? 0) >= Math.ceil((HOT_SHARE * SHARE_WINDOW) / 4), 'the window counts the holder');
  assert.equal(r.forget(), total, 'forget() says how many decisions it forgot');
  assert.equal(r.recentShares().size, 0);
  assert.ok(!r.hot(D[0]!));
  route = ask();
  assert.equal(route.decoder, D[0], 'the holder takes its prefix again');
  assert.equal(route.reason, 'prefix_hit');
  // Ties (nothing cached anywhere) start at the first instance of each role again.
  r.forget();
  const tie = r.route({ promptTokens: 1088, tokenizer: D[1]!, cached: {}, lookupFailed: false });
  assert.equal(tie.decoder, D[0]);
  assert.equal(tie.prefillers[0], P[0]);
  assert.equal(r.forget(), 1, 'only the decision since the last forget() was remembered');
});

test('the share rule does not apply to round-robin, and one healthy instance is never passed over', () => {
  const rr = router(true, { mode: 'round-robin', maxLocalPrefillTokens: null, maxPrefillQueue: null }).r;
  for (let i = 0; i < 2 * SHARE_WINDOW; i++) {
    const route = rr.route({ promptTokens: 1088, tokenizer: D[0]!, cached: { 'decoder-0': 1024 }, lookupFailed: false });
    assert.equal(route.decoder, D[0]);
    assert.equal(route.reason, 'round_robin');
  }
  P.forEach((p) => p.markDown('test'));
  D[1]!.markDown('test');
  try {
    const { r } = router(true);
    for (let i = 0; i < 2 * SHARE_WINDOW; i++) {
      const route = r.route({ promptTokens: 1088, tokenizer: D[0]!, cached: { 'decoder-0': 1024 }, lookupFailed: false });
      assert.equal(route.decoder, D[0]);
      assert.equal(route.where, 'local_no_prefiller');
    }
  } finally {
    P.forEach((p) => p.markUp());
    D[1]!.markUp();
  }
});

test('a busy decoder leaves a short prompt to an idle prefiller; an idle one prefills it (the costs compared)', () => {
  const cached = { 'decoder-0': 1024, 'prefiller-0': 1024 };
  const ask = (r: Router) => r.route({ promptTokens: 1088, tokenizer: D[0]!, cached, lookupFailed: false });
  // Idle: the decoder holding the prefix costs what the prefiller holding it costs (64): local.
  const idle = ask(router(true).r);
  assert.equal(idle.where, 'local_short_uncached');
  assert.equal(idle.decoder, D[0]);
  // One stream decoding on it: 64 + 1 + REQUEST_WEIGHT > the prefiller's 64, so the prefiller
  // computes the question; the decoder still receives it (only its 64 tokens cross, and its
  // receiving cost, 0.15 × 64 + 129, is below the other decoder's 0.15 × 1088).
  const { r, load } = router(true);
  const stream = load.begin(D[0]!, 1);
  const busy = ask(r);
  assert.equal(busy.where, 'remote');
  assert.equal(busy.prefillers[0], P[0]);
  assert.equal(busy.reason, 'prefix_hit');
  assert.equal(busy.decoder, D[0]);
  assert.ok(r.receiveCost(D[0]!, 1088, cached) < r.receiveCost(D[1]!, 1088, cached));
  // Two streams: receiving there costs more than on the idle decoder, which gets the KV.
  const second = load.begin(D[0]!, 1);
  const busier = ask(r);
  assert.equal(busier.where, 'remote');
  assert.equal(busier.decoder, D[1]);
  assert.equal(r.receiveCost(D[1]!, 1088, cached), P2P_FETCH_WEIGHT * 1088);
  stream.end();
  second.end();
  assert.equal(ask(r).where, 'local_short_uncached', 'idle again: local');
});

test('a decoder prefilling another prompt is passed over as the receiver of a disaggregated one', () => {
  // Without P2P the other decoder would recompute the 640 cached tokens, so decoder-0 is the
  // cheapest to prefill the prompt even while it prefills 200 tokens of another; the prompt lacks
  // 260 > 256 there, so it is disaggregated, and only receiving is compared: 0.15 × 260 + 200 + 128
  // on decoder-0 against 0.15 × 900 on the idle decoder-1.
  const { r, load } = router(false);
  const cached = { 'decoder-0': 640 };
  const prefilling = load.begin(D[0]!, 200);
  assert.ok(r.cost(D[0]!, 900, cached) < r.cost(D[1]!, 900, cached), 'decoder-0 is the cheapest to prefill it');
  const route = r.route({ promptTokens: 900, tokenizer: D[0]!, cached, lookupFailed: false });
  assert.equal(route.where, 'remote');
  assert.equal(route.decoder, D[1], 'the idle decoder receives');
  assert.equal(r.receiveCost(D[0]!, 900, cached), P2P_FETCH_WEIGHT * 260 + 200 + REQUEST_WEIGHT);
  prefilling.end();
  // Idle again: the decoder holding most of it receives (less crosses the wire).
  assert.equal(r.route({ promptTokens: 900, tokenizer: D[1]!, cached, lookupFailed: false }).decoder, D[0]);
});
