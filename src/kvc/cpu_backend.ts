// LocalCPUBackend: chunks in this process's memory, bounded by max_local_cpu_size.
// Memory comes from a BufferPool (grown on demand, recycled on eviction); eviction is
// LRU over unpinned chunks. All operations are synchronous inside, so each one is atomic
// with respect to the event loop; the async signatures match the StorageBackend contract.
import { checkChunkFor } from '../common/chunk.js';
import type { ChunkKey } from '../common/keys.js';
import { BufferPool, sizeClass } from '../common/buffer_pool.js';
import { LruIndex, type Entry } from './lru_index.js';
import { CopyDeclinedError, StoreFullError, type BackendStats, type PutOptions, type StorageBackend } from './types.js';

interface CpuEntry extends Entry {
  /** The pooled buffer (size class); the chunk occupies its first `length` bytes. */
  buf: Uint8Array;
  length: number;
}

export class LocalCPUBackend implements StorageBackend {
  readonly location = 'LocalCPUBackend' as const;
  private readonly index = new LruIndex<CpuEntry>();
  private readonly pool: BufferPool;
  /**
   * Bytes (size classes) of reservations for chunks still arriving (reserve()): not in the index,
   * so no eviction can take them, and counted against the capacity so no put can either.
   */
  private reservedBytes = 0;

  constructor(readonly capacityBytes: number) {
    this.pool = new BufferPool(capacityBytes);
  }

  has(key: ChunkKey): boolean {
    return this.index.get(key) !== undefined;
  }

  sizeOf(key: ChunkKey): number {
    return this.index.get(key)?.length ?? -1;
  }

  /**
   * Zero-copy access to a stored chunk for in-process readers (engine import, xfer send).
   * The view is valid only until control returns to the event loop (an eviction may recycle it).
   */
  peek(key: ChunkKey): Uint8Array | null {
    const e = this.index.touch(key);
    return e ? e.buf.subarray(0, e.length) : null;
  }

  async put(key: ChunkKey, chunk: Uint8Array, opts: PutOptions = {}): Promise<ChunkKey[]> {
    return this.putSync(key, chunk, opts);
  }

  /**
   * Stores a copy of `chunk` under `key` and returns the keys evicted to make room.
   * The chunk's header must carry `key` (ChunkFormatError otherwise: a chunk filed under another
   * prefix's key would be served for the wrong prompt). With `evictFirst` the chunk is admitted
   * at the cold end (LruIndex): the next victim until a read uses it; a chunk already held keeps
   * its place then.
   */
  putSync(key: ChunkKey, chunk: Uint8Array, opts: PutOptions = {}): ChunkKey[] {
    checkChunkFor(chunk, key);
    if (this.index.readmit(key, opts)) return []; // same key ⇒ same prefix ⇒ same bytes
    const cls = sizeClass(chunk.byteLength);
    if (cls > this.capacityBytes) {
      throw new StoreFullError(`chunk ${key} (${chunk.byteLength} bytes) is larger than LocalCPUBackend capacity (${this.capacityBytes} bytes)`);
    }
    const room = this.capacityBytes - this.reservedBytes;
    const victims = this.index.victims(cls, room, opts);
    if (victims === null && this.index.declines(cls, room, opts)) {
      throw new CopyDeclinedError('LocalCPUBackend', key, opts);
    }
    if (victims === null) {
      throw new StoreFullError(
        `LocalCPUBackend is full: ${this.index.bytes} of ${this.capacityBytes} bytes used${this.reservedBytes ? ` (${this.reservedBytes} more reserved for chunks arriving)` : ''} and ${this.index.pinnedCount} pinned chunk(s) cannot be evicted to store chunk ${key}`,
      );
    }
    for (const v of victims) this.pool.release(this.index.delete(v)!.buf);
    const buf = this.pool.acquire(cls);
    // Unreachable by construction (the index counts exactly the pool's live bytes); the victims are
    // already gone, so the error carries them for the store to report.
    if (!buf) throw new StoreFullError(`LocalCPUBackend could not allocate ${cls} bytes within its budget`, victims);
    buf.set(chunk, 0);
    this.index.add(key, { buf, length: chunk.byteLength, bytes: cls, pinned: false }, opts);
    return victims;
  }

  /**
   * Room for a chunk of `bytes` that is about to arrive over the network (a move or copy into this
   * tier, src/kvc/peer_receive.ts): unpinned chunks are evicted now as a put would evict them, and
   * the pooled buffer the chunk will occupy is handed out, so the socket reads its bytes straight
   * into their final place (no receive buffer, no copy at commit). Until commitReserved() the chunk
   * is invisible (not indexed, never served) and its room cannot be taken (counted against the
   * capacity); abortReserved() gives the room back. Throws StoreFullError when the room cannot be
   * made (every other chunk pinned or reserved).
   */
  reserve(bytes: number): { slot: Uint8Array; victims: ChunkKey[] } {
    const cls = sizeClass(bytes);
    const room = this.capacityBytes - this.reservedBytes;
    if (cls > room) {
      throw new StoreFullError(`LocalCPUBackend has no room for an incoming chunk of ${bytes} bytes: ${this.reservedBytes} of ${this.capacityBytes} bytes are reserved for chunks arriving`);
    }
    const victims = this.index.victims(cls, room);
    if (victims === null) {
      throw new StoreFullError(
        `LocalCPUBackend is full: ${this.index.bytes} of ${this.capacityBytes} bytes used, ${this.reservedBytes} reserved for chunks arriving, and ${this.index.pinnedCount} pinned chunk(s) cannot be evicted to receive a chunk of ${bytes} bytes`,
      );
    }
    for (const v of victims) this.pool.release(this.index.delete(v)!.buf);
    const slot = this.pool.acquire(cls);
    if (!slot) throw new StoreFullError(`LocalCPUBackend could not allocate ${cls} bytes within its budget`, victims);
    this.reservedBytes += cls;
    return { slot, victims };
  }

