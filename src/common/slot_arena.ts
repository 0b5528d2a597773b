// Chunk slots in WASM memory, hashed in place: the memory of the transfer receiver
// (src/xfer/receive_buffer.ts). The socket reads a chunk's bytes straight into its slot, and the xxh64
// kernel (xxh64_kernel.ts) hashes them there: no staging copy for the read, none for the hash
// (xxhash-wasm's own create64 would copy every piece into its memory first).
//
// Same contract as BufferPool (buffer_pool.ts): grows on demand up to a byte budget, recycles
// slots, trim() gives idle memory back. A slot handed out is a view of its size class (bytes rounded
// up to 4 KiB), and that class is what counts against the budget. The memory comes in arenas: one
// instance of the kernel per arena, its memory grown ONCE at creation to hold
// [4 KiB header: hash state][slot 0][slot 1]… and never again — growing would detach the views
// handed out. Untouched pages of an arena cost nothing (the kernel maps them on first write), so an
// arena is sized generously (ARENA_BYTES) and only slots handed out at least once count as held
// memory. A WASM memory cannot shrink: an arena goes back to the system (at the next GC) only when
// none of its slots is live; trim() drops those.
//
// Few arenas on purpose, and so an arena's slots are a power of two of pages (arenaClass below):
// every size class of its own arena made one arena per distinct chunk length, and the last,
// partial chunk of every prompt has its own length. Each new arena grows a WASM memory by
// ARENA_BYTES (~20 ms on the main thread) and V8 counts that memory as external, so it answered
// every new arena with a full garbage collection ("external memory pressure"): a decoder receiving
// ~1 long prompt a second created an arena a second and paused its decode steps for 10–95 ms each
// time (docs/disaggregation.md). With power-of-two slots there are a handful of slot sizes (nine
// up to 1 MiB), a receiver creates their arenas at start (prepare), and another arena of a size
// is created only when all slots of that size are in use. A slot holds at most twice the bytes
// counted for it (a warm slot reused for a shorter chunk keeps the pages a longer one touched):
// held memory is counted in whole slots, and idle arenas are dropped past twice the budget.
//
// Slots are 4 KiB aligned (a chunk's payload, at +64, is 64-byte aligned for typed-array views). A
// size class too large for one 32-bit WASM memory gets a plain buffer (hashed by copying).
import { sizeClass } from './buffer_pool.js';
import { copyingHash, type StreamHash } from './stream_hash.js';
import { asU64, registerInPlace, unregisterInPlace, xxh64Instance, XXH64_STATE_BYTES, type Xxh64Exports } from './xxh64_kernel.js';

