// The storage contract of a cache instance. A chunk is always the single buffer defined in
// src/common/chunk.ts (64-byte header + payload); backends store it byte for byte.
import type { ChunkKey } from '../common/keys.js';

export { LOCATIONS, isLocationName, type LocationName } from '../protocol/worker_api.js';
import type { LocationName } from '../protocol/worker_api.js';

export interface PinOptions {
  /** Pinned now, but not across a restart (a pin marker already on disk is removed). */
  transient?: boolean;
}

/** How a chunk is admitted (locations without recency order ignore it). */
export interface PutOptions {
  /**
   * Admit at the cold end of the eviction order: the chunk is the next victim until a read uses
   * it (then it is recent like any other), and it only takes room that is free or held by other
   * evict-first chunks and replicas (CopyDeclinedError otherwise). For chunks that are cheap to
   * get again or rarely reused: a copy of what a peer holds, a prompt's partial last chunk
   * (docs/storage.md).
   */
  evictFirst?: boolean;
  /**
   * Chunks this admission must not evict: the other chunks of the prompt being stored. Prefix
   * lookups stop at the first missing chunk, so evicting a prompt's head to make room for its tail
   * leaves a run no request can reach; when only such chunks (or pinned ones) could make room, the
   * chunk is declined instead (CopyDeclinedError), and the prompt's head stays whole.
   */
  keep?: ReadonlySet<ChunkKey>;
}

/** Thrown when a put cannot make room because everything that remains is pinned (or the chunk exceeds capacity). */
export class StoreFullError extends Error {
  override name = 'StoreFullError';
  constructor(
    message: string,
    /** Chunks that had already left the location when the put failed (normally none); the store reports them. */
    readonly evicted: ChunkKey[] = [],
  ) {
    super(message);
  }
}

/**
 * Thrown when an evict-first chunk (PutOptions.evictFirst) finds no room that is free or held by
 * other evict-first chunks and replicas: it is declined rather than displace a chunk this instance
 * computed, reused or keeps as the deployment's copy (src/kvc/lru_index.ts). Also when the only
 * room is held by the chunks the put must keep (PutOptions.keep: its own prompt's head). Not a
 * failure: the caller still has the chunk for the request at hand.
 */
export class CopyDeclinedError extends StoreFullError {
  override name = 'CopyDeclinedError';

  constructor(location: LocationName, key: ChunkKey, opts: PutOptions) {
    const what = opts.evictFirst ? 'evict-first chunk' : 'chunk';
    super(
      `${location} declined ${what} ${key}: the room it needs is held by chunks it may not displace ` +
        `(computed, reused or kept as the deployment's copy${opts.keep?.size ? ', or the earlier chunks of the same prompt' : ''})`,
    );
  }
}

/** Admission/eviction notices, batched per call; the controller client forwards them. */
export interface KeyEvent {
  location: LocationName;
  keys: ChunkKey[];
}

export interface BackendStats {
  location: LocationName;
  capacityBytes: number;
  usedBytes: number;
  chunks: number;
  pinned: number;
  /** Of `chunks`: admitted evict-first and not read since (the cold segment of the eviction order). */
  cold: number;
  /** Of `chunks`: copies the controller says another instance keeps first (the replica segment). */
  replicas: number;
}

/** One storage location. All methods are safe to call concurrently. */
export interface StorageBackend {
  readonly location: LocationName;
  readonly capacityBytes: number;
  has(key: ChunkKey): boolean;
  /** Number of bytes of the stored chunk (header included), or -1. */
  sizeOf(key: ChunkKey): number;
  /**
   * Stores a copy of `chunk`, whose header must carry `key` (ChunkFormatError otherwise), evicting
   * least-recently-used unpinned chunks as needed. Resolves once the chunk is stored in this
   * location: in memory for LocalCPUBackend; for LocalDiskBackend written, fsynced and renamed into
   * place, so it survives a restart. Returns the keys evicted to make room.
   * Throws StoreFullError when room cannot be made without evicting pinned chunks. A put that
   * throws has evicted nothing, except the keys listed in `StoreFullError.evicted`.
   */
  put(key: ChunkKey, chunk: Uint8Array, opts?: PutOptions): Promise<ChunkKey[]>;
  /**
   * Replaces a held chunk by another encoding of it (same key; chunk_codec.ts), in place: it keeps
   * its pin and its place in the eviction order. A larger encoding evicts other unpinned chunks
   * to make room (returned); StoreFullError when it cannot, and the old encoding stays. Resolves
   * null when the key is not held.
   */
  replace(key: ChunkKey, chunk: Uint8Array): Promise<ChunkKey[] | null>;
  /** Copies the chunk into `dest` (or a new buffer) and returns that view, or null if absent/corrupt. */
  get(key: ChunkKey, dest?: Uint8Array): Promise<Uint8Array | null>;
  /**
   * Pins a chunk (never evicted until unpinned). A transient pin (a transfer's hold) lasts for
   * this process only; a plain pin is also persisted where the location persists (disk).
   */
  pin(key: ChunkKey, opts?: PinOptions): boolean;
  /**
   * Marks a prompt's chunks (in prompt order) used so that eviction takes its tail before its head
   * (optional: a location without recency order ignores it).
   */
  touchPrefix?(keys: readonly ChunkKey[]): void;
  /**
   * The controller's replica hint (src/protocol/replica_hint.ts): `elsewhere` true when another
   * instance holds the chunk too (evict it before chunks only this instance holds, even when read
   * here), false when this instance now holds the last copy (plain recency again). False when the
   * chunk is not here (optional: a location without recency order ignores it).
   */
  markReplica?(key: ChunkKey, elsewhere: boolean): boolean;
  /** Makes every chunk marked by markReplica ordinary again (the controller's advice is stale). */
  clearReplicaMarks?(): void;
  unpin(key: ChunkKey): boolean;
  isPinned(key: ChunkKey): boolean;
  remove(key: ChunkKey): Promise<boolean>;
  /** Removes every chunk (pinned ones too unless `keepPinned`); returns the removed keys. */
  clear(keepPinned?: boolean): Promise<ChunkKey[]>;
  keys(): ChunkKey[];
  stats(): BackendStats;
  close(): Promise<void>;
}
