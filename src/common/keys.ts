// Chunk keys, the one definition shared by engine, cache, controller and xfer.
//
//   k_0 = H(uint64le(seed) || utf8(model_id))                        (no cache salt)
//   k_0 = H(uint64le(seed) || utf8(model_id) || 0x00 || utf8(salt))  (a request's cache_salt)
//   k_i = H(uint64le(k_{i-1}) || uint32le(tokens of chunk i))
//
// The salt (vLLM's `cache_salt` request field) enters the root, so every key of a salted prompt
// differs from the unsalted prompt's and from every other salt's: chunks are never shared across
// salts, whoever asks (engine, controller lookup, P2P, transfer).
//
// The KV dtype (the element type the engine holds KV in) enters the root too, so chunks of one
// prompt in different dtypes never share a key:
//   f32:        the root above (unchanged, so every f32 key already stored stays valid);
//   f16, bf16:  H(uint64le(root above) || 0xff || uint8(dtype code) || "kv_dtype") — 18 bytes,
//               a length no chunk step (8 + 4·tokens bytes) has, so no chain can produce it.
//
// H is xxh64 (xxhash-wasm). Chaining makes a key identify the whole prefix up to and
// including its chunk, so "longest cached prefix" is "first missing key".
// Keys travel as 16-digit lowercase hex strings: a JS number cannot hold 64 bits.
import xxhash from 'xxhash-wasm';
import { DType } from './dtype.js';
import { xxh64InPlace, xxh64Instance } from './xxh64_kernel.js';
import { environmentOf } from './environment.js';

const { h64Raw } = await xxhash();

export type ChunkKey = string;

export interface KeyParams {
  modelId: string;
  chunkSize: number;
  /** The integer in PYTHONHASHSEED (the same in every process of a deployment); unset means 0. */
  seed: bigint;
  /** When true, a last chunk shorter than chunkSize gets no key. */
  discardPartialChunks?: boolean;
  /** The request's cache salt; absent or empty: none. */
  salt?: string;
  /** The KV element type the chunks hold (dtype.ts DType); unset means f32. */
  kvDtype?: DType;
}

export interface ChunkSpan {
  index: number;
  start: number;
  end: number;
  key: ChunkKey;
}

/** A chunk key on the wire and on disk: 16 lowercase hex digits (the big-endian u64). */
export const CHUNK_KEY_PATTERN = /^[0-9a-f]{16}$/;
export const CHUNK_KEY_CHARS = 16;

export function isChunkKey(s: unknown): s is ChunkKey {
  return typeof s === 'string' && CHUNK_KEY_PATTERN.test(s);
}

export function toHex(k: bigint): ChunkKey {
  return k.toString(16).padStart(16, '0');
}

/** Reads PYTHONHASHSEED as the key seed: a non-negative integer; unset or empty means 0, anything else (e.g. "random") is refused. */
export function seedFromEnv(env: NodeJS.ProcessEnv = process.env): bigint {
  return environmentOf(env).get('hashSeed') ?? 0n;
}

const rootCache = new Map<string, bigint>();

/** Roots remembered (salts are per request: the map is bounded, oldest dropped first). */
const ROOT_CACHE_MAX = 4096;

/** k_0 for a (seed, model, salt, KV dtype). */
export function rootKey(seed: bigint, modelId: string, salt = '', kvDtype: DType = DType.f32): bigint {
  const id = `${seed}\u0000${kvDtype}\u0000${modelId}\u0000${salt}`;
  let k = rootCache.get(id);
  if (k === undefined) {
    const name = Buffer.from(salt === '' ? modelId : `${modelId}\u0000${salt}`, 'utf8');
    const buf = Buffer.allocUnsafe(8 + name.length);
    buf.writeBigUInt64LE(BigInt.asUintN(64, seed), 0);
    name.copy(buf, 8);
    k = h64Raw(buf);
    if (kvDtype !== DType.f32) {
      const d = Buffer.allocUnsafe(18);
      d.writeBigUInt64LE(k, 0);
      d[8] = 0xff;
      d[9] = kvDtype;
      d.write('kv_dtype', 10, 'ascii');
      k = h64Raw(d);
    }
    if (rootCache.size >= ROOT_CACHE_MAX) rootCache.delete(rootCache.keys().next().value!);
    rootCache.set(id, k);
  }
  return k;
}

