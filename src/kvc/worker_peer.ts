// Peer-to-peer chunk transfer between cache instances over `distributed_url` (DESIGN §5):
// chunk bytes of a move/copy never pass through the controller.
//
// Wire format, both directions: frames of  u32le body_length | u8 type | body.
//   sender → receiver  HELLO (1)  msgpack {v, location, count, from}
//                      CHUNK (2)  16 ASCII hex key digits + the chunk buffer (header + payload)
//                      COMMIT (3) msgpack {count}  after the last ACK
//   receiver → sender  HELLO_OK (0x81)  msgpack {ok, error?}  (also carries a refusal at any point)
//                      ACK (0x82)       msgpack {key, ok, error?}  once the chunk is STORED
//                      COMMIT_OK (0x83) msgpack {ok, stored, missing, first_missing}
// The receiver verifies every chunk (header, length, key, checksum — the checksum hashed while the
// bytes arrive, see FrameReader) and its layout against the instance's own before storing it, and
// reads one chunk at a time (the socket is paused while a chunk is being stored), which is the
// backpressure. Every chunk stored for a transfer is pinned (a TransferHolds hold) until the
// transfer ends, so the later chunks of a move bigger than the free room cannot evict the earlier
// ones: such a chunk is refused (no room) instead. COMMIT asks the receiver to confirm that it still
// holds every chunk of the transfer; the holds are released after the answer (or when the
// connection closes). The sender knows a move is safe to complete only when COMMIT_OK says so.
//
// Limits (a peer port is reachable by anything on the network): a control frame (HELLO, COMMIT,
// every reply) is at most 64 KiB, a CHUNK frame at most the key plus the largest chunk of this
// instance's layout and chunk size, and both are refused from the header, before any buffer is
// reserved; CHUNK before HELLO is refused; a connection idle for `idleMs` is closed.
import net from 'node:net';
import { decode, encode } from '@msgpack/msgpack';
import xxhash from 'xxhash-wasm';
import { checkChunkFor, chunkBytes, describeLayout, HEADER_BYTES, sameLayout, verifyStreamed, type KvLayout } from '../common/chunk.js';
import { logger } from '../common/log.js';
import type { KvcStore } from './store.js';
import { transferHolds } from './transfer_holds.js';
import { isLocationName, type LocationName } from './types.js';

const log = logger('kvc.peer');
const { create64 } = await xxhash();

const HELLO = 1;
const CHUNK = 2;
const COMMIT = 3;
const HELLO_OK = 0x81;
const ACK = 0x82;
const COMMIT_OK = 0x83;
const FRAME_HEAD = 5;
const KEY_CHARS = 16;
/** Offset of the chunk payload inside a CHUNK body (key digits, then the 64-byte chunk header). */
const PAYLOAD_AT = KEY_CHARS + HEADER_BYTES;
/** Absolute upper bound of one frame body (a Buffer cannot be larger). */
const MAX_BODY = 2 ** 31 - 1;
/** Upper bound of a control frame body (HELLO, COMMIT and every reply). */
export const MAX_CONTROL_BODY = 64 * 1024;
/** A receiving connection with no traffic for this long is closed. */
export const DEFAULT_PEER_IDLE_MS = 60_000;
/** How many missing keys a COMMIT_OK names. */
const NAMED_MISSING = 8;

function frame(type: number, body: Uint8Array): Buffer {
  const head = Buffer.allocUnsafe(FRAME_HEAD);
  head.writeUInt32LE(body.byteLength, 0);
  head.writeUInt8(type, 4);
  return Buffer.concat([head, body]);
}

function msgFrame(type: number, obj: unknown): Buffer {
  return frame(type, encode(obj));
}

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
 * Incremental frame parser. A large body is copied straight into one reusable buffer (no
 * concat of 32 MiB chunks). When the frame handler returns a promise, parsing stops until it
 * settles (the body buffer is reused by the next frame) and later data waits in a backlog.
 */
