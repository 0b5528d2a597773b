// The receiving side of one move or copy on the peer port: src/kvc/worker_peer.ts hands this every
// CHUNK of the transfer and its COMMIT (docs/controller.md, "Peer-to-peer transfer").
//
// Into the CPU tier (the common case) a chunk's bytes are read by the socket straight into the room
// reserved for them in the tier (LocalCPUBackend.reserve: evictions happen then, as for a put), hashed
// as they arrive, verified when complete and staged: not indexed, never served, not evictable, and
// counted against the capacity. COMMIT makes every staged chunk part of the tier at once (one
// synchronous pass: nothing else runs between two of them) and only then answers COMMIT_OK. A transfer
// that ends without its COMMIT (a refused chunk, a cut connection, a cancelled sender) gives every
// reservation back: the destination is left as it was. No receive buffer and no copy at commit.
//
// Into another location (the disk tier) there is no memory to reserve in: a chunk is read into the
// connection's receive buffer and stored (the socket paused meanwhile), then held (pinned) so the
// later chunks of the transfer cannot evict it. COMMIT checks that every one is still there. A
// transfer that ends without its COMMIT removes the chunks it added.
//
// A chunk the location already holds is not stored again: its bytes are dropped as they arrive,
// and it is held (pinned) until the transfer ends, so that it is still there at COMMIT.
import { describeLayout, sameLayout, verifyStreamed, type KvLayout } from '../common/chunk.js';
import { logger } from '../common/log.js';
import type { PeerCommitOk } from '../protocol/peer_frames.js';
import type { KvcStore } from './store.js';
import { transferHolds, type TransferHolds } from './transfer_holds.js';
import type { LocationName } from './types.js';

const log = logger('kvc.peer');

/** How many missing keys a COMMIT_OK names. */
const NAMED_MISSING = 8;

/** A reusable receive buffer (the disk path's): large enough for the body asked for. */
export interface ReceiveBuffer {
  take(len: number): Buffer;
}

interface Staged {
  key: string;
  slot: Uint8Array;
  length: number;
}

export class IncomingTransfer {
  private readonly holds: TransferHolds;
  private readonly toCpu: boolean;
  /** CPU tier: chunks complete and verified, waiting for COMMIT. */
  private staged: Staged[] = [];
  private readonly stagedKeys = new Set<string>();
  /** Chunks held (pinned) until the transfer ends: already present ones, and the disk path's stored ones. */
  private held: string[] = [];
  /** Disk path: chunks this transfer added (removed when it ends without COMMIT). */
  private added: string[] = [];
  /** CHUNK frames acknowledged as stored. */
  private acked = 0;
  /** The key of every CHUNK frame, in the order sent (COMMIT's pin bitmap indexes it). */
  private readonly sent: string[] = [];
  /** The current frame: its reserved slot, or why its body is not kept (null: dropped because held). */
  private slot: Uint8Array | null = null;
  private refusal: string | null = null;
  private ended = false;

  constructor(
    private readonly store: KvcStore,
    readonly location: LocationName,
    private readonly layout: KvLayout | null,
    private readonly scratch: ReceiveBuffer,
  ) {
    this.holds = transferHolds(store);
    this.toCpu = location === 'LocalCPUBackend';
  }

  /** Where the body of CHUNK `key` (`len` bytes) goes, or null to drop it as it arrives. */
  sink(key: string, len: number): Uint8Array | null {
    this.sent.push(key);
    this.slot = null;
    this.refusal = null;
    if (this.stagedKeys.has(key)) return null; // sent twice in one transfer: the first is staged
    if (this.holds.hold(key, this.location)) {
      this.held.push(key);
      return null;
    }
    if (!this.toCpu) return this.scratch.take(len);
    try {
      this.slot = this.store.reserveIncoming(len);
      return this.slot;
    } catch (e) {
      this.refusal = (e as Error).message;
      return null;
    }
  }

