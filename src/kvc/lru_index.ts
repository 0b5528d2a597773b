// Recency-ordered index shared by the storage backends: a Map keeps insertion order,
// so "touch" is delete + set and the least recently used entry is the first one.
// Pinned entries stay in the map but are skipped when choosing victims.
//
// Two segments: `cold` holds entries admitted evict-first (add with {evictFirst}: a copy of a
// chunk a peer also holds, a prompt's partial last chunk), in admission order; `main` the rest.
// Victims come from `cold` first. A read of a cold entry (touch) moves it to the most recent end
// of `main`: a copy earns its place by being used from this cache, and until then never pushes
// out a chunk that was.
import type { ChunkKey } from '../common/keys.js';
import type { BackendStats, LocationName } from './types.js';

export interface Entry {
  bytes: number;
  pinned: boolean;
}

export class LruIndex<E extends Entry> {
  private readonly map = new Map<ChunkKey, E>();
  /** Entries admitted evict-first and not read since (victims before anything in `map`). */
  private readonly cold = new Map<ChunkKey, E>();
  private _bytes = 0;
  private _pinned = 0;

  get size(): number {
    return this.map.size + this.cold.size;
  }
  /** Entries admitted evict-first and not read since. */
  get coldCount(): number {
    return this.cold.size;
  }
  /** True when `key` was admitted evict-first and has not been read since. */
  isCold(key: ChunkKey): boolean {
    return this.cold.has(key);
  }
  get bytes(): number {
    return this._bytes;
  }
  get pinnedCount(): number {
    return this._pinned;
  }

  get(key: ChunkKey): E | undefined {
    return this.map.get(key) ?? this.cold.get(key);
  }

  /** Looks up and marks as most recently used (a cold entry joins the main segment). */
  touch(key: ChunkKey): E | undefined {
    const e = this.map.get(key) ?? this.cold.get(key);
    if (e) {
      this.map.delete(key);
      this.cold.delete(key);
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
    // Cold entries stay cold (ordering a prompt is not a read of the copies it received), but
    // are ordered head-last among the cold ones too: a cold copy also goes tail first.
    for (let i = keys.length - 1; i >= 0; i--) {
      const k = keys[i]!;
      const c = this.cold.get(k);
      if (c) {
        this.cold.delete(k);
        this.cold.set(k, c);
      } else if (this.map.has(k)) this.touch(k);
    }
  }

  /**
   * For a put of `key`: true when it is indexed already (same key, same bytes: nothing to store).
   * A plain put then marks it used; an evict-first one leaves it where it is (a copy of what a
   * peer holds is not a use of this one).
   */
  readmit(key: ChunkKey, opts: { evictFirst?: boolean } = {}): boolean {
    return (opts.evictFirst ? this.get(key) : this.touch(key)) !== undefined;
  }

  /** Indexes `key` as most recently used, or, with evictFirst, at the cold end (see the top). */
  add(key: ChunkKey, e: E, opts: { evictFirst?: boolean } = {}): void {
    if (this.get(key)) this.delete(key);
    (opts.evictFirst ? this.cold : this.map).set(key, e);
    this._bytes += e.bytes;
    if (e.pinned) this._pinned++;
  }

  delete(key: ChunkKey): E | undefined {
    const e = this.get(key);
    if (!e) return undefined;
    this.map.delete(key);
    this.cold.delete(key);
    this._bytes -= e.bytes;
    if (e.pinned) this._pinned--;
    return e;
  }

  /** Marks `key` pinned; false when it is not indexed. */
  pin(key: ChunkKey): boolean {
    const e = this.get(key);
    if (!e) return false;
    if (!e.pinned) this._pinned++;
    e.pinned = true;
    return true;
  }

  /** Marks `key` unpinned; false when it is not indexed. */
  unpin(key: ChunkKey): boolean {
    const e = this.get(key);
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
    for (const seg of [this.cold, this.map]) {
      for (const [k, e] of seg) {
        if (e.pinned) continue;
        out.push(k);
        excess -= e.bytes;
        if (excess <= 0) return out;
      }
    }
    return null;
  }

  /** Every unpinned key, first evicted first (cold ones, then least recently used). */
  unpinnedKeys(): ChunkKey[] {
    const out: ChunkKey[] = [];
    for (const seg of [this.cold, this.map]) for (const [k, e] of seg) if (!e.pinned) out.push(k);
    return out;
  }

  /** Every key, first evicted first. */
  keys(): ChunkKey[] {
    return [...this.cold.keys(), ...this.map.keys()];
  }

  *entries(): IterableIterator<[ChunkKey, E]> {
    yield* this.cold.entries();
    yield* this.map.entries();
  }

  /** The backend-level figures every location reports. */
  stats(location: LocationName, capacityBytes: number): BackendStats {
    return { location, capacityBytes, usedBytes: this._bytes, chunks: this.size, pinned: this._pinned };
  }
}
