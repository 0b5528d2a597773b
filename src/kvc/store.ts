// KvcStore: the tiered store of one cache instance over its configured locations
// (LocalCPUBackend, LocalDiskBackend). It is what the engine connector, the controller
// worker and xfer use; backends stay simple and the policies live here:
//  - put checks that the chunk's header carries the key it is stored under, then, without a
//    location, writes through to every configured location; the result says which locations
//    hold it and whether it is durable (on the disk tier: fsynced, survives a restart);
//  - get reads the fastest location first and promotes a disk hit into CPU memory;
//  - every admission and eviction is emitted as a batched {location, keys} event, which
//    the controller client forwards so the global index stays exact.
import { EventEmitter } from 'node:events';
import type { CacheConfig } from '../common/config.js';
import { gibToBytes } from '../common/config.js';
import { ERRORS, kvcError } from '../common/errors.js';
import { checkChunkFor } from '../common/chunk.js';
import { halvesToHex, keyHalves, type ChunkKey, type KeyParams } from '../common/keys.js';
import { logger } from '../common/log.js';
import { LocalCPUBackend } from './cpu_backend.js';
import { LocalDiskBackend } from './disk_backend.js';
import { LOCATIONS, StoreFullError, type BackendStats, type KeyEvent, type LocationName, type PinOptions, type StorageBackend } from './types.js';

const log = logger('kvc.store');

/** What a put did, location by location. */
export interface PutResult {
  /** Locations that hold the chunk afterwards, fastest first. */
  stored: LocationName[];
  /** Locations that refused it (write-through only; with an explicit location a refusal throws). */
  failed: { location: LocationName; error: string }[];
  /**
   * True when the chunk is on LocalDiskBackend (fsynced and renamed into place, so it survives a
   * restart). False when the disk tier is not configured, was not targeted, or refused the chunk:
   * then the chunk lives only in memory.
   */
  durable: boolean;
}

export interface StoreEvents {
  admit: [KeyEvent];
  evict: [KeyEvent];
}

export class KvcStore extends EventEmitter<StoreEvents> {
  private readonly backends = new Map<LocationName, StorageBackend>();
  /**
   * Chunks evicted per location to make room (LRU), since the store opened. Removals and clears
   * are not evictions: they are emitted as 'evict' events too, but not counted here.
   */
  readonly evictions: Partial<Record<LocationName, number>> = {};

  private constructor() {
    super();
  }

  /** Builds the locations the configuration enables. With none enabled the store holds nothing. */
  static async create(cfg: Pick<CacheConfig, 'local_cpu' | 'max_local_cpu_size' | 'max_local_disk_size' | 'local_disk'>): Promise<KvcStore> {
    const s = new KvcStore();
    if (cfg.local_cpu && cfg.max_local_cpu_size > 0) {
      s.backends.set('LocalCPUBackend', new LocalCPUBackend(gibToBytes(cfg.max_local_cpu_size)));
    }
    if (cfg.max_local_disk_size > 0 && cfg.local_disk) {
      const disk = await LocalDiskBackend.open(cfg.local_disk, gibToBytes(cfg.max_local_disk_size));
      disk.onDrop = (keys) => s.emit('evict', { location: 'LocalDiskBackend', keys });
      s.backends.set('LocalDiskBackend', disk);
    }
    return s;
  }

  /** Configured locations, fastest first. */
  locations(): LocationName[] {
    return LOCATIONS.filter((l) => this.backends.has(l));
  }

  /** Throws 404 (unknown_location) unless `loc` is configured on this instance. */
  assertLocation(loc: string): asserts loc is LocationName {
    if (!this.backends.has(loc as LocationName)) throw kvcError(ERRORS.unknown_location, `location "${loc}" is not configured on this instance (configured: ${this.locations().join(', ') || 'none'})`);
  }

  /** The backend for `loc`, or a 404 KvcError naming the configured ones. */
  backend(loc: string): StorageBackend {
    this.assertLocation(loc);
    return this.backends.get(loc)!;
  }

  /** The CPU tier, for zero-copy in-process reads (see LocalCPUBackend.peek). */
  cpu(): LocalCPUBackend | undefined {
    return this.backends.get('LocalCPUBackend') as LocalCPUBackend | undefined;
  }

  has(key: ChunkKey, loc?: LocationName): boolean {
    if (loc) return this.backends.get(loc)?.has(key) ?? false;
    for (const b of this.backends.values()) if (b.has(key)) return true;
    return false;
  }

  /** Number of leading `keys` present (in `loc`, or in any location): the cached prefix in chunks. */
  lookupPrefix(keys: readonly ChunkKey[], loc?: LocationName): number {
    let n = 0;
    while (n < keys.length && this.has(keys[n]!, loc)) n++;
    return n;
  }

  /**
   * The longest cached prefix of a token list, in tokens: the prompt is split and keyed exactly as
   * the engine saves it (src/common/keys.ts, `p` = model, chunk size, seed, partial-chunk rule),
   * and the result is where the last present leading chunk ends. A stored partial last chunk counts
   * its own length, so a fully cached prompt returns `tokens.length`.
   */
  lookupPrefixTokens(tokens: ArrayLike<number>, p: KeyParams, loc?: LocationName): number {
    const k = keyHalves(tokens, p);
    let matched = 0;
    for (let i = 0; i < k.count; i++) {
      if (!this.has(halvesToHex(k.hi[i]!, k.lo[i]!), loc)) break;
      matched = k.ends[i]!;
    }
    return matched;
  }

