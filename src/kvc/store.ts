// KvcStore: the tiered store of one cache instance over its configured locations
// (LocalCPUBackend, LocalDiskBackend). It is what the engine connector, the controller
// worker and xfer use; backends stay simple and the policies live here:
//  - put checks that the chunk's header carries the key it is stored under, then, without a
//    location, writes through to every configured location; the result says which locations
//    hold it and whether it is durable (on the disk tier: fsynced, survives a restart);
//  - get reads the fastest location first and promotes a disk hit into CPU memory;
//  - with remote_url, a third tier under CPU and disk (remote_tier.ts): every chunk stored
//    locally is also queued for the shared server, and a local miss reads through it (the
//    chunk is verified and promoted into CPU memory). The remote tier is not a location the
//    controller tracks: it is shared by many instances and belongs to none;
//  - every admission and eviction is emitted as a batched {location, keys} event, which
//    the controller client forwards so the global index stays exact.
import { EventEmitter } from 'node:events';
import type { CacheConfig } from '../common/config.js';
import { REMOTE_DEFAULTS, gibToBytes, remoteEndpoint } from '../common/config.js';
import { ERRORS, kvcError } from '../common/errors.js';
import { checkChunkFor, Codec } from '../common/chunk.js';
import { codecByName, recodeChunk } from '../common/chunk_codec.js';
import { halvesToHex, keyHalves, type ChunkKey, type KeyParams } from '../common/keys.js';
import { logger } from '../common/log.js';
import { LocalCPUBackend } from './cpu_backend.js';
import { LocalDiskBackend } from './disk_backend.js';
import { RemoteTier, type EnqueueResult, type RemoteStats } from './remote_tier.js';
import { CopyDeclinedError, LOCATIONS, StoreFullError, type BackendStats, type KeyEvent, type LocationName, type PinOptions, type PutOptions, type StorageBackend } from './types.js';

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
  /** With a remote tier only: queued for a background write, already there, or dropped (counted). */
  remote?: EnqueueResult;
}

/** Keys of the cache configuration the store reads (the remote ones may be absent: no remote tier). */
export type StoreConfig = Pick<CacheConfig, 'local_cpu' | 'max_local_cpu_size' | 'max_local_disk_size' | 'local_disk'> &
  Partial<Pick<CacheConfig, 'remote_url' | 'remote_timeout_ms' | 'remote_write_queue_size' | 'local_cpu_serde' | 'local_disk_serde' | 'remote_serde'>>;

export interface StoreOptions {
  /** The model id of the engine: remote keys are `kvc:<model_id>:<chunk key>`. Required with remote_url. */
  modelId?: string;
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
  /**
   * Evict-first chunks (copies, partial chunks) declined per location, since the store opened:
   * the room they needed was held by chunks they may not displace (CopyDeclinedError).
   */
  readonly declined: Partial<Record<LocationName, number>> = {};
  /** The shared remote tier (remote_url), or null. */
  remote: RemoteTier | null = null;
  /** The codec each location holds its chunks in (local_cpu_serde, local_disk_serde). */
  private readonly codecs = new Map<LocationName, Codec>();
  /** The remote tier's codec (remote_serde). */
  private remoteCodec: Codec = Codec.naive;
  /** Chunks a tier could not encode with its codec (kept as they came), since the store opened. */
  encodeFailures = 0;

  private constructor() {
    super();
  }

