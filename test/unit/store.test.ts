// Cache instance storage: LocalCPUBackend, LocalDiskBackend and the tiered KvcStore.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { copyFileSync, existsSync, mkdirSync, readdirSync, writeFileSync, readFileSync, truncateSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
import { ChunkFormatError, DType, HEADER_BYTES, encodeChunk, payloadBytes } from '../../src/common/chunk.js';
import { chunkKeys } from '../../src/common/keys.js';
import { KvcStore } from '../../src/kvc/store.js';
import { LocalCPUBackend } from '../../src/kvc/cpu_backend.js';
import { LocalDiskBackend } from '../../src/kvc/disk_backend.js';
import { CopyDeclinedError, StoreFullError, type KeyEvent } from '../../src/kvc/types.js';
import { transferHolds } from '../../src/kvc/transfer_holds.js';
import { STALE_AFTER_TURNOVERS } from '../../src/kvc/lru_index.js';
import { tempDir } from '../../harness/temp_dir.js';

const layout = { dtype: DType.f32, numLayers: 2, numKvHeads: 2, headDim: 64 };
const TOKENS = 16; // 2*2*16*128*4 = 32 KiB payload per chunk
const MiB = 1024 * 1024;
const gib = (bytes: number) => bytes / 1024 ** 3;

function makeChunk(key: string, fill: number): Uint8Array {
  const p = new Uint8Array(payloadBytes(layout, TOKENS)).fill(fill);
  return encodeChunk(layout, TOKENS, key, p);
}
const keyOf = (i: number) => i.toString(16).padStart(16, '0');

test('LocalCPUBackend never exceeds its capacity when overfilled, evicting least recently used', async () => {
  const chunkSize = makeChunk(keyOf(0), 0).byteLength;
  const cap = 10 * 36 * 1024; // room for ten 36 KiB size classes
  const cpu = new LocalCPUBackend(cap);
  const evicted: string[] = [];
  for (let i = 0; i < 50; i++) {
    evicted.push(...(await cpu.put(keyOf(i), makeChunk(keyOf(i), i))));
    assert.ok(cpu.stats().usedBytes <= cap, `used ${cpu.stats().usedBytes} > cap ${cap}`);
    assert.ok(cpu.heldBytes() <= cap, 'pool memory stays within capacity too');
    if (i === 5) await cpu.get(keyOf(0)); // touch 0: it becomes most recently used
  }
  assert.equal(cpu.stats().chunks, 10);
  assert.equal(evicted.length, 40);
  assert.ok(evicted.indexOf(keyOf(1)) < evicted.indexOf(keyOf(0)), 'LRU: untouched chunk 1 leaves before touched chunk 0');
  const got = await cpu.get(keyOf(49));
  assert.equal(got!.byteLength, chunkSize);
  assert.equal(got![HEADER_BYTES], 49);
});

test('a prompt\'s chunks are evicted from its tail: after touchPrefix the head is the most recently used', async () => {
  const cap = 6 * 36 * 1024; // six chunks: two prompts of three
  const store = await KvcStore.create({ local_cpu: true, max_local_cpu_size: gib(cap), max_local_disk_size: 0, local_disk: null });
  const a = [keyOf(1), keyOf(2), keyOf(3)];
  const b = [keyOf(4), keyOf(5), keyOf(6)];
  for (const [i, k] of [...a, ...b].entries()) await store.put(k, makeChunk(k, i));
  store.touchPrefix(a);
  store.touchPrefix(b);
  // A third prompt needs two chunks of room: with plain per-chunk LRU prompt a would lose its
  // head (stored first) and with it every chunk; head-last, it loses its last two chunks.
  for (const [i, k] of [keyOf(7), keyOf(8)].entries()) await store.put(k, makeChunk(k, 10 + i));
  assert.equal(store.lookupPrefix(a), 1, 'prompt a keeps its first chunk');
  assert.equal(store.lookupPrefix(b), 3, 'prompt b (used later) is whole');
  assert.ok(!store.has(keyOf(2)) && !store.has(keyOf(3)), 'a\'s tail went first');
});

test('pinned chunks are never evicted; a put fails clearly when only pinned chunks remain', async () => {
  const cpu = new LocalCPUBackend(4 * 36 * 1024);
  for (let i = 0; i < 4; i++) await cpu.put(keyOf(i), makeChunk(keyOf(i), i));
  for (let i = 0; i < 3; i++) assert.ok(cpu.pin(keyOf(i)));
  for (let i = 10; i < 20; i++) await cpu.put(keyOf(i), makeChunk(keyOf(i), i));
  for (let i = 0; i < 3; i++) assert.ok(cpu.has(keyOf(i)), `pinned ${i} survived`);
  assert.ok(cpu.pin(keyOf(19)));
  await assert.rejects(cpu.put(keyOf(99), makeChunk(keyOf(99), 1)), (e: Error) => e instanceof StoreFullError && /pinned chunk\(s\) cannot be evicted/.test(e.message));
  assert.ok(!cpu.has(keyOf(99)));
  assert.ok(cpu.unpin(keyOf(0)));
  await cpu.put(keyOf(99), makeChunk(keyOf(99), 1));
  assert.ok(!cpu.has(keyOf(0)), 'unpinned chunk is evictable again');
  assert.equal(cpu.pin('ffffffffffffffff'), false, 'pinning an absent key reports false');
});

test('LocalCPUBackend get copies into the caller buffer', async () => {
  const cpu = new LocalCPUBackend(2 * 36 * 1024);
  const c = makeChunk(keyOf(1), 7);
  await cpu.put(keyOf(1), c);
  const dest = new Uint8Array(c.byteLength + 10);
  const view = await cpu.get(keyOf(1), dest);
  assert.equal(view!.buffer, dest.buffer);
  assert.deepEqual(view, c);
  await assert.rejects(cpu.get(keyOf(1), new Uint8Array(10)), RangeError);
});

