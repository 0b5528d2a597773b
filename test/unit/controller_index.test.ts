// Unit tests of the controller's index structures: the typed-array ChunkIndex against a
// reference Map model under random admits/evicts/drops (including growth and deletions that
// wrap around the table), prefix matching, the fast keyer against src/common/keys.ts, and
// the event log's lifecycle and bounded history.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { chunkKeys } from '../../src/common/keys.js';
import { ChunkIndex } from '../../src/controller/chunk_index.js';
import { EventLog } from '../../src/controller/events.js';
import { halvesToHex, keyHalves } from '../../src/common/keys.js';
import { packKeys, unpackKeys } from '../../src/protocol/monitor.js';

function rng(seed: number) {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

test('ChunkIndex agrees with a reference model under random operations', () => {
  const idx = new ChunkIndex();
  const ref = new Map<string, Set<number>>();
  const rand = rng(42);
  // A small key universe forces collisions of operations on the same keys; some keys share
  // their low half so that probe chains form and deletions must shift entries back.
  const universe = Array.from({ length: 3000 }, (_, i) => (i % 7 === 0 ? `${randomBytes(4).toString('hex')}0000abcd` : randomBytes(8).toString('hex')));
  for (let step = 0; step < 60_000; step++) {
    const key = universe[Math.floor(rand() * universe.length)]!;
    const holder = 1 + Math.floor(rand() * 4);
    const set = ref.get(key) ?? new Set<number>();
    if (rand() < 0.6) {
      assert.equal(idx.add(key, holder), !set.has(holder));
      set.add(holder);
      ref.set(key, set);
    } else {
      assert.equal(idx.remove(key, holder), set.has(holder));
      set.delete(holder);
      if (set.size === 0) ref.delete(key);
    }
    if (step % 20_000 === 19_999) {
      idx.dropHolders(new Set([2]));
      for (const [k, s] of ref) {
        s.delete(2);
        if (s.size === 0) ref.delete(k);
      }
    }
  }
  assert.equal(idx.size, ref.size);
  for (const k of universe) for (let h = 1; h <= 4; h++) assert.equal(idx.has(k, h), ref.get(k)?.has(h) ?? false, `${k} holder ${h}`);
  for (let h = 1; h <= 4; h++) {
    let n = 0;
    for (const s of ref.values()) if (s.has(h)) n++;
    assert.equal(idx.count(h), n, `count of holder ${h}`);
  }
});

test('ChunkIndex.dropHolders reports, after the rebuild, the keys that lost a dropped holder and kept another', () => {
  const idx = new ChunkIndex();
  const key = (i: number) => (0x1000 + i).toString(16).padStart(16, '0');
  const holders = (k: string) => {
    const out: number[] = [];
    return idx.holdersOf(parseInt(k.slice(0, 8), 16) >>> 0, parseInt(k.slice(8), 16) >>> 0, out).sort();
  };
  // Holders 1 and 2 leave; 3 and 4 stay.
  idx.add(key(0), 1); // dropped holder only: gone, not reported
  idx.add(key(1), 1); idx.add(key(1), 2); // two dropped holders, no survivor: not reported
  idx.add(key(2), 1); idx.add(key(2), 3); // one survivor: reported
  idx.add(key(3), 2); idx.add(key(3), 3); idx.add(key(3), 4); // two survivors: reported
  idx.add(key(4), 1); idx.add(key(4), 2); idx.add(key(4), 4); // two dropped, one survivor: reported
  idx.add(key(5), 3); // untouched single holder: not reported
  idx.add(key(6), 3); idx.add(key(6), 4); // untouched shared key: not reported
  const got: { key: string; holders: number[]; firstLeft: boolean }[] = [];
  idx.dropHolders(new Set([1, 2]), (hi, lo, firstLeft) => {
    const k = halvesToHex(hi, lo);
    // Called once the table is rebuilt: the key's holders are the survivors only.
    got.push({ key: k, holders: holders(k), firstLeft });
  });
  got.sort((a, b) => a.key.localeCompare(b.key));
  // firstLeft: the key's first holder (the oldest admission) was among the dropped.
  assert.deepEqual(got, [
    { key: key(2), holders: [3], firstLeft: true },
    { key: key(3), holders: [3, 4], firstLeft: true },
    { key: key(4), holders: [4], firstLeft: true },
  ]);
  assert.equal(idx.size, 5);
  assert.equal(idx.count(1), 0);
  assert.equal(idx.count(3), 4);
  // Without a callback, and for holders that hold nothing, nothing is reported and nothing breaks.
  idx.dropHolders(new Set([4]));
  assert.equal(idx.size, 4);
  let calls = 0;
  idx.dropHolders(new Set([9]), () => calls++);
  assert.equal(calls, 0);
  assert.equal(idx.size, 4);
  // Many reported keys (past the first allocation of the list): each once.
  const many = Array.from({ length: 5000 }, (_, i) => key(100 + i));
  for (const k of many) {
    idx.add(k, 5);
    idx.add(k, 6);
  }
  const seen = new Set<string>();
  let reported = 0;
  idx.dropHolders(new Set([5]), (hi, lo) => {
    reported++;
    seen.add(halvesToHex(hi, lo));
  });
  assert.equal(reported, many.length);
  assert.equal(seen.size, many.length);
  for (const k of many) assert.ok(seen.has(k) && idx.has(k, 6) && !idx.has(k, 5));
});

test("ChunkIndex keeps a key's holders in admission order: removing the first is reported as such", () => {
  const idx = new ChunkIndex();
  const key = (i: number) => i.toString(16).padStart(16, '0');
  for (const h of [3, 1, 2]) idx.add(key(1), h);
  const holders = () => idx.holdersOf(0, 1, []);
  assert.deepEqual(holders(), [3, 1, 2], 'admission order, not numeric order');
  const calls: [number, boolean][] = [];
  const left = (_hi: number, lo: number, firstLeft: boolean) => calls.push([lo, firstLeft]);
  idx.removePacked(packKeys([key(1)]), 1, left); // a later holder leaves
  idx.removePacked(packKeys([key(1)]), 3, left); // the first holder leaves: 2 is first now
  assert.deepEqual(calls, [[1, false], [1, true]]);
  assert.deepEqual(holders(), [2]);
  idx.add(key(1), 5);
  idx.add(key(1), 6);
  // Dropping whole holders: the survivors keep their order; the first one left here.
  const dropped: boolean[] = [];
  idx.dropHolders(new Set([2]), (_hi, _lo, firstLeft) => dropped.push(firstLeft));
  assert.deepEqual(dropped, [true]);
  assert.deepEqual(holders(), [5, 6]);
  idx.dropHolders(new Set([6]), (_hi, _lo, firstLeft) => dropped.push(firstLeft));
  assert.deepEqual(dropped, [true, false]);
});

test('ChunkIndex grows past a million keys and ingests packed keys', () => {
  const idx = new ChunkIndex();
  // 1.1 M random keys cut from one random buffer (a randomBytes call per key costs seconds).
  const bytes = randomBytes(8 * 1_100_000);
  const keys = Array.from({ length: 1_100_000 }, (_, i) => bytes.toString('hex', 8 * i, 8 * i + 8));
  for (let o = 0; o < keys.length; o += 65_536) idx.addPacked(packKeys(keys.slice(o, o + 65_536)), 7);
  assert.equal(idx.size, keys.length);
  assert.equal(idx.count(7), keys.length);
  assert.ok(idx.has(keys[123_456]!, 7));
  idx.removePacked(packKeys(keys.slice(0, 100_000)), 7);
  assert.equal(idx.size, 1_000_000);
  assert.equal(idx.has(keys[5]!, 7), false);
  assert.ok(idx.has(keys[100_000]!, 7));
  assert.deepEqual(unpackKeys(packKeys(keys.slice(0, 3))), keys.slice(0, 3));
});

test('prefixMatches: per holder, the number of leading keys held', () => {
  const tokens = Array.from({ length: 100 }, (_, i) => i * 3);
  const k = keyHalves(tokens, { modelId: 'm', chunkSize: 10, seed: 0n });
  const hex = Array.from({ length: k.count }, (_, i) => halvesToHex(k.hi[i]!, k.lo[i]!));
  const idx = new ChunkIndex();
  for (const h of hex.slice(0, 10)) idx.add(h, 1); // holder 1: all 10
  for (const h of hex.slice(0, 4)) idx.add(h, 2); // holder 2: first 4
  for (const h of [...hex.slice(0, 2), ...hex.slice(3, 10)]) idx.add(h, 3); // holder 3: gap at 2
  for (const h of hex.slice(1)) idx.add(h, 4); // holder 4: misses the first → no match
  const got = new Map<number, number>();
  idx.prefixMatches(k.hi, k.lo, k.count, (h, n) => got.set(h, n));
  assert.deepEqual([...got].sort(), [[1, 10], [2, 4], [3, 2]]);
  const single = new ChunkIndex();
  for (const h of hex.slice(0, 6)) single.add(h, 9);
  const one: [number, number][] = [];
  single.prefixMatches(k.hi, k.lo, k.count, (h, n) => one.push([h, n]));
  assert.deepEqual(one, [[9, 6]]);
});

test('EventLog: lifecycle, timing and bounded history', () => {
  const log = new EventLog(3);
  const a = log.create('move', 512, 2, {});
  assert.equal(a.status, 'pending');
  log.start(a);
  assert.equal(a.status, 'running');
  log.finish(a, 2);
  assert.equal(a.status, 'finished');
  assert.ok(a.finished_at && a.duration_ms !== null);
  const b = log.create('pin', 0, 0, {});
  log.fail(b, 'boom');
  assert.equal(b.status, 'failed');
  assert.equal(b.error, 'boom');
  log.finish(b, 0); // a completed event does not change again
  assert.equal(b.status, 'failed');
  const running = log.create('copy', 1, 1, {});
  log.start(running);
  for (let i = 0; i < 5; i++) log.finish(log.create('pin', 1, 1, {}), 1);
  assert.equal(log.get(a.event_id), undefined, 'oldest completed events leave the history');
  assert.equal(log.get(running.event_id)?.status, 'running', 'running events are kept');
  assert.deepEqual(log.counts, { pending: 0, running: 1, finished: 6, failed: 1 });
});
