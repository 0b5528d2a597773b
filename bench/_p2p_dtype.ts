// The P2P figures of `npm run bench -- xfer`'s per-dtype part: one holder process per KV dtype (a
// cache instance attached to a controller, its CPU tier filled with chunks of the Llama-3-8B shape
// in that dtype: bench/_move.ts), and this process fetching the whole run from each holder's peer
// port as an engine's P2P client does (src/kvc/p2p_fetch.ts: FETCH, every chunk verified on
// arrival), in rounds that alternate the dtypes' order. Tokens a second per dtype and round.
import { DType, type KvLayout } from '../src/common/chunk.js';
import { DTYPE_NAMES } from '../src/common/dtype.js';
import { chunkKeys } from '../src/common/keys.js';
import { freePortRange } from '../src/common/ports.js';
import { startController } from '../src/controller/server.js';
import { fetchFromPeer } from '../src/kvc/p2p_fetch.js';
import { LLAMA3_8B, spawnInstance } from './_move.js';

/** 64-token chunks (16 MiB at f32), 24 of them: 1,536 tokens a fetch. */
const CHUNK_TOKENS = 64;
const CHUNKS = 24;

export async function p2pPerDtype(rounds: number): Promise<Record<string, number[]>> {
  const dtypes = Object.keys(DTYPE_NAMES).map(Number) as DType[];
  const base = await freePortRange(2);
  const ctl = await startController({ host: '127.0.0.1', port: base, monitorPort: base + 1, heartbeatTimeoutMs: 60_000, seed: 0n });
  // A model id per dtype: the controller refuses instances of one model holding different dtypes.
  const model = (d: DType) => `bench-llama-3-8b-${DTYPE_NAMES[d]}`;
  const holders = dtypes.map((d) => spawnInstance(`p2p-${DTYPE_NAMES[d]}`, base + 1, CHUNKS, CHUNK_TOKENS, d, model(d)));
  const tps: Record<string, number[]> = {};
  try {
    const urls = await Promise.all(holders.map((h) => h.ready));
    const fetchOnce = async (i: number): Promise<number> => {
      const layout: KvLayout = { ...LLAMA3_8B, dtype: dtypes[i]! };
      const keys = chunkKeys(
        Array.from({ length: CHUNKS * CHUNK_TOKENS }, (_, t) => t),
        { modelId: model(layout.dtype), chunkSize: CHUNK_TOKENS, seed: 0n, kvDtype: layout.dtype },
      ).map((s) => s.key);
      const t0 = performance.now();
      const r = await fetchFromPeer({ peerUrl: urls[i]!, keys, from: 'bench', deadline: Date.now() + 300_000, layout, chunkSize: CHUNK_TOKENS });
      const s = (performance.now() - t0) / 1000;
      if (r.failure || r.chunks.length !== CHUNKS) throw new Error(`P2P fetch of ${DTYPE_NAMES[dtypes[i]!]} chunks ended early (${r.chunks.length}/${CHUNKS}): ${r.error}`);
      return (CHUNKS * CHUNK_TOKENS) / s;
    };
    for (let i = 0; i < dtypes.length; i++) await fetchOnce(i); // warm-up: the connections' first buffers
    for (let r = 0; r < rounds; r++) {
      const order = dtypes.map((_, i) => i);
      for (const i of r % 2 === 0 ? order : order.reverse()) (tps[DTYPE_NAMES[dtypes[i]!]] ??= []).push(Math.round(await fetchOnce(i)));
    }
  } finally {
    for (const h of holders) {
      h.child.kill('SIGTERM');
      setTimeout(() => h.child.kill('SIGKILL'), 5000).unref();
    }
    await ctl.close();
  }
  return tps;
}
