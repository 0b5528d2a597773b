// Wire protocol of the xfer library (DESIGN §6): length-prefixed frames over raw TCP.
//
// Frame = 12-byte header | meta (msgpack map) | body (raw bytes, may be empty)
//   0 u16 magic 0x5846 ('XF')   2 u8 protocol version   3 u8 frame type
//   4 u32 meta length            8 u32 body length
//
// Chunk bytes travel as the body of a DATA frame exactly as they sit in memory (the sealed
// chunk of src/common/chunk.ts, header + payload). The writer hands header+meta and the
// chunk buffer to the socket as two writes under cork() (one writev, no concatenation);
// the reader copies the body straight into the receiver's reserved slot.
import type { Socket } from 'node:net';
import { encode, decode } from '@msgpack/msgpack';

export const FRAME_MAGIC = 0x5846;
export const PROTOCOL_VERSION = 1;
export const FRAME_HEADER_BYTES = 12;
/** Meta is small (keys, ids); anything bigger is a broken or hostile peer. */
export const MAX_META_BYTES = 4 << 20;

export enum FrameType {
  /** sender → receiver init port: identify and describe the KV layout. */
  Hello = 1,
  /** receiver → sender: accepted ({session}) or refused ({error}). */
  HelloReply = 2,
  /** sender → receiver alloc port: reserve space for a request's chunks. */
  Alloc = 3,
  /** receiver → sender: reservation made ({have}) or not ({error}). */
  AllocReply = 4,
  /** sender → receiver init port: one chunk for a reservation; body = chunk bytes. */
  Data = 5,
  /** receiver → sender: chunk stored and verified, or rejected ({error}). */
  Ack = 6,
  /**
   * sender → receiver, no reply. On the init port (after the request's last DATA frame, same
   * stream): no more chunks will come for `req_id`; the chunks it reserved and never sent are
   * discarded so nobody waits for them. On the alloc port (after an ALLOC whose answer did not
   * come in time): withdraw that ALLOC, queued or granted.
   */
  Cancel = 7,
}

export interface HelloMeta {
  version: number;
  sender_id: string;
  model_id: string;
  chunk_size: number;
  /** DType code of src/common/chunk.ts */
  dtype: number;
  num_layers: number;
  num_kv_heads: number;
  head_dim: number;
}
export interface HelloReplyMeta {
  ok: boolean;
  session?: string;
  receiver_id?: string;
  error?: string;
}
export interface AllocMeta {
  id: number;
  session: string;
  req_id: string;
  /** [key, chunk bytes] in prompt order */
  chunks: [string, number][];
  /** how long the sender is willing to wait for buffer space */
  wait_ms: number;
}
export interface AllocReplyMeta {
  id: number;
  ok: boolean;
  /** keys the receiver already holds (or is already receiving): do not send them */
  have?: string[];
  error?: string;
}
export interface DataMeta {
  req_id: string;
  key: string;
}
export interface CancelMeta {
  session: string;
  req_id: string;
}
export interface AckMeta {
  req_id: string;
  key: string;
  ok: boolean;
  error?: string;
}

export class ProtocolError extends Error {
  override name = 'ProtocolError';
}

/**
 * Writes one frame. Returns false when the socket's buffer is over its high-water mark
 * (the caller should wait for 'drain' before writing more).
 */
export function writeFrame(sock: Socket, type: FrameType, meta: object, body?: Uint8Array): boolean {
  const m = encode(meta);
  const head = Buffer.allocUnsafe(FRAME_HEADER_BYTES + m.byteLength);
  head.writeUInt16LE(FRAME_MAGIC, 0);
  head.writeUInt8(PROTOCOL_VERSION, 2);
  head.writeUInt8(type, 3);
  head.writeUInt32LE(m.byteLength, 4);
  head.writeUInt32LE(body?.byteLength ?? 0, 8);
  head.set(m, FRAME_HEADER_BYTES);
  if (!body || body.byteLength === 0) return sock.write(head);
  sock.cork();
  sock.write(head);
  const ok = sock.write(body);
  sock.uncork();
  return ok;
}

/**
 * Where a frame's body goes. The receiver returns its reserved slot for DATA frames so the
 * bytes are copied once, socket buffer → slot; returning null discards the body (the frame
 * handler still runs and learns the body was dropped).
 */
export type BodySink = (type: FrameType, meta: any, bodyLen: number) => Uint8Array | null;
export type FrameHandler = (type: FrameType, meta: any, body: Uint8Array | null, bodyLen: number) => void;

/**
 * Incremental frame parser for one connection. Feed it every 'data' buffer; it calls
 * `onFrame` for each complete frame. Throws ProtocolError on malformed input (the caller
 * closes the connection).
 */
