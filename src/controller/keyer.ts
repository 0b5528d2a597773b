// Chunk keys for the controller's hot path (/lookup): the same keys as src/common/keys.ts
// (same chain, same xxh64, checked equal by test/controller_index.test.ts) but produced as
// (hi, lo) 32-bit halves for the typed-array index, with the tokens copied through a
// Uint32Array view instead of per-token writeUInt32LE and no hex strings on the way.
import xxhash from 'xxhash-wasm';
import { rootKey } from '../common/keys.js';

const { h64Raw } = await xxhash();
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

export interface KeyHalves {
  /** Number of chunks. */
  count: number;
  hi: Uint32Array;
  lo: Uint32Array;
  /** Token offset where chunk i ends. */
  ends: Uint32Array;
}

const scratch = new Map<number, { bytes: Uint8Array; words: Uint32Array; view: DataView }>();

export function keyHalves(tokens: ArrayLike<number>, modelId: string, chunkSize: number, seed: bigint): KeyHalves {
  const n = tokens.length;
  const count = Math.ceil(n / chunkSize);
  const out: KeyHalves = { count, hi: new Uint32Array(count), lo: new Uint32Array(count), ends: new Uint32Array(count) };
  if (count === 0) return out;
  let s = scratch.get(chunkSize);
  if (!s) {
    const bytes = new Uint8Array(8 + 4 * chunkSize);
    s = { bytes, words: new Uint32Array(bytes.buffer), view: new DataView(bytes.buffer) };
    scratch.set(chunkSize, s);
  }
  let prev = rootKey(seed, modelId);
  for (let i = 0; i < count; i++) {
    const start = i * chunkSize;
    const end = Math.min(n, start + chunkSize);
    s.view.setBigUint64(0, prev, true);
    if (LITTLE_ENDIAN) {
      const w = s.words;
      for (let t = start, j = 2; t < end; t++, j++) w[j] = tokens[t]!;
    } else {
      for (let t = start, o = 8; t < end; t++, o += 4) s.view.setUint32(o, tokens[t]! >>> 0, true);
    }
    prev = h64Raw(s.bytes.subarray(0, 8 + 4 * (end - start)));
    out.hi[i] = Number(prev >> 32n);
    out.lo[i] = Number(prev & 0xffffffffn);
    out.ends[i] = end;
  }
  return out;
}

export function halvesToHex(hi: number, lo: number): string {
  return hi.toString(16).padStart(8, '0') + lo.toString(16).padStart(8, '0');
}
