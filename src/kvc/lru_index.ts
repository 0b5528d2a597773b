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
// free or held by cold entries, stale entries of `main` and replicas (victims(..., {evictFirst})).
// A copy of what a peer keeps, or a partial chunk, does not displace a chunk of `main` that is
// still in use; when those cannot make room, the copy is declined (CopyDeclinedError) and the tier
// keeps what it has.
//
// "Still in use" ages with the copies that arrive: a chunk of `main` not used (stored, read, made
// the deployment's copy) while STALE_AFTER_TURNOVERS times as many evict-first chunks arrived as
// the tier holds chunks is stale. Stale entries go after cold ones and before replicas (a replica
// duplicates something another instance keeps; a stale chunk is what nobody asked for over that
// much traffic), oldest first. Without that, a tier that rarely computes (a decoder) kept the
// chunks it held as the deployment's last copy of an earlier workload for good: only a chunk it
// computes may displace them, and the copies of the current workload turned over in whatever
// room was left (docs/routing.md, "Benchmark figures", "Tiers already full").
import type { ChunkKey } from '../common/keys.js';
import type { BackendStats, LocationName, PutOptions } from './types.js';
import { NewestFirst } from './newest_first.js';

/**
 * How many tiers' worth of arriving evict-first chunks (counted in chunks the tier holds) make an
 * unused chunk of `main` stale (see the top). On the routing benchmark a decoder keeps the
 * deployment's last copy of a tenant's prefix, read every ~10 s while ~16 chunks of copies arrive
 * in a tier of ~15: four tiers' worth leaves such a chunk a wide margin.
 */
export const STALE_AFTER_TURNOVERS = 4;