  /**
   * A complete CHUNK frame. Resolves to null when it is stored (or staged), else to the reason it
   * is refused (the ACK's error). Synchronous into the CPU tier; a promise into the disk tier.
   */
  chunk(key: string, body: Uint8Array | null, digest: bigint | null): string | null | Promise<string | null> {
    const slot = this.slot;
    this.slot = null;
    if (!body) {
      if (this.refusal !== null) return this.refused(key, this.refusal);
      this.acked++;
      return null;
    }
    try {
      if (digest === null) throw new Error('chunk arrived without its checksum computed');
      const h = verifyStreamed(body, key, digest);
      if (this.layout && !sameLayout(h, this.layout)) throw new Error(`chunk layout ${describeLayout(h)} does not match this instance's ${describeLayout(this.layout)}`);
    } catch (e) {
      if (slot) this.store.abortIncoming(slot);
      return this.refused(key, (e as Error).message);
    }
    if (slot) {
      if (this.ended) {
        this.store.abortIncoming(slot);
        return this.refused(key, 'the transfer has ended');
      }
      this.staged.push({ key, slot, length: body.byteLength });
      this.stagedKeys.add(key);
      this.acked++;
      return null;
    }
    return this.storeElsewhere(key, body);
  }

  /** The disk path: store, then hold until the transfer ends. */
  private async storeElsewhere(key: string, body: Uint8Array): Promise<string | null> {
    const loc = this.location;
    try {
      const had = this.store.has(key, loc);
      // A full location (everything else pinned, including this transfer's earlier chunks) throws
      // StoreFullError: the chunk is refused, the earlier ones stay until the transfer ends.
      await this.store.put(key, body, loc);
      if (!this.holds.hold(key, loc)) throw new Error(`chunk ${key} was evicted from ${loc} right after it was stored`);
      if (this.ended) {
        // The connection went away while the chunk was being stored: undo it like the others.
        this.holds.release(key, loc);
        if (!had) await this.store.remove(key, loc);
        return 'the transfer has ended';
      }
      this.held.push(key);
      if (!had) this.added.push(key);
      this.acked++;
      return null;
    } catch (e) {
      return this.refused(key, (e as Error).message);
    }
  }

  private refused(key: string, why: string): string {
    log.warn(`refused chunk ${key}: ${why}`);
    return why;
  }

  /**
   * COMMIT {count, pinned?}: when every chunk of the transfer is here, the staged ones join the tier
   * (those `pinned` marks, pinned) and the answer is ok; otherwise nothing is committed and the
   * transfer is undone. Ends the transfer.
   */
  commit(count: number, peerName: string, pinned?: Uint8Array): PeerCommitOk {
    const missing = this.held.filter((k) => !this.store.has(k, this.location));
    const ok = missing.length === 0 && this.acked === count;
    if (!ok) {
      log.warn(`peer ${peerName}: commit of ${count} chunk(s) into ${this.location} refused: ${this.acked} stored, ${missing.length} missing`);
      this.abort();
      return { ok, stored: this.acked, missing: missing.length, first_missing: missing.slice(0, NAMED_MISSING) };
    }
    for (const s of this.staged) this.store.commitIncoming(s.key, s.slot, s.length);
    this.staged = [];
    // A move carries the source's pins (docs/controller.md "Pins, moves and copies"): pinned here
    // before the holds are released, so they outlive them.
    if (pinned) {
      for (let i = 0; i < this.sent.length; i++) if ((pinned[i >> 3] ?? 0) & (1 << (i & 7))) this.holds.pin(this.sent[i]!, this.location);
    }
    this.added = [];
    this.release();
    return { ok, stored: this.acked, missing: 0, first_missing: [] };
  }

  /** The transfer ended without its COMMIT: reservations given back, chunks it added removed. */
  abort(): void {
    if (this.ended) return;
    for (const s of this.staged) this.store.abortIncoming(s.slot);
    this.staged = [];
    const added = this.added;
    this.added = [];
    this.release();
    for (const k of added) void this.store.remove(k, this.location).catch((e) => log.warn(`could not remove chunk ${k} of an uncommitted transfer from ${this.location}: ${(e as Error).message}`));
  }

  /** Gives back the current frame's reservation (the connection closed in the middle of it). */
  dropPending(): void {
    if (this.slot) this.store.abortIncoming(this.slot);
    this.slot = null;
  }

  private release(): void {
    this.ended = true;
    for (const k of this.held) this.holds.release(k, this.location);
    this.held = [];
    this.stagedKeys.clear();
  }
}
