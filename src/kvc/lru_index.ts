// Recency-ordered index shared by the storage backends: a Map keeps insertion order,
// so "touch" is delete + set and the least recently used entry is the first one.
// Pinned entries stay in the map but are skipped when choosing victims.
//
// Two segments: `cold` holds entries admitted evict-first (add with {evictFirst}: a copy of a
// chunk a peer also holds, a prompt's partial last chunk), in admission order; `main` the rest.
// Victims come from `cold` first. A read of a cold entry (touch) moves it to the most recent end
// of `main`: a copy earns its place by being used from this cache, and until then never pushes
// out a chunk that was.
//
// A third segment, `replicas`, holds the chunks the controller says another instance holds too
// (setReplica; src/controller/replica_hints.ts): victims after `cold` and before `main`, and
// NEWEST first. Why newest first: the other copy is typically the first one, on an instance that
// evicts by recency, so it goes oldest first there; keeping the oldest duplicates here makes the
// two tiers hold different chunks (together, the most distinct prefixes) instead of both dropping
// the same oldest prefix. A hint's keys come in prompt order, so a prefix's tail is the newest
// and leaves first, as in `main`. A read here (touch) moves a replica to `main` (used here, so
// kept by recency); the controller's last-copy hint does the same for a cold entry or a replica.
import type { ChunkKey } from '../common/keys.js';
import type { BackendStats, LocationName } from './types.js';
import { NewestFirst } from './newest_first.js';

export interface Entry {
  bytes: number;
  pinned: boolean;
}

export class LruIndex<E extends Entry> {
  private readonly map = new Map<ChunkKey, E>();
  /** Entries admitted evict-first and not read since (victims before anything in `map`). */
  private readonly cold = new Map<ChunkKey, E>();
  /** Entries another instance holds too (controller hint): victims after `cold`, newest first. */
  private readonly replicas = new NewestFirst<ChunkKey, E>();
  private _bytes = 0;
  private _pinned = 0;

  get size(): number {
    return this.map.size + this.cold.size + this.replicas.size;
  }
  /** Entries the controller said another instance holds too, not read here since. */
  get replicaCount(): number {
    return this.replicas.size;
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
    return this.map.get(key) ?? this.cold.get(key) ?? this.replicas.get(key);
  }

  /** Removes `key` from whichever segment holds it (no accounting). */
  private unlink(key: ChunkKey): void {
    if (!this.map.delete(key) && !this.cold.delete(key)) this.replicas.delete(key);
  }

  /** Looks up and marks as most recently used (a cold entry or a replica joins the main segment). */
  touch(key: ChunkKey): E | undefined {
    const e = this.get(key);
    if (e) {
      this.unlink(key);
      this.map.set(key, e);
    }
    return e;
  }

  /**
   * The controller's replica hint (see the top): `elsewhere` true makes `key` the newest replica;
   * false (this instance holds the last copy) moves a cold entry or a replica to the recent end of
   * `main` and leaves one already in `main` where it is. False when `key` is not indexed (the hint
   * is then moot).
   */
  setReplica(key: ChunkKey, elsewhere: boolean): boolean {
    const e = this.get(key);
    if (!e) return false;
    if (elsewhere) {
      this.unlink(key);
      this.replicas.set(key, e);
    } else if (!this.map.has(key)) {
      this.unlink(key);
      this.map.set(key, e);
    }
    return true;
  }

  /** Moves every replica to the recent end of `main`, oldest first (the advice behind them is gone). */
  clearReplicas(): void {
    const all = [...this.replicas.entries()].reverse();
    for (const [k, e] of all) {
      this.replicas.delete(k);
      this.map.set(k, e);
    }
  }

  /**
   * Marks a prefix's chunks used, its FIRST chunk last: the head ends most recently used, so
   * eviction takes a prefix from its tail. A prefix is only usable from its start (a lookup stops
   * at the first missing chunk), so losing the head to plain per-chunk LRU (the head is stored
   * and read first, hence oldest) would make every later chunk of it dead weight.
   */
  touchHeadLast(keys: readonly ChunkKey[]): void {
    // Cold entries stay cold (ordering a prompt is not a read of the copies it received), but
    // are ordered head-last among the cold ones too: a cold copy also goes tail first. Replicas
    // stay where the hint put them (their order is already tail first).
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
    this.unlink(key);
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
    for (const seg of [this.cold.entries(), this.replicas.entries(), this.map.entries()]) {
      for (const [k, e] of seg) {
        if (e.pinned) continue;
        out.push(k);
        excess -= e.bytes;
        if (excess <= 0) return out;
      }
    }
    return null;
  }

  /** Every unpinned key, first evicted first (cold ones, replicas newest first, then least recently used). */
  unpinnedKeys(): ChunkKey[] {
    const out: ChunkKey[] = [];
    for (const [k, e] of this.entries()) if (!e.pinned) out.push(k);
    return out;
  }

  /** Every key, first evicted first. */
  keys(): ChunkKey[] {
    return [...this.cold.keys(), ...this.replicas.keys(), ...this.map.keys()];
  }

  /** Every entry, first evicted first. */
  *entries(): IterableIterator<[ChunkKey, E]> {
    yield* this.cold.entries();
    yield* this.replicas.entries();
    yield* this.map.entries();
  }

  /** The backend-level figures every location reports. */
  stats(location: LocationName, capacityBytes: number): BackendStats {
    return { location, capacityBytes, usedBytes: this._bytes, chunks: this.size, pinned: this._pinned };
  }
}
