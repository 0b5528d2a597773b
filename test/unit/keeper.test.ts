// Who keeps a disaggregated prompt's chunks (src/proxy/keeper.ts, src/protocol/keeper.ts) and the
// room a tier reports for it (LruIndex.room), on their own (no processes).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chooseKeeper, chooseKeeperSplit } from '../../src/proxy/keeper.js';
import { keeperAt, keeperOf, keeperSplitOf } from '../../src/protocol/keeper.js';
import { kvTransferParamsSchema } from '../../src/protocol/disagg_spec.js';
import { LruIndex } from '../../src/kvc/lru_index.js';

test('the prefiller keeps while its tier has room for the prompt, or when a room is unknown', () => {
  assert.equal(chooseKeeper(64, { free_bytes: 4096, free_tokens: 64, tail_age_ms: 5 }, { free_bytes: 99_999, free_tokens: 1024, tail_age_ms: null }), 'prefiller');
  // Room for half the prompt is not room for it.
  assert.equal(chooseKeeper(64, { free_bytes: 2048, free_tokens: 32, tail_age_ms: 5 }, { free_bytes: 99_999, free_tokens: 1024, tail_age_ms: null }), 'decoder');
  assert.equal(chooseKeeper(64, undefined, { free_bytes: 1000, free_tokens: 1000, tail_age_ms: null }), 'prefiller');
  assert.equal(chooseKeeper(64, { free_bytes: 0, free_tokens: 0, tail_age_ms: 5 }, undefined), 'prefiller');
});

test('a full prefiller hands the prompt to a decoder with room, or whose next chunk to go is older', () => {
  assert.equal(chooseKeeper(64, { free_bytes: 0, free_tokens: 0, tail_age_ms: 100_000 }, { free_bytes: 64, free_tokens: 64, tail_age_ms: 1 }), 'decoder');
  assert.equal(chooseKeeper(64, { free_bytes: 0, free_tokens: 0, tail_age_ms: 1_000 }, { free_bytes: 0, free_tokens: 0, tail_age_ms: 9_000 }), 'decoder');
  assert.equal(chooseKeeper(64, { free_bytes: 0, free_tokens: 0, tail_age_ms: 9_000 }, { free_bytes: 0, free_tokens: 0, tail_age_ms: 1_000 }), 'prefiller');
  // Equal ages keep the prefiller; a decoder with nothing in use is the oldest room.
  assert.equal(chooseKeeper(64, { free_bytes: 0, free_tokens: 0, tail_age_ms: 5_000 }, { free_bytes: 0, free_tokens: 0, tail_age_ms: 5_000 }), 'prefiller');
  assert.equal(chooseKeeper(64, { free_bytes: 0, free_tokens: 0, tail_age_ms: 5_000 }, { free_bytes: 0, free_tokens: 0, tail_age_ms: null }), 'decoder');
});

test('kv_transfer_params.kvc_keeper: read as sent, "prefiller" when absent, a bad value refused naming the field', () => {
  assert.equal(keeperOf({ kvc_keeper: 'decoder' }), 'decoder');
  assert.equal(keeperOf({ kvc_keeper: 'prefiller' }), 'prefiller');
  assert.equal(keeperOf({}), 'prefiller');
  assert.equal(keeperOf(undefined), 'prefiller');
  assert.ok(kvTransferParamsSchema.safeParse({ kvc_keeper: 'decoder', other: 1 }).success);
  const bad = kvTransferParamsSchema.safeParse({ kvc_keeper: 'both' });
  assert.equal(bad.success, false);
  assert.deepEqual(bad.error!.issues[0]!.path, ['kvc_keeper']);
  assert.match(bad.error!.issues[0]!.message, /expected one of prefiller, decoder/);
});

