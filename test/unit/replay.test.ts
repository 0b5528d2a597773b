// The replay guard of the deployment-secret channels (src/common/replay.ts): the nonce memory's
// window, expiry and bound, and sealed messages (tag over the whole message, then timestamp, then
// nonce). The clock is injected, so nothing here depends on time passing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { NonceMemory, canonical, refusalsSoFar, requestSignature, seal, signedHeaders, stamp, unseal } from '../../src/common/replay.js';

const W = 30_000;
const clock = (t0: number) => {
  const c = { now: t0 };
  return { c, memory: (capacity?: number) => new NonceMemory('unit-test', { windowMs: () => W, now: () => c.now, capacity }) };
};

test('a nonce is taken once within the window; timestamps outside it are refused either way', () => {
  const { c, memory } = clock(1_000_000_000);
  const m = memory();
  const n = 'a'.repeat(32);
  assert.equal(m.admit(c.now, n), null);
  assert.equal(m.admit(c.now, n)?.reason, 'replayed_nonce');
  assert.equal(m.admit(c.now - W - 1, 'b'.repeat(32))?.reason, 'stale_timestamp', 'older than the window');
  assert.equal(m.admit(c.now + W + 1, 'c'.repeat(32))?.reason, 'stale_timestamp', 'further in the future than the window');
  assert.equal(m.admit(c.now - W + 1, 'd'.repeat(32)), null, 'a clock behind by less than the window');
  assert.equal(m.admit(c.now + W - 1, 'e'.repeat(32)), null, 'a clock ahead by less than the window');
  assert.equal(m.admit(undefined, 'f'.repeat(32))?.reason, 'stale_timestamp', 'no timestamp');
  assert.equal(m.admit(c.now, 'short')?.reason, 'replayed_nonce', 'no usable nonce');
  // Once its timestamp left the window, the first message is refused by its timestamp, and its
  // nonce is forgotten: the memory holds about two windows of nonces, never more.
  c.now += W + 1_001;
  assert.equal(m.admit(c.now - W - 1_001, n)?.reason, 'stale_timestamp');
  assert.equal(m.size, 1, 'only the nonce stamped W ahead is still remembered');
  c.now += 2 * W;
  m.admit(c.now, 'g'.repeat(32));
  assert.equal(m.size, 1);
});

test('a full nonce memory refuses instead of forgetting', () => {
  const { c, memory } = clock(2_000_000_000);
  const m = memory(3);
  for (let i = 0; i < 3; i++) assert.equal(m.admit(c.now, String(i).repeat(16)), null);
  assert.equal(m.admit(c.now, '9'.repeat(16))?.reason, 'nonce_memory_full');
  assert.equal(m.admit(c.now, '0'.repeat(16))?.reason, 'replayed_nonce', 'a replay is still a replay');
  c.now += 2 * W;
  assert.equal(m.admit(c.now, '9'.repeat(16)), null, 'room again once the window passed');
});

test('a sealed message: any change, another secret or a second delivery is refused, and counted', () => {
  const secret = 'unit-secret-0123456789';
  const m = new NonceMemory('unit-seal');
  const msg = seal(secret, 'unit-seal', { req_id: 'r1', ok: true, n: 3, nested: { b: [1, 2], a: null } });
  assert.equal(unseal(secret, new NonceMemory('unit-seal'), { ...msg, ok: false })?.reason, 'invalid_deployment_secret', 'a changed field');
  assert.equal(unseal('other-secret-0123456789', m, msg)?.reason, 'invalid_deployment_secret');
  assert.equal(unseal(secret, new NonceMemory('another-channel'), msg)?.reason, 'invalid_deployment_secret', 'the tag names its channel');
  const { nested, ...rest } = msg;
  assert.equal(unseal(secret, m, { nested: { a: null, b: [1, 2] }, ...rest }), null, 'key order does not matter');
  assert.equal(unseal(secret, m, msg)?.reason, 'replayed_nonce');
  assert.equal(unseal(null, m, msg), null, 'without a secret the channel is open');
  assert.deepEqual(seal(null, 'x', { a: 1 }), { a: 1 }, 'and nothing is added');
  const counts = refusalsSoFar();
  assert.equal(counts['unit-seal/invalid_deployment_secret'], 2);
  assert.equal(counts['unit-seal/replayed_nonce'], 1);
  assert.equal(counts['another-channel/invalid_deployment_secret'], 1);
});

test('a signed HTTP call covers the method, the path with its query, and the body', () => {
  const s = 'unit-secret-0123456789';
  const body = { instance_id: 'decoder-0', location: 'LocalCPUBackend' };
  const h = signedHeaders(s, 'post', '/clear', body);
  const ts = h['x-kvc-timestamp']!;
  const nonce = h['x-kvc-nonce']!;
  assert.equal(requestSignature(s, 'POST', '/clear', ts, nonce, JSON.parse(JSON.stringify(body))), h['x-kvc-signature']);
  for (const [m, p, b] of [['POST', '/clear?x=1', body], ['PUT', '/clear', body], ['POST', '/clear', { ...body, location: 'LocalDiskBackend' }]] as const) {
    assert.notEqual(requestSignature(s, m, p, ts, nonce, b), h['x-kvc-signature'], `${m} ${p}`);
  }
  assert.deepEqual(signedHeaders(null, 'POST', '/clear', body), {});
  assert.equal(canonical(undefined), '');
  assert.equal(stamp(5).ts, 5);
  assert.equal(stamp().nonce.length, 32);
});
