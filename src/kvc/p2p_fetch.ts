// The requester side of a P2P pull (docs/p2p.md): connects to a holder's peer port, sends one
// FETCH for consecutive chunk keys and reads the CHUNK frames that come back, in order, until
// FETCH_END. Every chunk is verified as it arrives like every other hop (header, exact length,
// layout, key = the key asked for at that position, xxh64 payload checksum hashed while the bytes
// arrive); the first bad frame ends the fetch. Never rejects: the result says what arrived (all
// verified, usable) and why it stopped, so the caller computes the rest.
// The socket reads each chunk's bytes straight into the buffer the chunk is returned in (the
// `onread` option: no 64 KiB buffer per read for the GC to collect, no copy off the socket).
// With a connection pool (src/kvc/p2p_pool.ts) the fetch asks the holder to keep the connection
// and parks it after a clean FETCH_END; the next fetch from that holder starts on it, without a
// handshake. A pooled connection that turns out dead (closed, reset, or silent past a few of its
// measured round trips before any byte of the answer) is dropped and the fetch starts again on a
// fresh connection, within the same deadline.
import { chunkBytes, describeLayout, HEADER_BYTES, sameLayout, verifyStreamed, type KvLayout } from '../common/chunk.js';
import { CHUNK_KEY_CHARS } from '../common/keys.js';
import { FrameReader } from '../protocol/frame_reader.js';
import {
  decodePeerControl,
  MAX_CONTROL_BODY,
  PEER_KEYED_FRAMES,
  PeerFrame,
  peerControlFrame,
  peerFetchEndSchema,
  peerHelloOkSchema,
} from '../protocol/peer_frames.js';
import { fetchFrame } from './p2p_serve.js';
import { PeerConn, type PeerConnPool } from './p2p_pool.js';
import { parseHostPort } from './worker_peer.js';

/** Why a fetch ended before every asked chunk arrived (a label of kvc_p2p_failures_total). */
export type P2pFailure = 'controller' | 'connect' | 'closed' | 'corrupt' | 'timeout' | 'refused';

export interface PeerFetchResult {
  /** The verified chunks that arrived, in key order (chunk i is keys[i]). */
  chunks: Uint8Array[];
  /** Null when the holder sent every chunk it had (FETCH_END ok). */
  failure: P2pFailure | null;
  /** What went wrong, for the log. */
  error: string | null;
}

export interface PeerFetchOptions {
  /** host:port of the holder's peer port. */
  peerUrl: string;
  keys: readonly string[];
  /** Who asks (instance id), for the holder's log and the FETCH tag. */
  from: string;
  /** Absolute time (Date.now() scale) by which the fetch ends, whatever it got. */
  deadline: number;
  layout: KvLayout;
  chunkSize: number;
  /** Called when the connection is open and the FETCH written (tests and metrics). */
  onStarted?: () => void;
  /** Idle connections to holders: take one for this fetch, park it after (none: a connection per fetch). */
  pool?: PeerConnPool;
}

/**
 * How long a pooled connection may stay silent after the FETCH before it is taken for dead: a
 * few of the round trips measured on it (its first fetch's first byte), at least this floor, and
 * at most half the time left, so a fresh connection still has the other half.
 */
export const STALE_FLOOR_MS = 100;
const STALE_RTTS = 4;

export async function fetchFromPeer(o: PeerFetchOptions): Promise<PeerFetchResult> {
  const { host, port } = parseHostPort(o.peerUrl);
  const pooled = o.pool?.take(o.peerUrl) ?? null;
  if (pooled) {
    const left = o.deadline - Date.now();
    const staleMs = Math.min(left / 2, Math.max(STALE_FLOOR_MS, STALE_RTTS * (pooled.firstByteMs ?? 0)));
    const r = await fetchOn(pooled, o, staleMs);
    if (!r.stale) {
      o.pool!.counted('reused');
      return r.result;
    }
    // Dead before it said anything: nothing arrived, so nothing is lost by asking again.
    o.pool!.counted('stale');
    if (Date.now() >= o.deadline) return r.result;
  }
  o.pool?.counted('new');
  return (await fetchOn(new PeerConn(host, port), o, null)).result;
}

/**
 * One FETCH on `conn`. `staleMs` (a pooled connection): when the connection dies, or stays silent
 * this long, before the first byte of the answer, the result says `stale` instead of failing.
 */