  /** Size in bytes of a stored chunk (first location holding it), or -1. */
  sizeOf(key: ChunkKey, loc?: LocationName): number {
    for (const b of loc ? [this.backend(loc)] : this.backends.values()) {
      const s = b.sizeOf(key);
      if (s >= 0) return s;
    }
    return -1;
  }

  /**
   * Stores `chunk` under `key` in `loc`, or in every configured location when `loc` is omitted.
   * The chunk's header must carry `key` (ChunkFormatError otherwise, before any location is touched).
   * With an explicit location a refusal throws. Write-through resolves when at least one location
   * stored the chunk (a CPU tier full of pinned chunks does not lose a chunk the disk kept) and throws
   * the first error when none did; the result lists the refusals, and `durable` is false whenever the
   * disk tier did not store it, so a caller never mistakes a memory-only copy for a durable one.
   * Chunks evicted to make room are emitted as 'evict' (also when the put then fails).
   */
  async put(key: ChunkKey, chunk: Uint8Array, loc?: LocationName): Promise<PutResult> {
    checkChunkFor(chunk, key);
    const targets = loc ? [this.backend(loc)] : [...this.backends.values()];
    if (targets.length === 0) throw new StoreFullError('no storage location is configured on this instance');
    const result: PutResult = { stored: [], failed: [], durable: false };
    let firstError: unknown;
    for (const b of targets) {
      const had = b.has(key);
      try {
        const evicted = await b.put(key, chunk);
        if (evicted.length) this.evicted(b.location, evicted);
        if (!had) this.emit('admit', { location: b.location, keys: [key] });
        result.stored.push(b.location);
        if (b.location === 'LocalDiskBackend') result.durable = true;
      } catch (e) {
        if (e instanceof StoreFullError && e.evicted.length) this.evicted(b.location, e.evicted);
        if (loc) throw e;
        firstError ??= e;
        result.failed.push({ location: b.location, error: (e as Error).message });
      }
    }
    if (!result.stored.length) throw firstError;
    for (const f of result.failed) {
      // A disk refusal means the chunk is not durable: worth an operator's attention.
      if (f.location === 'LocalDiskBackend') log.warn(`chunk ${key} not written to LocalDiskBackend (kept only in memory): ${f.error}`);
      else log.debug(`write-through to ${f.location} failed for ${key}: ${f.error}`);
    }
    return result;
  }

  /**
   * Copies the chunk into `dest` (or a new buffer), reading `loc` or the fastest location that
   * has it. A disk hit is promoted into the CPU tier when there is room.
   */
  async get(key: ChunkKey, dest?: Uint8Array, loc?: LocationName): Promise<Uint8Array | null> {
    if (loc) return this.backend(loc).get(key, dest);
    for (const b of this.backends.values()) {
      const got = await b.get(key, dest);
      if (!got) continue;
      const cpu = this.cpu();
      if (cpu && b !== cpu && !cpu.has(key)) {
        try {
          const evicted = cpu.putSync(key, got);
          if (evicted.length) this.evicted(cpu.location, evicted);
          this.emit('admit', { location: cpu.location, keys: [key] });
        } catch (e) {
          if (!(e instanceof StoreFullError)) throw e;
        }
      }
      return got;
    }
    return null;
  }

  /** Counts and announces chunks that left `location` to make room. */
  private evicted(location: LocationName, keys: ChunkKey[]): void {
    this.evictions[location] = (this.evictions[location] ?? 0) + keys.length;
    this.emit('evict', { location, keys });
  }

  pin(key: ChunkKey, loc: LocationName, opts: PinOptions = {}): boolean {
    return this.backend(loc).pin(key, opts);
  }

  unpin(key: ChunkKey, loc: LocationName): boolean {
    return this.backend(loc).unpin(key);
  }

  isPinned(key: ChunkKey, loc: LocationName): boolean {
    return this.backend(loc).isPinned(key);
  }

  async remove(key: ChunkKey, loc: LocationName): Promise<boolean> {
    const removed = await this.backend(loc).remove(key);
    if (removed) this.emit('evict', { location: loc, keys: [key] });
    return removed;
  }

  /** Removes every chunk of `loc` (pinned ones too) and returns how many. */
  async clear(loc: LocationName): Promise<number> {
    const keys = await this.backend(loc).clear();
    if (keys.length) this.emit('evict', { location: loc, keys });
    return keys.length;
  }

  keys(loc: LocationName): ChunkKey[] {
    return this.backend(loc).keys();
  }

  stats(): BackendStats[] {
    return [...this.backends.values()].map((b) => b.stats());
  }

  /** Waits for pending disk writes and releases memory. Disk chunks stay for the next start. */
  async close(): Promise<void> {
    for (const b of this.backends.values()) await b.close();
  }
}
