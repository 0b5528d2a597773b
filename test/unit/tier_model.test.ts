// The tier model of bench/_trace_policy.ts (harness/tier_model.ts): one tier is the pooled LRU;
// with the keeper chosen by room a full prefiller's prompts go to its decoder.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { simulate, type ReplayRequest } from '../../harness/trace_model.js';
import { modelTiers } from '../../harness/tier_model.js';

const req = (index: number, chunks: string[]): ReplayRequest => ({ index, at: index, chunks, chunkTokens: chunks.map(() => 4), maxTokens: 1, droppedBlocks: 0 });

test('one tier alone computes exactly what the pooled LRU of its size computes', () => {
  const reqs = [req(0, ['a', 'b']), req(1, ['c', 'd']), req(2, ['a', 'b', 'e']), req(3, ['c', 'd', 'f']), req(4, ['a', 'b', 'e', 'g'])];
  for (const cap of [1, 2, 3, 5, 100]) {
    const m = modelTiers(reqs, { prefillers: 0, decoders: 1, perTier: cap, maxLocalChunks: 0, keeper: 'room' });
    const s = simulate(reqs, cap);
    assert.deepEqual([m.sent, m.computed], [s.sent, s.computed], `capacity ${cap}`);
  }
});

test('a full prefiller keeps nothing more when the keeper is chosen by room: its decoder stores the prompts', () => {
  const reqs = [req(0, ['a', 'b']), req(1, ['c', 'd']), req(2, ['e', 'f']), req(3, ['g', 'h'])];
  const byPrefiller = modelTiers(reqs, { prefillers: 1, decoders: 1, perTier: 2, maxLocalChunks: 0, keeper: 'prefiller' });
  assert.deepEqual(byPrefiller.stored, [8, 0]);
  const byRoom = modelTiers(reqs, { prefillers: 1, decoders: 1, perTier: 2, maxLocalChunks: 0, keeper: 'room' });
  // The prefiller fills with the first prompt; then the decoder has room (the oldest), then the ages alternate.
  assert.deepEqual(byRoom.stored, [4, 4]);
  assert.throws(() => modelTiers(reqs, { prefillers: 1, decoders: 0, perTier: 2, maxLocalChunks: 0, keeper: 'room' }), /at least one decoder/);
});