class FrameReader {
  private head = Buffer.alloc(0);
  private body: Buffer | null = null;
  private bodyLen = 0;
  private got = 0;
  private type = 0;
  private scratch: Buffer = Buffer.alloc(0);
  private busy = false;
  private backlog: Buffer[] = [];
  /** xxh64 of a CHUNK body's payload (bytes after the key and the chunk header), fed as bytes arrive. */
  private hasher: ReturnType<typeof create64> | null = null;

  /**
   * `refuse(type, length)` is asked as soon as a frame header is complete, before any buffer is
   * reserved for the body: it returns why the frame is not acceptable, or null.
   */
  constructor(
    private readonly onFrame: (type: number, body: Buffer, payloadSum: bigint | null) => void | Promise<void>,
    private readonly onError: (e: Error) => void,
    private readonly refuse: (type: number, length: number) => string | null,
  ) {}

  push(data: Buffer): void {
    if (this.released) return;
    if (this.busy) {
      this.backlog.push(data);
      return;
    }
    try {
      this.consume(data);
    } catch (e) {
      this.onError(e as Error);
    }
  }

  private released = false;

  /** Returns the receive buffer for the next connection, once no frame handler still reads it. */
  release(): void {
    this.released = true;
    this.backlog = [];
    if (this.busy) return; // given back when the running handler settles
    giveScratch(this.scratch);
    this.scratch = Buffer.alloc(0);
    this.body = null;
    this.backlog = [];
  }

