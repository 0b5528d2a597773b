// The two halves of a P2P fetch without engines: the controller's holder answer (from its
// registry and index, fed by real monitor messages) and the pull from one peer against a real
// holder (a KvcStore behind startPeerServer) and against peers that misbehave (silent, wrong key).
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { Registry } from '../../src/controller/registry.js';
import { answerP2pLookup } from '../../src/controller/p2p_holders.js';
import { PROTOCOL_VERSION, packKeys } from '../../src/protocol/monitor.js';
import { chunkBytes, HEADER_BYTES, sealChunk, type KvLayout } from '../../src/common/chunk.js';
import { chunkKeys } from '../../src/common/keys.js';
import { setDeploymentSecret } from '../../src/common/auth.js';
import { KvcStore } from '../../src/kvc/store.js';
import { startPeerServer } from '../../src/kvc/worker_peer.js';
import { fetchFromPeer } from '../../src/kvc/p2p_fetch.js';
import { coverage, P2pClient } from '../../src/kvc/p2p_client.js';
import { P2pMetrics } from '../../src/kvc/p2p_metrics.js';
import { Registry as PromRegistry } from 'prom-client';
import { peerChunkHead } from '../../src/protocol/peer_frames.js';

setDeploymentSecret(null);

const register = (id: string, session: string, o: { model?: string; chunk?: number; url?: string | null } = {}) => ({
  t: 'register', v: PROTOCOL_VERSION, instance_id: id, worker_id: 0, session, ip: '127.0.0.1', worker_port: 7750,
  distributed_url: o.url === undefined ? `127.0.0.1:${7800 + session.length}` : o.url, chunk_size: o.chunk ?? 4, model_id: o.model ?? 'm', seed: '0',
  locations: ['LocalCPUBackend', 'LocalDiskBackend'], pid: 1,
});
const keys = chunkKeys(Array.from({ length: 40 }, (_, i) => i + 7), { modelId: 'm', chunkSize: 4, seed: 0n }).map((s) => s.key);

test('the controller names the other instances holding the leading keys, longest run first', () => {
  const reg = new Registry({ heartbeatTimeoutMs: 10_000, seed: 0n, secret: null });
  const sync = (session: string, loc: string, ks: string[]) => reg.handle(session, { t: 'sync', location: loc, keys: packKeys(ks), reset: false, last: true });
  for (const [id, s, o] of [['asker', 's1', {}], ['long', 's22', {}], ['short', 's333', {}], ['disk', 's4444', {}], ['other-model', 's55555', { model: 'x' }], ['no-peer', 's666666', { url: null }]] as const) {
    assert.equal(reg.handle(s, register(id, s, o))?.t, 'welcome', id);
  }
  sync('s1', 'LocalCPUBackend', keys.slice(0, 2));
  sync('s22', 'LocalCPUBackend', keys.slice(2, 8));
  sync('s333', 'LocalCPUBackend', keys.slice(2, 4));
  sync('s4444', 'LocalDiskBackend', keys.slice(2, 8));
  sync('s55555', 'LocalCPUBackend', keys.slice(2, 10));
  sync('s666666', 'LocalCPUBackend', keys.slice(2, 10));
  // The asker lacks keys 2.. and asks for them; it holds 0..1 itself (never named for itself).
  const r = answerP2pLookup(reg, 's1', { t: 'p2p_lookup', id: 7, keys: packKeys(keys.slice(2)) });
  assert.equal(r.t, 'p2p_holders');
  if (r.t !== 'p2p_holders') return;
  assert.equal(r.id, 7);
  // other-model holds the same keys in the index (synced so here) but serves another model; no-peer has no peer port.
  assert.deepEqual(r.holders.map((h) => [h.instance_id, h.location, h.chunks]), [['long', 'LocalCPUBackend', 6], ['disk', 'LocalDiskBackend', 6], ['short', 'LocalCPUBackend', 2]]);
  assert.equal(r.holders[0]!.peer_url, '127.0.0.1:7803', 'the address the holder registered');
  // Keys nobody holds: no holder. Unregistered session: re-register. Bad body: an error naming the field.
  const none = answerP2pLookup(reg, 's1', { t: 'p2p_lookup', id: 8, keys: packKeys(['0123456789abcdef']) });
  assert.deepEqual(none, { t: 'p2p_holders', id: 8, holders: [] });
  assert.equal(answerP2pLookup(reg, 'stranger', { t: 'p2p_lookup', id: 9, keys: packKeys(keys) }).t, 'reregister');
  const bad = answerP2pLookup(reg, 's1', { t: 'p2p_lookup', id: 10, keys: new Uint8Array(7) });
  assert.equal(bad.t, 'error');
  assert.match((bad as { message: string }).message, /keys/);
  assert.equal(reg.stats.p2pLookups, 2);
});

