// npm run bench -- remote
// The shared remote tier against a real redis-server started here (loopback, no persistence):
//   put/get GB/s   Llama-3-8B-shaped chunks (32 layers, 8 KV heads, head dim 128, fp16, 256 tokens
//                  = 32 MiB) through RemoteTier (queue copy + background SET; GET + checksum
//                  verification) vs the same client library's raw SET/GET of the same bytes with the
//                  same number of commands in flight, alternating rounds, medians of 3.
//   TTFT           a 1,024-token prompt computed by engine A vs the same prompt on engine B, whose
//                  local tiers are empty so its KV comes through the remote tier (medians of 3).
// Targets: remote put and get >= 0.8 x raw; remote-hit TTFT <= 0.25 x recompute.
// Plot: bench-results/remote/remote.svg (vega-lite).
import { Redis } from 'ioredis';
import { DType, encodeChunk, payloadBytes, type KvLayout } from '../src/common/chunk.js';
import { validateCacheConfig } from '../src/common/config.js';
import { parseRemoteUrl } from '../src/common/remote_url.js';
import { RemoteTier } from '../src/kvc/remote_tier.js';
import { startEngine, type Engine } from '../src/engine/server.js';
import { REDIS_SKIP, findRedisServer, startRedisServer } from '../harness/redis_server.js';
import { resultsDir, writeBarsSvg } from './_plot.js';
import { readStreamTtft } from './_stream_ttft.js';

const GB = 1e9;
const GiB = 1024 ** 3;
const llama8b: KvLayout = { dtype: DType.f16, numLayers: 32, numKvHeads: 8, headDim: 128 };
const TOKENS = 256;
const N = 8; // chunks per round (256 MiB)
const INFLIGHT = 4; // what RemoteTier keeps in flight for SET and GET
const MODEL = 'builtin:tiny';

const now = () => performance.now() / 1e3;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const prompt = (n: number, salt: number) => Array.from({ length: n }, (_, i) => 1000 + ((i * 7919 + salt * 104729) % 30000));

/** Runs `fn(i)` for i in [0, n) with `width` in flight. */
async function windowed(n: number, width: number, fn: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < n) await fn(next++);
  }));
}

