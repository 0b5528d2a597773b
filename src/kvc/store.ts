// KvcStore: the tiered store of one cache instance over its configured locations
// (LocalCPUBackend, LocalDiskBackend). It is what the engine connector, the controller
// worker and xfer use; backends stay simple and the policies live here:
//  - put without a location writes through to every configured location (a chunk
//    acknowledged is then durable on disk too, when the disk tier is on);
//  - get reads the fastest location first and promotes a disk hit into CPU memory;
//  - every admission and eviction is emitted as a batched {location, keys} event, which
//    the controller client forwards so the global index stays exact.
import { EventEmitter } from 'node:events';
import type { CacheConfig } from '../common/config.js';
import { gibToBytes } from '../common/config.js';
import { notFound } from '../common/errors.js';
import type { ChunkKey } from '../common/keys.js';
import { logger } from '../common/log.js';
import { LocalCPUBackend } from './cpu_backend.js';
import { LocalDiskBackend } from './disk_backend.js';
import { LOCATIONS, StoreFullError, type BackendStats, type KeyEvent, type LocationName, type StorageBackend } from './types.js';

const log = logger('kvc.store');

export interface StoreEvents {
  admit: [KeyEvent];
  evict: [KeyEvent];
}

export class KvcStore extends EventEmitter<StoreEvents> {
  private readonly backends = new Map<LocationName, StorageBackend>();

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

  /** The backend for `loc`, or a 404 KvcError naming the configured ones. */
  backend(loc: string): StorageBackend {
    const b = this.backends.get(loc as LocationName);
    if (!b) throw notFound(`location "${loc}" is not configured on this instance (configured: ${this.locations().join(', ') || 'none'})`, 'unknown_location');
    return b;
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

  /** Size in bytes of a stored chunk (first location holding it), or -1. */
  sizeOf(key: ChunkKey, loc?: LocationName): number {
    for (const b of loc ? [this.backend(loc)] : this.backends.values()) {
      const s = b.sizeOf(key);
      if (s >= 0) return s;
    }
    return -1;
  }

  /**
   * Stores `chunk` in `loc`, or in every configured location when `loc` is omitted.
   * With an explicit location a failure throws. Write-through succeeds when at least one
   * location stored the chunk (a full CPU tier does not lose a chunk the disk kept).
   * Returns the locations that hold the chunk afterwards.
   */
  async put(key: ChunkKey, chunk: Uint8Array, loc?: LocationName): Promise<LocationName[]> {
    const targets = loc ? [this.backend(loc)] : [...this.backends.values()];
    if (targets.length === 0) throw new StoreFullError('no storage location is configured on this instance');
    const stored: LocationName[] = [];
    let firstError: unknown;
    for (const b of targets) {
      const had = b.has(key);
      try {
        const evicted = await b.put(key, chunk);
        if (evicted.length) this.emit('evict', { location: b.location, keys: evicted });
        if (!had) this.emit('admit', { location: b.location, keys: [key] });
        stored.push(b.location);
      } catch (e) {
        if (loc) throw e;
        firstError ??= e;
        log.debug(`write-through to ${b.location} failed for ${key}: ${(e as Error).message}`);
      }
    }
    if (!stored.length) throw firstError;
    return stored;
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
          if (evicted.length) this.emit('evict', { location: cpu.location, keys: evicted });
          this.emit('admit', { location: cpu.location, keys: [key] });
        } catch (e) {
          if (!(e instanceof StoreFullError)) throw e;
        }
      }
      return got;
    }
    return null;
  }

  pin(key: ChunkKey, loc: LocationName): boolean {
    return this.backend(loc).pin(key);
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
