// Recency-ordered index shared by the storage backends: a Map keeps insertion order,
// so "touch" is delete + set and the least recently used entry is the first one.
// Pinned entries stay in the map but are skipped when choosing victims.
//
// Two segments: `cold` holds entries admitted evict-first (add with {evictFirst}: a copy of a
// chunk a peer also holds, a prompt's partial last chunk), in admission order; `main` the rest.
// Victims come from `cold` first. A read of a cold entry (touch) moves it to the most recent end
// of `main`: a copy earns its place by being used from this cache.
//
// A third segment, `replicas`, holds the chunks the controller says another instance holds too
// and keeps first (setReplica; src/controller/replica_hints.ts): victims after `cold` and before
// `main`, NEWEST first. Why newest first: the other copy is typically the first one, on an
// instance that evicts by recency, so it goes oldest first there; keeping the oldest duplicates
// here makes the two tiers hold different chunks (together, the most distinct prefixes) instead
// of both dropping the same oldest prefix. A hint's keys come in prompt order, so a prefix's tail
// is the newest and leaves first. A read here (touch) keeps a replica a replica but moves it to
// the OLDEST end of the segment (the last duplicate to go): the copy this instance serves from is
// kept longest among its duplicates, yet never outlives a chunk of `main`, where the deployment's
// first and last copies are. Only the controller's hint (the first copy left) makes a replica
// ordinary again, as it does a cold entry.
//
// The one admission rule that makes this hold: an evict-first admission takes only room that is
// free or held by cold entries and replicas (victims(..., {evictFirst})). A copy of what a peer
// keeps, or a partial chunk, never displaces a chunk of `main`; when the two evict-first segments
// cannot make room, the copy is declined (CopyDeclinedError) and the tier keeps what it has.
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

  /**
   * Looks up and marks as used: a cold entry joins `main` at its recent end, an entry of `main`
   * moves there, a replica moves to the oldest end of the replicas (see the top).
   */
  touch(key: ChunkKey): E | undefined {
    const r = this.replicas.get(key);
    if (r) {
      this.replicas.setOldest(key, r);
      return r;
    }
    const e = this.map.get(key) ?? this.cold.get(key);
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
    // this prompt used stay replicas, moved to the oldest end head last (the head is then the
    // last of them to go).
    for (let i = keys.length - 1; i >= 0; i--) {
      const k = keys[i]!;
      const c = this.cold.get(k);
      if (c) {
        this.cold.delete(k);
        this.cold.set(k, c);
      } else if (this.map.has(k) || this.replicas.has(k)) this.touch(k);
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
   * Chooses unpinned victims (cold, then replicas newest first, then least recently used) whose
   * removal brings bytes + need within capacity. Returns null when that is impossible: the rest
   * is pinned, or, for an evict-first admission (`opts.evictFirst`), the cold entries and
   * replicas are not enough (such a chunk never displaces one of `main`; see the top).
   */
  victims(need: number, capacity: number, opts: { evictFirst?: boolean } = {}): ChunkKey[] | null {
    let excess = this._bytes + need - capacity;
    if (excess <= 0) return [];
    const out: ChunkKey[] = [];
    const segments = [this.cold.entries(), this.replicas.entries()];
    if (!opts.evictFirst) segments.push(this.map.entries());
    for (const seg of segments) {
      for (const [k, e] of seg) {
        if (e.pinned) continue;
        out.push(k);
        excess -= e.bytes;
        if (excess <= 0) return out;
      }
    }
    return null;
  }

  /**
   * True when victims(need, capacity, opts) found no room only because the chunk is evict-first:
   * an ordinary put would find it (so the chunk is declined, CopyDeclinedError), rather than
   * everything being pinned.
   */
  declines(need: number, capacity: number, opts: { evictFirst?: boolean }): boolean {
    return !!opts.evictFirst && this.victims(need, capacity) !== null;
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
    return { location, capacityBytes, usedBytes: this._bytes, chunks: this.size, pinned: this._pinned, cold: this.cold.size, replicas: this.replicas.size };
  }
}