export class FrameParser {
  private head = Buffer.alloc(FRAME_HEADER_BYTES);
  private headFill = 0;
  private meta: Buffer | null = null;
  private metaFill = 0;
  private type: FrameType = FrameType.Hello;
  private metaLen = 0;
  private bodyLen = 0;
  private metaObj: any = null;
  private body: Uint8Array | null = null;
  private bodyFill = 0;
  private state: 'head' | 'meta' | 'body' = 'head';
  /**
   * Optional per-frame observer of the body bytes as they arrive (set by the sink, cleared at
   * the end of the frame). The receiver hashes each piece while it is still in cache instead
   * of re-reading the whole chunk from memory afterwards.
   */
  tap: ((piece: Uint8Array, offset: number) => void) | null = null;

  constructor(
    private readonly maxBody: number,
    private readonly sink: BodySink,
    private readonly onFrame: FrameHandler,
  ) {}

  /** True when a frame has been started but not finished (a cut here means a truncated transfer). */
  get midFrame(): boolean {
    return this.state !== 'head' || this.headFill > 0;
  }

  /** The frame in progress, for reporting a cut transfer. */
  get current(): { type: FrameType; meta: any } | null {
    return this.state === 'body' ? { type: this.type, meta: this.metaObj } : null;
  }

  push(buf: Buffer): void {
    let off = 0;
    while (off < buf.length) {
      if (this.state === 'head') {
        const n = Math.min(FRAME_HEADER_BYTES - this.headFill, buf.length - off);
        buf.copy(this.head, this.headFill, off, off + n);
        this.headFill += n;
        off += n;
        if (this.headFill < FRAME_HEADER_BYTES) return;
        this.headFill = 0;
        if (this.head.readUInt16LE(0) !== FRAME_MAGIC) throw new ProtocolError('not an xfer peer (bad frame magic)');
        const ver = this.head.readUInt8(2);
        if (ver !== PROTOCOL_VERSION) throw new ProtocolError(`unsupported xfer protocol version ${ver} (this build speaks ${PROTOCOL_VERSION})`);
        this.type = this.head.readUInt8(3);
        this.metaLen = this.head.readUInt32LE(4);
        this.bodyLen = this.head.readUInt32LE(8);
        if (this.metaLen > MAX_META_BYTES) throw new ProtocolError(`frame meta of ${this.metaLen} bytes exceeds ${MAX_META_BYTES}`);
        if (this.bodyLen > this.maxBody) throw new ProtocolError(`frame body of ${this.bodyLen} bytes exceeds ${this.maxBody}`);
        this.meta = Buffer.allocUnsafe(this.metaLen);
        this.metaFill = 0;
        this.state = 'meta';
        if (this.metaLen === 0) this.finishMeta();
        continue;
      }
      if (this.state === 'meta') {
        const n = Math.min(this.metaLen - this.metaFill, buf.length - off);
        buf.copy(this.meta!, this.metaFill, off, off + n);
        this.metaFill += n;
        off += n;
        if (this.metaFill === this.metaLen) this.finishMeta();
        continue;
      }
      // body
      const n = Math.min(this.bodyLen - this.bodyFill, buf.length - off);
      if (this.body) this.body.set(buf.subarray(off, off + n), this.bodyFill);
      if (this.tap) this.tap(buf.subarray(off, off + n), this.bodyFill);
      this.bodyFill += n;
      off += n;
      if (this.bodyFill === this.bodyLen) this.finishFrame();
    }
  }

  private finishMeta(): void {
    try {
      this.metaObj = this.metaLen ? decode(this.meta!) : {};
    } catch (e) {
      throw new ProtocolError(`frame meta is not valid msgpack (${(e as Error).message})`);
    }
    if (this.metaObj === null || typeof this.metaObj !== 'object' || Array.isArray(this.metaObj)) {
      throw new ProtocolError('frame meta must be a msgpack map');
    }
    this.meta = null;
    this.bodyFill = 0;
    this.tap = null;
    this.body = this.bodyLen > 0 ? this.sink(this.type, this.metaObj, this.bodyLen) : null;
    if (this.body && this.body.byteLength < this.bodyLen) throw new ProtocolError('body sink returned a buffer smaller than the body');
    this.state = 'body';
    if (this.bodyLen === 0) this.finishFrame();
  }

  private finishFrame(): void {
    const { type, metaObj, body, bodyLen } = this;
    this.state = 'head';
    this.body = null;
    this.metaObj = null;
    this.tap = null;
    this.onFrame(type, metaObj, body ? body.subarray(0, bodyLen) : null, bodyLen);
  }
}

/** Resolves when the socket drains, rejects after `ms` or when it closes. */
export function waitDrain(sock: Socket, ms: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = (err?: Error) => {
      clearTimeout(t);
      sock.off('drain', onDrain);
      sock.off('close', onClose);
      err ? reject(err) : resolve();
    };
    const onDrain = () => done();
    const onClose = () => done(new Error('connection closed while sending'));
    const t = setTimeout(() => done(new Error(`peer did not read for ${ms} ms`)), ms);
    sock.on('drain', onDrain);
    sock.on('close', onClose);
  });
}