test('a prompt longer than its keeper\'s whole tier is split: the chunks past the tier\'s size go to the other side', () => {
  const full = (capacity: number, age: number) => ({ free_bytes: 0, free_tokens: 0, capacity_tokens: capacity, tail_age_ms: age });
  // The prefiller keeps (older tail); its tier holds 576 tokens, the prompt has 1,000: split at 576.
  assert.deepEqual(chooseKeeperSplit(1_000, full(576, 9_000), full(576, 1_000)), { keeper: 'prefiller', split: 576 });
  // The decoder keeps; the split is at the decoder's own size.
  assert.deepEqual(chooseKeeperSplit(1_000, full(576, 1_000), full(320, 9_000)), { keeper: 'decoder', split: 320 });
  // A prompt that fits the keeper's tier is not split, nor one whose other side has no tier, nor
  // one whose tier sizes are not reported (an engine that does not say it is never given a part).
  assert.deepEqual(chooseKeeperSplit(576, full(576, 9_000), full(576, 1_000)), { keeper: 'prefiller', split: null });
  assert.deepEqual(chooseKeeperSplit(1_000, full(576, 9_000), full(0, 1_000)), { keeper: 'prefiller', split: null });
  assert.deepEqual(chooseKeeperSplit(1_000, { free_bytes: 0, free_tokens: 0, tail_age_ms: 9_000 }, full(576, 1_000)), { keeper: 'prefiller', split: null });
  assert.deepEqual(chooseKeeperSplit(1_000, undefined, full(576, 1_000)), { keeper: 'prefiller', split: null });
  // The head goes to the side that already holds more of the prompt (it need not store it again).
  assert.deepEqual(chooseKeeperSplit(1_000, full(576, 9_000), full(320, 1_000), { p: 0, d: 320 }), { keeper: 'decoder', split: 320 });
  assert.deepEqual(chooseKeeperSplit(1_000, full(576, 1_000), full(320, 9_000), { p: 64, d: 0 }), { keeper: 'prefiller', split: 576 });
  // Equal holdings leave the keeper by room; so does a prompt that fits its keeper's tier.
  assert.deepEqual(chooseKeeperSplit(1_000, full(576, 1_000), full(320, 9_000), { p: 64, d: 64 }), { keeper: 'decoder', split: 320 });
  assert.deepEqual(chooseKeeperSplit(500, full(576, 9_000), full(576, 1_000), { p: 0, d: 320 }), { keeper: 'prefiller', split: null });
});

test('kv_transfer_params.kvc_keeper_split: who keeps each chunk; a bad value refused naming the field', () => {
  const p = { kvc_keeper: 'prefiller', kvc_keeper_split: 64 };
  assert.equal(keeperSplitOf(p), 64);
  assert.equal(keeperAt(p, 0), 'prefiller');
  assert.equal(keeperAt(p, 32), 'prefiller');
  assert.equal(keeperAt(p, 64), 'decoder');
  assert.equal(keeperAt({ kvc_keeper: 'decoder', kvc_keeper_split: 64 }, 96), 'prefiller');
  assert.equal(keeperAt({ kvc_keeper: 'decoder' }, 96), 'decoder');
  assert.equal(keeperSplitOf({}), null);
  assert.ok(kvTransferParamsSchema.safeParse(p).success);
  for (const v of [0, -32, 1.5, '64', null]) {
    const bad = kvTransferParamsSchema.safeParse({ kvc_keeper: 'decoder', kvc_keeper_split: v });
    assert.equal(bad.success, false, String(v));
    assert.deepEqual(bad.error!.issues[0]!.path, ['kvc_keeper_split']);
    assert.match(bad.error!.issues[0]!.message, /expected a token position \(an integer > 0\)/);
  }
});

test('a tier\'s room: free room plus what cold and replica chunks hold; the age of the oldest chunk in use', () => {
  let now = 1_000;
  const ix = new LruIndex<{ bytes: number; pinned: boolean }>(() => now);
  assert.deepEqual(ix.room(100), { freeBytes: 100, tailAgeMs: null });
  ix.add('a', { bytes: 10, pinned: false });
  now = 2_000;
  ix.add('b', { bytes: 10, pinned: false });
  ix.add('c', { bytes: 10, pinned: false }, { evictFirst: true });
  now = 5_000;
  // a and b are in use (30 - 10 cold = 20 bytes), a the oldest, used 4 s ago.
  assert.deepEqual(ix.room(40), { freeBytes: 20, tailAgeMs: 4_000 });
  // A read makes a the newest: b is now the next to go.
  ix.touch('a');
  assert.deepEqual(ix.room(40), { freeBytes: 20, tailAgeMs: 3_000 });
  // A replica (another instance keeps the chunk) is room too; a pinned chunk is not.
  ix.setReplica('b', true);
  assert.deepEqual(ix.room(40), { freeBytes: 30, tailAgeMs: 0 });
  ix.pin('c');
  assert.deepEqual(ix.room(40), { freeBytes: 20, tailAgeMs: 0 });
  // Full of chunks in use: no room.
  assert.deepEqual(ix.room(10), { freeBytes: 0, tailAgeMs: 0 });
});
