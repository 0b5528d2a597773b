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

/**
 * Splits `tokens` into chunks and returns each chunk's span and key, in order.
 * Work is one hash over 8 + 4*chunkSize bytes per chunk, reusing one scratch buffer.
 */
export function chunkKeys(tokens: ArrayLike<number>, p: KeyParams): ChunkSpan[] {
  if (!Number.isInteger(p.chunkSize) || p.chunkSize <= 0) throw new Error(`chunkSize must be a positive integer, found ${p.chunkSize}`);
  const out: ChunkSpan[] = [];
  const n = tokens.length;
  const full = Math.floor(n / p.chunkSize);
  const count = p.discardPartialChunks || n % p.chunkSize === 0 ? full : full + 1;
  if (count === 0) return out;
  const scratch = Buffer.allocUnsafe(8 + 4 * p.chunkSize);
  let prev = rootKey(p.seed, p.modelId);
  for (let i = 0; i < count; i++) {
    const start = i * p.chunkSize;
    const end = Math.min(n, start + p.chunkSize);
    scratch.writeBigUInt64LE(prev, 0);
    let o = 8;
    for (let t = start; t < end; t++, o += 4) scratch.writeUInt32LE(tokens[t]! >>> 0, o);
    prev = h64Raw(scratch.subarray(0, o));
    out.push({ index: i, start, end, key: toHex(prev) });
  }
  return out;
}

/** xxh64 of arbitrary bytes, as used for chunk payload checksums (DESIGN §3). */
export function checksum64(bytes: Uint8Array): bigint {
  return h64Raw(bytes);
}