test('LocalCPUBackend pool: empty when idle, grows on demand, recycles freed buffers', async () => {
  const CLASS = 36 * 1024; // size class of one test chunk (32 KiB + 64 B header, rounded to 4 KiB)
  const cpu = new LocalCPUBackend(2 * CLASS);
  assert.equal(cpu.heldBytes(), 0, 'a fresh backend holds no memory');
  assert.equal(cpu.poolAllocations(), 0);
  await cpu.put(keyOf(1), makeChunk(keyOf(1), 1));
  assert.equal(cpu.heldBytes(), CLASS, 'one buffer after one chunk');
  await cpu.put(keyOf(2), makeChunk(keyOf(2), 2));
  assert.equal(cpu.heldBytes(), 2 * CLASS);
  assert.equal(cpu.poolAllocations(), 2);
  // Full: the next put evicts chunk 1 and must reuse its very buffer, not allocate.
  const buf1 = cpu.peek(keyOf(1))!.buffer;
  await cpu.get(keyOf(2)); // keep 2 most recently used
  assert.deepEqual(await cpu.put(keyOf(3), makeChunk(keyOf(3), 3)), [keyOf(1)]);
  assert.equal(cpu.peek(keyOf(3))!.buffer, buf1, "chunk 3 lives in chunk 1's recycled buffer");
  assert.equal(cpu.poolAllocations(), 2, 'evict + put of the same size allocates nothing');
  // remove frees a buffer; the next put of that size takes it back.
  const buf2 = cpu.peek(keyOf(2))!.buffer;
  assert.ok(await cpu.remove(keyOf(2)));
  await cpu.put(keyOf(4), makeChunk(keyOf(4), 4));
  assert.equal(cpu.peek(keyOf(4))!.buffer, buf2);
  for (let i = 5; i < 30; i++) await cpu.put(keyOf(i), makeChunk(keyOf(i), i));
  assert.equal(cpu.poolAllocations(), 2, 'a warm pool never allocates again for same-size chunks');
  assert.equal(cpu.heldBytes(), 2 * CLASS);
  assert.equal((await cpu.get(keyOf(29)))![HEADER_BYTES], 29, 'recycled buffers hold the new bytes');
});

/** A store with one tier of `capBytes`: CPU memory, or a disk directory named after `tag`. */
function oneTierStore(kind: 'cpu' | 'disk', capBytes: number, tag: string): Promise<KvcStore> {
  return KvcStore.create(
    kind === 'cpu'
      ? { local_cpu: true, max_local_cpu_size: gib(capBytes), max_local_disk_size: 0, local_disk: null }
      : { local_cpu: false, max_local_cpu_size: 0, max_local_disk_size: gib(capBytes), local_disk: tempDir(tag) },
  );
}

test('a chunk admitted evict-first is evicted before every recent one, keeps its place when stored again, and turns recent once read', async () => {
  const cap = 6 * 36 * 1024; // six chunks
  for (const kind of ['cpu', 'disk'] as const) {
    const store = await oneTierStore(kind, cap, 'kvc-cold-');
    const evicted: string[] = [];
    store.on('evict', (e) => evicted.push(...e.keys));
    const own = [keyOf(1), keyOf(2), keyOf(3)];
    const copy = [keyOf(4), keyOf(5), keyOf(6)];
    for (const [i, k] of own.entries()) await store.put(k, makeChunk(k, i));
    // A copy stored after the engine's own chunks (plain LRU would evict `own` first).
    for (const [i, k] of copy.entries()) await store.put(k, makeChunk(k, 10 + i), undefined, { evictFirst: true });
    store.touchPrefix(copy); // not a read: the copy stays cold, ordered head-last among the cold ones
    await store.put(keyOf(4), makeChunk(keyOf(4), 10), undefined, { evictFirst: true }); // already held: keeps its place
    await store.get(keyOf(6)); // a read: keyOf(6) is now the most recently used
    for (const [i, k] of [keyOf(7), keyOf(8), keyOf(9)].entries()) await store.put(k, makeChunk(k, 20 + i));
    assert.deepEqual(evicted, [keyOf(5), keyOf(4), keyOf(1)], `${kind}: the cold copy first (tail first), then plain LRU`);
    assert.ok(store.has(keyOf(6)) && store.has(keyOf(2)) && store.has(keyOf(3)), `${kind}: the read copy and the rest stay`);
    assert.equal(store.stats()[0]!.chunks, 6, `${kind}: counted in both segments`);
    await store.close();
  }
});

