// The paged KV pool's resident bytes (kvc_engine_kv_cache_resident_bytes): the most blocks ever in
// use at once, since freed blocks are handed out again before untouched ones.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BLOCK_TOKENS, PagedKvCache } from '../../src/engine/model/kv_cache.js';

test('resident bytes follow the peak of blocks in use, not the blocks handed out over time', () => {
  const kv = new PagedKvCache({ numLayers: 2, numKvHeads: 1, headDim: 4 }, 64 * 2 * 2 * BLOCK_TOKENS * 4 * 4);
  assert.equal(kv.totalBlocks, 64);
  assert.equal(kv.residentBytes, 0, 'nothing touched before the first allocation');
  kv.allocate('a', 3 * BLOCK_TOKENS);
  kv.allocate('b', 2 * BLOCK_TOKENS);
  assert.equal(kv.residentBytes, 5 * kv.blockBytes);
  // Many sequences one after the other, never more than 5 blocks at once: still 5 resident.
  for (let i = 0; i < 100; i++) {
    kv.free('a');
    kv.allocate('a', (1 + (i % 3)) * BLOCK_TOKENS);
  }
  assert.equal(kv.residentBytes, 5 * kv.blockBytes);
  kv.allocate('c', 4 * BLOCK_TOKENS);
  assert.equal(kv.residentBytes, kv.usedBlocks * kv.blockBytes, 'a new peak');
  kv.free('a');
  kv.free('b');
  kv.free('c');
  assert.equal(kv.usedBlocks, 0);
  assert.equal(kv.residentBytes > 0, true, 'touched pages stay resident after everything is freed');
});