async function ttft(e: Engine, p: number[]): Promise<{ ms: number; cached: number }> {
  const t = performance.now();
  const r = await fetch(`${e.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: p, max_tokens: 2, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } }),
    signal: AbortSignal.timeout(600_000),
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const { first, body: buf } = await readStreamTtft(r, t);
  const m = /"cached_tokens":(\d+)/.exec(buf);
  return { ms: first, cached: m ? Number(m[1]) : -1 };
}

async function main(): Promise<void> {
  if (!findRedisServer()) {
    console.log(`skipped: ${REDIS_SKIP}`);
    console.log(JSON.stringify({ bench: 'remote', skipped: REDIS_SKIP }));
    return;
  }
  const srv = await startRedisServer({ maxmemory: '1gb' });
  try {
    const size = payloadBytes(llama8b, TOKENS);
    const chunks = Array.from({ length: N }, (_, i) => {
      const key = (0x5000 + i).toString(16).padStart(16, '0');
      return { key, buf: encodeChunk(llama8b, TOKENS, key, new Uint8Array(size).fill(i + 1)) };
    });
    const bytes = N * chunks[0]!.buf.byteLength;
    const tier = new RemoteTier({ endpoint: parseRemoteUrl(srv.url), modelId: 'bench', timeoutMs: 30_000, queueBytes: 0.5 * GiB });
    await tier.start();
    const raw = new Redis({ host: '127.0.0.1', port: srv.port, lazyConnect: true, commandTimeout: 30_000, enableOfflineQueue: false, maxRetriesPerRequest: 0 });
    await raw.connect();
    const rawPut = async () => {
      const t = now();
      await windowed(N, INFLIGHT, (i) => raw.set(`raw:${chunks[i]!.key}`, Buffer.from(chunks[i]!.buf.buffer, chunks[i]!.buf.byteOffset, chunks[i]!.buf.byteLength)));
      return bytes / (now() - t) / GB;
    };
    const rawGet = async () => {
      const t = now();
      await windowed(N, INFLIGHT, async (i) => {
        const v = await raw.getBuffer(`raw:${chunks[i]!.key}`);
        if (!v || v.byteLength !== chunks[i]!.buf.byteLength) throw new Error('raw GET lost a value');
      });
      return bytes / (now() - t) / GB;
    };
    const tierPut = async () => {
      await raw.del(...chunks.map((c) => tier.remoteKey(c.key)));
      tier.forgetKnown(); // else the tier skips chunks it wrote in the previous round
      const t = now();
      for (const c of chunks) if (tier.enqueue(c.key, c.buf) !== 'queued') throw new Error('the write queue dropped a chunk');
      if (!(await tier.flush(60_000))) throw new Error('remote writes did not finish');
      return bytes / (now() - t) / GB;
    };
    const tierGet = async () => {
      const t = now();
      const got = await tier.getLeading(chunks.map((c) => c.key));
      if (got.length !== N) throw new Error(`remote GET returned ${got.length} of ${N} chunks`);
      return bytes / (now() - t) / GB;
    };
    // Warm-up: the first round touches fresh memory (the pool, the server's allocator).
    await rawPut();
    await tierPut();
    await rawGet();
    await tierGet();
    const r = { rawPut: [] as number[], tierPut: [] as number[], rawGet: [] as number[], tierGet: [] as number[] };
    for (let i = 0; i < 3; i++) {
      r.rawPut.push(await rawPut());
      r.tierPut.push(await tierPut());
      r.rawGet.push(await rawGet());
      r.tierGet.push(await tierGet());
    }
    const m = { rawPut: median(r.rawPut), tierPut: median(r.tierPut), rawGet: median(r.rawGet), tierGet: median(r.tierGet) };
    console.log(`chunks: ${N} x ${(chunks[0]!.buf.byteLength / 2 ** 20).toFixed(0)} MiB (Llama-3-8B shape, fp16, ${TOKENS} tokens), ${INFLIGHT} commands in flight`);
    console.log(`raw SET          ${m.rawPut.toFixed(2)} GB/s     RemoteTier put  ${m.tierPut.toFixed(2)} GB/s  (x${(m.tierPut / m.rawPut).toFixed(2)}; copy into the write queue + SET)`);
    console.log(`raw GET          ${m.rawGet.toFixed(2)} GB/s     RemoteTier get  ${m.tierGet.toFixed(2)} GB/s  (x${(m.tierGet / m.rawGet).toFixed(2)}; GET + checksum verification)`);
    raw.disconnect();
    await tier.close();

    // TTFT: engine A computes, engine B (empty local tiers) reads through the remote tier.
    const cacheConfig = validateCacheConfig({ chunk_size: 256, max_local_cpu_size: 0.5, remote_url: srv.url, remote_timeout_ms: 5_000, remote_write_queue_size: 0.25 }).config;
    const connector = { kv_connector: 'KvcConnectorV1', kv_role: 'kv_both', kv_connector_extra_config: { discard_partial_chunks: false, skip_last_n_tokens: 0 } } as const;
    const a = await startEngine({ model: MODEL, maxModelLen: 2048, kvTransferConfig: connector, cacheConfig });
    const b = await startEngine({ model: MODEL, maxModelLen: 2048, kvTransferConfig: connector, cacheConfig });
    try {
      await ttft(a, prompt(64, 999)); // warm-up (kernels compiled, pages touched)
      await ttft(b, prompt(64, 998));
      const computed: number[] = [];
      const hits: number[] = [];
      for (let i = 0; i < 3; i++) {
        const p = prompt(1024, 100 + i);
        const c = await ttft(a, p);
        if (c.cached !== 0) throw new Error(`engine A found ${c.cached} cached tokens for a fresh prompt`);
        computed.push(c.ms);
        if (!(await a.store!.remote!.flush(60_000))) throw new Error('engine A did not finish its remote writes');
        const h = await ttft(b, p);
        if (h.cached !== 1023) throw new Error(`engine B loaded ${h.cached} tokens, expected 1023 through the remote tier`);
        hits.push(h.ms);
      }
      const recompute = median(computed);
      const hit = median(hits);
      const rs = b.store!.remoteStats()!;
      console.log(`TTFT 1,024-token prompt: computed ${recompute.toFixed(1)} ms, remote hit ${hit.toFixed(1)} ms (x${(hit / recompute).toFixed(3)}); engine B remote reads: ${rs.hits} hits, ${(rs.getBytes / 2 ** 20).toFixed(1)} MiB`);
      const svg = await writeBarsSvg(
        `${resultsDir('remote')}/remote.svg`,
        'Remote tier (Redis on loopback): throughput vs the raw client, and TTFT of a 1,024-token prompt',
        [
          { panel: 'put (GB/s)', series: 'raw SET', value: m.rawPut },
          { panel: 'put (GB/s)', series: 'RemoteTier', value: m.tierPut },
          { panel: 'get (GB/s)', series: 'raw GET', value: m.rawGet },
          { panel: 'get (GB/s)', series: 'RemoteTier', value: m.tierGet },
          { panel: 'TTFT (ms)', series: 'computed', value: recompute },
          { panel: 'TTFT (ms)', series: 'remote hit', value: hit },
        ],
        'value',
      );
      console.log(`plot: ${svg}`);
      console.log(
        JSON.stringify({
          bench: 'remote',
          remote_put_gbps: Number(m.tierPut.toFixed(3)),
          remote_get_gbps: Number(m.tierGet.toFixed(3)),
          raw_set_gbps: Number(m.rawPut.toFixed(3)),
          raw_get_gbps: Number(m.rawGet.toFixed(3)),
          remote_hit_ttft_ms: Number(hit.toFixed(1)),
          recompute_ttft_ms: Number(recompute.toFixed(1)),
        }),
      );
    } finally {
      await a.close();
      await b.close();
    }
  } finally {
    await srv.stop();
  }
}

main().then(
  () => process.exit(0),
  (e: unknown) => {
    console.error(`bench remote failed: ${(e as Error).stack ?? e}`);
    process.exit(1);
  },
);