test('an evict-first chunk never displaces a recent one: declined (counted, nothing evicted) when only recent chunks could make room', async () => {
  const cap = 3 * 36 * 1024; // three chunks
  for (const kind of ['cpu', 'disk'] as const) {
    const store = await oneTierStore(kind, cap, 'kvc-decline-');
    const loc = store.locations()[0]!;
    const evicted: string[] = [];
    store.on('evict', (e) => evicted.push(...e.keys));
    for (const i of [1, 2]) await store.put(keyOf(i), makeChunk(keyOf(i), i));
    // Free room: a copy takes it.
    await store.put(keyOf(3), makeChunk(keyOf(3), 3), undefined, { evictFirst: true });
    // Full: a copy may displace the other copy, not a recent chunk.
    await store.put(keyOf(4), makeChunk(keyOf(4), 4), undefined, { evictFirst: true });
    assert.deepEqual(evicted, [keyOf(3)], `${kind}: the older copy made room`);
    store.markReplicas(loc, [keyOf(4)], [1]); // held elsewhere: a replica, still fair game
    await store.put(keyOf(5), makeChunk(keyOf(5), 5), undefined, { evictFirst: true });
    assert.deepEqual(evicted, [keyOf(3), keyOf(4)], `${kind}: a replica made room`);
    // keyOf(5) was read: it is ordinary now; the tier holds only recent chunks.
    await store.get(keyOf(5));
    await assert.rejects(store.put(keyOf(6), makeChunk(keyOf(6), 6), undefined, { evictFirst: true }), (e: unknown) => {
      assert.ok(e instanceof CopyDeclinedError, `${kind}: ${String(e)}`);
      assert.match((e as Error).message, /declined evict-first chunk 0+6/);
      return true;
    });
    assert.equal(store.declined[loc], 1, `${kind}: counted`);
    assert.deepEqual(evicted, [keyOf(3), keyOf(4)], `${kind}: nothing evicted by the declined copy`);
    assert.ok(!store.has(keyOf(6)) && [1, 2, 5].every((i) => store.has(keyOf(i))), `${kind}: the tier kept what it had`);
    // An ordinary chunk still evicts by recency.
    await store.put(keyOf(7), makeChunk(keyOf(7), 7));
    assert.deepEqual(evicted, [keyOf(3), keyOf(4), keyOf(1)], `${kind}: a computed chunk evicts the least recently used`);
    if (kind === 'cpu') {
      // A P2P copy promoted into a full tier is declined the same way (best effort, counted).
      store.promoteFetched(keyOf(8), makeChunk(keyOf(8), 8), { evictFirst: true });
      assert.ok(!store.has(keyOf(8)));
      assert.equal(store.declined[loc], 2);
    }
    await store.close();
  }
});

test('a chunk nobody used while STALE_AFTER_TURNOVERS tiers\' worth of copies arrived is stale: it goes after cold copies and before replicas; one read meanwhile stays', async () => {
  const cap = 4 * 36 * 1024; // four chunks
  const stale = STALE_AFTER_TURNOVERS * 4; // copies arriving at a full four-chunk tier that make an unused chunk stale
  for (const kind of ['cpu', 'disk'] as const) {
    const store = await oneTierStore(kind, cap, 'kvc-stale-');
    const loc = store.locations()[0]!;
    const evicted: string[] = [];
    store.on('evict', (e) => evicted.push(...e.keys));
    for (const i of [1, 2, 3, 4]) await store.put(keyOf(i), makeChunk(keyOf(i), i));
    store.markReplicas(loc, [keyOf(4)], [1]); // held elsewhere too: a replica
    const copy = (i: number) => store.put(keyOf(i), makeChunk(keyOf(i), i), undefined, { evictFirst: true });
    // The replica makes room for the first copy (one arrival); read, the copy is in use here too.
    await copy(100);
    assert.deepEqual(evicted, [keyOf(4)]);
    await store.get(keyOf(100));
    // The tier now holds only chunks in use: copies are declined, and each one counts as arrived.
    let next = 101;
    for (let n = 0; n < 7; n++) await assert.rejects(copy(next++), CopyDeclinedError);
    await store.get(keyOf(1)); // used on the way: keyOf(1) is in use again
    while (next < 100 + stale) await assert.rejects(copy(next++), CopyDeclinedError);
    assert.equal(store.declined[loc], stale - 1);
    assert.deepEqual(evicted, [keyOf(4)], `${kind}: nothing displaced while declining`);
    store.markReplicas(loc, [keyOf(100)], [1]); // keyOf(100) is held elsewhere too: a replica
    // `stale` arrivals since keyOf(2) and keyOf(3) were last used: stale, so they go before the
    // replica keyOf(100), oldest first.
    await copy(next++);
    assert.deepEqual(evicted, [keyOf(4), keyOf(2)], `${kind}: the oldest stale chunk made room, not the replica`);
    await copy(next++);
    assert.deepEqual(evicted, [keyOf(4), keyOf(2), keyOf(100 + stale)], `${kind}: a cold copy goes before the next stale chunk`);
    assert.ok(store.has(keyOf(1)) && store.has(keyOf(3)) && store.has(keyOf(100)), `${kind}: the chunk read on the way, the stale one behind the copy and the replica stay`);
    // Ordinary puts take the cold copy, then the stale chunk, before the replica.
    await store.put(keyOf(9), makeChunk(keyOf(9), 9));
    await store.put(keyOf(10), makeChunk(keyOf(10), 10));
    assert.deepEqual(evicted.slice(3), [keyOf(101 + stale), keyOf(3)], `${kind}: cold, then stale`);
    assert.ok(store.has(keyOf(100)) && store.has(keyOf(1)), `${kind}: the replica and the chunk in use stay`);
    await store.close();
  }
});

test('a prompt being stored never evicts its own earlier chunks (keep): its head stays whole, its tail is declined', async () => {
  // A decoder's tier full of replicas (copies the controller says a prefiller holds too, evicted
  // newest first). A received prompt's chunks become replicas as the hints arrive, each one the
  // newest: without `keep`, storing chunk k+1 evicted chunk k of the same prompt, leaving a tail
  // no prefix lookup reaches.
  const cap = 4 * 36 * 1024; // four chunks
  for (const kind of ['cpu', 'disk'] as const) {
    const store = await oneTierStore(kind, cap, 'kvc-keep-');
    const loc = store.locations()[0]!;
    const old = [keyOf(1), keyOf(2)];
    for (const k of old) await store.put(k, makeChunk(k, 1));
    store.markReplicas(loc, old, [1, 1]);
    const prompt = [keyOf(10), keyOf(11), keyOf(12), keyOf(13), keyOf(14)];
    const keep = new Set(prompt);
    for (const [i, k] of prompt.entries()) {
      const put = store.put(k, makeChunk(k, 10 + i), undefined, { keep });
      if (i < 4) await put;
      else await assert.rejects(put, (e: unknown) => e instanceof CopyDeclinedError && /earlier chunks of the same prompt/.test((e as Error).message));
      store.markReplicas(loc, [k], [1]); // the hint for this chunk arrives before the next one
    }
    assert.equal(store.lookupPrefix(prompt), 4, `${kind}: the prompt's first four chunks are held`);
    assert.ok(!store.has(keyOf(1)) && !store.has(keyOf(2)), `${kind}: the older replicas made the room`);
    // Without `keep` the same sequence loses the head: the newest replica is the previous chunk.
    const other = [keyOf(20), keyOf(21)];
    for (const k of other) {
      await store.put(k, makeChunk(k, 20));
      store.markReplicas(loc, [k], [1]);
    }
    assert.equal(store.lookupPrefix(other), 0, `${kind}: unprotected, chunk 21 evicted chunk 20 (newest replica first)`);
    await store.close();
  }
});

