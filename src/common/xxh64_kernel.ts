// The xxh64 WASM kernel shipped inside the xxhash-wasm package (workerd/xxhash.wasm), compiled once
// per process, for the places that must hash bytes where they already lie in WASM memory instead of
// letting xxhash-wasm's JS wrapper copy them into its own memory first (chunk keys in keys.ts; the
// transfer receiver's slots in slot_arena.ts, which checksum64 in keys.ts also hashes in place when
// a consumer verifies a received chunk again). Same module as xxhash-wasm's h64 / create64, so the
// same values.
//
// Exports of the module (all pointers are byte offsets into its own exported memory `mem`):
//   xxh64(ptr, len, seed: i64) → i64           one-shot hash
//   init64(state, seed: i64)                    streaming state of 88 bytes at `state` (zeroed first:
//                                               init64 does not clear the buffered-tail fields)
//   update64(state, ptr, len)                   any split of the input gives the one-shot value
//   digest64(state) → i64                       (i64 results arrive as signed BigInts)
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';

export interface Xxh64Exports {
  mem: WebAssembly.Memory;
  xxh64(ptr: number, len: number, seed: bigint): bigint;
  init64(state: number, seed: bigint): void;
  update64(state: number, ptr: number, len: number): void;
  digest64(state: number): bigint;
}

/** Bytes of xxh64's streaming state (what xxhash-wasm's create64 reserves). */
export const XXH64_STATE_BYTES = 88;
const U64 = (1n << 64n) - 1n;
/** The module's i64 results as the unsigned values xxhash-wasm returns. */
export const asU64 = (v: bigint): bigint => v & U64;

function compile(): WebAssembly.Module | null {
  try {
    const pkgMain = createRequire(import.meta.url).resolve('xxhash-wasm');
    const mod = new WebAssembly.Module(readFileSync(join(dirname(pkgMain), '..', 'workerd', 'xxhash.wasm')));
    const names = WebAssembly.Module.exports(mod).map((e) => e.name);
    return ['mem', 'xxh64', 'init64', 'update64', 'digest64'].every((n) => names.includes(n)) ? mod : null;
  } catch {
    return null; // package layout changed: callers fall back to xxhash-wasm's own API (same values, copies)
  }
}

const mod = compile();

/** A fresh instance of the kernel with its own memory, or null when the package does not ship it. */
export function xxh64Instance(): Xxh64Exports | null {
  return mod ? (new WebAssembly.Instance(mod, {}).exports as unknown as Xxh64Exports) : null;
}

// Memories whose bytes may be hashed where they lie, each with its kernel: an owner registers a
// memory once it will never grow again (slot_arena.ts), so a view's offset stays valid.
const inPlace = new WeakMap<ArrayBufferLike, Xxh64Exports>();

export function registerInPlace(k: Xxh64Exports): void {
  inPlace.set(k.mem.buffer, k);
}

export function unregisterInPlace(buffer: ArrayBufferLike): void {
  inPlace.delete(buffer);
}

/** xxh64 of `bytes` computed where they lie when they are in a registered kernel memory, else null. */
export function xxh64InPlace(bytes: Uint8Array, seed = 0n): bigint | null {
  const k = inPlace.get(bytes.buffer);
  return k ? asU64(k.xxh64(bytes.byteOffset, bytes.byteLength, seed)) : null;
}