// rootKey's cache is keyed by a string built from a BigInt: too slow for every lookup, so the
// last (seed, model) pair's root is kept as halves (a controller sees one or two models).
let lastRoot = { seed: -1n, modelId: '', salt: '', kvDtype: DType.f32, hi: 0, lo: 0 };
function rootHalves(seed: bigint, modelId: string, salt: string, kvDtype: DType): { hi: number; lo: number } {
  if (lastRoot.seed !== seed || lastRoot.modelId !== modelId || lastRoot.salt !== salt || lastRoot.kvDtype !== kvDtype) {
    const k = rootKey(seed, modelId, salt, kvDtype);
    lastRoot = { seed, modelId, salt, kvDtype, hi: Number(k >> 32n), lo: Number(k & 0xffffffffn) };
  }
  return lastRoot;
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

// The hot path of /lookup (8192 tokens → 32 chained keys). xxhash-wasm's h64Raw copies its input
// into WASM memory and returns a BigInt on every call, which made key derivation ~20 µs of a ~21 µs
// lookup. Instead we instantiate the same xxh64 WASM module (shipped in the package as
// workerd/xxhash.wasm, see xxh64_kernel.ts) a second time and write the tokens straight into its memory: layout
// [8 spare bytes][all tokens as uint32le]; chunk i is hashed in place as the 8 bytes just before its
// first token (overwritten with k_{i-1}; they belong to chunk i-1, already hashed) followed by its
// tokens. No per-chunk copy, and the i64 result is split into halves through a BigUint64Array
// instead of BigInt arithmetic. WASM memory is little-endian, as xxh64's input must be.
const raw = xxh64Instance();
let words = new Uint32Array(raw ? raw.mem.buffer : new ArrayBuffer(8 + 4 * 8192));
const result64 = new BigUint64Array(1);
const result32 = new Uint32Array(result64.buffer);
const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/**
 * Splits `tokens` into chunks and returns every chunk's key as 32-bit halves, in order.
 * `reuse`, when given, is filled and returned instead of allocating three typed arrays (its arrays
 * are replaced only when too short): the /lookup hot path keeps one, since small off-heap typed
 * arrays cost about as much to allocate and collect as hashing a quarter of the prompt.
 */
export function keyHalves(tokens: ArrayLike<number>, p: KeyParams, reuse?: KeyHalves): KeyHalves {
  if (!Number.isInteger(p.chunkSize) || p.chunkSize <= 0) throw new Error(`chunkSize must be a positive integer, found ${p.chunkSize}`);
  const n = tokens.length;
  const full = Math.floor(n / p.chunkSize);
  const count = p.discardPartialChunks || n % p.chunkSize === 0 ? full : full + 1;
  let out: KeyHalves;
  if (reuse) {
    out = reuse;
    out.count = count;
    if (out.hi.length < count) [out.hi, out.lo, out.ends] = [new Uint32Array(count), new Uint32Array(count), new Uint32Array(count)];
  } else {
    out = { count, hi: new Uint32Array(count), lo: new Uint32Array(count), ends: new Uint32Array(count) };
  }
  if (count === 0) return out;
  const need = 8 + 4 * n;
  if (raw) {
    if (raw.mem.buffer.byteLength < need) raw.mem.grow(Math.ceil((need - raw.mem.buffer.byteLength) / 65536));
    if (words.buffer !== raw.mem.buffer) words = new Uint32Array(raw.mem.buffer); // grow detaches the old view
  } else if (words.byteLength < need) {
    words = new Uint32Array(need / 4);
  }
  const le = LITTLE_ENDIAN ? null : new DataView(words.buffer);
  if (LITTLE_ENDIAN) words.set(tokens, 2);
  else for (let t = 0; t < n; t++) le!.setUint32(8 + 4 * t, tokens[t]! >>> 0, true);
  const root = rootHalves(p.seed, p.modelId, p.salt ?? '', p.kvDtype ?? DType.f32);
  let ph = root.hi;
  let pl = root.lo;
  for (let i = 0; i < count; i++) {
    const start = i * p.chunkSize;
    const end = Math.min(n, start + p.chunkSize);
    if (LITTLE_ENDIAN) {
      words[start] = pl; // uint64le(k_{i-1}) as (lo, hi)
      words[start + 1] = ph;
    } else {
      le!.setUint32(4 * start, pl, true);
      le!.setUint32(4 * start + 4, ph, true);
    }
    if (raw) result64[0] = raw.xxh64(4 * start, 8 + 4 * (end - start), 0n);
    else result64[0] = h64Raw(new Uint8Array(words.buffer, 4 * start, 8 + 4 * (end - start)));
    pl = result32[LITTLE_ENDIAN ? 0 : 1]!;
    ph = result32[LITTLE_ENDIAN ? 1 : 0]!;
    out.hi[i] = ph;
    out.lo[i] = pl;
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

/**
 * xxh64 of arbitrary bytes, as used for chunk payload checksums (src/common/chunk.ts). Bytes that
 * live in a kernel memory registered for it (a transfer receiver's slots) are hashed in place;
 * others are copied into xxhash-wasm's memory first (h64Raw).
 */
export function checksum64(bytes: Uint8Array): bigint {
  return xxh64InPlace(bytes) ?? h64Raw(bytes);
}