test('a chunk the prompt keeps may take the room of the same prompt\'s cold copies; a copy may not', async () => {
  // A prefiller fetched a prompt's head by P2P (copies admitted evict-first: the holder keeps the
  // original) and computed the rest: the computed chunks evict those copies rather than being
  // declined, so the deployment holds the whole prompt (head there, tail here).
  const cap = 4 * 36 * 1024; // four chunks
  for (const kind of ['cpu', 'disk'] as const) {
    const store = await oneTierStore(kind, cap, 'kvc-keep-cold-');
    const prompt = [keyOf(30), keyOf(31), keyOf(32), keyOf(33), keyOf(34), keyOf(35)];
    const keep = new Set(prompt);
    for (const k of prompt.slice(0, 3)) await store.put(k, makeChunk(k, 30), undefined, { evictFirst: true, keep });
    // The controller's hint that the holder has them marks one a replica: still a copy.
    store.markReplicas(store.locations()[0]!, [keyOf(31)], [1]);
    await store.put(keyOf(40), makeChunk(keyOf(40), 40));
    // Another copy of the prompt finds no room it may take: the prompt's own copies stay.
    await assert.rejects(store.put(keyOf(39), makeChunk(keyOf(39), 39), undefined, { evictFirst: true, keep: new Set([...keep, keyOf(39)]) }), (e: unknown) => e instanceof CopyDeclinedError);
    for (const k of prompt.slice(3)) await store.put(k, makeChunk(k, 33), undefined, { keep });
    for (const k of prompt.slice(3)) assert.ok(store.has(k), `${kind}: computed chunk ${k} stored`);
    assert.equal(prompt.slice(0, 3).filter((k) => store.has(k)).length, 0, `${kind}: the prompt's cold copies made the room`);
    assert.ok(store.has(keyOf(40)), `${kind}: the other prompt's chunk in use stays (the copies went first)`);
    await store.close();
  }
});

test('a put whose chunk header does not carry its key is refused, in every location and in the store', async () => {
  const good = makeChunk(keyOf(1), 1);
  const wrongKey = makeChunk(keyOf(2), 2);
  const cpu = new LocalCPUBackend(4 * 36 * 1024);
  await assert.rejects(cpu.put(keyOf(1), wrongKey), (e: Error) => e instanceof ChunkFormatError && e.message.includes(`refusing chunk for key ${keyOf(1)}: its header carries key ${keyOf(2)}`));
  const junk = new Uint8Array(good.byteLength).fill(0x55);
  await assert.rejects(cpu.put(keyOf(1), junk), /refusing chunk for key 0000000000000001: not a KV chunk \(bad magic\)/);
  await assert.rejects(cpu.put(keyOf(1), good.subarray(0, good.byteLength - 1)), /refusing chunk for key 0000000000000001: .*header implies/);
  assert.equal(cpu.stats().chunks, 0);
  const dir = tempDir();
  const disk = await LocalDiskBackend.open(dir, 8 * MiB);
  await assert.rejects(disk.put(keyOf(1), wrongKey), /its header carries key 0000000000000002/);
  assert.deepEqual(readdirSync(dir), [], 'nothing was written');
  const store = await KvcStore.create({ local_cpu: true, max_local_cpu_size: gib(MiB), max_local_disk_size: gib(8 * MiB), local_disk: tempDir() });
  const admitted: string[] = [];
  store.on('admit', (e) => admitted.push(...e.keys));
  await assert.rejects(store.put(keyOf(1), wrongKey), ChunkFormatError);
  await assert.rejects(store.put(keyOf(1), wrongKey, 'LocalDiskBackend'), ChunkFormatError);
  assert.ok(!store.has(keyOf(1)) && !store.has(keyOf(2)));
  assert.deepEqual(admitted, []);
  assert.deepEqual(await store.put(keyOf(1), good), { stored: ['LocalCPUBackend', 'LocalDiskBackend'], failed: [], durable: true });
  await store.close();
  await disk.close();
});

