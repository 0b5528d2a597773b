// Wire protocol of the xfer library (prefiller's src/xfer/sender.ts ↔ decoder's
// src/xfer/receiver.ts): length-prefixed frames over raw TCP, on two ports of the receiver
// (init: HELLO, DATA, CANCEL and their replies; alloc: ALLOC, CANCEL and their replies).
//
// Frame = 12-byte header | meta (msgpack map) | body (raw bytes, may be empty)
//   0 u16 magic 0x5846 ('XF')   2 u8 protocol version   3 u8 frame type
//   4 u32 meta length            8 u32 body length
//
// Chunk bytes travel as the body of a DATA frame exactly as they sit in memory (the sealed
// chunk of src/common/chunk.ts, header + payload). The writer hands header+meta and the
// chunk buffer to the socket as two writes under cork() (one writev, no concatenation); the
// reader (src/protocol/frame_reader.ts) copies the body straight into the receiver's reserved
// slot and hashes it on the way. Each meta is described once below as a zod schema; its type is
// derived from it.
import type { Socket } from 'node:net';
import { decode, encode } from '@msgpack/msgpack';
import { z } from 'zod';
import { CHUNK_KEY_PATTERN } from '../common/keys.js';
import type { StreamHash } from '../common/stream_hash.js';
import { FrameReader, ProtocolError, type FrameHead, type FrameLayout } from './frame_reader.js';

export { ProtocolError } from './frame_reader.js';

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

export const helloMetaSchema = z.object({
  version: z.number(),
  sender_id: z.string(),
  model_id: z.string(),
  chunk_size: z.number(),
  /** DType code of src/common/chunk.ts */
  dtype: z.number(),
  num_layers: z.number(),
  num_kv_heads: z.number(),
  head_dim: z.number(),
  /** With a deployment secret: the sender's clock (ms), a random nonce and the seal's tag (src/common/replay.ts, channel "xfer-hello"). */
  ts: z.number().optional(),
  nonce: z.string().optional(),
  auth: z.string().optional(),
});
export type HelloMeta = z.infer<typeof helloMetaSchema>;

export const helloReplyMetaSchema = z.object({
  ok: z.boolean(),
  session: z.string().optional(),
  receiver_id: z.string().optional(),
  error: z.string().optional(),
});
export type HelloReplyMeta = z.infer<typeof helloReplyMetaSchema>;

// The receiver checks what it alone knows on top of these: that the session is live and that
// each chunk size fits its layout.
export const allocMetaSchema = z.object({
  id: z.number('expected a number'),
  session: z.string('expected a string'),
  req_id: z.string('expected a non-empty string').min(1, 'expected a non-empty string'),
  /** [key, chunk bytes] in prompt order */
  chunks: z
    .array(
      z.tuple([z.string().regex(CHUNK_KEY_PATTERN, 'expected a 16-digit lowercase hex chunk key'), z.number().int('expected an integer number of bytes')], 'expected [key, bytes]'),
      'expected a non-empty array of [key, bytes]',
    )
    .min(1, 'expected a non-empty array of [key, bytes]'),
  /** how long the sender is willing to wait for buffer space */
  wait_ms: z.number('expected a number >= 0').min(0, 'expected a number >= 0'),
});
export type AllocMeta = z.infer<typeof allocMetaSchema>;

export const allocReplyMetaSchema = z.object({
  id: z.number(),
  ok: z.boolean(),
  /** keys the receiver already holds (or is already receiving): do not send them */
  have: z.array(z.string()).optional(),
  error: z.string().optional(),
});
export type AllocReplyMeta = z.infer<typeof allocReplyMetaSchema>;

export const dataMetaSchema = z.object({ req_id: z.string(), key: z.string() });
export type DataMeta = z.infer<typeof dataMetaSchema>;

export const cancelMetaSchema = z.object({ session: z.string(), req_id: z.string() });
export type CancelMeta = z.infer<typeof cancelMetaSchema>;

export const ackMetaSchema = z.object({ req_id: z.string(), key: z.string(), ok: z.boolean(), error: z.string().optional() });
export type AckMeta = z.infer<typeof ackMetaSchema>;

/** `field: problem` of the first issue of a meta that failed its schema. */
export function describeMeta(e: z.ZodError): string {
  const i = e.issues[0]!;
  return `${i.path.join('.') || '(meta)'}: ${i.message}`;
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

/** The xfer framing for FrameReader: magic and version checked, meta a msgpack map. */
export const XFER_FRAMES: FrameLayout<any> = {
  headBytes: FRAME_HEADER_BYTES,
  readHead(head: Buffer): FrameHead {
    if (head.readUInt16LE(0) !== FRAME_MAGIC) throw new ProtocolError('not an xfer peer (bad frame magic)');
    const ver = head.readUInt8(2);
    if (ver !== PROTOCOL_VERSION) throw new ProtocolError(`unsupported xfer protocol version ${ver} (this build speaks ${PROTOCOL_VERSION})`);
    return { type: head.readUInt8(3), metaLen: head.readUInt32LE(4), bodyLen: head.readUInt32LE(8) };
  },
  decodeMeta(bytes: Buffer): any {
    if (bytes.length === 0) return {};
    let m: unknown;
    try {
      m = decode(bytes);
    } catch (e) {
      throw new ProtocolError(`frame meta is not valid msgpack (${(e as Error).message})`);
    }
    if (m === null || typeof m !== 'object' || Array.isArray(m)) throw new ProtocolError('frame meta must be a msgpack map');
    return m;
  },
};

/**
 * Where a frame's body goes. The receiver returns its reserved slot for DATA frames so the
 * bytes are copied once, socket buffer → slot; returning null discards the body (the frame
 * handler still runs and learns the body was dropped).
 */
export type BodySink = (type: FrameType, meta: any, bodyLen: number) => Uint8Array | null;
export type FrameHandler = (type: FrameType, meta: any, body: Uint8Array | null, bodyLen: number, digest: bigint | null) => void;

/**
 * FrameReader over the xfer framing for one connection, with the size limits of the protocol:
 * meta at most MAX_META_BYTES, body at most `maxBody`. `hashFrom` and `hasher` are the hashing
 * hooks of FrameReader (the receiver hashes a DATA body's payload, past the chunk header, in place).
 * push() throws ProtocolError on malformed input (the caller closes the connection).
 */
export class FrameParser extends FrameReader<any> {
  constructor(
    maxBody: number,
    sink: BodySink,
    onFrame: FrameHandler,
    hashFrom?: (type: FrameType, meta: any) => number | null,
    hasher?: (body: Uint8Array) => StreamHash,
  ) {
    super(XFER_FRAMES, {
      refuse: (h) =>
        h.metaLen > MAX_META_BYTES ? `frame meta of ${h.metaLen} bytes exceeds ${MAX_META_BYTES}` : h.bodyLen > maxBody ? `frame body of ${h.bodyLen} bytes exceeds ${maxBody}` : null,
      sink,
      hashFrom,
      ...(hasher ? { hasher } : {}),
      onFrame,
    });
  }
}