  private consume(data: Buffer): void {
    let off = 0;
    while (off < data.length) {
      if (!this.body) {
        const need = FRAME_HEAD - this.head.length;
        const take = Math.min(need, data.length - off);
        this.head = this.head.length ? Buffer.concat([this.head, data.subarray(off, off + take)]) : Buffer.from(data.subarray(off, off + take));
        off += take;
        if (this.head.length < FRAME_HEAD) return;
        this.bodyLen = this.head.readUInt32LE(0);
        this.type = this.head.readUInt8(4);
        this.head = Buffer.alloc(0);
        const refused = this.bodyLen > MAX_BODY ? `frame of ${this.bodyLen} bytes exceeds the limit` : this.refuse(this.type, this.bodyLen);
        if (refused) {
          this.released = true; // nothing more is read from this peer
          throw new Error(refused);
        }
        // Reuse the scratch buffer between chunks: fresh pages cost far more than the copy
        // into them (first-touch page faults).
        if (this.scratch.length < this.bodyLen) {
          giveScratch(this.scratch);
          this.scratch = takeScratch(this.bodyLen);
        }
        this.body = this.scratch.subarray(0, this.bodyLen);
        this.got = 0;
        this.hasher = this.type === CHUNK ? create64() : null;
      }
      const take = Math.min(this.bodyLen - this.got, data.length - off);
      data.copy(this.body, this.got, off, off + take);
      if (this.hasher) {
        // Hash the payload part of what was just copied, from the copy (still in cache).
        const from = Math.max(this.got, PAYLOAD_AT);
        if (from < this.got + take) this.hasher.update(this.body.subarray(from, this.got + take));
      }
      this.got += take;
      off += take;
      if (this.got === this.bodyLen) {
        const body = this.body;
        this.body = null;
        const sum = this.hasher ? this.hasher.digest() : null;
        this.hasher = null;
        const r = this.onFrame(this.type, body, sum);
        if (r instanceof Promise) {
          this.busy = true;
          const rest = data.subarray(off);
          void r.then(() => {
            this.busy = false;
            if (this.released) return this.release();
            const queued = rest.length ? [rest, ...this.backlog] : this.backlog;
            this.backlog = [];
            for (const q of queued) this.push(q);
          });
          return;
        }
      }
    }
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
  if (o.layout && o.chunkSize && o.chunkSize > 0) return Math.min(MAX_BODY, KEY_CHARS + chunkBytes(o.layout, o.chunkSize));
  // Layout unknown: no chunk can be larger than the largest location.
  const cap = Math.max(0, ...store.stats().map((s) => s.capacityBytes));
  return Math.min(MAX_BODY, KEY_CHARS + cap);
}

/** Receives chunks from other instances into `store`. */
export async function startPeerServer(store: KvcStore, host: string, port: number, o: PeerServerOptions): Promise<PeerServer> {
  const layout = o.layout;
  const idleMs = o.idleMs ?? DEFAULT_PEER_IDLE_MS;
  const chunkLimit = maxChunkBody(store, o);
  const holds = transferHolds(store);
  const sockets = new Set<net.Socket>();
  const server = net.createServer((sock) => {
    sockets.add(sock);
    sock.setNoDelay(true);
    let location: LocationName | null = null;
    let storing = false;
    /** Keys stored (and held) for the transfer on this connection, until COMMIT or close. */
    let held: string[] = [];
    const releaseHolds = (loc: LocationName | null) => {
      if (loc) for (const k of held) holds.release(k, loc);
      held = [];
    };
    const peerName = `${sock.remoteAddress}:${sock.remotePort}`;
    // Frames are handled strictly in order; the socket is paused while one is stored.
    /** Names the reason to the peer and closes (a peer that keeps its side open is cut off shortly after). */
    const fail = (msg: string) => {
      log.warn(`peer ${peerName}: ${msg}`);
      if (sock.destroyed) return;
      sock.end(msgFrame(HELLO_OK, { ok: false, error: msg }));
      setTimeout(() => sock.destroy(), 1000).unref();
    };
    sock.setTimeout(idleMs);
    sock.on('timeout', () => {
      if (storing) return; // our own store is slow; the ACK written afterwards re-arms the timer
      reader.release(); // nothing more is read from this peer
      fail(`no traffic for ${idleMs} ms; connection closed`);
    });
    const refuse = (type: number, len: number): string | null => {
      if (type === HELLO || type === COMMIT) return len > MAX_CONTROL_BODY ? `${type === HELLO ? 'HELLO' : 'COMMIT'} frame of ${len} bytes exceeds ${MAX_CONTROL_BODY}` : null;
      if (type === CHUNK) {
        if (location === null) return 'CHUNK before HELLO';
        return len > chunkLimit ? `CHUNK frame of ${len} bytes exceeds the largest chunk this instance stores (${chunkLimit} bytes)` : null;
      }
      return `unknown frame type ${type}`;
    };
    const reader = new FrameReader((type, body, payloadSum) => {
      if (type === HELLO) {
        let hello: { location?: unknown };
        try {
          hello = decode(body) as { location?: unknown };
        } catch {
          return fail('malformed HELLO');
        }
        const loc = hello?.location;
        if (location !== null) return fail('second HELLO on one connection');
        if (typeof loc !== 'string' || !isLocationName(loc) || !store.locations().includes(loc)) {
          return fail(`location "${String(loc)}" is not configured on this instance (configured: ${store.locations().join(', ') || 'none'})`);
        }
        location = loc;
        sock.write(msgFrame(HELLO_OK, { ok: true }));
        return;
      }
      if (type === COMMIT) {
        if (location === null) return fail('COMMIT before HELLO');
        let count = -1;
        try {
          count = Number((decode(body) as { count?: unknown })?.count ?? -1);
        } catch {
          return fail('malformed COMMIT');
        }
        // Every chunk of the transfer is still held (pinned) here: check that each is present.
        const missing = held.filter((k) => !store.has(k, location!));
        const ok = missing.length === 0 && held.length === count;
        if (!ok) log.warn(`peer ${peerName}: commit of ${count} chunk(s) into ${location} refused: ${held.length} stored, ${missing.length} missing`);
        sock.write(msgFrame(COMMIT_OK, { ok, stored: held.length, missing: missing.length, first_missing: missing.slice(0, NAMED_MISSING) }));
        releaseHolds(location);
        location = null; // a transfer ends with its commit
        return;
      }
      if (type !== CHUNK || location === null) return fail(type === CHUNK ? 'CHUNK before HELLO' : `unknown frame type ${type}`);
      const key = body.subarray(0, KEY_CHARS).toString('latin1');
      const chunk = body.subarray(KEY_CHARS);
      const loc = location;
      sock.pause();
      storing = true;
      return (async () => {
        let error: string | null = null;
        try {
          if (payloadSum === null) throw new Error('chunk arrived without its checksum computed');
          const h = verifyStreamed(chunk, key, payloadSum);
          if (layout && !sameLayout(h, layout)) throw new Error(`chunk layout ${describeLayout(h)} does not match this instance's ${describeLayout(layout)}`);
          // put copies the bytes into the store, so the reader may reuse its buffer afterwards.
          // A full location (everything else pinned, including this transfer's earlier chunks)
          // throws StoreFullError: the chunk is refused, the earlier ones stay.
          await store.put(key, chunk, loc);
          // Hold it until the transfer ends, so the next chunks cannot evict it.
          if (!holds.hold(key, loc)) throw new Error(`chunk ${key} was evicted from ${loc} right after it was stored`);
          if (sock.destroyed || location !== loc) holds.release(key, loc); // the transfer is already over
          else held.push(key);
        } catch (e) {
          error = (e as Error).message;
          log.warn(`refused chunk ${key}: ${error}`);
        }
        storing = false;
        if (!sock.destroyed) {
          sock.write(msgFrame(ACK, error ? { key, ok: false, error } : { key, ok: true }));
          sock.resume();
        }
      })();
    }, (e) => {
      // The reader stopped reading (a refused header): say why, then close.
      sock.pause();
      fail(e.message);
    }, refuse);
    sock.on('data', (d: Buffer) => reader.push(d));
    sock.on('error', () => {});
    sock.on('close', () => {
      sockets.delete(sock);
      reader.release();
      releaseHolds(location);
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

/** A chunk to send: its bytes, and what to call once they are on the wire (or the send ended). */
export interface OutgoingChunk {
  bytes: Uint8Array;
  release?: () => void;
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
    const reader = new FrameReader((type, body) => {
      let m: { ok?: boolean; error?: string; key?: string; stored?: number; missing?: number; first_missing?: string[] };
      try {
        m = decode(body) as typeof m;
      } catch {
        return done(new Error(`peer ${o.distributedUrl} sent a malformed reply`));
      }
      if (type === HELLO_OK) {
        if (!m.ok) return done(new Error(`peer ${o.distributedUrl} refused the transfer: ${m.error}`));
        void pump();
        return;
      }
      if (type === COMMIT_OK) {
        if (acked !== keys.length) return done(new Error(`peer ${o.distributedUrl} answered a commit that was not asked`));
        if (m.ok) return done(null);
        const named = m.first_missing?.length ? ` (first: ${m.first_missing.join(', ')})` : '';
        return done(new Error(`peer ${o.distributedUrl} no longer holds ${m.missing} of the ${keys.length} chunks it stored${named} (stored ${m.stored}); the move is not committed`));
      }
      if (type !== ACK) return done(new Error(`peer ${o.distributedUrl} sent unknown frame type ${type}`));
      if (!m.ok) return done(new Error(`peer ${o.distributedUrl} did not store chunk ${m.key}: ${m.error}`));
      acked++;
      // Every chunk stored: ask the peer to confirm it still holds them all.
      if (acked === keys.length) sock.write(msgFrame(COMMIT, { count: keys.length }));
    }, (e) => done(e), (type, len) => (len > MAX_CONTROL_BODY ? `reply frame (type ${type}) of ${len} bytes exceeds ${MAX_CONTROL_BODY}` : null));
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
          const head = Buffer.allocUnsafe(FRAME_HEAD + KEY_CHARS);
          head.writeUInt32LE(KEY_CHARS + chunk.byteLength, 0);
          head.writeUInt8(CHUNK, 4);
          head.write(key, FRAME_HEAD, 'latin1');
          await writeAsync(head);
          // The chunk's bytes stay held until the socket has taken them.
          await writeAsync(chunk, release);
        }
      } catch (e) {
        done(e as Error);
      }
    };
    sock.on('connect', () => {
      sock.write(msgFrame(HELLO, { v: 1, location: o.location, count: keys.length, from: o.from }));
      if (keys.length === 0) done(null);
    });
    sock.on('data', (d: Buffer) => reader.push(d));
    sock.on('error', (e) => done(new Error(`connection to peer ${o.distributedUrl} failed: ${e.message}`)));
    sock.on('close', () => {
      reader.release();
      done(new Error(`peer ${o.distributedUrl} closed the connection after ${acked}/${keys.length} chunks were stored`));
    });
  });
}
