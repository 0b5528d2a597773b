// A clear asked by the controller keeps pinned chunks unless the caller says include_pinned: a pin
// is a promise that the chunk stays, and a clear of "the cache" must not break it by accident.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { DType, encodeChunk, payloadBytes } from '../../src/common/chunk.js';
import { KvcStore } from '../../src/kvc/store.js';
import { WorkerOps } from '../../src/kvc/worker_ops.js';

const layout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 64 };
const keyOf = (i: number) => i.toString(16).padStart(16, '0');
const chunk = (key: string) => encodeChunk(layout, 16, key, new Uint8Array(payloadBytes(layout, 16)).fill(1));

test('a worker clear keeps pinned chunks; include_pinned clears them too', async () => {
  const store = await KvcStore.create({ local_cpu: true, max_local_cpu_size: 8 / 1024 /* 8 MiB */, max_local_disk_size: 0, local_disk: null });
  try {
    for (let i = 0; i < 4; i++) await store.put(keyOf(i), chunk(keyOf(i)));
    const ops = new WorkerOps(store, 'inst');
    assert.equal(ops.pin([keyOf(1), keyOf(2)], 'LocalCPUBackend'), 2);
    assert.deepEqual(await ops.clear('LocalCPUBackend'), { removed: 2, kept: 2 }, 'the two unpinned chunks are removed, the two pinned kept');
    assert.deepEqual(store.keys('LocalCPUBackend').sort(), [keyOf(1), keyOf(2)], 'the pinned ones stay');
    assert.deepEqual(await ops.clear('LocalCPUBackend', true), { removed: 2, kept: 0 }, 'include_pinned removes them too');
    assert.deepEqual(store.keys('LocalCPUBackend'), []);
  } finally {
    await store.close();
  }
});
