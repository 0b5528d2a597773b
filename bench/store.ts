// npm run bench -- store
// Put/get throughput of LocalCPUBackend and LocalDiskBackend for Llama-3-8B-shaped chunks
// (32 layers, 8 KV heads, head dim 128, fp16, 256 tokens = 32 MiB) and built-in-model-shaped
// chunks, with a memcpy of the same bytes in the same run as the baseline.
// Target: cpu_put_gbps and cpu_get_gbps each >= 0.5 x memcpy_gbps.
import { rmSync } from 'node:fs';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DType, chunkBytes, encodeChunk, payloadBytes, type KvLayout } from '../src/common/chunk.js';
import { LocalCPUBackend } from '../src/kvc/cpu_backend.js';
import { LocalDiskBackend } from '../src/kvc/disk_backend.js';

const GB = 1e9;
const llama8b: KvLayout = { dtype: DType.f16, numLayers: 32, numKvHeads: 8, headDim: 128 };
const tiny: KvLayout = { dtype: DType.f32, numLayers: 4, numKvHeads: 2, headDim: 32 };
const TOKENS = 256;

function chunks(layout: KvLayout, n: number): { key: string; buf: Uint8Array }[] {
  const out = [];
  const payload = new Uint8Array(payloadBytes(layout, TOKENS));
  for (let i = 0; i < n; i++) {
    payload.fill(i & 0xff);
    const key = (0x1000 + i).toString(16).padStart(16, '0');
    out.push({ key, buf: encodeChunk(layout, TOKENS, key, payload) });
  }
  return out;
}

const now = () => Number(process.hrtime.bigint()) / 1e9;

function memcpyGbps(bytes: number, iters: number): number {
  const a = new Uint8Array(bytes).fill(1);
  const b = new Uint8Array(bytes).fill(2);
  b.set(a); // warm
  const t = now();
  for (let i = 0; i < iters; i++) (i & 1 ? a : b).set(i & 1 ? b : a);
  return (bytes * iters) / (now() - t) / GB;
}

async function cpuBench(layout: KvLayout, capacityChunks: number, rounds: number) {
  const size = chunkBytes(layout, TOKENS);
  const set = chunks(layout, capacityChunks * 2);
  const cpu = new LocalCPUBackend(capacityChunks * (Math.ceil(size / 4096) * 4096));
  // Fill once so the pool has touched its memory: the steady state of a running cache.
  for (const c of set.slice(0, capacityChunks)) cpu.putSync(c.key, c.buf);
  let t = now();
  let bytes = 0;
  for (let r = 0; r < rounds; r++) {
    for (const c of set) {
      cpu.putSync(c.key, c.buf); // every put evicts the LRU chunk and reuses its buffer
      bytes += size;
    }
  }
  const put = bytes / (now() - t) / GB;
  const dest = new Uint8Array(size).fill(0);
  const held = cpu.keys();
  t = now();
  bytes = 0;
  for (let r = 0; r < rounds * 2; r++) {
    for (const k of held) {
      cpu.getSync(k, dest);
      bytes += size;
    }
  }
  const get = bytes / (now() - t) / GB;
  await cpu.close();
  return { put, get };
}

async function diskBench(layout: KvLayout, n: number) {
  const dir = mkdtempSync(join(tmpdir(), 'kvc-bench-disk-'));
  const size = chunkBytes(layout, TOKENS);
  const disk = await LocalDiskBackend.open(dir, n * size * 2);
  const set = chunks(layout, n);
  let t = now();
  for (const c of set) await disk.put(c.key, c.buf);
  const put = (n * size) / (now() - t) / GB;
  const dest = new Uint8Array(size);
  t = now();
  for (const c of set) await disk.get(c.key, dest); // includes the checksum verification
  const get = (n * size) / (now() - t) / GB;
  await disk.close();
  rmSync(dir, { recursive: true, force: true });
  return { put, get };
}

const fmt = (x: number) => x.toFixed(2).padStart(7);
const memcpy = memcpyGbps(chunkBytes(llama8b, TOKENS), 60);
const big = await cpuBench(llama8b, 24, 3);
const small = await cpuBench(tiny, 256, 6);
const bigDisk = await diskBench(llama8b, 12);
const smallDisk = await diskBench(tiny, 128);

console.log(`chunk shapes: llama-3-8b ${(chunkBytes(llama8b, TOKENS) / 2 ** 20).toFixed(1)} MiB, builtin-tiny ${(chunkBytes(tiny, TOKENS) / 2 ** 10).toFixed(0)} KiB (256 tokens)`);
console.log(`memcpy (same bytes)            ${fmt(memcpy)} GB/s`);
console.log(`LocalCPUBackend  put  8b-shape ${fmt(big.put)} GB/s   tiny-shape ${fmt(small.put)} GB/s`);
console.log(`LocalCPUBackend  get  8b-shape ${fmt(big.get)} GB/s   tiny-shape ${fmt(small.get)} GB/s`);
console.log(`LocalDiskBackend put  8b-shape ${fmt(bigDisk.put)} GB/s   tiny-shape ${fmt(smallDisk.put)} GB/s`);
console.log(`LocalDiskBackend get  8b-shape ${fmt(bigDisk.get)} GB/s   tiny-shape ${fmt(smallDisk.get)} GB/s  (verifies checksums; page cache warm)`);
const ratioPut = big.put / memcpy;
const ratioGet = big.get / memcpy;
console.log(`target cpu_put >= 0.5 x memcpy: ${ratioPut.toFixed(2)}x ${ratioPut >= 0.5 ? 'MET' : 'MISSED'}; cpu_get: ${ratioGet.toFixed(2)}x ${ratioGet >= 0.5 ? 'MET' : 'MISSED'}`);
console.log(
  JSON.stringify({
    bench: 'store',
    cpu_put_gbps: +big.put.toFixed(3),
    cpu_get_gbps: +big.get.toFixed(3),
    disk_put_gbps: +bigDisk.put.toFixed(3),
    disk_get_gbps: +bigDisk.get.toFixed(3),
    memcpy_gbps: +memcpy.toFixed(3),
    tiny_cpu_put_gbps: +small.put.toFixed(3),
    tiny_cpu_get_gbps: +small.get.toFixed(3),
  }),
);