  /**
   * Builds the locations the configuration enables, and the remote tier when remote_url is set
   * (an unsupported scheme throws a ConfigError naming remote_url). With none enabled the store
   * holds nothing.
   */
  static async create(cfg: StoreConfig, o: StoreOptions = {}): Promise<KvcStore> {
    const endpoint = remoteEndpoint({ remote_url: cfg.remote_url ?? null });
    if (endpoint && !o.modelId) throw new Error('KvcStore.create: a remote tier needs the model id (remote keys are kvc:<model_id>:<chunk key>)');
    const s = new KvcStore();
    if (cfg.local_cpu && cfg.max_local_cpu_size > 0) {
      s.backends.set('LocalCPUBackend', new LocalCPUBackend(gibToBytes(cfg.max_local_cpu_size)));
      s.codecs.set('LocalCPUBackend', codecByName(cfg.local_cpu_serde ?? 'naive'));
    }
    if (cfg.max_local_disk_size > 0 && cfg.local_disk) {
      const disk = await LocalDiskBackend.open(cfg.local_disk, gibToBytes(cfg.max_local_disk_size));
      disk.onDrop = (keys) => s.emit('evict', { location: 'LocalDiskBackend', keys });
      s.backends.set('LocalDiskBackend', disk);
      s.codecs.set('LocalDiskBackend', codecByName(cfg.local_disk_serde ?? 'naive'));
    }
    if (endpoint) {
      s.remote = new RemoteTier({
        endpoint,
        modelId: o.modelId!,
        timeoutMs: cfg.remote_timeout_ms ?? REMOTE_DEFAULTS.remote_timeout_ms,
        queueBytes: gibToBytes(cfg.remote_write_queue_size ?? REMOTE_DEFAULTS.remote_write_queue_size),
      });
      await s.remote.start();
      s.remoteCodec = codecByName(cfg.remote_serde ?? 'naive');
    }
    return s;
  }

  /** The codec `loc` encodes admitted chunks with. */
  codecOf(loc: LocationName): Codec {
    return this.codecs.get(loc) ?? Codec.naive;
  }

  /**
   * `chunk` as a tier with `codec` holds it: re-encoded when its codec differs (chunk_codec.ts);
   * `memo` keeps one encoding per codec for a write-through. A chunk the codec cannot encode (a
   * non-finite value) is kept as it came, counted in encodeFailures.
   */
  private encodedFor(codec: Codec, chunk: Uint8Array, memo?: Map<Codec, Uint8Array>): Uint8Array {
    const have = memo?.get(codec);
    if (have) return have;
    let out = chunk;
    try {
      out = recodeChunk(chunk, codec);
    } catch (e) {
      this.encodeFailures++;
      log.debug(`chunk kept in its own encoding: ${(e as Error).message}`);
    }
    memo?.set(codec, out);
    return out;
  }

