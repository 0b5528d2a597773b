// LocalDiskBackend: one file per chunk under `local_disk`, bounded by max_local_disk_size.
//
// - Writes are atomic and durable: the chunk goes to a temporary file that is fsynced, renamed
//   into place, and the directory fsynced; only then does the put resolve. A reader or a restart
//   never sees half a chunk, and an acknowledged chunk survives a restart.
// - Eviction happens only once the new chunk is safely in place: victims are chosen and taken out
//   of the index in one synchronous step after the write (so a pin() that landed during the write
//   is honoured, and a pin() after it finds the victim already gone), then their files are removed.
//   A put that fails has evicted nothing.
// - The index is rebuilt from the directory at start (recency from mtime); a file whose
//   header, length or name disagree is dropped and reported, never served. If the capacity shrank,
//   the oldest unpinned chunks are dropped until it fits (all of them if the pinned ones alone
//   exceed it).
// - The payload checksum is verified on every read; a corrupt file is deleted and reported.
// - Pins persist as empty `<key>.pin` marker files, so a pinned chunk stays pinned across restarts.
// Mutations are serialized by a small promise queue; reads run concurrently (a read racing
// with an eviction simply misses).
import { promises as fsp, mkdirSync, writeFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ChunkFormatError, HEADER_BYTES, checkChunkFor, readHeader, verifyChunk } from '../common/chunk.js';
import { isChunkKey, type ChunkKey } from '../common/keys.js';
import { logger } from '../common/log.js';
import { LruIndex, type Entry } from './lru_index.js';
import { CopyDeclinedError, StoreFullError, type BackendStats, type PinOptions, type PutOptions, type StorageBackend } from './types.js';

const log = logger('kvc.disk');

export class LocalDiskBackend implements StorageBackend {
  readonly location = 'LocalDiskBackend' as const;
  private readonly index = new LruIndex<Entry>();
  private queue: Promise<unknown> = Promise.resolve();
  private tmpSeq = 0;
  /** Called with keys dropped for corruption (the store reports them as evictions). */
  onDrop: (keys: ChunkKey[], reason: string) => void = () => {};
  /** Problems found while opening the directory (for logs and tests). */
  readonly openProblems: string[] = [];
  /**
   * Chunks found in the directory at open and deleted (bad file, or over a smaller capacity).
   * The controller learns the surviving set from the full key list every instance sends on
   * registration; this list is for logs, metrics and tests.
   */
  readonly droppedAtOpen: { key: string; reason: string }[] = [];

  private constructor(
    readonly dir: string,
    readonly capacityBytes: number,
  ) {}

  static async open(dir: string, capacityBytes: number): Promise<LocalDiskBackend> {
    mkdirSync(dir, { recursive: true });
    const b = new LocalDiskBackend(dir, capacityBytes);
    await b.rebuild();
    return b;
  }

  private file(key: ChunkKey): string {
    return join(this.dir, `${key}.kvc`);
  }
  private pinFile(key: ChunkKey): string {
    return join(this.dir, `${key}.pin`);
  }

