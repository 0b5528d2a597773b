// Conditional transfer: a decoder whose own cache already holds a prompt's leading chunks
// receives only the chunks it lacks. The receiver is told what the engine's cache holds
// (heldLocally); its ALLOC reply lists those keys in `have`, the sender skips them, and take()
// hands out the transferred ones, stepping over the cached ones. Real loopback TCP.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { DType, chunkBytes, type KvLayout } from '../../src/common/chunk.js';
import { freePortRange } from '../../harness/ports.js';
import { XferReceiver, XferSender, type DisaggSpec, type OutChunk } from '../../src/xfer/index.js';
import { syntheticChunk, syntheticKey } from '../../src/xfer/peer.js';

const layout: KvLayout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 8 };
const CHUNK = 16;
const MODEL = 'builtin-test';

const closers: (() => unknown)[] = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

function chunks(seed: number, tokens: number[]): OutChunk[] {
  return tokens.map((n, i) => ({ key: syntheticKey(seed, i), numTokens: n, data: syntheticChunk(layout, n, syntheticKey(seed, i), seed * 1000 + i) }));
}

test('a decoder holding the first chunks in its cache receives only the rest; take() steps over the cached ones', async () => {
  const a = chunks(3, [CHUNK, CHUNK, CHUNK, 7]);
  const cached = new Set([a[0]!.key, a[1]!.key]);
  const port = await freePortRange(2);
  const r = await XferReceiver.start({
    host: '127.0.0.1',
    initPort: port,
    allocPort: port + 1,
    bufferBytes: 1 << 20,
    layout,
    chunkSize: CHUNK,
    modelId: MODEL,
    heldLocally: (k) => cached.has(k),
  });
  closers.push(() => r.close());
  const s = new XferSender({ layout, chunkSize: CHUNK, modelId: MODEL, bufferBytes: 1 << 20 });
  closers.push(() => s.close());
  const spec: DisaggSpec = { req_id: 'req-cached', receiver_host: '127.0.0.1', receiver_init_port: port, receiver_alloc_port: port + 1 };
  const res = await s.send(spec, a);
  assert.equal(res.ok, true, res.error);
  assert.deepEqual([res.sent, res.skipped], [2, 2], 'the two cached chunks were not sent');
  assert.equal(res.bytes, chunkBytes(layout, CHUNK) + chunkBytes(layout, 7), 'only the lacking chunks crossed the wire');
  const taken = await r.take(a.map((c) => c.key), 'req-cached', 1000);
  assert.deepEqual(taken.keys, [a[2]!.key, a[3]!.key], 'the transferred chunks, past the cached ones');
  assert.deepEqual(taken.chunks[0], a[2]!.data);
  assert.deepEqual(taken.chunks[1], a[3]!.data);
  taken.release();
  // Once the cache no longer holds them (evicted), the next transfer sends every chunk.
  cached.clear();
  const b = chunks(4, [CHUNK, CHUNK]);
  const res2 = await s.send({ ...spec, req_id: 'req-evicted' }, b);
  assert.deepEqual([res2.ok, res2.sent, res2.skipped], [true, 2, 0]);
  const t2 = await r.take(b.map((c) => c.key), 'req-evicted', 1000);
  assert.equal(t2.keys.length, 2);
  t2.release();
});
