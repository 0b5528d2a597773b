// Peer-to-peer chunk transfer between cache instances over `distributed_url`, for a controller
// move/copy: src/kvc/worker_peer.ts is both the sender (sendChunks) and the receiver
// (startPeerServer). Chunk bytes of a move never pass through the controller.
//
// Wire format, both directions: frames of  u32le body_length | u8 type | body.
//   sender → receiver  HELLO (1)  msgpack {v, location, count, from}
//                      CHUNK (2)  16 ASCII hex key digits + the chunk buffer (header + payload)
//                      COMMIT (3) msgpack {count, pinned?}  after the last ACK; `pinned`: a
//                                 bitmap over the transfer's chunks in sent order, those to stay
//                                 pinned at the receiver (a move carries the source's pins)
//   receiver → sender  HELLO_OK (0x81)  msgpack {ok, error?}  (also carries a refusal at any point)
//                      ACK (0x82)       msgpack {key, ok, error?}  once the chunk is STORED
//                      COMMIT_OK (0x83) msgpack {ok, stored, missing, first_missing}
// P2P pull (an engine that missed a prefix fetches it from a holder; docs/p2p.md), same port:
//   requester → holder FETCH (4)        msgpack {v, from, ts, nonce, auth?, keys, keep?}  (the only frame it sends)
//   holder → requester CHUNK (2)        one per key, in order, up to the first key it lacks
//                      FETCH_END (0x84) msgpack {ok, sent, error?, keep?}  then the holder closes,
//                                       unless the FETCH asked to `keep` the connection and the
//                                       fetch was served: then FETCH_END says `keep: true` and the
//                                       holder reads the next FETCH on it (one at a time)
//   requester → holder FETCH_STOP (5)   msgpack {}  on a kept connection, when the requester's time
//                                       bound has passed: the holder stops after the chunk it is
//                                       writing and sends FETCH_END; one that arrives after the
//                                       FETCH_END (they crossed) is ignored
// Control bodies are small msgpack maps described once below (zod); CHUNK bodies are binary and
// are never parsed beyond the chunk header (the reader hashes the payload as it arrives).
import { decode, encode } from '@msgpack/msgpack';
import { z } from 'zod';
import { CHUNK_KEY_CHARS } from '../common/keys.js';
import { HEADER_BYTES } from '../common/chunk.js';
import { ProtocolError, type FrameHead, type FrameLayout } from './frame_reader.js';

export const PEER_PROTOCOL_VERSION = 1;

export const PeerFrame = {
  Hello: 1,
  Chunk: 2,
  Commit: 3,
  Fetch: 4,
  FetchStop: 5,
  HelloOk: 0x81,
  Ack: 0x82,
  CommitOk: 0x83,
  FetchEnd: 0x84,
} as const;

/** Most keys one FETCH may ask for (a 64 KiB control frame holds about 3,500 hex keys). */
export const P2P_MAX_FETCH_KEYS = 2048;

export const PEER_FRAME_HEAD = 5;
/** Offset of the chunk payload inside a CHUNK body (key digits, then the chunk header). */
export const PEER_PAYLOAD_AT = CHUNK_KEY_CHARS + HEADER_BYTES;
/** Absolute upper bound of one frame body (a Buffer cannot be larger). */
export const PEER_MAX_BODY = 2 ** 31 - 1;
/** Upper bound of a control frame body (HELLO, COMMIT and every reply). */
export const MAX_CONTROL_BODY = 64 * 1024;

export const peerHelloSchema = z.object({ v: z.number(), location: z.string(), count: z.number().int().min(0), from: z.string() });
export type PeerHello = z.infer<typeof peerHelloSchema>;
export const peerCommitSchema = z.object({ count: z.number().int().min(0), pinned: z.instanceof(Uint8Array).optional() });
export type PeerCommit = z.infer<typeof peerCommitSchema>;
export const peerHelloOkSchema = z.object({ ok: z.boolean(), error: z.string().optional() });
export type PeerHelloOk = z.infer<typeof peerHelloOkSchema>;
export const peerAckSchema = z.object({ key: z.string(), ok: z.boolean(), error: z.string().optional() });
export type PeerAck = z.infer<typeof peerAckSchema>;
export const peerCommitOkSchema = z.object({ ok: z.boolean(), stored: z.number(), missing: z.number(), first_missing: z.array(z.string()) });
export type PeerCommitOk = z.infer<typeof peerCommitOkSchema>;

/**
 * FETCH: the chunks `keys` (consecutive chunk keys of one prompt), in order. `ts` (the sender's
 * clock, ms) and `nonce` make it unique; `auth` is the seal's tag over the whole frame when the
 * deployment has a secret (src/common/replay.ts, channel "p2p-fetch").
 */
