// Peer-to-peer chunk transfer between cache instances over `distributed_url` (docs/controller.md):
// chunk bytes of a move/copy never pass through the controller.
//
// Wire format: src/protocol/peer_frames.ts; frames are read by the shared FrameReader
// (src/protocol/frame_reader.ts).
// The sender writes every chunk back to back (it never waits between chunks) and, after the last
// ACK, one COMMIT. The receiver's connections are read with the socket's `onread` option
// (src/common/direct_read.ts) through the shared FrameReader, a CHUNK's key digits as its meta
// (PEER_KEYED_FRAMES), so each chunk's bytes land straight where the chunk will live: room reserved
// in the CPU tier, hashed as they arrive, verified, staged and committed at COMMIT, or undone when
// the connection ends first (src/kvc/peer_receive.ts, which also has the disk path). The sender
// knows a move is safe to complete only when COMMIT_OK says so.
//
// Limits (a peer port is reachable by anything on the network): a control frame (HELLO, COMMIT,
// every reply) is at most 64 KiB, a CHUNK frame at most the key plus the largest chunk of this
// instance's layout and chunk size, and both are refused from the header, before any buffer is
// reserved; CHUNK before HELLO is refused; a connection idle for `idleMs` is closed.
import net from 'node:net';
import { checkChunkFor, chunkBytes, HEADER_BYTES, type KvLayout } from '../common/chunk.js';
import { readDirect } from '../common/direct_read.js';
import { CHUNK_KEY_CHARS } from '../common/keys.js';
import { logger } from '../common/log.js';
import { FrameReader } from '../protocol/frame_reader.js';
import {
  decodePeerControl,
  MAX_CONTROL_BODY,
  PEER_FRAMES,
  PEER_KEYED_FRAMES,
  PEER_MAX_BODY,
  PEER_PROTOCOL_VERSION,
  PeerFrame,
  peerAckSchema,
  peerChunkHead,
  peerCommitOkSchema,
  peerCommitSchema,
  peerControlFrame,
  peerFetchSchema,
  peerHelloOkSchema,
  peerHelloSchema,
} from '../protocol/peer_frames.js';
import type { KvcStore } from './store.js';
import { serveFetch } from './p2p_serve.js';
import { IncomingTransfer } from './peer_receive.js';
import type { OutgoingChunk } from './transfer_holds.js';
import { isLocationName } from './types.js';

const log = logger('kvc.peer');

export { MAX_CONTROL_BODY } from '../protocol/peer_frames.js';
const { Hello: HELLO, Chunk: CHUNK, Commit: COMMIT, Fetch: FETCH, FetchStop: FETCH_STOP, HelloOk: HELLO_OK, Ack: ACK, CommitOk: COMMIT_OK } = PeerFrame;
/** A receiving connection with no traffic for this long is closed. */
export const DEFAULT_PEER_IDLE_MS = 60_000;

// Receive buffers outlive connections: every move opens a new connection, and a fresh 32 MiB
// buffer costs its page faults again (first touch runs at ~0.5 GB/s here, reuse at memcpy speed).
const spareScratch: Buffer[] = [];
const MAX_SPARE = 2;

function takeScratch(min: number): Buffer {
  const i = spareScratch.findIndex((b) => b.length >= min);
  if (i >= 0) return spareScratch.splice(i, 1)[0]!;
  return Buffer.allocUnsafeSlow(min);
}

function giveScratch(b: Buffer): void {
  if (b.length === 0) return;
  spareScratch.push(b);
  spareScratch.sort((x, y) => y.length - x.length);
  if (spareScratch.length > MAX_SPARE) spareScratch.length = MAX_SPARE;
}

/**
 * The receive buffer of one connection: a large body is copied straight into one reusable
 * buffer (no concat of 32 MiB chunks), given back for the next connection when it closes.
 */
