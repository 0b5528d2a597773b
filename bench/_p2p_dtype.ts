// The P2P figures of `npm run bench -- xfer`'s per-dtype part: one holder process per KV dtype (a
// cache instance attached to a controller, its CPU tier filled with chunks of the Llama-3-8B shape
// in that dtype: bench/_move.ts), and this process fetching a prompt's chunks from each holder's
// peer port as an engine's P2P client does (src/kvc/p2p_fetch.ts: FETCH, every chunk verified on
// arrival, connections to a holder kept between fetches as src/kvc/p2p_client.ts keeps them by
// default). A round is P2P_FETCHES_PER_ROUND fetches of the same prompt per dtype, the dtypes'
// order rotating from one fetch to the next so each dtype's share is spread over the round; a
// dtype's round figure is its tokens over its seconds, summed over its fetches.
import { DType, type KvLayout } from '../src/common/chunk.js';
import { DTYPE_NAMES } from '../src/common/dtype.js';
import { chunkKeys } from '../src/common/keys.js';
import { freePortRange } from '../src/common/ports.js';
import { startController } from '../src/controller/server.js';
import { fetchFromPeer } from '../src/kvc/p2p_fetch.js';
import { PeerConnPool } from '../src/kvc/p2p_pool.js';
import { LLAMA3_8B, spawnInstance } from './_move.js';

/** 64-token chunks (16 MiB at f32), 24 of them: a 1,536-token prompt per fetch. */
const CHUNK_TOKENS = 64;
const CHUNKS = 24;
export const P2P_TOKENS = CHUNK_TOKENS * CHUNKS;
export const P2P_FETCHES_PER_ROUND = 4;

export async function p2pPerDtype(rounds: number): Promise<Record<string, number[]>> {
  const dtypes = Object.keys(DTYPE_NAMES).map(Number) as DType[];
  const base = await freePortRange(2);
  const ctl = await startController({ host: '127.0.0.1', port: base, monitorPort: base + 1, heartbeatTimeoutMs: 60_000, seed: 0n });
  // A model id per dtype: the controller refuses instances of one model holding different dtypes.
  const model = (d: DType) => `bench-llama-3-8b-${DTYPE_NAMES[d]}`;
  const holders = dtypes.map((d) => spawnInstance(`p2p-${DTYPE_NAMES[d]}`, base + 1, CHUNKS, CHUNK_TOKENS, d, model(d)));
  const pool = new PeerConnPool({ onConnection: () => undefined, onIdle: () => undefined });
  const tps: Record<string, number[]> = {};
  try {
    const urls = await Promise.all(holders.map((h) => h.ready));
    const keys = dtypes.map((d) =>
      chunkKeys(
        Array.from({ length: P2P_TOKENS }, (_, t) => t),
        { modelId: model(d), chunkSize: CHUNK_TOKENS, seed: 0n, kvDtype: d },
      ).map((s) => s.key),
    );
    /** Seconds of one fetch of the whole prompt from holder i. */
    const fetchOnce = async (i: number): Promise<number> => {
      const layout: KvLayout = { ...LLAMA3_8B, dtype: dtypes[i]! };
      const t0 = performance.now();
      const r = await fetchFromPeer({ peerUrl: urls[i]!, keys: keys[i]!, from: 'bench', deadline: Date.now() + 300_000, layout, chunkSize: CHUNK_TOKENS, pool });
      const s = (performance.now() - t0) / 1000;
      if (r.failure || r.chunks.length !== CHUNKS) throw new Error(`P2P fetch of ${DTYPE_NAMES[dtypes[i]!]} chunks ended early (${r.chunks.length}/${CHUNKS}): ${r.error}`);
      return s;
    };
    for (let i = 0; i < dtypes.length; i++) await fetchOnce(i); // warm-up: the connections and their first buffers
    for (let r = 0; r < rounds; r++) {
      const seconds = dtypes.map(() => 0);
      for (let f = 0; f < P2P_FETCHES_PER_ROUND; f++) {
        const k = r * P2P_FETCHES_PER_ROUND + f;
        for (let j = 0; j < dtypes.length; j++) {
          const i = (j + k) % dtypes.length;
          seconds[i]! += await fetchOnce(i);
        }
      }
      dtypes.forEach((d, i) => (tps[DTYPE_NAMES[d]] ??= []).push(Math.round((P2P_FETCHES_PER_ROUND * P2P_TOKENS) / seconds[i]!)));
    }
  } finally {
    pool.close();
    for (const h of holders) {
      h.child.kill('SIGTERM');
      setTimeout(() => h.child.kill('SIGKILL'), 5000).unref();
    }
    await ctl.close();
  }
  return tps;
}