test('past the leading run, the controller names the runs that continue it (headless copies), stepping over the asker\'s own keys', () => {
  const reg = new Registry({ heartbeatTimeoutMs: 10_000, seed: 0n, secret: null });
  const sync = (session: string, ks: string[]) => reg.handle(session, { t: 'sync', location: 'LocalCPUBackend', keys: packKeys(ks), reset: false, last: true });
  for (const [id, s] of [['asker', 's1'], ['head', 's22'], ['mid', 's333'], ['tail', 's4444'], ['far', 's55555']] as const) {
    assert.equal(reg.handle(s, register(id, s))?.t, 'welcome', id);
  }
  // The query is keys 2..11 (indices 0..9). head: 2..4; mid: 5 (without the head); the asker
  // itself: 6; tail: 7..8; nobody: 9; far: 10..11 (after the gap: unusable).
  sync('s1', [keys[6]!]);
  sync('s22', keys.slice(2, 5));
  sync('s333', [keys[5]!]);
  sync('s4444', keys.slice(7, 9));
  sync('s55555', keys.slice(10, 12));
  const r = answerP2pLookup(reg, 's1', { t: 'p2p_lookup', id: 1, keys: packKeys(keys.slice(2, 12)) });
  assert.equal(r.t, 'p2p_holders');
  if (r.t !== 'p2p_holders') return;
  assert.deepEqual(r.holders.map((h) => [h.instance_id, h.from ?? 0, h.chunks]), [['head', 0, 3], ['mid', 3, 1], ['tail', 5, 2]]);
  assert.equal(coverage(r.holders, 10), 7);
  // Nobody holds the first key: nothing, even though later keys are held.
  const none = answerP2pLookup(reg, 's1', { t: 'p2p_lookup', id: 2, keys: packKeys(keys.slice(9, 12)) });
  assert.deepEqual(none, { t: 'p2p_holders', id: 2, holders: [] });
});

const layout: KvLayout = { dtype: 0, numLayers: 2, numKvHeads: 1, headDim: 4 } as KvLayout;
function chunk(key: string, tokens: number, fill: number): Uint8Array {
  const buf = new Uint8Array(chunkBytes(layout, tokens));
  buf.subarray(HEADER_BYTES).fill(fill);
  return sealChunk(buf, layout, tokens, key);
}

const closers: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of closers) await c();
});

test('a pull from a real holder gets its run in order and stops at the first key it lacks', async () => {
  const store = await KvcStore.create({ local_cpu: true, max_local_cpu_size: 0.01, max_local_disk_size: 0, local_disk: null });
  for (let i = 0; i < 5; i++) await store.put(keys[i]!, chunk(keys[i]!, 4, i + 1));
  const peer = await startPeerServer(store, '127.0.0.1', 0, { layout, chunkSize: 4 });
  closers.push(() => peer.close(), () => store.close());
  const r = await fetchFromPeer({ peerUrl: `127.0.0.1:${peer.port}`, keys: keys.slice(2, 8), from: 't', deadline: Date.now() + 30_000, layout, chunkSize: 4 });
  assert.equal(r.failure, null, r.error ?? '');
  assert.equal(r.chunks.length, 3);
  assert.deepEqual(r.chunks.map((c) => c[HEADER_BYTES]), [3, 4, 5]);
  // A holder of another layout: its chunks are refused (corrupt), never used.
  const other = { ...layout, headDim: 8 } as KvLayout;
  const wrong = await fetchFromPeer({ peerUrl: `127.0.0.1:${peer.port}`, keys: keys.slice(0, 2), from: 't', deadline: Date.now() + 30_000, layout: other, chunkSize: 4 });
  assert.equal(wrong.failure, 'corrupt');
  assert.equal(wrong.chunks.length, 0);
});

