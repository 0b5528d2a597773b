// Cache instance storage: LocalCPUBackend, LocalDiskBackend and the tiered KvcStore.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, writeFileSync, readFileSync, truncateSync } from 'node:fs';
import { join } from 'node:path';
import { DType, HEADER_BYTES, encodeChunk, payloadBytes } from '../src/common/chunk.js';
import { chunkKeys } from '../src/common/keys.js';
import { KvcStore } from '../src/kvc/store.js';
import { LocalCPUBackend } from '../src/kvc/cpu_backend.js';
import { StoreFullError, type KeyEvent } from '../src/kvc/types.js';
import { tempDir } from './helpers/proc.js';

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

test('get copies into the caller buffer; buffers are recycled after eviction', async () => {
  const cpu = new LocalCPUBackend(2 * 36 * 1024);
  const c = makeChunk(keyOf(1), 7);
  await cpu.put(keyOf(1), c);
  const dest = new Uint8Array(c.byteLength + 10);
  const view = await cpu.get(keyOf(1), dest);
  assert.equal(view!.buffer, dest.buffer);
  assert.deepEqual(view, c);
  await assert.rejects(cpu.get(keyOf(1), new Uint8Array(10)), RangeError);
  for (let i = 2; i < 20; i++) await cpu.put(keyOf(i), makeChunk(keyOf(i), i));
  assert.ok(cpu.heldBytes() <= 2 * 36 * 1024);
});

test('KvcStore: write-through, prefix lookup, admit/evict events, pin per location, clear', async () => {
  const dir = tempDir();
  const store = await KvcStore.create({ local_cpu: true, max_local_cpu_size: gib(3 * 36 * 1024), max_local_disk_size: gib(8 * MiB), local_disk: dir });
  assert.deepEqual(store.locations(), ['LocalCPUBackend', 'LocalDiskBackend']);
  const events: (KeyEvent & { kind: string })[] = [];
  store.on('admit', (e) => events.push({ kind: 'admit', ...e }));
  store.on('evict', (e) => events.push({ kind: 'evict', ...e }));
  const keys = chunkKeys(Array.from({ length: 5 * TOKENS }, (_, i) => i), { modelId: 'm', chunkSize: TOKENS, seed: 0n }).map((s) => s.key);
  for (let i = 0; i < 4; i++) assert.deepEqual(await store.put(keys[i]!, makeChunk(keys[i]!, i)), ['LocalCPUBackend', 'LocalDiskBackend']);
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
