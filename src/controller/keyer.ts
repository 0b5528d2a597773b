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

// One growable scratch: [8 spare bytes][all tokens as uint32]. Chunk i is hashed in place as
// the 8 bytes before its first token (overwritten with k_{i-1}; they belong to chunk i-1, which
// is already hashed) followed by its tokens. The tokens go in with one TypedArray.set.
let bytes = new Uint8Array(8 + 4 * 8192);
let words = new Uint32Array(bytes.buffer);
let view = new DataView(bytes.buffer);

export function keyHalves(tokens: ArrayLike<number>, modelId: string, chunkSize: number, seed: bigint): KeyHalves {
  const n = tokens.length;
  const count = Math.ceil(n / chunkSize);
  const out: KeyHalves = { count, hi: new Uint32Array(count), lo: new Uint32Array(count), ends: new Uint32Array(count) };
  if (count === 0) return out;
  if (words.length < 2 + n) {
    bytes = new Uint8Array(8 + 4 * n);
    words = new Uint32Array(bytes.buffer);
    view = new DataView(bytes.buffer);
  }
  if (LITTLE_ENDIAN) words.set(tokens, 2);
  else for (let t = 0; t < n; t++) view.setUint32(8 + 4 * t, tokens[t]! >>> 0, true);
  let prev = rootKey(seed, modelId);
  for (let i = 0; i < count; i++) {
    const start = i * chunkSize;
    const end = Math.min(n, start + chunkSize);
    view.setBigUint64(4 * start, prev, true);
    prev = h64Raw(bytes.subarray(4 * start, 8 + 4 * end));
    out.hi[i] = Number(prev >> 32n);
    out.lo[i] = Number(prev & 0xffffffffn);
    out.ends[i] = end;
  }
  return out;
}

export function halvesToHex(hi: number, lo: number): string {
  return hi.toString(16).padStart(8, '0') + lo.toString(16).padStart(8, '0');
}