  /** Scans the directory: keeps valid chunk files (oldest first), removes temp files and bad ones. */
  private async rebuild(): Promise<void> {
    const names = await fsp.readdir(this.dir);
    const found: { key: ChunkKey; bytes: number; mtime: number }[] = [];
    const pins = new Set<string>();
    const header = Buffer.alloc(HEADER_BYTES);
    for (const name of names) {
      const path = join(this.dir, name);
      if (name.includes('.tmp-')) {
        await this.rmLogged(path);
        continue;
      }
      if (name.endsWith('.pin')) {
        pins.add(name.slice(0, -4));
        continue;
      }
      if (!name.endsWith('.kvc')) continue;
      const key = name.slice(0, -4);
      try {
        if (!isChunkKey(key)) throw new ChunkFormatError('file name is not a chunk key');
        const st = await fsp.stat(path);
        if (!st.isFile()) {
          // Not ours to delete (a directory or device named like a chunk): never indexed, left in place.
          const msg = `ignored ${name}: not a regular file`;
          this.openProblems.push(msg);
          log.warn(msg);
          continue;
        }
        const fh = await fsp.open(path, 'r');
        try {
          const { bytesRead } = await fh.read(header, 0, HEADER_BYTES, 0);
          const h = readHeader(header.subarray(0, bytesRead));
          if (h.key !== key) throw new ChunkFormatError(`header key ${h.key} does not match file name`);
          if (st.size !== HEADER_BYTES + h.payloadBytes) throw new ChunkFormatError(`truncated: ${st.size} bytes, expected ${HEADER_BYTES + h.payloadBytes}`);
        } finally {
          await fh.close();
        }
        found.push({ key, bytes: st.size, mtime: st.mtimeMs });
      } catch (e) {
        const reason = (e as Error).message;
        this.noteOpenDrop(name, key, reason);
        await this.rmLogged(path);
      }
    }
    found.sort((a, b) => a.mtime - b.mtime);
    for (const f of found) this.index.add(f.key, { bytes: f.bytes, pinned: pins.has(f.key) });
    for (const p of pins) if (!this.index.get(p)) await this.rmLogged(this.pinFile(p));
    // A smaller capacity than last time: drop the oldest unpinned chunks until it fits, or every
    // unpinned chunk when the pinned ones alone exceed it (pinned chunks are never evicted).
    const used = this.index.bytes;
    if (used > this.capacityBytes) {
      const victims = this.index.victims(0, this.capacityBytes) ?? this.index.unpinnedKeys();
      for (const v of victims) this.index.delete(v);
      for (const v of victims) {
        this.noteOpenDrop(`${v}.kvc`, v, `over capacity: ${used} bytes on disk, capacity ${this.capacityBytes}`);
        await this.unlinkFiles(v);
      }
      if (this.index.bytes > this.capacityBytes) {
        this.openProblems.push(`pinned chunks use ${this.index.bytes} bytes, more than the capacity ${this.capacityBytes}; new puts fail until some are unpinned`);
        log.warn(this.openProblems[this.openProblems.length - 1]!);
      }
    }
  }

  private noteOpenDrop(name: string, key: string, reason: string): void {
    const msg = `dropped ${name}: ${reason}`;
    this.openProblems.push(msg);
    this.droppedAtOpen.push({ key, reason });
    log.warn(msg);
  }