  /**
   * Re-encodes the chunk held at `loc` under `key` with `codec`, in place (keeps its pin and its
   * place in the eviction order; see StorageBackend.replace). Returns false when `loc` does not
   * hold it. Throws when the chunk cannot be read or encoded, or (a larger encoding) finds no room:
   * the old encoding then stays.
   */
  async recode(key: ChunkKey, loc: LocationName, codec: Codec): Promise<boolean> {
    const b = this.backend(loc);
    const held = await b.get(key);
    if (!held) return false;
    const out = recodeChunk(held, codec);
    if (out === held) return true;
    const evicted = await b.replace(key, out);
    if (evicted === null) return false;
    if (evicted.length) this.evicted(loc, evicted);
    return true;
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

  /**
   * Marks a prompt's chunks used in every location, head last, so eviction takes a prefix from its
   * tail (see LruIndex.touchHeadLast). Called once a request has loaded or stored its chunks.
   */
  touchPrefix(keys: readonly ChunkKey[]): void {
    if (keys.length === 0) return;
    for (const b of this.backends.values()) b.touchPrefix?.(keys);
  }

  /**
   * Applies the controller's replica hints to location `loc`, in order (see
   * StorageBackend.markReplica); returns how many named a chunk held there. Unknown locations and
   * chunks no longer held are ignored: a hint is advice about the past.
   */
  markReplicas(loc: string, keys: readonly ChunkKey[], elsewhere: ArrayLike<number>): number {
    const b = this.backends.get(loc as LocationName);
    if (!b?.markReplica) return 0;
    let n = 0;
    for (let i = 0; i < keys.length; i++) if (b.markReplica(keys[i]!, elsewhere[i] === 1)) n++;
    return n;
  }

  /** Makes every replica-marked chunk ordinary again, in every location (see markReplicas). */
  clearReplicaMarks(): void {
    for (const b of this.backends.values()) b.clearReplicaMarks?.();
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
   * `opts.evictFirst` admits the chunk at the cold end of every location's eviction order
   * (types.ts PutOptions); a location that declines it (CopyDeclinedError: no room that such a
   * chunk may take) counts it in `declined` and is a refusal like any other.
   */
  async put(key: ChunkKey, chunk: Uint8Array, loc?: LocationName, opts: PutOptions = {}): Promise<PutResult> {
    checkChunkFor(chunk, key);
    const targets = loc ? [this.backend(loc)] : [...this.backends.values()];
    const result: PutResult = { stored: [], failed: [], durable: false };
    const memo = new Map<Codec, Uint8Array>();
    if (targets.length === 0) {
      // An instance with only a remote tier (e.g. a decoder without local memory) still shares.
      if (!this.remote) throw new StoreFullError('no storage location is configured on this instance');
      result.remote = this.remote.enqueue(key, this.encodedFor(this.remoteCodec, chunk, memo));
      return result;
    }
    let firstError: unknown;
    for (const b of targets) {
      const had = b.has(key);
      try {
        const evicted = await b.put(key, this.encodedFor(this.codecOf(b.location), chunk, memo), opts);
        if (evicted.length) this.evicted(b.location, evicted);
        if (!had) this.emit('admit', { location: b.location, keys: [key] });
        result.stored.push(b.location);
        if (b.location === 'LocalDiskBackend') result.durable = true;
      } catch (e) {
        if (e instanceof StoreFullError && e.evicted.length) this.evicted(b.location, e.evicted);
        if (e instanceof CopyDeclinedError) this.countDeclined(b.location);
        if (loc) throw e;
        firstError ??= e;
        result.failed.push({ location: b.location, error: (e as Error).message });
      }
    }
    if (!result.stored.length) throw firstError;
    // Never awaited: the write happens in the background and a full queue drops (and counts) it.
    if (this.remote) result.remote = this.remote.enqueue(key, this.encodedFor(this.remoteCodec, chunk, memo));
    for (const f of result.failed) {
      // A disk refusal means the chunk is not durable: worth an operator's attention.
      if (f.location === 'LocalDiskBackend') log.warn(`chunk ${key} not written to LocalDiskBackend (kept only in memory): ${f.error}`);
      else log.debug(`write-through to ${f.location} failed for ${key}: ${f.error}`);
    }
    return result;
  }

  /**
   * Room in the CPU tier for a chunk of `bytes` arriving from another instance, its bytes to be
   * read straight into the returned slot (LocalCPUBackend.reserve; chunks evicted for it are
   * announced). Then commitIncoming() or abortIncoming(). Throws StoreFullError (no room, or no
   * CPU tier).
   */
  reserveIncoming(bytes: number): Uint8Array {
    const cpu = this.cpu();
    if (!cpu) throw new StoreFullError('LocalCPUBackend is not configured on this instance');
    const { slot, victims } = cpu.reserve(bytes);
    if (victims.length) this.evicted(cpu.location, victims);
    return slot;
  }

  /**
   * A reserved chunk, complete and verified by the caller, joins the CPU tier under `key` (its
   * first `length` bytes) exactly as a put into that location would: an admit the controller sees,
   * and a copy queued for the remote tier when there is one.
   */
  commitIncoming(key: ChunkKey, slot: Uint8Array, length: number): void {
    const cpu = this.cpu()!;
    const chunk = slot.subarray(0, length);
    try {
      checkChunkFor(chunk, key);
    } catch (e) {
      cpu.abortReserved(slot);
      throw e;
    }
    if (this.remote) this.remote.enqueue(key, chunk);
    if (cpu.commitReserved(key, slot, length)) this.emit('admit', { location: cpu.location, keys: [key] });
  }

  /** Gives back a reservation from reserveIncoming() that will not be committed. */
  abortIncoming(slot: Uint8Array): void {
    this.cpu()?.abortReserved(slot);
  }

  /**
   * Copies a chunk that came from a peer (P2P, already verified by the caller) into the CPU tier
   * when there is room, exactly like a disk or remote hit (an admit the controller sees; it is
   * not written to the remote tier). Best effort: a full tier keeps what it has (an evict-first
   * copy that is declined is counted in `declined`).
   */
  promoteFetched(key: ChunkKey, chunk: Uint8Array, opts: PutOptions = {}): void {
    checkChunkFor(chunk, key);
    this.promote(key, chunk, opts);
  }

  /** Copies a chunk read from a slower tier into the CPU tier when there is room (best effort). */
  private promote(key: ChunkKey, chunk: Uint8Array, opts: PutOptions = {}): void {
    const cpu = this.cpu();
    if (!cpu || cpu.has(key)) return;
    try {
      const evicted = cpu.putSync(key, this.encodedFor(this.codecOf(cpu.location), chunk), opts);
      if (evicted.length) this.evicted(cpu.location, evicted);
      this.emit('admit', { location: cpu.location, keys: [key] });
    } catch (e) {
      if (!(e instanceof StoreFullError)) throw e;
      if (e instanceof CopyDeclinedError) this.countDeclined(cpu.location);
    }
  }

  /**
   * Copies the chunk into `dest` (or a new buffer), reading `loc` or the fastest location that
   * has it; without `loc`, a local miss reads through the remote tier. A disk or remote hit is
   * promoted into the CPU tier when there is room.
   */
  async get(key: ChunkKey, dest?: Uint8Array, loc?: LocationName): Promise<Uint8Array | null> {
    if (loc) return this.backend(loc).get(key, dest);
    for (const b of this.backends.values()) {
      const got = await b.get(key, dest);
      if (!got) continue;
      if (b !== this.cpu()) this.promote(key, got);
      return got;
    }
    if (!this.remote) return null;
    const got = await this.remote.get(key);
    if (!got) return null;
    this.promote(key, got);
    if (!dest) return got;
    if (dest.byteLength < got.byteLength) throw new RangeError(`destination of ${dest.byteLength} bytes is too small for chunk ${key} (${got.byteLength} bytes)`);
    dest.set(got, 0);
    return dest.subarray(0, got.byteLength);
  }

  /**
   * Reads through the remote tier for the `keys` (a prompt's chunk keys, in order) that no local
   * location holds: they are fetched a few at a time up to the first one the server lacks,
   * verified, and promoted into the CPU tier. Returns the fetched chunks by key, so a caller
   * without a CPU tier can use them directly. Bounded by the remote tier's command timeout; never
   * throws for remote trouble (it is counted in remoteStats()).
   */
  async readThrough(keys: readonly ChunkKey[]): Promise<Map<ChunkKey, Uint8Array>> {
    const out = new Map<ChunkKey, Uint8Array>();
    if (!this.remote) return out;
    const missing = keys.filter((k) => !this.has(k));
    if (!missing.length) return out;
    const got = await this.remote.getLeading(missing);
    for (let i = 0; i < got.length; i++) {
      this.promote(missing[i]!, got[i]!);
      out.set(missing[i]!, got[i]!);
    }
    return out;
  }

  /** Counters of the remote tier, or null without one. */
  remoteStats(): RemoteStats | null {
    return this.remote?.stats() ?? null;
  }

  /** Counts an evict-first chunk `location` declined (see `declined`). */
  private countDeclined(location: LocationName): void {
    this.declined[location] = (this.declined[location] ?? 0) + 1;
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

  /**
   * Removes every chunk of `loc` and returns how many: pinned ones too, unless `keepPinned` (what
   * a clear asked through the controller does by default: a pin is a promise the chunk stays).
   */
  async clear(loc: LocationName, opts: { keepPinned?: boolean } = {}): Promise<number> {
    const keys = await this.backend(loc).clear(opts.keepPinned ?? false);
    if (keys.length) this.emit('evict', { location: loc, keys });
    return keys.length;
  }

  keys(loc: LocationName): ChunkKey[] {
    return this.backend(loc).keys();
  }

  stats(): BackendStats[] {
    return [...this.backends.values()].map((b) => b.stats());
  }

  /** Waits for pending disk and remote writes (bounded) and releases memory. Disk chunks stay for the next start. */
  async close(): Promise<void> {
    await this.remote?.close();
    for (const b of this.backends.values()) await b.close();
  }
}
