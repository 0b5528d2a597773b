// Chunk slots in WASM memory, hashed in place: the memory of the transfer receiver
// (src/xfer/receiver.ts). The socket reads a chunk's bytes straight into its slot, and the xxh64
// kernel (xxh64_kernel.ts) hashes them there: no staging copy for the read, none for the hash
// (xxhash-wasm's own create64 would copy every piece into its memory first).
//
// Same contract as BufferPool (buffer_pool.ts): grows on demand up to a byte budget, recycles
// slots of a size class (bytes rounded up to 4 KiB), trim() gives idle memory back. The memory comes
// in arenas: one instance of the kernel per arena, its memory grown ONCE at creation to hold
// [4 KiB header: hash state][slot 0][slot 1]… of one size class, and never again — growing would
// detach the views handed out. Untouched pages of an arena cost nothing (the kernel maps them on
// first write), so an arena is sized generously (ARENA_BYTES) and only slots handed out at least once
// count as held memory. A WASM memory cannot shrink: an arena goes back to the system (at the next
// GC) only when none of its slots is live; trim() drops those.
//
// Few arenas on purpose: every WASM memory reserves a large stretch of virtual address space, so one
// per slot would exhaust it with small chunks. Slots are 4 KiB aligned (a chunk's payload, at +64,
// is 64-byte aligned for typed-array views). A size class too large for one 32-bit WASM memory gets a
// plain buffer (hashed by copying).
import { sizeClass } from './buffer_pool.js';
import { copyingHash, type StreamHash } from './stream_hash.js';
import { asU64, registerInPlace, unregisterInPlace, xxh64Instance, XXH64_STATE_BYTES, type Xxh64Exports } from './xxh64_kernel.js';

const WASM_PAGE = 65536;
const HEADER = 4096;
/** Address space of one arena (slots of one class); untouched pages are free. */
const ARENA_BYTES = 256 << 20;
/** What one 32-bit WASM memory can hold, with margin. */
const WASM_MAX = 4 * 1024 * 1024 * 1024 - 64 * WASM_PAGE;

class Arena {
  readonly k: Xxh64Exports;
  readonly buffer: ArrayBuffer;
  /** Slots handed out at least once and free now (warm pages: reused first). */
  readonly warm: number[] = [];
  /** Slots below this index have been handed out at least once. */
  touched = 0;
  live = 0;

  constructor(
    k: Xxh64Exports,
    readonly cls: number,
    readonly slots: number,
  ) {
    const bytes = HEADER + slots * cls;
    const have = k.mem.buffer.byteLength;
    if (bytes > have) k.mem.grow(Math.ceil((bytes - have) / WASM_PAGE));
    this.k = k;
    this.buffer = k.mem.buffer; // final: never grown again
    registerInPlace(k); // checksum64 (keys.ts) hashes a slot's bytes in place too
  }

  slot(i: number): Uint8Array {
    return new Uint8Array(this.buffer, HEADER + i * this.cls, this.cls);
  }

  /** A hasher for pieces of this arena's memory: the kernel reads them in place. */
  hasher(seed: bigint): StreamHash {
    // Streaming state lives in JS between calls (88 bytes in and out around each update), so any
    // number of streams may share the arena's one state area.
    const state = new Uint8Array(XXH64_STATE_BYTES);
    const area = new Uint8Array(this.buffer, 0, XXH64_STATE_BYTES);
    area.fill(0); // init64 leaves the buffered-tail fields as they are
    this.k.init64(0, seed);
    state.set(area);
    const { buffer, k } = this;
    return {
      update(piece: Uint8Array): void {
        if (piece.buffer !== buffer) throw new Error('in-place hasher: piece is not in its arena');
        if (piece.byteLength === 0) return;
        area.set(state);
        k.update64(0, piece.byteOffset, piece.byteLength);
        state.set(area);
      },
      digest(): bigint {
        area.set(state);
        return asU64(k.digest64(0));
      },
    };
  }
}

export class SlotArenaPool {
  private readonly arenas = new Map<number, Arena[]>();
  /** Which arena a slot belongs to (by its memory). */
  private readonly owner = new WeakMap<ArrayBuffer, Arena>();
  private liveBytes = 0;
  private warmBytes = 0;
  /** Arenas created so far: for tests and metrics. */
  allocations = 0;
  private readonly inPlace: boolean;