  /**
   * Makes a reserved chunk, now complete and verified by the caller, part of the tier under `key`
   * (its first `length` bytes). Returns false when the tier already held `key` meanwhile (same key,
   * same bytes): the reservation is given back and the held chunk stays.
   */
  commitReserved(key: ChunkKey, slot: Uint8Array, length: number): boolean {
    try {
      checkChunkFor(slot.subarray(0, length), key);
    } catch (e) {
      this.abortReserved(slot);
      throw e;
    }
    this.reservedBytes -= slot.byteLength;
    if (this.index.readmit(key)) {
      this.pool.release(slot);
      return false;
    }
    this.index.add(key, { buf: slot, length, bytes: slot.byteLength, pinned: false });
    return true;
  }

  /** Gives back a reservation that will not be committed (the transfer failed or was refused). */
  abortReserved(slot: Uint8Array): void {
    this.reservedBytes -= slot.byteLength;
    this.pool.release(slot);
  }

  /** Bytes reserved for chunks still arriving (for tests and metrics). */
  get reserved(): number {
    return this.reservedBytes;
  }

  async replace(key: ChunkKey, chunk: Uint8Array): Promise<ChunkKey[] | null> {
    return this.replaceSync(key, chunk);
  }

  /** StorageBackend.replace, synchronously (so atomic with respect to every other operation). */
  replaceSync(key: ChunkKey, chunk: Uint8Array): ChunkKey[] | null {
    checkChunkFor(chunk, key);
    const e = this.index.get(key);
    if (!e) return null;
    const cls = sizeClass(chunk.byteLength);
    let victims: ChunkKey[] = [];
    if (cls > e.bytes) {
      const v = this.index.victims(cls - e.bytes, this.capacityBytes, { keep: new Set([key]) });
      if (v === null) throw new StoreFullError(`LocalCPUBackend is full: no room to grow chunk ${key} from ${e.length} to ${chunk.byteLength} bytes without evicting pinned chunks`);
      for (const x of v) this.pool.release(this.index.delete(x)!.buf);
      victims = v;
    }
    if (cls !== e.bytes) {
      this.pool.release(e.buf);
      const buf = this.pool.acquire(cls);
      // Unreachable by construction: the old buffer and the victims free at least `cls` bytes.
      if (!buf) throw new StoreFullError(`LocalCPUBackend could not allocate ${cls} bytes within its budget`, victims);
      e.buf = buf;
      this.index.resize(key, cls);
    }
    e.buf.set(chunk, 0);
    e.length = chunk.byteLength;
    return victims;
  }

  async get(key: ChunkKey, dest?: Uint8Array): Promise<Uint8Array | null> {
    return this.getSync(key, dest);
  }

  getSync(key: ChunkKey, dest?: Uint8Array): Uint8Array | null {
    const e = this.index.touch(key);
    if (!e) return null;
    const out = dest ?? new Uint8Array(Buffer.allocUnsafeSlow(e.length).buffer, 0, e.length);
    if (out.byteLength < e.length) throw new RangeError(`destination of ${out.byteLength} bytes is too small for chunk ${key} (${e.length} bytes)`);
    out.set(e.buf.subarray(0, e.length), 0);
    return out.subarray(0, e.length);
  }

  pin(key: ChunkKey): boolean {
    return this.index.pin(key);
  }

  touchPrefix(keys: readonly ChunkKey[]): void {
    this.index.touchHeadLast(keys);
  }

  markReplica(key: ChunkKey, elsewhere: boolean): boolean {
    return this.index.setReplica(key, elsewhere);
  }

  clearReplicaMarks(): void {
    this.index.clearReplicas();
  }

  /** Chunks admitted evict-first and not read since (for metrics and tests). */
  coldChunks(): number {
    return this.index.coldCount;
  }

  /** Chunks the controller said another instance holds too, not read here since (for metrics and tests). */
  replicaChunks(): number {
    return this.index.replicaCount;
  }

  /** True when `key` was admitted evict-first and has not been read since. */
  isCold(key: ChunkKey): boolean {
    return this.index.isCold(key);
  }

  unpin(key: ChunkKey): boolean {
    return this.index.unpin(key);
  }

  isPinned(key: ChunkKey): boolean {
    return this.index.get(key)?.pinned ?? false;
  }

  async remove(key: ChunkKey): Promise<boolean> {
    const e = this.index.delete(key);
    if (e) this.pool.release(e.buf);
    return !!e;
  }

  async clear(keepPinned = false): Promise<ChunkKey[]> {
    const keys = keepPinned ? this.index.keys().filter((k) => !this.index.get(k)!.pinned) : this.index.keys();
    for (const k of keys) this.pool.release(this.index.delete(k)!.buf);
    this.pool.trim();
    return keys;
  }

  keys(): ChunkKey[] {
    return this.index.keys();
  }

  stats(): BackendStats {
    return this.index.stats(this.location, this.capacityBytes);
  }

  /** Room for chunks this instance would keep (LruIndex.room). */
  room(): { freeBytes: number; tailAgeMs: number | null } {
    return this.index.room(this.capacityBytes);
  }

  /** Memory the pool holds, including idle recycled buffers (for metrics). */
  heldBytes(): number {
    return this.pool.heldBytes;
  }

  /** Buffers the pool has obtained from the allocator so far; recycling a freed buffer does not add one. */
  poolAllocations(): number {
    return this.pool.allocations;
  }

  async close(): Promise<void> {
    await this.clear();
  }
}
