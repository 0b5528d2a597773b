// One streaming reader for the length-prefixed binary framings between processes: the xfer
// frames (src/protocol/xfer_frames.ts) and the peer frames of a controller move
// (src/protocol/peer_frames.ts). A framing is described by a FrameLayout (header size and how a
// header reads); the reader does the rest the same way for both:
//   - header → `refuse` is asked before any buffer is reserved for the body (size limits,
//     frames out of order), so a hostile length never allocates;
//   - meta (xfer frames only) is decoded by the layout;
//   - the body goes into the buffer `sink` returns (a reserved pool slot, a reused scratch buffer),
//     or is dropped when it returns null. Fed by push() (socket 'data' events), it is copied once
//     from the socket's buffer; fed by readBuffer()/readDone() (a socket's `onread` option), the
//     socket reads it straight into that buffer and only the few bytes that arrive in the same read
//     as the frame's header are copied;
//   - the hashing hook: `hashFrom` names the body offset from which the bytes are hashed (xxh64)
//     as they arrive, still hot in cache, so the receiver verifies a 32 MiB chunk without a second
//     pass over it (verifyStreamed in src/common/chunk.ts); `hasher` may hash them where they lie
//     (src/common/slot_arena.ts) instead of through a copy;
//   - a frame handler may return a promise: reading stops until it settles (the caller pauses
//     its socket), later data waits in a backlog.
// Binary payloads are never parsed here; only headers and meta.
import { copyingHash, type StreamHash } from '../common/stream_hash.js';

export class ProtocolError extends Error {
  override name = 'ProtocolError';
}

export interface FrameHead {
  type: number;
  metaLen: number;
  bodyLen: number;
}

export interface FrameLayout<M> {
  /** Bytes of the fixed header. */
  readonly headBytes: number;
  /** Reads a complete header; throws ProtocolError when it is not one. */
  readHead(head: Buffer): FrameHead;
  /** Decodes the meta bytes (called with an empty buffer when the frame has none). */
  decodeMeta(bytes: Buffer): M;
}

export interface FrameHooks<M> {
  /** Why a frame whose header just arrived is not acceptable, or null. Asked before any body buffer is reserved. */
  refuse?(head: FrameHead): string | null;
  /** Where the body goes: a buffer of at least bodyLen bytes, or null to drop it. */
  sink(type: number, meta: M, bodyLen: number): Uint8Array | null;
  /** The hashing hook: offset in the body from which its bytes are hashed as they arrive, or null for no hash. Asked only for a body that is kept. */
  hashFrom?(type: number, meta: M): number | null;
  /** How pieces of this body (as returned by sink) are hashed; default: by copying (xxhash-wasm). */
  hasher?(body: Uint8Array): StreamHash;
  /** A complete frame. `digest` is the xxh64 of the body from `hashFrom` on, or null. */
  onFrame(type: number, meta: M, body: Uint8Array | null, bodyLen: number, digest: bigint | null): void | Promise<void>;
  /** Errors raised while replaying data held back during an asynchronous handler (push() throws the others). */
  onError?(e: Error): void;
}

const EMPTY = Buffer.alloc(0);
/** Reads that carry headers and meta (and bodies nobody keeps) land in a reused buffer of this size. */
const SCRATCH_BYTES = 64 * 1024;
/**
 * Most bytes one read may put straight into a body. libuv reads a ready socket up to 32 times in a
 * row while each read fills its buffer, and all of that work (the kernel's copy, first-touch page
 * faults of a fresh slot, the hash) runs before the event loop can do anything else, e.g. a
 * decoder's next step. 256 KiB bounds a turn at 8 MiB: ~3 ms with warm slots here (the decoder's
 * bound between steps is 50 ms, docs/disaggregation.md), while a read costs a system call and a
 * callback (~5–10 µs): at Node's own 64 KiB a 32 MiB chunk took 512 of them, ~0.15 s of CPU per GB.
 */
export const MAX_DIRECT_READ = 256 * 1024;

