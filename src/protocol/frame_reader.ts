// One streaming reader for the length-prefixed binary framings between processes: the xfer
// frames (src/protocol/xfer_frames.ts) and the peer frames of a controller move
// (src/protocol/peer_frames.ts). A framing is described by a FrameLayout (header size and how a
// header reads); the reader does the rest the same way for both:
//   - header → `refuse` is asked before any buffer is reserved for the body (size limits,
//     frames out of order), so a hostile length never allocates;
//   - meta (xfer frames only) is decoded by the layout;
//   - the body is copied once, from the socket's buffer straight into the buffer `sink` returns
//     (a reserved pool slot, a reused scratch buffer), or dropped when it returns null;
//   - the hashing hook: `hashFrom` names the body offset from which the bytes are hashed (xxh64)
//     while they are copied, still hot in cache, so the receiver verifies a 32 MiB chunk without a
//     second pass over it (verifyStreamed in src/common/chunk.ts);
//   - a frame handler may return a promise: reading stops until it settles (the caller pauses
//     its socket), later data waits in a backlog.
// Binary payloads are never parsed here; only headers and meta.
import xxhash from 'xxhash-wasm';

const { create64 } = await xxhash();

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
  /** A complete frame. `digest` is the xxh64 of the body from `hashFrom` on, or null. */
  onFrame(type: number, meta: M, body: Uint8Array | null, bodyLen: number, digest: bigint | null): void | Promise<void>;
  /** Errors raised while replaying data held back during an asynchronous handler (push() throws the others). */
  onError?(e: Error): void;
}

const EMPTY = Buffer.alloc(0);

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
  private hasher: ReturnType<typeof create64> | null = null;
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

  /** Consumes one piece of the stream. Throws ProtocolError (and stops) on malformed input. */
  push(data: Buffer): void {
    if (this.stopped) return;
    if (this.busy) {
      this.backlog.push(data);
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
      const body = this.body;
      if (body) {
        body.set(buf.subarray(off, off + n), this.bodyFill);
        if (this.hasher) {
          // Hash the part of what was just copied that lies past hashAt, from the copy (still in cache).
          const from = Math.max(this.bodyFill, this.hashAt);
          if (from < this.bodyFill + n) this.hasher.update(body.subarray(from, this.bodyFill + n));
        }
      }
      this.bodyFill += n;
      off += n;
      if (this.bodyFill === this.bodyLen && this.finishFrame()) return this.holdBack(buf, off);
    }
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
        this.hasher = create64();
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
    if (off < buf.length) this.backlog.unshift(buf.subarray(off));
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
