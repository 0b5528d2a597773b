// Streaming xxh64 over the pieces of one buffer as they arrive (the payload checksum of a chunk,
// src/common/chunk.ts). Two implementations give the same value for any split of the input:
//   - in place (slot_arena.ts): the buffer lives in the xxh64 kernel's WASM memory and each piece is
//     hashed where it lies;
//   - copying (below): xxhash-wasm's create64, which copies every piece into its own WASM memory —
//     for buffers that live elsewhere.
import xxhash from 'xxhash-wasm';

const { create64 } = await xxhash();

export interface StreamHash {
  /** Hashes the next piece. A hasher made for a particular buffer takes only views of that buffer. */
  update(piece: Uint8Array): void;
  /** xxh64 of every piece so far, in order (unsigned). */
  digest(): bigint;
}

/** A hasher for pieces of any memory (each piece is copied once into xxhash-wasm's memory). */
export function copyingHash(seed = 0n): StreamHash {
  const h = create64(seed);
  return {
    update: (piece) => void h.update(piece),
    digest: () => h.digest(),
  };
}