  constructor(readonly budgetBytes: number) {
    this.inPlace = xxh64Instance() !== null;
  }

  /** Bytes of slots handed out at least once in arenas still held (live + warm free), i.e. memory this pool costs. */
  get heldBytes(): number {
    return this.liveBytes + this.warmBytes;
  }

  get inUseBytes(): number {
    return this.liveBytes;
  }

  /** A slot of at least `bytes` (exactly its size class), or null when the budget does not allow it. */
  acquire(bytes: number): Uint8Array | null {
    const cls = sizeClass(bytes);
    if (this.liveBytes + cls > this.budgetBytes) return null;
    const list = this.arenas.get(cls) ?? [];
    // warm slot first (pages already mapped), then a fresh slot of an existing arena
    let a = list.find((x) => x.warm.length > 0);
    let i: number;
    if (a) {
      i = a.warm.pop()!;
      this.warmBytes -= cls;
    } else {
      a = list.find((x) => x.touched < x.slots);
      if (!a) {
        a = this.newArena(cls) ?? undefined;
        if (!a) return this.plain(cls);
        list.push(a);
        this.arenas.set(cls, list);
      }
      i = a.touched++;
      this.dropIdle(cls); // keep warm memory of other classes within the budget
    }
    a.live++;
    this.liveBytes += cls;
    return a.slot(i);
  }

  /** Returns a slot obtained from acquire(). */
  release(buf: Uint8Array): void {
    const cls = buf.byteLength;
    this.liveBytes -= cls;
    const a = this.owner.get(buf.buffer as ArrayBuffer);
    if (!a) return; // plain buffer: the GC takes it
    a.live--;
    a.warm.push((buf.byteOffset - HEADER) / a.cls);
    this.warmBytes += cls;
  }

  /**
   * How to hash pieces of `buf` as they arrive: in place when it is one of this pool's slots, else
   * by copying (same values either way).
   */
  hasher(buf: Uint8Array, seed = 0n): StreamHash {
    const a = this.owner.get(buf.buffer as ArrayBuffer);
    return a ? a.hasher(seed) : copyingHash(seed);
  }

  /** Gives back every arena with no live slot (memory returns to the system at the next GC). */
  trim(): void {
    for (const [cls, list] of this.arenas) {
      const keep = list.filter((a) => a.live > 0);
      for (const a of list) if (a.live === 0) this.forget(a);
      if (keep.length) this.arenas.set(cls, keep);
      else this.arenas.delete(cls);
    }
  }

  private forget(a: Arena): void {
    this.warmBytes -= a.warm.length * a.cls;
    a.warm.length = 0;
    this.owner.delete(a.buffer);
    unregisterInPlace(a.buffer);
  }

  /** Held memory over the budget: idle arenas of other classes go first. */
  private dropIdle(cls: number): void {
    if (this.heldBytes + cls <= this.budgetBytes) return;
    for (const [c, list] of this.arenas) {
      if (c === cls) continue;
      for (const a of list.filter((x) => x.live === 0)) {
        this.forget(a);
        list.splice(list.indexOf(a), 1);
        if (this.heldBytes + cls <= this.budgetBytes) break;
      }
      if (!list.length) this.arenas.delete(c);
      if (this.heldBytes + cls <= this.budgetBytes) return;
    }
  }

  private newArena(cls: number): Arena | null {
    if (!this.inPlace || HEADER + cls > WASM_MAX) return null;
    const k = xxh64Instance()!;
    const slots = Math.max(1, Math.min(Math.floor(ARENA_BYTES / cls), Math.floor((WASM_MAX - HEADER) / cls), Math.ceil(this.budgetBytes / cls)));
    let a: Arena;
    try {
      a = new Arena(k, cls, slots);
    } catch {
      return null; // no address space left for another WASM memory: plain buffers still work
    }
    this.owner.set(a.buffer, a);
    this.allocations++;
    return a;
  }

  /** A slot outside any arena (class too large for WASM memory, or no kernel): hashed by copying. */
  private plain(cls: number): Uint8Array {
    this.liveBytes += cls;
    const b = Buffer.allocUnsafeSlow(cls);
    return new Uint8Array(b.buffer, b.byteOffset, cls);
  }
}