class Scratch {
  private buf: Buffer = Buffer.alloc(0);
  take(len: number): Buffer {
    if (this.buf.length < len) {
      giveScratch(this.buf);
      this.buf = takeScratch(len);
    }
    return this.buf.subarray(0, len);
  }
  give(): void {
    giveScratch(this.buf);
    this.buf = Buffer.alloc(0);
  }
}

export interface PeerServer {
  readonly port: number;
  close(): Promise<void>;
}

export interface PeerServerOptions {
  /** The instance's KV layout: every chunk must match it. Null when unknown (no layout check). */
  layout: KvLayout | null;
  /** The instance's chunk size in tokens; with `layout` it bounds a CHUNK frame. */
  chunkSize?: number;
  /** A connection without traffic for this long is closed (default DEFAULT_PEER_IDLE_MS). */
  idleMs?: number;
}

/** Largest CHUNK body this instance accepts: the key plus its largest possible chunk. */
function maxChunkBody(store: KvcStore, o: PeerServerOptions): number {
  if (o.layout && o.chunkSize && o.chunkSize > 0) return Math.min(PEER_MAX_BODY, CHUNK_KEY_CHARS + chunkBytes(o.layout, o.chunkSize));
  // Layout unknown: no chunk can be larger than the largest location.
  const cap = Math.max(0, ...store.stats().map((s) => s.capacityBytes));
  return Math.min(PEER_MAX_BODY, CHUNK_KEY_CHARS + cap);
}

