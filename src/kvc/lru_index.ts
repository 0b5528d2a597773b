// Recency-ordered index shared by the storage backends: a Map keeps insertion order,
// so "touch" is delete + set and the least recently used entry is the first one.
// Pinned entries stay in the map but are skipped when choosing victims.
import type { ChunkKey } from '../common/keys.js';
import type { BackendStats, LocationName } from './types.js';

export interface Entry {
  bytes: number;
  pinned: boolean;
}

export class LruIndex<E extends Entry> {
  private readonly map = new Map<ChunkKey, E>();
  private _bytes = 0;
  private _pinned = 0;

  get size(): number {
    return this.map.size;
  }
  get bytes(): number {
    return this._bytes;
  }
  get pinnedCount(): number {
    return this._pinned;
  }

  get(key: ChunkKey): E | undefined {
    return this.map.get(key);
  }

  /** Looks up and marks as most recently used. */
  touch(key: ChunkKey): E | undefined {
    const e = this.map.get(key);
    if (e) {
      this.map.delete(key);
      this.map.set(key, e);
    }
    return e;
  }

  /**
   * Marks a prefix's chunks used, its FIRST chunk last: the head ends most recently used, so
   * eviction takes a prefix from its tail. A prefix is only usable from its start (a lookup stops
   * at the first missing chunk), so losing the head to plain per-chunk LRU (the head is stored
   * and read first, hence oldest) would make every later chunk of it dead weight.
   */
  touchHeadLast(keys: readonly ChunkKey[]): void {
    for (let i = keys.length - 1; i >= 0; i--) this.touch(keys[i]!);
  }

  add(key: ChunkKey, e: E): void {
    const old = this.map.get(key);
    if (old) this.delete(key);
    this.map.set(key, e);
    this._bytes += e.bytes;
    if (e.pinned) this._pinned++;
  }

  delete(key: ChunkKey): E | undefined {
    const e = this.map.get(key);
    if (!e) return undefined;
    this.map.delete(key);
    this._bytes -= e.bytes;
    if (e.pinned) this._pinned--;
    return e;
  }

  /** Marks `key` pinned; false when it is not indexed. */
  pin(key: ChunkKey): boolean {
    const e = this.map.get(key);
    if (!e) return false;
    if (!e.pinned) this._pinned++;
    e.pinned = true;
    return true;
  }

  /** Marks `key` unpinned; false when it is not indexed. */
  unpin(key: ChunkKey): boolean {
    const e = this.map.get(key);
    if (!e) return false;
    if (e.pinned) this._pinned--;
    e.pinned = false;
    return true;
  }

  /**
   * Chooses least-recently-used unpinned victims whose removal brings bytes + need
   * within capacity. Returns null when that is impossible (the rest is pinned).
   */
  victims(need: number, capacity: number): ChunkKey[] | null {
    let excess = this._bytes + need - capacity;
    if (excess <= 0) return [];
    const out: ChunkKey[] = [];
    for (const [k, e] of this.map) {
      if (e.pinned) continue;
      out.push(k);
      excess -= e.bytes;
      if (excess <= 0) return out;
    }
    return null;
  }

  /** Every unpinned key, least recently used first. */
  unpinnedKeys(): ChunkKey[] {
    const out: ChunkKey[] = [];
    for (const [k, e] of this.map) if (!e.pinned) out.push(k);
    return out;
  }

  keys(): ChunkKey[] {
    return [...this.map.keys()];
  }

  entries(): IterableIterator<[ChunkKey, E]> {
    return this.map.entries();
  }

  /** The backend-level figures every location reports. */
  stats(location: LocationName, capacityBytes: number): BackendStats {
    return { location, capacityBytes, usedBytes: this._bytes, chunks: this.map.size, pinned: this._pinned };
  }
}