/** Incremental reader for one connection: feed it every 'data' buffer. */
export class FrameReader<M> {
  private readonly head: Buffer;
  private headFill = 0;
  private state: 'head' | 'meta' | 'body' = 'head';
  private type = 0;
  private metaLen = 0;
  private bodyLen = 0;
  private metaBuf: Buffer | null = null;
  private metaFill = 0;
  private meta: M | null = null;
  private body: Uint8Array | null = null;
  private bodyFill = 0;
  private hashAt = -1;
  private hasher: StreamHash | null = null;
  /** Pull mode: the reused buffer for reads outside a kept body, and what readBuffer() lent last. */
  private scratch: Buffer | null = null;
  private lent: 'scratch' | 'body' = 'scratch';
  private busy = false;
  private stopped = false;
  private backlog: Buffer[] = [];
  private whenIdle: (() => void) | null = null;

  constructor(
    private readonly layout: FrameLayout<M>,
    private readonly hooks: FrameHooks<M>,
  ) {
    this.head = Buffer.alloc(layout.headBytes);
  }

  /** True when a frame has been started but not finished (a cut here means a truncated transfer). */
  get midFrame(): boolean {
    return this.state !== 'head' || this.headFill > 0;
  }

  /** True while an asynchronous frame handler runs (its body buffer is still being read). */
  get handling(): boolean {
    return this.busy;
  }

  /**
   * Stops reading: later data is ignored and held-back data dropped. `then` runs once no frame
   * handler is running any more (at once when none is), e.g. to give a reused buffer back.
   */
  stop(then?: () => void): void {
    this.stopped = true;
    this.backlog = [];
    if (!this.busy) then?.();
    else this.whenIdle = then ?? null;
  }

  /**
   * Pull mode (a socket's `onread.buffer`): where the next read should land. Inside a body that
   * is kept, the next (at most MAX_DIRECT_READ) bytes of that body itself — the kernel writes them
   * into their final place and never past the frame; elsewhere a reused scratch buffer. Pair every
   * call with readDone().
   */
  readBuffer(): Uint8Array {
    if (this.state === 'body' && this.body && !this.busy && !this.stopped && this.bodyFill < this.bodyLen) {
      this.lent = 'body';
      return this.body.subarray(this.bodyFill, Math.min(this.bodyLen, this.bodyFill + MAX_DIRECT_READ));
    }
    this.lent = 'scratch';
    return (this.scratch ??= Buffer.allocUnsafe(SCRATCH_BYTES));
  }

  /** Pull mode (a socket's `onread.callback`): `n` bytes arrived in the last readBuffer(). Throws like push(). */
  readDone(n: number): void {
    if (this.stopped || n <= 0) return;
    if (this.lent === 'scratch') return this.push(this.scratch!.subarray(0, n));
    try {
      this.bodyArrived(n);
      if (this.bodyFill === this.bodyLen) this.finishFrame(); // later bytes are read into scratch anyway
    } catch (e) {
      this.stopped = true;
      throw e;
    }
  }

  /** Consumes one piece of the stream. Throws ProtocolError (and stops) on malformed input. */
  push(data: Buffer): void {
    if (this.stopped) return;
    if (this.busy) {
      this.backlog.push(data.buffer === this.scratch?.buffer ? Buffer.from(data) : data); // pull mode reuses scratch
      return;
    }
    try {
      this.consume(data);
    } catch (e) {
      this.stopped = true;
      throw e;
    }
  }

