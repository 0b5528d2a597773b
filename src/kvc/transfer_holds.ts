// Temporary pins taken by chunk transfers (moves and copies), on top of the store's own pin flag.
//
// A destination pins every chunk of a transfer as soon as it is stored, so that storing the
// later chunks of the same transfer cannot evict the earlier ones (LRU); a source pins a
// memory-tier chunk while its bytes are queued on the socket, so that an eviction cannot recycle
// the buffer under the send. When the transfer ends the hold is released, and the chunk is
// unpinned again only if nobody else wanted it pinned: a chunk that was pinned before the first
// hold, or that the controller pinned (WorkerOps.pin) while it was held, stays pinned.
//
// Holds are counted per (location, key): two transfers holding the same chunk do not unpin it
// under each other. One registry per store (the peer server and the worker ops share it).
import type { ChunkKey } from '../common/keys.js';
import type { KvcStore } from './store.js';
import type { LocationName } from './types.js';

interface Hold {
  count: number;
  /** Whether the chunk must stay pinned once the last hold is released. */
  keepPinned: boolean;
}

export class TransferHolds {
  private readonly held = new Map<string, Hold>();

  constructor(private readonly store: KvcStore) {}

  private id(key: ChunkKey, loc: LocationName): string {
    return `${loc}\u0000${key}`;
  }

  /** Pins `key` in `loc` for a transfer. False when the location does not hold the key (nothing held). */
  hold(key: ChunkKey, loc: LocationName): boolean {
    if (!this.store.has(key, loc)) return false;
    const id = this.id(key, loc);
    let h = this.held.get(id);
    if (h) h.count++;
    else this.held.set(id, (h = { count: 1, keepPinned: this.store.isPinned(key, loc) }));
    // Pin if not pinned: a first hold, or a chunk removed (a /clear) and stored again since the
    // first hold, which the rest of this transfer could otherwise evict. Transient unless it is to
    // stay pinned: if this process dies mid-transfer, a hold must not survive as a disk pin.
    if (!this.store.isPinned(key, loc)) this.store.pin(key, loc, { transient: !h.keepPinned });
    return true;
  }

  /** Gives back one hold; the last one unpins the chunk unless it was pinned for its own sake. */
  release(key: ChunkKey, loc: LocationName): void {
    const id = this.id(key, loc);
    const h = this.held.get(id);
    if (!h) return;
    if (--h.count > 0) return;
    this.held.delete(id);
    if (!h.keepPinned) this.store.unpin(key, loc);
  }

  // A pin or unpin asked for by the controller. A held chunk stays pinned until its transfers
  // end, so for it only the persisted state and what happens after the last release follow the
  // request.

  /** The controller's pin: the chunk stays pinned, also after the transfers holding it end. */
  pin(key: ChunkKey, loc: LocationName): void {
    const h = this.held.get(this.id(key, loc));
    if (h) h.keepPinned = true;
    this.store.pin(key, loc);
  }

  /** The controller's unpin: unpinned now, or when the last transfer holding it ends. */
  unpin(key: ChunkKey, loc: LocationName): void {
    const h = this.held.get(this.id(key, loc));
    if (!h) {
      this.store.unpin(key, loc);
      return;
    }
    h.keepPinned = false;
    // Still pinned for the transfers, but transient: a restart must not find it pinned on disk.
    this.store.pin(key, loc, { transient: true });
  }

  /** Pinned for its own sake (by the controller or before any transfer), not only held by one. */
  isPinnedForItself(key: ChunkKey, loc: LocationName): boolean {
    const h = this.held.get(this.id(key, loc));
    return h ? h.keepPinned : this.store.isPinned(key, loc);
  }

  isHeld(key: ChunkKey, loc: LocationName): boolean {
    return this.held.has(this.id(key, loc));
  }

  /** Number of (location, key) pairs currently held (for tests and /health). */
  get size(): number {
    return this.held.size;
  }
}

const registries = new WeakMap<KvcStore, TransferHolds>();

/** The hold registry of `store` (created on first use). */
export function transferHolds(store: KvcStore): TransferHolds {
  let h = registries.get(store);
  if (!h) registries.set(store, (h = new TransferHolds(store)));
  return h;
}

/** A chunk to send: its bytes, and what to call once they are on the wire (or the send ended). */
export interface OutgoingChunk {
  bytes: Uint8Array;
  release?: () => void;
}

/**
 * Reads a chunk of `location` for sending. From the CPU tier: a zero-copy view, with the chunk
 * pinned (a transfer hold) until the socket has taken its bytes, since an eviction would otherwise
 * recycle the buffer under the send. From elsewhere: a copy. Null when the location lacks the key.
 */
export function chunkForSend(store: KvcStore, location: LocationName): (key: string) => Promise<OutgoingChunk | null> {
  const cpu = location === 'LocalCPUBackend' ? store.cpu() : undefined;
  if (cpu) {
    const holds = transferHolds(store);
    return async (key) => {
      if (!holds.hold(key, location)) return null;
      const bytes = cpu.peek(key);
      if (!bytes) {
        holds.release(key, location);
        return null;
      }
      return { bytes, release: () => holds.release(key, location) };
    };
  }
  return async (key) => {
    const bytes = await store.get(key, undefined, location);
    return bytes ? { bytes } : null;
  };
}