test('lookupPrefixTokens: longest cached prefix in tokens, partial last chunk included', async () => {
  const store = await KvcStore.create({ local_cpu: true, max_local_cpu_size: gib(MiB), max_local_disk_size: gib(8 * MiB), local_disk: tempDir() });
  const p = { modelId: 'm', chunkSize: TOKENS, seed: 0n };
  const tokens = Array.from({ length: 5 * TOKENS + 7 }, (_, i) => (i * 7) % 1000); // 5 full chunks + 7 tokens
  const spans = chunkKeys(tokens, p);
  assert.equal(spans.length, 6);
  const put = async (i: number, loc?: 'LocalCPUBackend' | 'LocalDiskBackend') => {
    const s = spans[i]!;
    const n = s.end - s.start;
    await store.put(s.key, encodeChunk(layout, n, s.key, new Uint8Array(payloadBytes(layout, n)).fill(i)), loc);
  };
  assert.equal(store.lookupPrefixTokens(tokens, p), 0, 'nothing cached');
  for (let i = 0; i < 3; i++) await put(i);
  assert.equal(store.lookupPrefixTokens(tokens, p), 3 * TOKENS);
  await put(4); // chunk 3 missing: chunk 4 cannot extend the prefix
  assert.equal(store.lookupPrefixTokens(tokens, p), 3 * TOKENS);
  await put(3);
  assert.equal(store.lookupPrefixTokens(tokens, p), 5 * TOKENS, 'every full chunk, not the missing partial one');
  await put(5, 'LocalDiskBackend');
  assert.equal(store.lookupPrefixTokens(tokens, p), tokens.length, 'the stored partial chunk counts its 7 tokens');
  assert.equal(store.lookupPrefixTokens(tokens, p, 'LocalCPUBackend'), 5 * TOKENS, 'per location');
  assert.equal(store.lookupPrefixTokens(tokens, { ...p, discardPartialChunks: true }), 5 * TOKENS, 'a discarded partial chunk is never matched');
  assert.equal(store.lookupPrefixTokens(tokens.slice(0, 2 * TOKENS + 3), p), 2 * TOKENS, 'a shorter prompt keys its own partial chunk');
  assert.equal(store.lookupPrefixTokens(tokens, { ...p, modelId: 'other' }), 0, 'another model shares nothing');
  await store.remove(spans[1]!.key, 'LocalCPUBackend');
  await store.remove(spans[1]!.key, 'LocalDiskBackend');
  assert.equal(store.lookupPrefixTokens(tokens, p), TOKENS);
  await store.close();
});

test('KvcStore: write-through, prefix lookup, admit/evict events, pin per location, clear', async () => {
  const dir = tempDir();
  const store = await KvcStore.create({ local_cpu: true, max_local_cpu_size: gib(3 * 36 * 1024), max_local_disk_size: gib(8 * MiB), local_disk: dir });
  assert.deepEqual(store.locations(), ['LocalCPUBackend', 'LocalDiskBackend']);
  const events: (KeyEvent & { kind: string })[] = [];
  store.on('admit', (e) => events.push({ kind: 'admit', ...e }));
  store.on('evict', (e) => events.push({ kind: 'evict', ...e }));
  const keys = chunkKeys(Array.from({ length: 5 * TOKENS }, (_, i) => i), { modelId: 'm', chunkSize: TOKENS, seed: 0n }).map((s) => s.key);
  for (let i = 0; i < 4; i++) assert.deepEqual(await store.put(keys[i]!, makeChunk(keys[i]!, i)), { stored: ['LocalCPUBackend', 'LocalDiskBackend'], failed: [], durable: true });
  assert.equal(store.lookupPrefix(keys), 4);
  assert.equal(store.lookupPrefix(keys, 'LocalCPUBackend'), 0, 'chunk 0 was evicted from the 3-chunk CPU tier');
  assert.equal(store.lookupPrefix(keys, 'LocalDiskBackend'), 4);
  assert.ok(events.some((e) => e.kind === 'evict' && e.location === 'LocalCPUBackend' && e.keys.includes(keys[0]!)));
  assert.equal(events.filter((e) => e.kind === 'admit' && e.location === 'LocalDiskBackend').length, 4);
  // A disk hit is promoted into CPU.
  const got = await store.get(keys[0]!);
  assert.equal(got![HEADER_BYTES], 0);
  assert.ok(store.has(keys[0]!, 'LocalCPUBackend'));
  // Pin on one location does not pin the other.
  assert.ok(store.pin(keys[1]!, 'LocalDiskBackend'));
  assert.ok(store.isPinned(keys[1]!, 'LocalDiskBackend'));
  assert.ok(!store.isPinned(keys[1]!, 'LocalCPUBackend') || !store.has(keys[1]!, 'LocalCPUBackend'));
  assert.throws(() => store.pin(keys[1]!, 'RemoteBackend' as never), /location "RemoteBackend" is not configured/);
  assert.equal(await store.clear('LocalCPUBackend'), 3, 'the CPU tier held three chunks');
  assert.equal(store.stats()[0]!.chunks, 0);
  assert.equal(store.lookupPrefix(keys, 'LocalDiskBackend'), 4, 'clearing CPU leaves disk intact');
  await store.close();
});

test('LocalDiskBackend: acknowledged chunks survive a restart; pins persist; index rebuilt', async () => {
  const dir = tempDir();
  const cfg = { local_cpu: false, max_local_cpu_size: 0, max_local_disk_size: gib(8 * MiB), local_disk: dir };
  const a = await KvcStore.create(cfg);
  for (let i = 0; i < 5; i++) await a.put(keyOf(i), makeChunk(keyOf(i), i));
  a.pin(keyOf(2), 'LocalDiskBackend');
  await a.close();
  writeFileSync(join(dir, `${keyOf(9)}.kvc.tmp-1-1`), 'half a chunk'); // a crash mid-write leaves this
  const b = await KvcStore.create(cfg);
  assert.deepEqual(b.keys('LocalDiskBackend').sort(), [0, 1, 2, 3, 4].map(keyOf));
  assert.ok(b.isPinned(keyOf(2), 'LocalDiskBackend'));
  assert.ok(!readdirSync(dir).some((n) => n.includes('.tmp-')), 'temporary files are cleaned up');
  const c3 = await b.get(keyOf(3));
  assert.deepEqual(c3, makeChunk(keyOf(3), 3));
  await b.close();
});

