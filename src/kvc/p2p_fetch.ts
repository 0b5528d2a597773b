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
 * With a pool, a fetch that reaches its deadline resolves with what arrived and then asks the
 * holder to stop (FETCH_STOP): the rest of the answer, up to FETCH_END, is read and dropped within
 * a bound as long as the fetch's own, and the connection is parked — its TCP window stays open for
 * the next fetch instead of a new connection starting over. Past that bound it is closed.
 */
function fetchOn(conn: PeerConn, o: PeerFetchOptions, staleMs: number | null): Promise<{ result: PeerFetchResult; stale: boolean }> {
  const maxChunk = chunkBytes(o.layout, o.chunkSize);
  const reused = staleMs !== null;
  const bound = Math.max(0, o.deadline - Date.now());
  return new Promise((resolve) => {
    const chunks: Uint8Array[] = [];
    /** fetch: answering the caller; drain: resolved at the deadline, the rest read and dropped; over: nothing more may arrive. */
    let phase: 'fetch' | 'drain' | 'over' = 'fetch';
    let answered = false;
    let sentAt = 0;
    /** CHUNK frames of this answer, those dropped while draining included. */
    let received = 0;
    /** FETCH_END said the holder keeps the connection: park it once this read is done, if nothing follows. */
    let park = false;
    let drainTimer: NodeJS.Timeout | null = null;
    const close = () => {
      phase = 'over';
      park = false;
      if (drainTimer) clearTimeout(drainTimer);
      reader.stop();
      conn.detach();
      conn.destroy();
    };
    const finish = (failure: P2pFailure | null, error: string | null) => {
      if (phase !== 'fetch') return;
      clearTimeout(timer);
      if (staleTimer) clearTimeout(staleTimer);
      // A pooled connection that failed before any answer was dead already (the holder closed it, restarted, or the path is gone).
      const stale = reused && failure !== null && !answered;
      if (failure === 'timeout' && o.pool && conn.isConnected && !stale) {
        phase = 'drain';
        conn.sock.write(peerControlFrame(PeerFrame.FetchStop, {}));
        drainTimer = setTimeout(close, Math.max(bound, 1000));
      } else if (failure !== null) close();
      resolve({ result: { chunks, failure, error }, stale });
    };
    /** The answer's FETCH_END, well-formed and counting what came: the connection may be kept. */
    const ended = (keep: boolean | undefined) => {
      if (drainTimer) clearTimeout(drainTimer);
      phase = 'over';
      park = o.pool !== undefined && keep === true;
      if (!park) close();
    };
    const timer = setTimeout(() => finish('timeout', `no complete answer from ${o.peerUrl} within the P2P time bound (${chunks.length}/${o.keys.length} chunks arrived)`), bound);
    const staleTimer = reused
      ? setTimeout(() => {
          if (!answered) finish('closed', `pooled connection to ${o.peerUrl} silent for ${Math.round(staleMs)} ms`);
        }, staleMs)
      : null;
    const onFrame = (type: number, key: string | null, body: Uint8Array | null, digest: bigint | null) => {
      if (phase === 'over') return close(); // anything after FETCH_END: not a connection to keep
      if (phase === 'drain') {
        if (type === PeerFrame.Chunk) return void received++;
        const r = type === PeerFrame.FetchEnd ? decodePeerControl(peerFetchEndSchema, 'FETCH_END', body!) : null;
        return r?.ok && r.msg.ok && r.msg.sent === received ? ended(r.msg.keep) : close();
      }
      if (type === PeerFrame.Chunk) {
        received++;
        const want = o.keys[chunks.length];
        if (want === undefined) return finish('corrupt', `${o.peerUrl} sent more chunks than asked`);
        if (key !== want) return finish('corrupt', `${o.peerUrl} sent chunk ${key} where ${want} was expected`);
        try {
          if (digest === null || body === null) throw new Error('chunk arrived without its checksum computed');
          const h = verifyStreamed(body, want, digest);
          if (!sameLayout(h, o.layout)) throw new Error(`layout ${describeLayout(h)} differs from this instance's ${describeLayout(o.layout)}`);
          if (h.numTokens < 1 || h.numTokens > o.chunkSize) throw new Error(`chunk of ${h.numTokens} tokens, chunk size is ${o.chunkSize}`);
        } catch (e) {
          return finish('corrupt', `chunk ${want} from ${o.peerUrl} rejected: ${(e as Error).message}`);
        }
        chunks.push(body);
        return;
      }
      if (type === PeerFrame.FetchEnd) {
        const r = decodePeerControl(peerFetchEndSchema, 'FETCH_END', body!);
        if (!r.ok) return finish('corrupt', `${o.peerUrl}: ${r.error}`);
        if (r.msg.sent !== chunks.length) return finish('corrupt', `${o.peerUrl} says it sent ${r.msg.sent} chunks, ${chunks.length} arrived`);
        if (!r.msg.ok) return finish('refused', `${o.peerUrl} stopped the fetch: ${r.msg.error ?? 'no reason given'}`);
        finish(null, null);
        return ended(r.msg.keep);
      }
      if (type === PeerFrame.HelloOk) {
        // The peer port's generic refusal (a malformed FETCH, an older instance).
        const r = decodePeerControl(peerHelloOkSchema, 'refusal', body!);
        return finish('refused', `${o.peerUrl} refused the fetch: ${r.ok ? (r.msg.error ?? 'no reason given') : r.error}`);
      }
      return finish('corrupt', `${o.peerUrl} sent an unexpected frame type ${type}`);
    };
    const reader = new FrameReader(PEER_KEYED_FRAMES, {
      refuse: (h) => {
        if (h.type === PeerFrame.Chunk) return h.bodyLen > maxChunk ? `CHUNK frame of ${h.bodyLen + CHUNK_KEY_CHARS} bytes (at most ${maxChunk + CHUNK_KEY_CHARS})` : null;
        return h.bodyLen > MAX_CONTROL_BODY ? `reply frame (type ${h.type}) of ${h.bodyLen} bytes exceeds ${MAX_CONTROL_BODY}` : null;
      },
      // Each chunk lands in its own buffer: it is kept (promoted into the CPU tier, imported).
      // Not zero-filled: the socket writes every byte of it before it is used. While draining, a
      // chunk's bytes are dropped (no buffer); a control frame's body is always kept.
      sink: (type, _key, len) => (phase === 'drain' && type === PeerFrame.Chunk ? null : new Uint8Array(Buffer.allocUnsafeSlow(len).buffer, 0, len)),
      hashFrom: (type) => (type === PeerFrame.Chunk ? HEADER_BYTES : null),
      onFrame: (type, key, body, _bodyLen, digest) => onFrame(type, key, body, digest),
      onError: (e) => (phase === 'fetch' ? finish('corrupt', `bad frame from ${o.peerUrl}: ${e.message}`) : close()),
    });
    const arrived = (feed: () => void) => {
      if (!answered) {
        answered = true;
        conn.firstByteMs ??= performance.now() - sentAt;
      }
      try {
        feed();
      } catch (e) {
        if (phase === 'fetch') finish('corrupt', `bad frame from ${o.peerUrl}: ${(e as Error).message}`);
        close();
      }
      // A clean FETCH_END with nothing after it: the connection goes back to the pool.
      if (park && !conn.dead) {
        park = false;
        reader.stop();
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
        if (phase !== 'fetch') return close();
        if (!conn.isConnected) return finish('connect', `cannot connect to ${o.peerUrl}: ${e?.message ?? 'connection closed'}`);
        finish('closed', e ? `connection to ${o.peerUrl}: ${e.message}` : `${o.peerUrl} closed the connection after ${chunks.length}/${o.keys.length} chunks`);
      },
    });
  });
}