export const peerFetchSchema = z.object({
  v: z.number(),
  from: z.string().min(1).max(200),
  ts: z.number(),
  nonce: z.string().min(16).max(64),
  auth: z.string().optional(),
  keys: z.array(z.string().regex(/^[0-9a-f]{16}$/, 'expected a 16-digit lowercase hex chunk key')).min(1).max(P2P_MAX_FETCH_KEYS),
  /** Keep the connection open after FETCH_END for the requester's next FETCH (docs/p2p.md "Connection reuse"). */
  keep: z.boolean().optional(),
});
export type PeerFetch = z.infer<typeof peerFetchSchema>;
/** FETCH_END: `sent` CHUNK frames preceded it; ok false with `error` when the fetch was refused; `keep`: the connection stays open for the next FETCH. */
export const peerFetchEndSchema = z.object({ ok: z.boolean(), sent: z.number().int().min(0), error: z.string().optional(), keep: z.boolean().optional() });
export type PeerFetchEnd = z.infer<typeof peerFetchEndSchema>;

/** FETCH_STOP: no fields. */
export const peerFetchStopSchema = z.object({});
export type PeerFetchStop = z.infer<typeof peerFetchStopSchema>;

type PeerControl = {
  [PeerFrame.Hello]: PeerHello;
  [PeerFrame.Commit]: PeerCommit;
  [PeerFrame.Fetch]: PeerFetch;
  [PeerFrame.FetchStop]: PeerFetchStop;
  [PeerFrame.HelloOk]: PeerHelloOk;
  [PeerFrame.Ack]: PeerAck;
  [PeerFrame.CommitOk]: PeerCommitOk;
  [PeerFrame.FetchEnd]: PeerFetchEnd;
};

/** A control frame (HELLO, COMMIT or a reply): head + msgpack body. */
export function peerControlFrame<T extends keyof PeerControl>(type: T, msg: PeerControl[T]): Buffer {
  const body = encode(msg);
  const head = Buffer.allocUnsafe(PEER_FRAME_HEAD);
  head.writeUInt32LE(body.byteLength, 0);
  head.writeUInt8(type, 4);
  return Buffer.concat([head, body]);
}

/** Head + key of a CHUNK frame; the chunk bytes follow as a separate write (no copy). */
export function peerChunkHead(key: string, chunkBytes: number): Buffer {
  const head = Buffer.allocUnsafe(PEER_FRAME_HEAD + CHUNK_KEY_CHARS);
  head.writeUInt32LE(CHUNK_KEY_CHARS + chunkBytes, 0);
  head.writeUInt8(PeerFrame.Chunk, 4);
  head.write(key, PEER_FRAME_HEAD, 'latin1');
  return head;
}

/** Splits a CHUNK body into its key and its chunk bytes (views, no copy). */
export function splitChunkBody(body: Uint8Array): { key: string; chunk: Uint8Array } {
  return { key: Buffer.from(body.buffer, body.byteOffset, CHUNK_KEY_CHARS).toString('latin1'), chunk: body.subarray(CHUNK_KEY_CHARS) };
}

/**
 * Decodes a control body against its schema. Returns the message, or a reason naming the bad
 * field (`malformed HELLO: location: …`).
 */
export function decodePeerControl<S extends z.ZodType>(schema: S, what: string, body: Uint8Array): { ok: true; msg: z.infer<S> } | { ok: false; error: string } {
  let raw: unknown;
  try {
    raw = decode(body);
  } catch {
    return { ok: false, error: `malformed ${what}` };
  }
  const r = schema.safeParse(raw);
  if (r.success) return { ok: true, msg: r.data };
  const i = r.error.issues[0]!;
  return { ok: false, error: `malformed ${what}: ${i.path.join('.') || '(body)'}: ${i.message}` };
}

/** The peer framing for FrameReader: no meta segment, the body is everything after the head. */
export const PEER_FRAMES: FrameLayout<null> = {
  headBytes: PEER_FRAME_HEAD,
  readHead(head: Buffer): FrameHead {
    return { bodyLen: head.readUInt32LE(0), type: head.readUInt8(4), metaLen: 0 };
  },
  decodeMeta: () => null,
};

/**
 * The same framing, read with a CHUNK frame's 16 key digits as its meta: the body a reader's sink
 * is asked for is then the chunk alone, and the sink knows its key, so the bytes can land where the
 * chunk will live (a reserved slot of the CPU tier, src/kvc/peer_receive.ts). The wire is unchanged.
 * A CHUNK frame too short to hold a key and a chunk header is refused from its header.
 */
export const PEER_KEYED_FRAMES: FrameLayout<string | null> = {
  headBytes: PEER_FRAME_HEAD,
  readHead(head: Buffer): FrameHead {
    const len = head.readUInt32LE(0);
    const type = head.readUInt8(4);
    if (type !== PeerFrame.Chunk) return { bodyLen: len, type, metaLen: 0 };
    if (len < PEER_PAYLOAD_AT) throw new ProtocolError(`CHUNK frame of ${len} bytes is shorter than a key and a chunk header (${PEER_PAYLOAD_AT} bytes)`);
    return { bodyLen: len - CHUNK_KEY_CHARS, type, metaLen: CHUNK_KEY_CHARS };
  },
  decodeMeta: (bytes) => (bytes.length ? bytes.toString('latin1') : null),
};