test('LocalDiskBackend: corrupt or truncated files are dropped and reported, never served', async () => {
  const dir = tempDir();
  const cfg = { local_cpu: false, max_local_cpu_size: 0, max_local_disk_size: gib(8 * MiB), local_disk: dir };
  const a = await KvcStore.create(cfg);
  for (let i = 0; i < 3; i++) await a.put(keyOf(i), makeChunk(keyOf(i), i));
  const evicted: string[] = [];
  a.on('evict', (e) => evicted.push(...e.keys));
  // Flip a payload byte behind the store's back: the read detects it.
  const f1 = join(dir, `${keyOf(1)}.kvc`);
  const bytes = readFileSync(f1);
  bytes[HEADER_BYTES + 3]! ^= 0xff;
  writeFileSync(f1, bytes);
  assert.equal(await a.get(keyOf(1)), null);
  assert.ok(!a.has(keyOf(1)));
  assert.deepEqual(evicted, [keyOf(1)]);
  await a.close();
  // Truncate another: the rebuild at start drops it.
  truncateSync(join(dir, `${keyOf(2)}.kvc`), 100);
  const b = await KvcStore.create(cfg);
  assert.deepEqual(b.keys('LocalDiskBackend'), [keyOf(0)]);
  await b.close();
});

test('LocalDiskBackend never exceeds its capacity; all-pinned put fails', async () => {
  const dir = tempDir();
  const size = makeChunk(keyOf(0), 0).byteLength;
  const store = await KvcStore.create({ local_cpu: false, max_local_cpu_size: 0, max_local_disk_size: gib(3 * size), local_disk: dir });
  for (let i = 0; i < 10; i++) {
    await store.put(keyOf(i), makeChunk(keyOf(i), i));
    assert.ok(store.stats()[0]!.usedBytes <= 3 * size);
    assert.ok(readdirSync(dir).filter((n) => n.endsWith('.kvc')).length <= 3);
  }
  for (const k of store.keys('LocalDiskBackend')) store.pin(k, 'LocalDiskBackend');
  await assert.rejects(store.put(keyOf(50), makeChunk(keyOf(50), 1)), StoreFullError);
  await store.close();
});

test('a store with no locations refuses puts clearly', async () => {
  const store = await KvcStore.create({ local_cpu: false, max_local_cpu_size: 0, max_local_disk_size: 0, local_disk: null });
  assert.deepEqual(store.locations(), []);
  await assert.rejects(store.put(keyOf(1), makeChunk(keyOf(1), 1)), /no storage location/);
});

test('LocalDiskBackend: a chunk pinned while a put is in flight is never evicted by that put', async () => {
  const dir = tempDir();
  const size = makeChunk(keyOf(0), 0).byteLength;
  const disk = await LocalDiskBackend.open(dir, 4 * size);
  const evicted: string[] = [];
  for (let i = 0; i < 4; i++) evicted.push(...(await disk.put(keyOf(i), makeChunk(keyOf(i), i))));
  // A chunk twice the size needs two victims: the LRU ones are 0 and 1.
  const big = encodeChunk(layout, 2 * TOKENS, keyOf(9), new Uint8Array(payloadBytes(layout, 2 * TOKENS)).fill(9));
  let settled = false;
  const putting = disk.put(keyOf(9), big).finally(() => (settled = true));
  // Pin chunk 1 as soon as the put has started, and again at every turn of the event loop until
  // it finishes: whenever pin() says yes, the chunk must survive.
  let pinned = false;
  await null;
  do {
    if (!pinned && disk.has(keyOf(1))) pinned = disk.pin(keyOf(1));
    await new Promise(setImmediate);
  } while (!settled);
  evicted.push(...(await putting));
  assert.ok(pinned, 'the pin landed while the put was in flight');
  assert.ok(disk.has(keyOf(1)) && disk.isPinned(keyOf(1)), 'pinned chunk 1 is still indexed');
  assert.ok(existsSync(join(dir, `${keyOf(1)}.kvc`)), 'and its file is still there');
  assert.ok(!evicted.includes(keyOf(1)));
  assert.deepEqual(evicted.sort(), [keyOf(0), keyOf(2)], 'the put took the next unpinned LRU chunk instead');
  assert.ok(disk.stats().usedBytes <= 4 * size);
  assert.deepEqual(await disk.get(keyOf(1)), makeChunk(keyOf(1), 1));
  await disk.close();
});

test('LocalDiskBackend: a failed write evicts nothing; write-through says the chunk is not durable', async () => {
  const dir = tempDir();
  const size = makeChunk(keyOf(0), 0).byteLength;
  const store = await KvcStore.create({ local_cpu: false, max_local_cpu_size: 0, max_local_disk_size: gib(3 * size), local_disk: dir });
  const reported: string[] = [];
  store.on('evict', (e) => reported.push(...e.keys));
  for (let i = 0; i < 3; i++) await store.put(keyOf(i), makeChunk(keyOf(i), i));
  // A directory where chunk 3's file must go: the rename into place fails (EISDIR), for real.
  mkdirSync(join(dir, `${keyOf(3)}.kvc`));
  writeFileSync(join(dir, `${keyOf(3)}.kvc`, 'x'), 'x');
  const before = store.keys('LocalDiskBackend');
  await assert.rejects(store.put(keyOf(3), makeChunk(keyOf(3), 3)));
  const after = store.keys('LocalDiskBackend');
  const dropped = before.filter((k) => !after.includes(k));
  assert.deepEqual(dropped.filter((k) => !reported.includes(k)), [], 'every chunk that left the index was reported');
  assert.deepEqual(after.sort(), [0, 1, 2].map(keyOf), 'a put that failed evicted nothing');
  for (let i = 0; i < 3; i++) assert.deepEqual(await store.get(keyOf(i)), makeChunk(keyOf(i), i), `chunk ${i} still served`);
  assert.ok(!readdirSync(dir).some((n) => n.includes('.tmp-')), 'no temporary file left behind');
  await store.close();

  // Same failure under write-through with a CPU tier: the put resolves (memory has it) but says
  // which tier refused and that the chunk is not durable.
  // (Reopening also shows that a directory named like a chunk is ignored, not indexed or deleted.)
  const both = await KvcStore.create({ local_cpu: true, max_local_cpu_size: gib(MiB), max_local_disk_size: gib(3 * size), local_disk: dir });
  assert.ok(existsSync(join(dir, `${keyOf(3)}.kvc`, 'x')));
  assert.ok(!both.has(keyOf(3)));
  const r = await both.put(keyOf(3), makeChunk(keyOf(3), 3));
  assert.deepEqual(r.stored, ['LocalCPUBackend']);
  assert.equal(r.durable, false);
  assert.equal(r.failed.length, 1);
  assert.equal(r.failed[0]!.location, 'LocalDiskBackend');
  assert.match(r.failed[0]!.error, /EISDIR|directory/i);
  assert.ok(!both.has(keyOf(3), 'LocalDiskBackend'));
  const ok = await both.put(keyOf(4), makeChunk(keyOf(4), 4));
  assert.deepEqual(ok, { stored: ['LocalCPUBackend', 'LocalDiskBackend'], failed: [], durable: true });
  await both.close();
});

