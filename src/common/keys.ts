// Chunk keys (DESIGN §2), the one definition shared by engine, cache, controller and xfer.
//
//   k_0 = H(uint64le(seed) || utf8(model_id))
//   k_i = H(uint64le(k_{i-1}) || uint32le(tokens of chunk i))
//
// H is xxh64 (xxhash-wasm). Chaining makes a key identify the whole prefix up to and
// including its chunk, so "longest cached prefix" is "first missing key".
// Keys travel as 16-digit lowercase hex strings: a JS number cannot hold 64 bits.
import xxhash from 'xxhash-wasm';

const { h64Raw } = await xxhash();

export type ChunkKey = string;

export interface KeyParams {
  modelId: string;
  chunkSize: number;
  /** The integer in PYTHONHASHSEED (spec §2.6); unset means 0. */
  seed: bigint;
  /** When true, a last chunk shorter than chunkSize gets no key. */
  discardPartialChunks?: boolean;
}

export interface ChunkSpan {
  index: number;
  start: number;
  end: number;
  key: ChunkKey;
}

export function toHex(k: bigint): ChunkKey {
  return k.toString(16).padStart(16, '0');
}

/** Reads PYTHONHASHSEED the way the spec intends: an integer; unset or "random" is refused loudly only if malformed. */
export function seedFromEnv(env: NodeJS.ProcessEnv = process.env): bigint {
  const raw = env.PYTHONHASHSEED;
  if (raw === undefined || raw === '') return 0n;
  if (!/^\d+$/.test(raw)) {
    throw new Error(`PYTHONHASHSEED must be a non-negative integer so that chunk keys agree across processes; found "${raw}"`);
  }
  return BigInt(raw);
}

const rootCache = new Map<string, bigint>();

/** k_0 for a (seed, model) pair. */
export function rootKey(seed: bigint, modelId: string): bigint {
  const id = `${seed}\u0000${modelId}`;
  let k = rootCache.get(id);
  if (k === undefined) {
    const name = Buffer.from(modelId, 'utf8');
    const buf = Buffer.allocUnsafe(8 + name.length);
    buf.writeBigUInt64LE(BigInt.asUintN(64, seed), 0);
    name.copy(buf, 8);
    k = h64Raw(buf);
    rootCache.set(id, k);
  }
  return k;
}

/** Chunk keys as (hi, lo) 32-bit halves: the form the controller's typed-array index uses. */
export interface KeyHalves {
  /** Number of chunks. */
  count: number;
  hi: Uint32Array;
  lo: Uint32Array;
  /** Token offset where chunk i ends. */
  ends: Uint32Array;
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
// One growable scratch: [8 spare bytes][all tokens as uint32]. Chunk i is hashed in place as the
// 8 bytes just before its first token (overwritten with k_{i-1}; they belong to chunk i-1, which
// is already hashed) followed by its tokens, so the tokens go in with one TypedArray.set and no
// per-chunk copy. This is the hot path of /lookup (8192 tokens in ~20 µs).
let scratch = new Uint8Array(8 + 4 * 8192);
let words = new Uint32Array(scratch.buffer);
let view = new DataView(scratch.buffer);

/** Splits `tokens` into chunks and returns every chunk's key as 32-bit halves, in order. */
export function keyHalves(tokens: ArrayLike<number>, p: KeyParams): KeyHalves {
  if (!Number.isInteger(p.chunkSize) || p.chunkSize <= 0) throw new Error(`chunkSize must be a positive integer, found ${p.chunkSize}`);
  const n = tokens.length;
  const full = Math.floor(n / p.chunkSize);
  const count = p.discardPartialChunks || n % p.chunkSize === 0 ? full : full + 1;
  const out: KeyHalves = { count, hi: new Uint32Array(count), lo: new Uint32Array(count), ends: new Uint32Array(count) };
  if (count === 0) return out;
  if (words.length < 2 + n) {
    scratch = new Uint8Array(8 + 4 * n);
    words = new Uint32Array(scratch.buffer);
    view = new DataView(scratch.buffer);
  }
  if (LITTLE_ENDIAN) words.set(tokens, 2);
  else for (let t = 0; t < n; t++) view.setUint32(8 + 4 * t, tokens[t]! >>> 0, true);
  let prev = rootKey(p.seed, p.modelId);
  for (let i = 0; i < count; i++) {
    const start = i * p.chunkSize;
    const end = Math.min(n, start + p.chunkSize);
    view.setBigUint64(4 * start, prev, true);
    prev = h64Raw(scratch.subarray(4 * start, 8 + 4 * end));
    out.hi[i] = Number(prev >> 32n);
    out.lo[i] = Number(prev & 0xffffffffn);
    out.ends[i] = end;
  }
  return out;
}

export function halvesToHex(hi: number, lo: number): ChunkKey {
  return hi.toString(16).padStart(8, '0') + lo.toString(16).padStart(8, '0');
}

/** Splits `tokens` into chunks and returns each chunk's span and key (hex), in order. */
export function chunkKeys(tokens: ArrayLike<number>, p: KeyParams): ChunkSpan[] {
  const k = keyHalves(tokens, p);
  const out: ChunkSpan[] = new Array(k.count);
  for (let i = 0; i < k.count; i++) {
    out[i] = { index: i, start: i * p.chunkSize, end: k.ends[i]!, key: halvesToHex(k.hi[i]!, k.lo[i]!) };
  }
  return out;
}

/** xxh64 of arbitrary bytes, as used for chunk payload checksums (DESIGN §3). */
export function checksum64(bytes: Uint8Array): bigint {
  return h64Raw(bytes);
}
