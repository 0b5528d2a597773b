// LocalDiskBackend: one file per chunk under `local_disk`, bounded by max_local_disk_size.
//
// - Writes are atomic: the chunk goes to a temporary file that is renamed into place, so a
//   reader or a restart never sees half a chunk.
// - The index is rebuilt from the directory at start (recency from mtime); a file whose
//   header, length or name disagree is dropped and reported, never served.
// - The payload checksum is verified on every read; a corrupt file is deleted and reported.
// - Pins persist as empty `<key>.pin` marker files, so a pinned chunk stays pinned across restarts.
// Mutations are serialized by a small promise queue; reads run concurrently (a read racing
// with an eviction simply misses).
import { promises as fsp, mkdirSync, writeFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { ChunkFormatError, HEADER_BYTES, readHeader, verifyChunk } from '../common/chunk.js';
import type { ChunkKey } from '../common/keys.js';
import { logger } from '../common/log.js';
import { LruIndex, type Entry } from './lru_index.js';
import { StoreFullError, type BackendStats, type StorageBackend } from './types.js';

const log = logger('kvc.disk');
const KEY_RE = /^[0-9a-f]{16}$/;

export class LocalDiskBackend implements StorageBackend {
  readonly location = 'LocalDiskBackend' as const;
  private readonly index = new LruIndex<Entry>();
  private queue: Promise<unknown> = Promise.resolve();
  private tmpSeq = 0;
  /** Called with keys dropped for corruption (the store reports them as evictions). */
  onDrop: (keys: ChunkKey[], reason: string) => void = () => {};
  /** Problems found while opening the directory (for logs and tests). */
  readonly openProblems: string[] = [];

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
        await fsp.rm(path, { force: true });
        continue;
      }
      if (name.endsWith('.pin')) {
        pins.add(name.slice(0, -4));
        continue;
      }
      if (!name.endsWith('.kvc')) continue;
      const key = name.slice(0, -4);
      try {
        if (!KEY_RE.test(key)) throw new ChunkFormatError('file name is not a chunk key');
        const st = await fsp.stat(path);
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
        const msg = `dropped ${name}: ${(e as Error).message}`;
        this.openProblems.push(msg);
        log.warn(msg);
        await fsp.rm(path, { force: true });
      }
    }
    found.sort((a, b) => a.mtime - b.mtime);
    for (const f of found) this.index.add(f.key, { bytes: f.bytes, pinned: pins.has(f.key) });
    for (const p of pins) if (!this.index.get(p)) await fsp.rm(this.pinFile(p), { force: true });
    // A smaller capacity than last time: evict the oldest unpinned chunks until it fits.
    const victims = this.index.victims(0, this.capacityBytes) ?? [];
    for (const v of victims) await this.unlinkEntry(v);
    if (this.index.bytes > this.capacityBytes) {
      this.openProblems.push(`pinned chunks use ${this.index.bytes} bytes, more than the capacity ${this.capacityBytes}`);
    }
  }

  private serialize<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.queue.then(fn, fn);
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async unlinkEntry(key: ChunkKey): Promise<void> {
    this.index.delete(key);
    await fsp.rm(this.file(key), { force: true });
    await fsp.rm(this.pinFile(key), { force: true });
  }

  has(key: ChunkKey): boolean {
    return this.index.get(key) !== undefined;
  }

  sizeOf(key: ChunkKey): number {
    return this.index.get(key)?.bytes ?? -1;
  }

  put(key: ChunkKey, chunk: Uint8Array): Promise<ChunkKey[]> {
    return this.serialize(async () => {
      if (this.index.touch(key)) return [];
      const size = chunk.byteLength;
      if (size > this.capacityBytes) {
        throw new StoreFullError(`chunk ${key} (${size} bytes) is larger than LocalDiskBackend capacity (${this.capacityBytes} bytes)`);
      }
      const victims = this.index.victims(size, this.capacityBytes);
      if (victims === null) {
        throw new StoreFullError(
          `LocalDiskBackend is full: ${this.index.bytes} of ${this.capacityBytes} bytes used and ${this.index.pinnedCount} pinned chunk(s) cannot be evicted to store chunk ${key}`,
        );
      }
      for (const v of victims) await this.unlinkEntry(v);
      const tmp = join(this.dir, `${key}.kvc.tmp-${process.pid}-${this.tmpSeq++}`);
      try {
        await fsp.writeFile(tmp, chunk);
        await fsp.rename(tmp, this.file(key));
      } catch (e) {
        await fsp.rm(tmp, { force: true });
        throw e;
      }
      this.index.add(key, { bytes: size, pinned: false });
      return victims;
    });
  }

  async get(key: ChunkKey, dest?: Uint8Array): Promise<Uint8Array | null> {
    const e = this.index.touch(key);
    if (!e) return null;
    const out = dest ?? new Uint8Array(Buffer.allocUnsafeSlow(e.bytes).buffer, 0, e.bytes);
    if (out.byteLength < e.bytes) throw new RangeError(`destination of ${out.byteLength} bytes is too small for chunk ${key} (${e.bytes} bytes)`);
    let fh: fsp.FileHandle;
    try {
      fh = await fsp.open(this.file(key), 'r');
    } catch {
      return null; // removed or evicted meanwhile
    }
    try {
      let off = 0;
      while (off < e.bytes) {
        const { bytesRead } = await fh.read(out, off, e.bytes - off, off);
        if (bytesRead === 0) break;
        off += bytesRead;
      }
      const view = out.subarray(0, off);
      verifyChunk(view, key);
      return view;
    } catch (err) {
      const reason = `corrupt chunk file ${key}.kvc: ${(err as Error).message}`;
      log.warn(`${reason}; dropped`);
      await this.serialize(() => this.unlinkEntry(key));
      this.onDrop([key], reason);
      return null;
    } finally {
      await fh.close();
    }
  }

  pin(key: ChunkKey): boolean {
    if (!this.index.setPinned(key, true)) return false;
    writeFileSync(this.pinFile(key), '');
    return true;
  }

  unpin(key: ChunkKey): boolean {
    if (!this.index.setPinned(key, false)) return false;
    rmSync(this.pinFile(key), { force: true });
    return true;
  }

  isPinned(key: ChunkKey): boolean {
    return this.index.get(key)?.pinned ?? false;
  }

  remove(key: ChunkKey): Promise<boolean> {
    return this.serialize(async () => {
      if (!this.index.get(key)) return false;
      await this.unlinkEntry(key);
      return true;
    });
  }

  clear(): Promise<ChunkKey[]> {
    return this.serialize(async () => {
      const keys = this.index.keys();
      for (const k of keys) await this.unlinkEntry(k);
      return keys;
    });
  }

  keys(): ChunkKey[] {
    return this.index.keys();
  }

  stats(): BackendStats {
    return this.index.stats(this.location, this.capacityBytes);
  }

  /** Waits for queued writes; files are complete and renamed, so the tier survives a restart. */
  async close(): Promise<void> {
    await this.serialize(async () => undefined);
  }
}