test('LocalDiskBackend restart: wrong magic, header/name key mismatch and bad names are deleted and reported', async () => {
  const dir = tempDir();
  const a = await LocalDiskBackend.open(dir, 8 * MiB);
  for (let i = 0; i < 3; i++) await a.put(keyOf(i), makeChunk(keyOf(i), i));
  await a.close();
  const junk = readFileSync(join(dir, `${keyOf(0)}.kvc`));
  junk.writeUInt32LE(0xdeadbeef, 0); // wrong magic, right length
  writeFileSync(join(dir, `${keyOf(0)}.kvc`), junk);
  copyFileSync(join(dir, `${keyOf(1)}.kvc`), join(dir, `${keyOf(7)}.kvc`)); // chunk 1's bytes under key 7's name
  writeFileSync(join(dir, 'not-a-key.kvc'), makeChunk(keyOf(8), 8));
  writeFileSync(join(dir, `${keyOf(0)}.pin`), ''); // a pin marker whose chunk is gone
  mkdirSync(join(dir, 'stray.kvc.tmp-1-1')); // not a file: cannot be removed, must not stop the open
  writeFileSync(join(dir, 'stray.kvc.tmp-1-1', 'x'), 'x');
  const b = await LocalDiskBackend.open(dir, 8 * MiB);
  assert.deepEqual(b.keys().sort(), [keyOf(1), keyOf(2)]);
  const drops = new Map(b.droppedAtOpen.map((d) => [d.key, d.reason]));
  assert.match(drops.get(keyOf(0)) ?? '', /bad magic/);
  assert.match(drops.get(keyOf(7)) ?? '', new RegExp(`header key ${keyOf(1)} does not match file name`));
  assert.match(drops.get('not-a-key') ?? '', /not a chunk key/);
  assert.equal(b.openProblems.length, 3);
  assert.deepEqual(readdirSync(dir).sort(), [`${keyOf(1)}.kvc`, `${keyOf(2)}.kvc`, 'stray.kvc.tmp-1-1'], 'bad files and the orphan pin are deleted');
  assert.equal(await b.get(keyOf(7)), null);
  await b.close();
});

test('LocalDiskBackend restart with a smaller capacity drops oldest unpinned chunks, or all of them when pins exceed it', async () => {
  const dir = tempDir();
  const size = makeChunk(keyOf(0), 0).byteLength;
  const a = await LocalDiskBackend.open(dir, 6 * size);
  for (let i = 0; i < 6; i++) await a.put(keyOf(i), makeChunk(keyOf(i), i));
  assert.ok(a.pin(keyOf(0)) && a.pin(keyOf(4)));
  await a.close();
  // Recency after a restart comes from mtime: make it explicit (chunk i last used at t0 + i s).
  const t0 = Date.now() / 1000 - 3600;
  for (let i = 0; i < 6; i++) utimesSync(join(dir, `${keyOf(i)}.kvc`), t0 + i, t0 + i);
  const b = await LocalDiskBackend.open(dir, 3 * size);
  assert.deepEqual(b.keys().sort(), [0, 4, 5].map(keyOf), 'oldest unpinned 1, 2, 3 dropped; pinned 0 and 4 kept');
  assert.deepEqual(b.droppedAtOpen.map((d) => d.key), [1, 2, 3].map(keyOf));
  assert.match(b.droppedAtOpen[0]!.reason, /over capacity/);
  assert.ok(b.stats().usedBytes <= 3 * size);
  assert.ok(b.isPinned(keyOf(0)) && b.isPinned(keyOf(4)));
  await b.close();
  // Now the two pinned chunks alone exceed a one-chunk capacity: every unpinned chunk goes.
  const c = await LocalDiskBackend.open(dir, size);
  assert.deepEqual(c.keys().sort(), [0, 4].map(keyOf));
  assert.deepEqual(c.droppedAtOpen.map((d) => d.key), [keyOf(5)]);
  assert.ok(c.openProblems.some((p) => /pinned chunks use \d+ bytes, more than the capacity/.test(p)));
  assert.deepEqual(readdirSync(dir).filter((n) => n.endsWith('.kvc')).sort(), [0, 4].map((i) => `${keyOf(i)}.kvc`));
  await assert.rejects(c.put(keyOf(9), makeChunk(keyOf(9), 9)), StoreFullError);
  await c.close();
});

