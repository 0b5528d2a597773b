// The two processes of `npm run bench -- p2p_link`, each started inside its host's network
// namespace (harness/netns.ts), so every byte between them crosses the emulated link.
//   holder  HOST PORT TOKENS CHUNK   a cache store holding the prompt's chunks (the built-in model's
//                                    layout, float16), behind its peer port; prints {"ready":port}
//   fetcher URL TOKENS CHUNK FETCHES GAP_MS REUSE(0|1)
//                                    FETCHES P2P fetches of the whole prompt from URL, one every
//                                    GAP_MS after the last ended, each bounded as an engine bounds
//                                    it (P2pClient with the default p2p_timeout_ms; the holder query
//                                    is answered at once, the holder being known); prints one JSON
//                                    line per fetch {chunks, of, ms, how, stale} and exits
import { Registry } from 'prom-client';
import { chunkBytes, DType, HEADER_BYTES, sealChunk, type KvLayout } from '../src/common/chunk.js';
import { P2P_DEFAULTS } from '../src/common/config.js';
import { chunkKeys } from '../src/common/keys.js';
import { P2pClient } from '../src/kvc/p2p_client.js';
import { P2pMetrics } from '../src/kvc/p2p_metrics.js';
import { KvcStore } from '../src/kvc/store.js';
import { startPeerServer } from '../src/kvc/worker_peer.js';

/** The built-in model's KV layout in the engine's default KV dtype (auto = float16). */
export const LINK_LAYOUT: KvLayout = { dtype: DType.f16, numLayers: 4, numKvHeads: 2, headDim: 32 };

export function promptKeys(tokens: number, chunk: number): string[] {
  const ids = Array.from({ length: tokens }, (_, i) => 1000 + ((i * 37) % 20000));
  return chunkKeys(ids, { modelId: 'bench-p2p-link', chunkSize: chunk, seed: 0n, kvDtype: LINK_LAYOUT.dtype }).map((s) => s.key);
}

const store = () => KvcStore.create({ local_cpu: true, max_local_cpu_size: 0.25, max_local_disk_size: 0, local_disk: null });

async function holder(host: string, port: number, tokens: number, chunk: number): Promise<void> {
  const s = await store();
  const keys = promptKeys(tokens, chunk);
  for (const [i, key] of keys.entries()) {
    const buf = new Uint8Array(chunkBytes(LINK_LAYOUT, chunk));
    buf.subarray(HEADER_BYTES).fill(i + 1);
    await s.put(key, sealChunk(buf, LINK_LAYOUT, chunk, key));
  }
  const peer = await startPeerServer(s, host, port, { layout: LINK_LAYOUT, chunkSize: chunk });
  console.log(JSON.stringify({ ready: peer.port }));
}

async function fetcher(url: string, tokens: number, chunk: number, fetches: number, gapMs: number, reuse: boolean): Promise<void> {
  const keys = promptKeys(tokens, chunk);
  const reg = new Registry();
  const metrics = new P2pMetrics(reg);
  const holders = [{ instance_id: 'holder', peer_url: url, location: 'LocalCPUBackend', chunks: keys.length }];
  const me = await store();
  const client = new P2pClient({
    store: me,
    instanceId: 'fetcher',
    layout: LINK_LAYOUT,
    chunkSize: chunk,
    timeoutMs: P2P_DEFAULTS.p2p_timeout_ms,
    askHolders: async () => holders,
    metrics,
    reuseConnections: reuse,
  });
  const how = async () => {
    const j = await metrics.connections.get();
    return Object.fromEntries(j.values.map((v) => [v.labels.how, v.value]));
  };
  for (let i = 0; i < fetches; i++) {
    if (i > 0) await new Promise((r) => setTimeout(r, gapMs));
    for (const k of keys) await me.remove(k, 'LocalCPUBackend').catch(() => undefined);
    const before = await how();
    const t0 = performance.now();
    const got = await client.fetch(keys);
    const ms = performance.now() - t0;
    const after = await how();
    const grew = (h: string) => (after[h] ?? 0) - (before[h] ?? 0);
    const used = grew('reused') > 0 ? 'reused' : grew('new') > 0 ? 'new' : 'none';
    console.log(JSON.stringify({ chunks: got.size, of: keys.length, ms: Math.round(ms), how: used, stale: grew('stale') }));
  }
  client.close();
  await me.close();
}

const [role, ...a] = process.argv.slice(2);
if (role === 'holder') await holder(a[0]!, Number(a[1]), Number(a[2]), Number(a[3]));
else if (role === 'fetcher') {
  await fetcher(a[0]!, Number(a[1]), Number(a[2]), Number(a[3]), Number(a[4]), a[5] === '1');
  process.exit(0);
} else throw new Error(`_p2p_link_child: role must be holder or fetcher, got ${JSON.stringify(role)}`);