const WASM_PAGE = 65536;
const HEADER = 4096;
/** Address space of one arena (slots of one class); untouched pages are free. */
const ARENA_BYTES = 256 << 20;
/** Slots of each arena prepare() creates below the largest slot size (see prepare). */
const PREPARED_SHORT_SLOTS = 64;
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

  /** Slot `i`, as a view of `bytes` (its size class; at most the slot). */
  slot(i: number, bytes: number): Uint8Array {
    return new Uint8Array(this.buffer, HEADER + i * this.cls, bytes);
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

/** The slot size of the arenas that serve size class `cls`: the next power of two (at least a page). */
export function arenaClass(cls: number): number {
  let c = 4096;
  while (c < cls) c *= 2;
  return c;
}

export class SlotArenaPool {
  /** Arenas by their slot size (arenaClass). */
  private readonly arenas = new Map<number, Arena[]>();
  /** Which arena a slot belongs to (by its memory). */
  private readonly owner = new WeakMap<ArrayBuffer, Arena>();
  /** Size classes of the slots handed out and not returned (what counts against the budget). */
  private liveBytes = 0;
  /** Arenas created so far: for tests and metrics. */
  allocations = 0;
  private readonly inPlace: boolean;
  /** Largest chunk prepare() was asked for (0: none): trim() keeps fresh arenas up to it. */
  private preparedMax = 0;

  constructor(readonly budgetBytes: number) {
    this.inPlace = xxh64Instance() !== null;
  }

  /** Bytes of slots handed out at least once in arenas still held (live + warm free, whole slots), i.e. at most the memory this pool costs. */
  get heldBytes(): number {
    let n = 0;
    for (const list of this.arenas.values()) for (const a of list) n += a.touched * a.cls;
    return n;
  }

  /**
   * Creates the arenas for every slot size up to `maxBytes` now rather than at the first chunk of
   * each size: a receiver calls it at start with its full chunk size (the last chunk of a prompt can
   * have any shorter length), so the WASM memory grows and the garbage collections V8 answers
   * them with happen before any request is served. Untouched, they hold no memory.
   */
  prepare(maxBytes: number): void {
    this.preparedMax = Math.max(this.preparedMax, maxBytes);
    const top = arenaClass(sizeClass(maxBytes));
    for (let cls = 4096; cls <= top; cls *= 2) {
      if (this.arenas.get(cls)?.length) continue;
      // Shorter slots hold the last chunk of a prompt, one per request in flight: a small arena
      // each (more are created if ever needed), not 256 MiB of address space apiece.
      const a = this.newArena(cls, cls < top ? PREPARED_SHORT_SLOTS : undefined);
      if (a) this.arenas.set(cls, [a]);
    }
  }

  get inUseBytes(): number {
    return this.liveBytes;
  }

  /** A slot of at least `bytes` (exactly its size class), or null when the budget does not allow it. */
  acquire(bytes: number): Uint8Array | null {
    const cls = sizeClass(bytes);
    if (this.liveBytes + cls > this.budgetBytes) return null;
    const slotBytes = arenaClass(cls);
    const list = this.arenas.get(slotBytes) ?? [];
    // warm slot first (pages already mapped), then a fresh slot of an existing arena
    let a = list.find((x) => x.warm.length > 0);
    let i: number;
    if (a) {
      i = a.warm.pop()!;
    } else {
      a = list.find((x) => x.touched < x.slots);
      if (!a) {
        a = this.newArena(slotBytes) ?? undefined;
        if (!a) return this.plain(cls);
        list.push(a);
        this.arenas.set(slotBytes, list);
      }
      i = a.touched++;
      this.dropIdle(slotBytes); // keep warm memory of other classes within the bound
    }
    a.live++;
    this.liveBytes += cls;
    return a.slot(i, cls);
  }

  /** Returns a slot obtained from acquire(). */
  release(buf: Uint8Array): void {
    this.liveBytes -= buf.byteLength;
    const a = this.owner.get(buf.buffer as ArrayBuffer);
    if (!a) return; // plain buffer: the GC takes it
    a.live--;
    a.warm.push((buf.byteOffset - HEADER) / a.cls);
  }

  /**
   * How to hash pieces of `buf` as they arrive: in place when it is one of this pool's slots, else
   * by copying (same values either way).
   */
  hasher(buf: Uint8Array, seed = 0n): StreamHash {
    const a = this.owner.get(buf.buffer as ArrayBuffer);
    return a ? a.hasher(seed) : copyingHash(seed);
  }

  /**
   * Gives back every arena with no live slot (memory returns to the system at the next GC). Slot
   * sizes prepare() covered get a fresh, untouched arena at once: trim runs when the receiver is
   * idle, so the WASM memory grow and the GC it brings happen now, not in the next transfer.
   */
  trim(): void {
    for (const [cls, list] of this.arenas) {
      const keep = list.filter((a) => a.live > 0 || a.touched === 0);
      for (const a of list) if (!keep.includes(a)) this.forget(a);
      if (keep.length) this.arenas.set(cls, keep);
      else this.arenas.delete(cls);
    }
    if (this.preparedMax) this.prepare(this.preparedMax);
  }

  private forget(a: Arena): void {
    a.warm.length = 0;
    this.owner.delete(a.buffer);
    unregisterInPlace(a.buffer);
  }

  /** Held memory (whole slots) over twice the budget: idle arenas of other slot sizes go first. */
  private dropIdle(slotBytes: number): void {
    const bound = 2 * this.budgetBytes;
    if (this.heldBytes + slotBytes <= bound) return;
    for (const [c, list] of this.arenas) {
      if (c === slotBytes) continue;
      // Untouched arenas hold no memory: dropping them would free nothing.
      for (const a of list.filter((x) => x.live === 0 && x.touched > 0)) {
        this.forget(a);
        list.splice(list.indexOf(a), 1);
        if (this.heldBytes + slotBytes <= bound) break;
      }
      if (!list.length) this.arenas.delete(c);
      if (this.heldBytes + slotBytes <= bound) return;
    }
  }

  private newArena(cls: number, maxSlots = Infinity): Arena | null {
    if (!this.inPlace || HEADER + cls > WASM_MAX) return null;
    const k = xxh64Instance()!;
    const slots = Math.max(1, Math.min(maxSlots, Math.floor(ARENA_BYTES / cls), Math.floor((WASM_MAX - HEADER) / cls), Math.ceil(this.budgetBytes / cls)));
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