test('LocalDiskBackend get copies into the caller buffer; an all-pinned put names the reason', async () => {
  const dir = tempDir();
  const size = makeChunk(keyOf(0), 0).byteLength;
  const store = await KvcStore.create({ local_cpu: false, max_local_cpu_size: 0, max_local_disk_size: gib(2 * size), local_disk: dir });
  await store.put(keyOf(1), makeChunk(keyOf(1), 1));
  await store.put(keyOf(2), makeChunk(keyOf(2), 2));
  const dest = new Uint8Array(size + 100).fill(0xee);
  const view = await store.get(keyOf(1), dest, 'LocalDiskBackend');
  assert.equal(view!.buffer, dest.buffer, 'the bytes land in the caller buffer');
  assert.equal(view!.byteOffset, dest.byteOffset);
  assert.deepEqual(view, makeChunk(keyOf(1), 1));
  assert.equal(dest[size], 0xee, 'nothing written past the chunk');
  await assert.rejects(store.get(keyOf(1), new Uint8Array(size - 1), 'LocalDiskBackend'), /destination of \d+ bytes is too small for chunk 0000000000000001/);
  assert.ok(store.pin(keyOf(1), 'LocalDiskBackend') && store.pin(keyOf(2), 'LocalDiskBackend'));
  await assert.rejects(store.put(keyOf(3), makeChunk(keyOf(3), 3)), (e: Error) => {
    assert.ok(e instanceof StoreFullError);
    assert.match(e.message, new RegExp(`^LocalDiskBackend is full: ${2 * size} of ${2 * size} bytes used and 2 pinned chunk\\(s\\) cannot be evicted to store chunk ${keyOf(3)}$`));
    return true;
  });
  assert.ok(!existsSync(join(dir, `${keyOf(3)}.kvc`)));
  await store.close();
});

test('a transfer hold pins a disk chunk for this process only; a controller pin made during it persists', async () => {
  const dir = tempDir();
  const cfg = { local_cpu: false, max_local_cpu_size: 0, max_local_disk_size: gib(8 * MiB), local_disk: dir };
  const a = await KvcStore.create(cfg);
  for (let i = 0; i < 3; i++) await a.put(keyOf(i), makeChunk(keyOf(i), i));
  const holds = transferHolds(a);
  assert.ok(holds.hold(keyOf(0), 'LocalDiskBackend'));
  assert.ok(holds.hold(keyOf(1), 'LocalDiskBackend'));
  holds.pin(keyOf(1), 'LocalDiskBackend'); // /pin while the transfer holds it
  assert.ok(a.isPinned(keyOf(0), 'LocalDiskBackend') && a.isPinned(keyOf(1), 'LocalDiskBackend'));
  assert.ok(!existsSync(join(dir, `${keyOf(0)}.pin`)), 'a hold leaves no pin marker on disk');
  assert.ok(existsSync(join(dir, `${keyOf(1)}.pin`)), 'the controller pin is persisted');
  await a.close(); // as if the process stopped mid-transfer, holds still taken
  const b = await KvcStore.create(cfg);
  assert.equal(b.isPinned(keyOf(0), 'LocalDiskBackend'), false, 'the hold did not survive the restart');
  assert.equal(b.isPinned(keyOf(1), 'LocalDiskBackend'), true);
  // Released normally: the held-only chunk is unpinned, the pinned one stays pinned.
  const hb = transferHolds(b);
  hb.hold(keyOf(2), 'LocalDiskBackend');
  hb.hold(keyOf(1), 'LocalDiskBackend');
  hb.release(keyOf(2), 'LocalDiskBackend');
  hb.release(keyOf(1), 'LocalDiskBackend');
  assert.equal(b.isPinned(keyOf(2), 'LocalDiskBackend'), false);
  assert.equal(b.isPinned(keyOf(1), 'LocalDiskBackend'), true);
  assert.ok(existsSync(join(dir, `${keyOf(1)}.pin`)), 'a hold on a pinned chunk keeps its marker');
  await b.close();
});

test('LocalDiskBackend: a put whose directory sync fails leaves no file behind (nothing unindexed on disk)', async () => {
  const dir = tempDir();
  const disk = await LocalDiskBackend.open(dir, 8 * MiB);
  await disk.put(keyOf(1), makeChunk(keyOf(1), 1));
  // Fault injection on the step after the rename (an fsync of the directory failing, e.g. EIO).
  (disk as unknown as { syncDir: () => Promise<void> }).syncDir = async () => {
    throw new Error('EIO: directory sync failed');
  };
  await assert.rejects(disk.put(keyOf(2), makeChunk(keyOf(2), 2)), /EIO/);
  assert.deepEqual(disk.keys(), [keyOf(1)]);
  assert.deepEqual(readdirSync(dir).sort(), [`${keyOf(1)}.kvc`], 'the renamed file of the failed put is removed');
  await disk.close();
});

test('a transfer hold re-pins a chunk that was removed and stored again while held', async () => {
  const store = await KvcStore.create({ local_cpu: true, max_local_cpu_size: gib(8 * MiB), max_local_disk_size: 0, local_disk: null });
  await store.put(keyOf(1), makeChunk(keyOf(1), 1));
  const holds = transferHolds(store);
  assert.ok(holds.hold(keyOf(1), 'LocalCPUBackend'));
  await store.clear('LocalCPUBackend'); // a /clear while the transfer holds the chunk
  await store.put(keyOf(1), makeChunk(keyOf(1), 1)); // the same transfer stores it again
  assert.equal(store.isPinned(keyOf(1), 'LocalCPUBackend'), false);
  assert.ok(holds.hold(keyOf(1), 'LocalCPUBackend'));
  assert.equal(store.isPinned(keyOf(1), 'LocalCPUBackend'), true, 'the new copy is held too');
  holds.release(keyOf(1), 'LocalCPUBackend');
  holds.release(keyOf(1), 'LocalCPUBackend');
  assert.equal(store.isPinned(keyOf(1), 'LocalCPUBackend'), false);
  await store.close();
});