  private consume(buf: Buffer): void {
    let off = 0;
    while (off < buf.length) {
      if (this.state === 'head') {
        const hb = this.layout.headBytes;
        const n = Math.min(hb - this.headFill, buf.length - off);
        buf.copy(this.head, this.headFill, off, off + n);
        this.headFill += n;
        off += n;
        if (this.headFill < hb) return;
        this.headFill = 0;
        const h = this.layout.readHead(this.head);
        const refused = this.hooks.refuse?.(h) ?? null;
        if (refused) throw new ProtocolError(refused);
        this.type = h.type;
        this.metaLen = h.metaLen;
        this.bodyLen = h.bodyLen;
        this.metaBuf = h.metaLen ? Buffer.allocUnsafe(h.metaLen) : null;
        this.metaFill = 0;
        this.state = 'meta';
        if (this.metaLen === 0 && this.finishMeta()) return this.holdBack(buf, off);
        continue;
      }
      if (this.state === 'meta') {
        const n = Math.min(this.metaLen - this.metaFill, buf.length - off);
        buf.copy(this.metaBuf!, this.metaFill, off, off + n);
        this.metaFill += n;
        off += n;
        if (this.metaFill === this.metaLen && this.finishMeta()) return this.holdBack(buf, off);
        continue;
      }
      // body
      const n = Math.min(this.bodyLen - this.bodyFill, buf.length - off);
      if (this.body) this.body.set(buf.subarray(off, off + n), this.bodyFill);
      this.bodyArrived(n);
      off += n;
      if (this.bodyFill === this.bodyLen && this.finishFrame()) return this.holdBack(buf, off);
    }
  }

  /** `n` more body bytes are in place (copied, or read straight into the body): hash them, count them. */
  private bodyArrived(n: number): void {
    if (this.body && this.hasher) {
      // Hash the part of what just arrived that lies past hashAt, where it lies (still in cache).
      const from = Math.max(this.bodyFill, this.hashAt);
      if (from < this.bodyFill + n) this.hasher.update(this.body.subarray(from, this.bodyFill + n));
    }
    this.bodyFill += n;
  }

  /** Meta complete: decode it, ask for the body's buffer. Returns true when reading must wait (async handler). */
  private finishMeta(): boolean {
    const meta = this.layout.decodeMeta(this.metaBuf ?? EMPTY);
    this.metaBuf = null;
    this.meta = meta;
    this.bodyFill = 0;
    this.hasher = null;
    this.body = this.bodyLen > 0 ? this.hooks.sink(this.type, meta, this.bodyLen) : null;
    if (this.body && this.body.byteLength < this.bodyLen) throw new ProtocolError('body sink returned a buffer smaller than the body');
    if (this.body && this.hooks.hashFrom) {
      const at = this.hooks.hashFrom(this.type, meta);
      if (at !== null) {
        this.hashAt = at;
        this.hasher = this.hooks.hasher?.(this.body) ?? copyingHash();
      }
    }
    this.state = 'body';
    return this.bodyLen === 0 ? this.finishFrame() : false;
  }

  /** Frame complete: hand it over. Returns true when the handler is asynchronous. */
  private finishFrame(): boolean {
    const { type, meta, body, bodyLen } = this;
    const digest = this.hasher ? this.hasher.digest() : null;
    this.state = 'head';
    this.body = null;
    this.meta = null;
    this.hasher = null;
    const r = this.hooks.onFrame(type, meta as M, body ? body.subarray(0, bodyLen) : null, bodyLen, digest);
    if (!(r instanceof Promise)) return false;
    this.busy = true;
    void r.then(() => this.resume(), () => this.resume());
    return true;
  }

  /** Keeps the unread rest of `buf` for when the running handler settles. */
  private holdBack(buf: Buffer, off: number): void {
    // (a copy when it is the scratch buffer of pull mode: the next read reuses it)
    if (off < buf.length) this.backlog.unshift(buf.buffer === this.scratch?.buffer ? Buffer.from(buf.subarray(off)) : buf.subarray(off));
  }

  private resume(): void {
    this.busy = false;
    if (this.stopped) {
      const then = this.whenIdle;
      this.whenIdle = null;
      then?.();
      return;
    }
    const queued = this.backlog;
    this.backlog = [];
    for (let i = 0; i < queued.length; i++) {
      if (this.busy) {
        // Another asynchronous frame: keep the rest, in order, for its turn.
        this.backlog.push(...queued.slice(i));
        return;
      }
      try {
        this.push(queued[i]!);
      } catch (e) {
        this.hooks.onError?.(e as Error);
        return;
      }
    }
  }
}