/** How a chunk is admitted: src/kvc/types.ts PutOptions. */
export type AdmitOptions = Pick<PutOptions, 'evictFirst' | 'keep'>;

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
  /**
   * Entries admitted evict-first (copies of what a peer keeps) and not made ordinary here since
   * (cold ones, and those the controller then marked replicas): a chunk the same prompt keeps may
   * take their room (victims()).
   */
  private readonly copies = new Set<ChunkKey>();
  /** Evict-first chunks that arrived so far, admitted or declined (the clock that ages `main`). */
  private copyArrivals = 0;
  /** Per entry of `main`: copyArrivals when it last entered or was used there (ascending in `map` order). */
  private readonly usedAt = new Map<ChunkKey, number>();
  /** Per entry of `main`: the clock (ms) when it last entered or was used there (ascending in `map` order). */
  private readonly usedMs = new Map<ChunkKey, number>();
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
    this.copies.delete(key);
    if (this.map.delete(key)) {
      this.usedAt.delete(key);
      this.usedMs.delete(key);
    }
    else if (!this.cold.delete(key)) this.replicas.delete(key);
  }

  /** Puts `key` at the recent end of `main` (after unlink), stamped with the arrival clock. */
  private toMain(key: ChunkKey, e: E): void {
    this.copies.delete(key);
    this.map.set(key, e);
    this.usedAt.set(key, this.copyArrivals);
    this.usedMs.set(key, this.now());
  }

  constructor(
    /** The clock `room()` measures ages with (ms); tests pass their own. */
    private readonly now: () => number = () => performance.now(),
  ) {}

  /**
   * How much this tier could take without losing a chunk of `main` still in use, and how long
   * ago the chunk an ordinary put would evict next from `main` was last used (docs/storage.md
   * "Who keeps a transferred chunk"): `freeBytes` counts free room and the room cold, stale and
   * replica entries hold (an ordinary put evicts those first); `tailAgeMs` is null when no chunk
   * of `main` is in use. Pinned entries are not room.
   */
  room(capacity: number): { freeBytes: number; tailAgeMs: number | null } {
    let inUse = 0;
    let pinnedElsewhere = 0;
    let oldest: number | null = null;
    for (const [k, e, used] of this.evictionOrder()) {
      if (used) {
        inUse += e.bytes;
        if (oldest === null && !e.pinned) oldest = this.usedMs.get(k)!;
      } else if (e.pinned) pinnedElsewhere += e.bytes;
    }
    return { freeBytes: Math.max(0, capacity - inUse - pinnedElsewhere), tailAgeMs: oldest === null ? null : Math.max(0, this.now() - oldest) };
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
      this.toMain(key, e);
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
      const copy = this.copies.has(key);
      this.unlink(key);
      this.replicas.set(key, e);
      if (copy) this.copies.add(key);
    } else if (!this.map.has(key)) {
      this.unlink(key);
      this.toMain(key, e);
    }
    return true;
  }

  /** Moves every replica to the recent end of `main`, oldest first (the advice behind them is gone). */
  clearReplicas(): void {
    const all = [...this.replicas.entries()].reverse();
    for (const [k, e] of all) {
      this.replicas.delete(k);
      this.toMain(k, e);
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
    if (opts.evictFirst) {
      this.cold.set(key, e);
      this.copies.add(key);
      this.copyArrivals++;
    } else this.toMain(key, e);
    this._bytes += e.bytes;
    if (e.pinned) this._pinned++;
  }

  /** Changes the bytes an indexed chunk takes (it was re-encoded in place), keeping its place and pin. */
  resize(key: ChunkKey, bytes: number): void {
    const e = this.get(key);
    if (!e) return;
    this._bytes += bytes - e.bytes;
    e.bytes = bytes;
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

  /** True while `main`'s entry `key` is stale (see the top). */
  private stale(key: ChunkKey): boolean {
    return this.usedAt.get(key)! <= this.copyArrivals - STALE_AFTER_TURNOVERS * this.size;
  }

  /**
   * Chooses unpinned victims (cold, then stale entries of `main` oldest first, then replicas
   * newest first, then the rest of `main` least recently used first) whose removal brings
   * bytes + need within capacity. Returns null when that is impossible: the rest is pinned, or,
   * for an evict-first admission (`opts.evictFirst`), cold, stale and replica entries are not
   * enough (such a chunk does not displace one of `main` still in use; see the top).
   */
  victims(need: number, capacity: number, opts: AdmitOptions = {}): ChunkKey[] | null {
    let excess = this._bytes + need - capacity;
    if (excess <= 0) return [];
    const out: ChunkKey[] = [];
    for (const [k, e, inUse] of this.evictionOrder()) {
      if (inUse && opts.evictFirst) return null;
      // `keep` (the prompt's own chunks) protects them from the prompt's other puts, except that a
      // chunk this instance keeps (an ordinary put) may take the room of the prompt's copies
      // (admitted evict-first: fetched or received, cold or since marked replicas): a peer keeps
      // those, so the deployment still has them, while a chunk computed here that found no room
      // would be stored nowhere.
      if (e.pinned || (opts.keep?.has(k) && (opts.evictFirst || !this.copies.has(k)))) continue;
      out.push(k);
      excess -= e.bytes;
      if (excess <= 0) return out;
    }
    return null;
  }

  /**
   * Every entry, first evicted first: cold, then the stale entries of `main` (its oldest: stamps
   * ascend along `map`, so the first one still in use ends them), then replicas newest first, then
   * the rest of `main`, which alone is flagged in use. The one definition of the eviction order.
   */
  private *evictionOrder(): IterableIterator<[ChunkKey, E, boolean]> {
    for (const [k, e] of this.cold) yield [k, e, false];
    let stale = 0;
    for (const [k, e] of this.map) {
      if (!this.stale(k)) break;
      stale++;
      yield [k, e, false];
    }
    for (const [k, e] of this.replicas.entries()) yield [k, e, false];
    let i = 0;
    for (const [k, e] of this.map) if (i++ >= stale) yield [k, e, true];
  }

  /**
   * True when victims(need, capacity, opts) found no room only because of how the chunk is
   * admitted (evict-first, or the chunks it must keep): an unrestricted put would find it (so the
   * chunk is declined, CopyDeclinedError), rather than everything being pinned. A declined
   * evict-first copy still counts as arrived (the clock that ages `main`).
   */
  declines(need: number, capacity: number, opts: AdmitOptions): boolean {
    const restricted = !!opts.evictFirst || (opts.keep?.size ?? 0) > 0;
    const declined = restricted && this.victims(need, capacity) !== null;
    if (declined && opts.evictFirst) this.copyArrivals++;
    return declined;
  }

  /** Every unpinned key, first evicted first (cold ones, stale ones, replicas newest first, then least recently used). */
  unpinnedKeys(): ChunkKey[] {
    const out: ChunkKey[] = [];
    for (const [k, e] of this.entries()) if (!e.pinned) out.push(k);
    return out;
  }

  /** Every key, first evicted first. */
  keys(): ChunkKey[] {
    return [...this.entries()].map(([k]) => k);
  }

  /** Every entry, first evicted first (cold, stale, replicas, the rest of `main`). */
  *entries(): IterableIterator<[ChunkKey, E]> {
    for (const [k, e] of this.evictionOrder()) yield [k, e];
  }

  /** The backend-level figures every location reports. */
  stats(location: LocationName, capacityBytes: number): BackendStats {
    return { location, capacityBytes, usedBytes: this._bytes, chunks: this.size, pinned: this._pinned, cold: this.cold.size, replicas: this.replicas.size };
  }
}