/** Receives chunks from other instances into `store`. */
export async function startPeerServer(store: KvcStore, host: string, port: number, o: PeerServerOptions): Promise<PeerServer> {
  const layout = o.layout;
  const idleMs = o.idleMs ?? DEFAULT_PEER_IDLE_MS;
  const chunkLimit = maxChunkBody(store, o) - CHUNK_KEY_CHARS;
  const sockets = new Set<net.Socket>();
  // pauseOnConnect: nothing is read before readDirect takes the connection over.
  const server = net.createServer({ pauseOnConnect: true }, (accepted) => {
    // assigned below, once the reader exists (readDirect asks it for a buffer at once)
    let sock!: net.Socket;
    /** The transfer under way on this connection (between HELLO and COMMIT). */
    let transfer: IncomingTransfer | null = null;
    let storing = false;
    /** A P2P pull (FETCH) is being answered. */
    let fetching = false;
    /** The connection has carried a FETCH: it carries nothing else (a kept one waits for the next FETCH). */
    let fetchConn = false;
    /** The requester's FETCH_STOP for the FETCH being answered. */
    let fetchStop = { requested: false };
    const peerName = `${accepted.remoteAddress}:${accepted.remotePort}`;
    // Frames are handled strictly in order; the socket is paused while one is stored on disk.
    /** Names the reason to the peer and closes (a peer that keeps its side open is cut off shortly after). */
    const fail = (msg: string) => {
      log.warn(`peer ${peerName}: ${msg}`);
      if (sock.destroyed) return;
      sock.end(peerControlFrame(HELLO_OK, { ok: false, error: msg }));
      setTimeout(() => sock.destroy(), 1000).unref();
    };
    const refuse = (type: number, len: number): string | null => {
      if (len > PEER_MAX_BODY) return `frame of ${len} bytes exceeds the limit`;
      if (type === HELLO || type === COMMIT || type === FETCH || type === FETCH_STOP) {
        const name = type === HELLO ? 'HELLO' : type === COMMIT ? 'COMMIT' : type === FETCH ? 'FETCH' : 'FETCH_STOP';
        return len > MAX_CONTROL_BODY ? `${name} frame of ${len} bytes exceeds ${MAX_CONTROL_BODY}` : null;
      }
      if (type === CHUNK) {
        if (transfer === null) return 'CHUNK before HELLO';
        return len > chunkLimit ? `CHUNK frame of ${len + CHUNK_KEY_CHARS} bytes exceeds the largest chunk this instance stores (${chunkLimit + CHUNK_KEY_CHARS} bytes)` : null;
      }
      return `unknown frame type ${type}`;
    };
    const scratch = new Scratch();
    const stopReading = () => reader.stop(() => scratch.give());
    const onFrame = (type: number, key: string | null, body: Uint8Array | null, digest: bigint | null): void | Promise<void> => {
      if (type === FETCH) {
        // A P2P pull (src/kvc/p2p_serve.ts): the connection carries FETCHes only from now on,
        // one at a time; one without `keep` is the last.
        if (transfer !== null) return fail('FETCH during a transfer');
        if (fetching) return fail('FETCH before the previous FETCH_END');
        const req = decodePeerControl(peerFetchSchema, 'FETCH', body!);
        if (!req.ok) return fail(req.error);
        fetching = true;
        fetchConn = true;
        if (req.msg.keep !== true) stopReading();
        const stop = (fetchStop = { requested: false });
        void serveFetch(sock, store, req.msg, peerName, stop).then((kept) => {
          fetching = false;
          if (!kept) stopReading();
        });
        return;
      }
      if (type === FETCH_STOP && fetchConn) {
        // The requester's time bound passed: end the answer at the next chunk. After the
        // FETCH_END (the two crossed) there is nothing to stop.
        if (fetching) fetchStop.requested = true;
        return;
      }
      if (fetchConn) return fail(`frame type ${type} on a P2P fetch connection`);
      if (type === HELLO) {
        if (transfer !== null) return fail('second HELLO on one connection');
        const hello = decodePeerControl(peerHelloSchema, 'HELLO', body!);
        if (!hello.ok) return fail(hello.error);
        const loc = hello.msg.location;
        if (!isLocationName(loc) || !store.locations().includes(loc)) {
          return fail(`location "${loc}" is not configured on this instance (configured: ${store.locations().join(', ') || 'none'})`);
        }
        transfer = new IncomingTransfer(store, loc, layout, scratch);
        sock.write(peerControlFrame(HELLO_OK, { ok: true }));
        return;
      }
      if (type === COMMIT) {
        if (transfer === null) return fail('COMMIT before HELLO');
        const commit = decodePeerControl(peerCommitSchema, 'COMMIT', body!);
        if (!commit.ok) return fail(commit.error);
        const answer = transfer.commit(commit.msg.count, peerName, commit.msg.pinned);
        transfer = null; // a transfer ends with its commit
        sock.write(peerControlFrame(COMMIT_OK, answer));
        return;
      }
      if (type !== CHUNK || transfer === null || key === null) return fail(type === CHUNK ? 'CHUNK before HELLO' : `unknown frame type ${type}`);
      const ack = (error: string | null) => {
        if (!sock.destroyed) sock.write(peerControlFrame(ACK, error === null ? { key, ok: true } : { key, ok: false, error }));
      };
      const r = transfer.chunk(key, body, digest);
      if (!(r instanceof Promise)) return ack(r);
      sock.pause();
      storing = true;
      return r.then((error) => {
        storing = false;
        ack(error);
        if (!sock.destroyed) sock.resume();
      });
    };
    /** The reader stopped reading (a refused header): say why, then close. */
    const onError = (e: Error) => {
      stopReading();
      sock.pause();
      fail(e.message);
    };
    const reader = new FrameReader(PEER_KEYED_FRAMES, {
      refuse: (h) => refuse(h.type, h.bodyLen),
      sink: (type, key, len) => (type === CHUNK && transfer && key !== null ? transfer.sink(key, len) : scratch.take(len)),
      hashFrom: (type) => (type === CHUNK ? HEADER_BYTES : null),
      onFrame: (type, key, body, bodyLen, digest) => onFrame(type, key, type === CHUNK ? body : (body ?? scratch.take(bodyLen)), digest),
      onError,
    });
    sock = readDirect(accepted, reader, onError);
    sockets.add(sock);
    sock.setNoDelay(true);
    sock.setTimeout(idleMs);
    sock.on('timeout', () => {
      if (storing) return; // our own store is slow; the ACK written afterwards re-arms the timer
      if (fetching) {
        // The requester stopped reading what it asked for: nothing to say, just close.
        log.warn(`peer ${peerName}: P2P fetch idle for ${idleMs} ms; connection closed`);
        sock.destroy();
        return;
      }
      if (fetchConn) {
        // A kept fetch connection nobody used for a while (the requester's pool closes its own earlier).
        log.debug(`peer ${peerName}: kept P2P fetch connection idle for ${idleMs} ms; closed`);
        stopReading();
        sock.end();
        return;
      }
      stopReading(); // nothing more is read from this peer
      fail(`no traffic for ${idleMs} ms; connection closed`);
    });
    sock.on('error', () => {});
    sock.on('close', () => {
      sockets.delete(sock);
      stopReading();
      // A transfer without its COMMIT leaves nothing behind (reservations back, added chunks removed).
      transfer?.dropPending();
      transfer?.abort();
      transfer = null;
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const bound = (server.address() as net.AddressInfo).port;
  return {
    port: bound,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

export function parseHostPort(url: string): { host: string; port: number } {
  const i = url.lastIndexOf(':');
  const host = url.slice(0, i).replace(/^\[|\]$/g, '');
  return { host, port: Number(url.slice(i + 1)) };
}

export interface SendOptions {
  distributedUrl: string;
  location: string;
  from: string;
  deadlineMs: number;
  /**
   * Returns the chunk for a key, or null. `bytes` must stay unchanged until `release` is called:
   * that happens once the socket has taken them (write callback) or the send ended.
   */
  read: (key: string) => Promise<OutgoingChunk | null>;
  /** Aborting it fails the send at once (the controller's request went away). */
  signal?: AbortSignal;
  /** Indices (into `keys`) of the chunks to stay pinned at the receiver once committed. */
  pinned?: readonly number[];
}

/** The COMMIT frame's pin bitmap: bit i set when keys[i] stays pinned (null: none). */
function pinBitmap(count: number, pinned: readonly number[] | undefined): Uint8Array<ArrayBuffer> | null {
  if (!pinned?.length) return null;
  const bits = new Uint8Array(Math.ceil(count / 8));
  for (const i of pinned) bits[i >> 3] |= 1 << (i & 7);
  return bits;
}

/**
 * Sends `keys` to the peer and resolves once every chunk is acknowledged as stored AND the peer
 * confirmed, in its answer to COMMIT, that it still holds all of them.
 * Rejects on any refusal, a broken connection, an abort or the deadline; a rejection means the
 * destination may hold some of the chunks but the caller must keep its own.
 */
export function sendChunks(keys: readonly string[], o: SendOptions): Promise<number> {
  const { host, port } = parseHostPort(o.distributedUrl);
  return new Promise<number>((resolve, reject) => {
    if (o.signal?.aborted) return reject(new Error(`transfer to ${o.distributedUrl} cancelled before it started`));
    const sock = net.connect({ host, port });
    sock.setNoDelay(true);
    let acked = 0;
    let settled = false;
    /** Releases of chunks whose bytes may still be queued on the socket. */
    const pending = new Set<() => void>();
    const onAbort = () => done(new Error(`transfer to ${o.distributedUrl} cancelled (${acked}/${keys.length} chunks stored)`));
    const done = (err: Error | null) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      o.signal?.removeEventListener('abort', onAbort);
      sock.destroy();
      for (const r of pending) r();
      pending.clear();
      if (err) reject(err);
      else resolve(acked);
    };
    o.signal?.addEventListener('abort', onAbort);
    const timer = setTimeout(() => done(new Error(`transfer to ${o.distributedUrl} did not complete within ${o.deadlineMs} ms (${acked}/${keys.length} chunks stored)`)), o.deadlineMs);
    const scratch = new Scratch();
    const malformed = (what: string) => done(new Error(`peer ${o.distributedUrl} sent a malformed reply (${what})`));
    const onReply = (type: number, body: Uint8Array) => {
      if (type === HELLO_OK) {
        const r = decodePeerControl(peerHelloOkSchema, 'HELLO_OK', body);
        if (!r.ok) return malformed(r.error);
        if (!r.msg.ok) return done(new Error(`peer ${o.distributedUrl} refused the transfer: ${r.msg.error}`));
        void pump();
        return;
      }
      if (type === COMMIT_OK) {
        const r = decodePeerControl(peerCommitOkSchema, 'COMMIT_OK', body);
        if (!r.ok) return malformed(r.error);
        const m = r.msg;
        if (acked !== keys.length) return done(new Error(`peer ${o.distributedUrl} answered a commit that was not asked`));
        if (m.ok) return done(null);
        const named = m.first_missing.length ? ` (first: ${m.first_missing.join(', ')})` : '';
        return done(new Error(`peer ${o.distributedUrl} no longer holds ${m.missing} of the ${keys.length} chunks it stored${named} (stored ${m.stored}); the move is not committed`));
      }
      if (type !== ACK) return done(new Error(`peer ${o.distributedUrl} sent unknown frame type ${type}`));
      const r = decodePeerControl(peerAckSchema, 'ACK', body);
      if (!r.ok) return malformed(r.error);
      if (!r.msg.ok) return done(new Error(`peer ${o.distributedUrl} did not store chunk ${r.msg.key}: ${r.msg.error}`));
      acked++;
      // Every chunk stored: ask the peer to confirm it still holds them all.
      if (acked === keys.length) {
        const pinned = pinBitmap(keys.length, o.pinned);
        sock.write(peerControlFrame(COMMIT, pinned ? { count: keys.length, pinned } : { count: keys.length }));
      }
    };
    const reader = new FrameReader(PEER_FRAMES, {
      refuse: (h) => (h.bodyLen > MAX_CONTROL_BODY ? `reply frame (type ${h.type}) of ${h.bodyLen} bytes exceeds ${MAX_CONTROL_BODY}` : null),
      sink: (_type, _meta, len) => scratch.take(len),
      onFrame: (type, _meta, body, bodyLen) => onReply(type, body ?? scratch.take(bodyLen)),
      onError: (e) => done(e),
    });
    const writeAsync = (b: Uint8Array, written?: () => void) =>
      new Promise<void>((res, rej) => {
        if (!sock.write(b, (e) => (written?.(), e && rej(e)))) sock.once('drain', res);
        else res();
      });
    const pump = async () => {
      try {
        for (const key of keys) {
          if (settled) return;
          const got = await o.read(key);
          if (!got) throw new Error(`chunk ${key} is no longer in ${o.from}`);
          let released = false;
          const release = () => {
            if (released) return;
            released = true;
            pending.delete(release);
            got.release?.();
          };
          pending.add(release);
          if (settled) return release();
          const chunk = got.bytes;
          checkChunkFor(chunk, key);
          await writeAsync(peerChunkHead(key, chunk.byteLength));
          // The chunk's bytes stay held until the socket has taken them.
          await writeAsync(chunk, release);
        }
      } catch (e) {
        done(e as Error);
      }
    };
    sock.on('connect', () => {
      sock.write(peerControlFrame(HELLO, { v: PEER_PROTOCOL_VERSION, location: o.location, count: keys.length, from: o.from }));
      if (keys.length === 0) done(null);
    });
    sock.on('data', (d: Buffer) => {
      try {
        reader.push(d);
      } catch (e) {
        done(e as Error);
      }
    });
    sock.on('error', (e) => done(new Error(`connection to peer ${o.distributedUrl} failed: ${e.message}`)));
    sock.on('close', () => {
      reader.stop(() => scratch.give());
      done(new Error(`peer ${o.distributedUrl} closed the connection after ${acked}/${keys.length} chunks were stored`));
    });
  });
}