test('a silent holder ends at the time bound, a wrong key as corrupt, a closed port as connect', async () => {
  // Reads (and drops) what arrives, so it sees the requester close; it never answers.
  const silent = net.createServer((s) => s.on('error', () => {}).resume());
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
  closers.push(() => new Promise((r) => silent.close(() => r())));
  const slow = await fetchFromPeer({ peerUrl: `127.0.0.1:${(silent.address() as net.AddressInfo).port}`, keys: keys.slice(0, 2), from: 't', deadline: Date.now() + 200, layout, chunkSize: 4 });
  assert.equal(slow.failure, 'timeout');
  assert.equal(slow.chunks.length, 0);

  const liar = net.createServer((s) => {
    s.on('error', () => {});
    s.once('data', () => {
      const c = chunk(keys[1]!, 4, 9);
      s.write(peerChunkHead(keys[1]!, c.byteLength));
      s.end(c);
    });
  });
  await new Promise<void>((r) => liar.listen(0, '127.0.0.1', r));
  closers.push(() => new Promise((r) => liar.close(() => r())));
  const lied = await fetchFromPeer({ peerUrl: `127.0.0.1:${(liar.address() as net.AddressInfo).port}`, keys: keys.slice(0, 2), from: 't', deadline: Date.now() + 30_000, layout, chunkSize: 4 });
  assert.equal(lied.failure, 'corrupt');
  assert.match(lied.error ?? '', /where .* was expected/);

  const gone = net.createServer();
  await new Promise<void>((r) => gone.listen(0, '127.0.0.1', r));
  const port = (gone.address() as net.AddressInfo).port;
  await new Promise<void>((r) => gone.close(() => r()));
  const refused = await fetchFromPeer({ peerUrl: `127.0.0.1:${port}`, keys: keys.slice(0, 1), from: 't', deadline: Date.now() + 30_000, layout, chunkSize: 4 });
  assert.equal(refused.failure, 'connect');
});

test('a fetch takes the head from one holder and the continuing run from another, stepping over a chunk it holds itself', async () => {
  // Two real holders behind their peer ports: A holds keys 0..1, B holds 3..4 without the head;
  // the asker holds key 2 itself. The answer is what the controller gives for that (test above).
  const a = await KvcStore.create({ local_cpu: true, max_local_cpu_size: 0.01, max_local_disk_size: 0, local_disk: null });
  const b = await KvcStore.create({ local_cpu: true, max_local_cpu_size: 0.01, max_local_disk_size: 0, local_disk: null });
  const me = await KvcStore.create({ local_cpu: true, max_local_cpu_size: 0.01, max_local_disk_size: 0, local_disk: null });
  for (const i of [0, 1]) await a.put(keys[i]!, chunk(keys[i]!, 4, i + 1));
  for (const i of [3, 4]) await b.put(keys[i]!, chunk(keys[i]!, 4, i + 1));
  await me.put(keys[2]!, chunk(keys[2]!, 4, 3));
  const pa = await startPeerServer(a, '127.0.0.1', 0, { layout, chunkSize: 4 });
  const pb = await startPeerServer(b, '127.0.0.1', 0, { layout, chunkSize: 4 });
  closers.push(() => pa.close(), () => pb.close(), () => a.close(), () => b.close(), () => me.close());
  const registry = new PromRegistry();
  const metrics = new P2pMetrics(registry);
  const client = (holders: { instance_id: string; peer_url: string; location: string; chunks: number; from?: number }[]) =>
    new P2pClient({ store: me, instanceId: 'me', layout, chunkSize: 4, timeoutMs: 30_000, askHolders: async () => holders, metrics });
  const want = keys.slice(0, 6);
  const head = { instance_id: 'a', peer_url: `127.0.0.1:${pa.port}`, location: 'LocalCPUBackend', chunks: 2 };
  const tail = { instance_id: 'b', peer_url: `127.0.0.1:${pb.port}`, location: 'LocalCPUBackend', chunks: 2, from: 3 };
  const got = await client([head, tail]).fetch(want);
  assert.deepEqual([...got.keys()], [keys[0], keys[1], keys[3], keys[4]]);
  assert.deepEqual([...got.values()].map((c) => c[HEADER_BYTES]), [1, 2, 4, 5]);
  // The asker no longer holds key 2: the continuing run would leave a gap and is not used.
  await me.remove(keys[2]!, 'LocalCPUBackend');
  const gap = await client([head, tail]).fetch(want);
  assert.deepEqual([...gap.keys()], [keys[0], keys[1]]);
  const text = await registry.metrics();
  assert.match(text, /kvc_p2p_fetches_total\{outcome="hit"\} 1/);
  assert.match(text, /kvc_p2p_fetches_total\{outcome="partial"\} 1/);
});