function fetchOn(conn: PeerConn, o: PeerFetchOptions, staleMs: number | null): Promise<{ result: PeerFetchResult; stale: boolean }> {
  const maxChunk = chunkBytes(o.layout, o.chunkSize);
  const reused = staleMs !== null;
  return new Promise((resolve) => {
    const chunks: Uint8Array[] = [];
    let settled = false;
    let answered = false;
    let sentAt = 0;
    /** FETCH_END said the holder keeps the connection: park it once this read is done, if nothing follows. */
    let keep = false;
    const finish = (failure: P2pFailure | null, error: string | null, stale = false) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (staleTimer) clearTimeout(staleTimer);
      reader.stop();
      if (!keep || failure) {
        conn.detach();
        conn.destroy();
      }
      resolve({ result: { chunks, failure, error }, stale });
    };
    const done = (failure: P2pFailure | null, error: string | null) => {
      // A pooled connection that failed before any answer was dead already (the holder closed it, restarted, or the path is gone).
      finish(failure, error, reused && failure !== null && !answered);
    };
    const left = Math.max(0, o.deadline - Date.now());
    const timer = setTimeout(() => done('timeout', `no complete answer from ${o.peerUrl} within the P2P time bound (${chunks.length}/${o.keys.length} chunks arrived)`), left);
    const staleTimer = reused
      ? setTimeout(() => {
          if (!answered) done('closed', `pooled connection to ${o.peerUrl} silent for ${Math.round(staleMs)} ms`);
        }, staleMs)
      : null;
    const onFrame = (type: number, key: string | null, body: Uint8Array, digest: bigint | null) => {
      if (settled) {
        // Anything after FETCH_END: not a connection to keep.
        keep = false;
        conn.destroy();
        return;
      }
      if (type === PeerFrame.Chunk) {
        const chunk = body;
        const want = o.keys[chunks.length];
        if (want === undefined) return done('corrupt', `${o.peerUrl} sent more chunks than asked`);
        if (key !== want) return done('corrupt', `${o.peerUrl} sent chunk ${key} where ${want} was expected`);
        try {
          if (digest === null) throw new Error('chunk arrived without its checksum computed');
          const h = verifyStreamed(chunk, want, digest);
          if (!sameLayout(h, o.layout)) throw new Error(`layout ${describeLayout(h)} differs from this instance's ${describeLayout(o.layout)}`);
          if (h.numTokens < 1 || h.numTokens > o.chunkSize) throw new Error(`chunk of ${h.numTokens} tokens, chunk size is ${o.chunkSize}`);
        } catch (e) {
          return done('corrupt', `chunk ${want} from ${o.peerUrl} rejected: ${(e as Error).message}`);
        }
        chunks.push(chunk);
        return;
      }
      if (type === PeerFrame.FetchEnd) {
        const r = decodePeerControl(peerFetchEndSchema, 'FETCH_END', body);
        if (!r.ok) return done('corrupt', `${o.peerUrl}: ${r.error}`);
        if (r.msg.sent !== chunks.length) return done('corrupt', `${o.peerUrl} says it sent ${r.msg.sent} chunks, ${chunks.length} arrived`);
        if (!r.msg.ok) return done('refused', `${o.peerUrl} stopped the fetch: ${r.msg.error ?? 'no reason given'}`);
        keep = o.pool !== undefined && r.msg.keep === true;
        return done(null, null);
      }
      if (type === PeerFrame.HelloOk) {
        // The peer port's generic refusal (a malformed FETCH, an older instance).
        const r = decodePeerControl(peerHelloOkSchema, 'refusal', body);
        return done('refused', `${o.peerUrl} refused the fetch: ${r.ok ? (r.msg.error ?? 'no reason given') : r.error}`);
      }
      return done('corrupt', `${o.peerUrl} sent an unexpected frame type ${type}`);
    };
    const reader = new FrameReader(PEER_KEYED_FRAMES, {
      refuse: (h) => {
        if (h.type === PeerFrame.Chunk) return h.bodyLen > maxChunk ? `CHUNK frame of ${h.bodyLen + CHUNK_KEY_CHARS} bytes (at most ${maxChunk + CHUNK_KEY_CHARS})` : null;
        return h.bodyLen > MAX_CONTROL_BODY ? `reply frame (type ${h.type}) of ${h.bodyLen} bytes exceeds ${MAX_CONTROL_BODY}` : null;
      },
      // Each chunk lands in its own buffer: it is kept (promoted into the CPU tier, imported).
      // Not zero-filled: the socket writes every byte of it before it is used.
      sink: (_type, _key, len) => new Uint8Array(Buffer.allocUnsafeSlow(len).buffer, 0, len),
      hashFrom: (type) => (type === PeerFrame.Chunk ? HEADER_BYTES : null),
      onFrame: (type, key, body, bodyLen, digest) => onFrame(type, key, body ?? new Uint8Array(bodyLen), digest),
      onError: (e) => done('corrupt', `bad frame from ${o.peerUrl}: ${e.message}`),
    });
    const arrived = (feed: () => void) => {
      if (!answered) {
        answered = true;
        conn.firstByteMs ??= performance.now() - sentAt;
      }
      try {
        feed();
      } catch (e) {
        done('corrupt', `bad frame from ${o.peerUrl}: ${(e as Error).message}`);
      }
        // A clean FETCH_END with nothing after it: the connection goes back to the pool.
        if (settled && keep && !conn.dead) {
          keep = false;
          conn.detach();
          if (reader.midFrame) conn.destroy();
          else o.pool!.put(o.peerUrl, conn);
        }
    };
    conn.attach({
      buffer: () => reader.readBuffer(),
      read: (n) => arrived(() => reader.readDone(n)),
      push: (data) => arrived(() => reader.push(data)),
      connected: () => {
        sentAt = performance.now();
        conn.sock.write(peerControlFrame(PeerFrame.Fetch, fetchFrame(o.from, o.keys, o.pool !== undefined)));
        o.onStarted?.();
      },
      ended: (e) => {
        if (!conn.isConnected) return done('connect', `cannot connect to ${o.peerUrl}: ${e?.message ?? 'connection closed'}`);
        done('closed', e ? `connection to ${o.peerUrl}: ${e.message}` : `${o.peerUrl} closed the connection after ${chunks.length}/${o.keys.length} chunks`);
      },
    });
  });
}