  private serialize<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.then(fn, fn);
    this.queue = run.catch(() => undefined);
    return run;
  }

  /** Removes a file if present; a failure (e.g. a directory by that name) is logged, never thrown. */
  private async rmLogged(path: string): Promise<void> {
    try {
      await fsp.rm(path, { force: true });
    } catch (e) {
      log.warn(`could not remove ${path}: ${(e as Error).message}`);
    }
  }

  /** Removes a chunk's files (the index entry must already be gone). Failures are logged: the index is the truth. */
  private async unlinkFiles(key: ChunkKey): Promise<void> {
    await this.rmLogged(this.file(key));
    await this.rmLogged(this.pinFile(key));
  }

  /** Writes `data` to a new file at `path` and fsyncs it. */
  private async writeDurably(path: string, data: Uint8Array): Promise<void> {
    const fh = await fsp.open(path, 'wx');
    try {
      await fh.writeFile(data);
      await fh.datasync();
    } finally {
      await fh.close();
    }
  }

  /** Makes a rename in the directory durable (a no-op where directories cannot be fsynced). */
  private async syncDir(): Promise<void> {
    let fh: fsp.FileHandle;
    try {
      fh = await fsp.open(this.dir, 'r');
    } catch {
      return;
    }
    try {
      await fh.sync();
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code !== 'EISDIR' && code !== 'EINVAL' && code !== 'EPERM') throw e;
    } finally {
      await fh.close();
    }
  }

  /** Why a put of `size` bytes finds no room: an evict-first chunk declined (LruIndex), or everything pinned. */
  private refusal(key: ChunkKey, size: number, opts: PutOptions): StoreFullError {
    if (this.index.declines(size, this.capacityBytes, opts)) {
      return new CopyDeclinedError('LocalDiskBackend', key, opts);
    }
    return this.fullError(key);
  }

  private fullError(key: ChunkKey): StoreFullError {
    return new StoreFullError(
      `LocalDiskBackend is full: ${this.index.bytes} of ${this.capacityBytes} bytes used and ${this.index.pinnedCount} pinned chunk(s) cannot be evicted to store chunk ${key}`,
    );
  }

  has(key: ChunkKey): boolean {
    return this.index.get(key) !== undefined;
  }

  sizeOf(key: ChunkKey): number {
    return this.index.get(key)?.bytes ?? -1;
  }

  /**
   * Stores `chunk` (whose header must carry `key`). Order: write a temporary file and fsync it,
   * rename it into place and fsync the directory, then, in one synchronous step, choose the LRU
   * victims, take them out of the index and index the new chunk; finally remove the victims'
   * files. So a put that throws has evicted nothing, and a put that resolves is on disk. While a
   * put is in flight the directory may hold one chunk more than the capacity; the index (what is
   * served and counted) never exceeds it.
   */
  put(key: ChunkKey, chunk: Uint8Array, opts: PutOptions = {}): Promise<ChunkKey[]> {
    return this.serialize(async () => {
      checkChunkFor(chunk, key);
      if (this.index.readmit(key, opts)) return [];
      const size = chunk.byteLength;
      if (size > this.capacityBytes) {
        throw new StoreFullError(`chunk ${key} (${size} bytes) is larger than LocalDiskBackend capacity (${this.capacityBytes} bytes)`);
      }
      if (this.index.victims(size, this.capacityBytes, opts) === null) throw this.refusal(key, size, opts); // don't write in vain
      const tmp = join(this.dir, `${key}.kvc.tmp-${process.pid}-${this.tmpSeq++}`);
      const path = this.file(key);
      let renamed = false;
      try {
        await this.writeDurably(tmp, chunk);
        await fsp.rename(tmp, path);
        renamed = true;
        await this.syncDir();
      } catch (e) {
        // Nothing of a failed put may stay on disk: a renamed but unindexed file would exceed the
        // capacity unseen and reappear at the next start.
        await fsp.rm(renamed ? path : tmp, { force: true }).catch(() => undefined);
        throw e;
      }
      // Commit (no await until the index is consistent again). Victims are chosen only now, so a
      // chunk pinned while the file was being written is not among them.
      const victims = this.index.victims(size, this.capacityBytes, opts);
      if (victims === null) {
        await fsp.rm(path, { force: true }).catch(() => undefined);
        throw this.refusal(key, size, opts);
      }
      for (const v of victims) this.index.delete(v);
      this.index.add(key, { bytes: size, pinned: false }, opts);
      for (const v of victims) await this.unlinkFiles(v);
      return victims;
    });
  }

  /**
   * StorageBackend.replace: the new encoding is written to a temporary file, fsynced and renamed
   * over the chunk's file (atomic: a reader or a restart sees one encoding or the other, each
   * checksummed); the index then takes its size.
   */
  replace(key: ChunkKey, chunk: Uint8Array): Promise<ChunkKey[] | null> {
    return this.serialize(async () => {
      checkChunkFor(chunk, key);
      const e = this.index.get(key);
      if (!e) return null;
      const grow = chunk.byteLength - e.bytes;
      const keep = { keep: new Set([key]) };
      if (grow > 0 && this.index.victims(grow, this.capacityBytes, keep) === null) throw this.fullError(key);
      const tmp = join(this.dir, `${key}.kvc.tmp-${process.pid}-${this.tmpSeq++}`);
      try {
        await this.writeDurably(tmp, chunk);
        await fsp.rename(tmp, this.file(key));
        await this.syncDir();
      } catch (err) {
        await fsp.rm(tmp, { force: true }).catch(() => undefined);
        throw err;
      }
      // The file is the new encoding now; the index follows (a chunk removed meanwhile stays removed).
      if (!this.index.get(key)) {
        await this.rmLogged(this.file(key));
        return null;
      }
      const victims = grow > 0 ? (this.index.victims(grow, this.capacityBytes, keep) ?? []) : [];
      for (const v of victims) this.index.delete(v);
      this.index.resize(key, chunk.byteLength);
      for (const v of victims) await this.unlinkFiles(v);
      return victims;
    });
  }

  async get(key: ChunkKey, dest?: Uint8Array): Promise<Uint8Array | null> {
    const e = this.index.touch(key);
    if (!e) return null;
    let fh: fsp.FileHandle;
    try {
      fh = await fsp.open(this.file(key), 'r');
    } catch {
      return null; // removed or evicted meanwhile
    }
    try {
      // The open file is one whole encoding (replace renames a new file over it): its own size
      // counts, not the index's, which a replace in flight may not have updated yet.
      const bytes = (await fh.stat()).size;
      const out = dest ?? new Uint8Array(Buffer.allocUnsafeSlow(bytes).buffer, 0, bytes);
      if (out.byteLength < bytes) throw new RangeError(`destination of ${out.byteLength} bytes is too small for chunk ${key} (${bytes} bytes)`);
      let off = 0;
      while (off < bytes) {
        const { bytesRead } = await fh.read(out, off, bytes - off, off);
        if (bytesRead === 0) break;
        off += bytesRead;
      }
      const view = out.subarray(0, off);
      verifyChunk(view, key);
      return view;
    } catch (err) {
      if (err instanceof RangeError) throw err;
      const reason = `corrupt chunk file ${key}.kvc: ${(err as Error).message}`;
      log.warn(`${reason}; dropped`);
      // Drop exactly the entry that was read (not one evicted and re-stored meanwhile), and report it once.
      const dropped = await this.serialize(async () => {
        if (this.index.get(key) !== e) return false;
        this.index.delete(key);
        await this.unlinkFiles(key);
        return true;
      });
      if (dropped) this.onDrop([key], reason);
      return null;
    } finally {
      await fh.close();
    }
  }

  pin(key: ChunkKey, opts: PinOptions = {}): boolean {
    if (!this.index.pin(key)) return false;
    // A transient pin (a transfer's hold) must not outlive a crash of this process.
    if (opts.transient) rmSync(this.pinFile(key), { force: true });
    else writeFileSync(this.pinFile(key), '');
    return true;
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

  unpin(key: ChunkKey): boolean {
    if (!this.index.unpin(key)) return false;
    rmSync(this.pinFile(key), { force: true });
    return true;
  }

  isPinned(key: ChunkKey): boolean {
    return this.index.get(key)?.pinned ?? false;
  }

  remove(key: ChunkKey): Promise<boolean> {
    return this.serialize(async () => {
      if (!this.index.delete(key)) return false;
      await this.unlinkFiles(key);
      return true;
    });
  }

  clear(keepPinned = false): Promise<ChunkKey[]> {
    return this.serialize(async () => {
      const keys = keepPinned ? this.index.keys().filter((k) => !this.index.get(k)!.pinned) : this.index.keys();
      for (const k of keys) this.index.delete(k);
      for (const k of keys) await this.unlinkFiles(k);
      return keys;
    });
  }

  keys(): ChunkKey[] {
    return this.index.keys();
  }

  stats(): BackendStats {
    return this.index.stats(this.location, this.capacityBytes);
  }

  /** Waits for queued writes; every acknowledged chunk is fsynced and renamed, so the tier survives a restart. */
  async close(): Promise<void> {
    await this.serialize(async () => undefined);
  }
}
