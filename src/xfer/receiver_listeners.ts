// The xfer receiver's two listeners (design: docs/xfer.md); what they accept and hold is decided
// by the receive buffer (receive_buffer.ts), so this file is about connections only.
//
//   init port  — a sender connects, says HELLO with its KV layout / chunk size / model, and is
//                refused with a clear message when that differs from ours. An accepted
//                connection gets a session id and then carries the sender's DATA frames
//                (chunk bytes) and our ACKs.
//   alloc port — ALLOC {session, req_id, chunks:[[key, bytes]]} reserves buffer space for a
//                request's chunks; CANCEL withdraws one the sender gave up waiting for.
//
// Zero-copy receive: the init port's connections are read with the socket's `onread` option
// (src/common/direct_read.ts): a DATA body is read by the kernel straight into its reserved slot,
// and the slot lives in the WASM memory of the xxh64 kernel, which hashes each read where it
// landed. No per-read buffer, no staging copy, no copy into the hasher.
import net from 'node:net';
import { deploymentSecret } from '../common/auth.js';
import { NonceMemory, unseal } from '../common/replay.js';
import { describeLayout, HEADER_BYTES, type KvLayout } from '../common/chunk.js';
import { readDirect } from '../common/direct_read.js';
import { logger } from '../common/log.js';
import {
  cancelMetaSchema,
  describeMeta,
  FrameParser,
  FrameType,
  helloMetaSchema,
  PROTOCOL_VERSION,
  ProtocolError,
  writeFrame,
  type AllocMeta,
  type DataMeta,
  type HelloMeta,
} from '../protocol/xfer_frames.js';
import type { Entry, ReceiveBuffer } from './receive_buffer.js';

const log = logger('xfer-recv');

export interface ListenerOptions {
  host: string;
  initPort: number;
  allocPort: number;
  /** A sender whose HELLO (or an alloc connection whose first frame of a live session) does not arrive within this time is dropped. */
  helloTimeoutMs: number;
  /** What a sender must match: the receiver's model, chunk size and KV layout. */
  modelId: string;
  chunkSize: number;
  layout: KvLayout;
  receiverId: string;
  /** The largest DATA body accepted (a full chunk of this layout). */
  maxChunkBytes: number;
}

/** Both listening ports and the connections they accepted, feeding one receive buffer. */
export class ReceiverListeners {
  private initServer: net.Server | null = null;
  private allocServer: net.Server | null = null;
  private readonly sockets = new Set<net.Socket>();
  /** The init connection of each live session (its alloc connection closes with it). */
  private readonly sessionSockets = new Map<string, net.Socket>();
  /** Nonces of the HELLOs accepted within the replay window (a captured HELLO is refused). */
  private readonly helloNonces = new NonceMemory('xfer-hello');

  private constructor(
    private readonly opts: ListenerOptions,
    private readonly buffer: ReceiveBuffer,
  ) {}

  /** Opens both ports; rejects (e.g. port in use) with a message naming the port, with nothing left open. */
  static async start(opts: ListenerOptions, buffer: ReceiveBuffer): Promise<ReceiverListeners> {
    const l = new ReceiverListeners(opts, buffer);
    try {
      // pauseOnConnect: nothing is read before readDirect takes the connection over
      l.initServer = await listen({ host: opts.host, port: opts.initPort, what: 'xfer_peer_init_port', onConnection: (s) => l.onInitConnection(s), pauseOnConnect: true });
      l.allocServer = await listen({ host: opts.host, port: opts.allocPort, what: 'xfer_peer_alloc_port', onConnection: (s) => l.onAllocConnection(s) });
    } catch (e) {
      await l.close();
      throw e;
    }
    return l;
  }

  /** Closes every connection and both ports. */
  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await Promise.all([closeServer(this.initServer), closeServer(this.allocServer)]);
  }

  /** Cuts the connection of sender `session` (its transfer stalled past its deadline). */
  cut(session: string, why: string): void {
    const sock = this.sessionSockets.get(session);
    if (!sock) return;
    log.warn(`sender session ${session}: connection cut: ${why}`);
    sock.destroy();
  }

  private track(sock: net.Socket): void {
    this.sockets.add(sock);
    sock.setNoDelay(true);
    sock.on('error', (e) => log.debug(`connection from ${sock.remoteAddress}:${sock.remotePort}: ${e.message}`));
    sock.on('close', () => this.sockets.delete(sock));
  }

  private onAllocConnection(sock: net.Socket): void {
    this.track(sock);
    // An alloc connection serves one live session: one that names none within the handshake
    // timeout is closed (it would otherwise sit open forever), and it closes with its session.
    let bound: string | null = null;
    const unbound = setTimeout(() => {
      log.warn(`alloc connection from ${sock.remoteAddress}: no frame of a live session within ${this.opts.helloTimeoutMs} ms; closing it`);
      sock.destroy();
    }, this.opts.helloTimeoutMs);
    sock.once('close', () => clearTimeout(unbound));
    const bind = (meta: unknown) => {
      const session = (meta as { session?: unknown } | null)?.session;
      if (bound !== null || typeof session !== 'string') return;
      const init = this.sessionSockets.get(session);
      if (!init) return;
      bound = session;
      clearTimeout(unbound);
      init.once('close', () => sock.destroy());
    };
    const parser = new FrameParser(0, () => null, (type, meta) => {
      bind(meta);
      if (type === FrameType.Cancel) {
        const m = cancelMetaSchema.safeParse(meta);
        // only a live session may withdraw, and only its own requests (checked in withdrawAlloc())
        if (m.success && this.buffer.hasSession(m.data.session)) this.buffer.withdrawAlloc(m.data.session, m.data.req_id);
        return;
      }
      if (type !== FrameType.Alloc) throw new ProtocolError(`unexpected frame type ${type} on the alloc port`);
      this.buffer.alloc(meta, (r) => {
        if (!sock.destroyed) writeFrame(sock, FrameType.AllocReply, { id: (meta as AllocMeta).id, ...r });
      });
    });
    sock.on('data', (d) => {
      try {
        parser.push(d);
      } catch (e) {
        log.warn(`alloc connection from ${sock.remoteAddress}: ${(e as Error).message}; closing it`);
        sock.destroy();
      }
    });
  }

  private onInitConnection(accepted: net.Socket): void {
    // assigned below, once the parser exists (readDirect asks it for a buffer at once)
    let sock!: net.Socket;
    let session: string | null = null;
    const helloTimer = setTimeout(() => {
      log.warn(`init connection from ${sock.remoteAddress}: no handshake within ${this.opts.helloTimeoutMs} ms; closing it`);
      sock.destroy();
    }, this.opts.helloTimeoutMs);
    const remote = accepted.remoteAddress;
    /** Where the DATA body goes: the pending entry's pooled buffer, or nowhere (dropped). */
    let target: Entry | null = null;
    const sink = (type: FrameType, meta: unknown, bodyLen: number): Uint8Array | null => {
      target = null;
      if (type !== FrameType.Data || !session) return null;
      target = this.buffer.chunkTarget(session, meta as DataMeta, bodyLen);
      return target?.buf ?? null;
    };
    const parser = new FrameParser(
      this.opts.maxChunkBytes,
      sink,
      (type, meta, body, bodyLen, payloadSum) => {
        if (type === FrameType.Hello) {
          if (session) throw new ProtocolError('second HELLO on one connection');
          clearTimeout(helloTimer);
          const shape = helloMetaSchema.safeParse(meta);
          const bad = shape.success ? checkHello(shape.data, this.opts, this.helloNonces) : `malformed HELLO: ${describeMeta(shape.error)}`;
          if (bad) {
            log.warn(`refused: ${bad}`);
            writeFrame(sock, FrameType.HelloReply, { ok: false, error: bad });
            sock.end();
            return;
          }
          session = this.buffer.openSession();
          this.sessionSockets.set(session, sock);
          log.info(`sender ${(meta as HelloMeta).sender_id} connected from ${sock.remoteAddress}:${sock.remotePort} (session ${session})`);
          writeFrame(sock, FrameType.HelloReply, { ok: true, session, receiver_id: this.opts.receiverId });
          return;
        }
        if (!session) throw new ProtocolError('expected HELLO first');
        if (type === FrameType.Cancel) {
          // the init port's CANCEL comes from the connection's own session, whatever its meta says
          const c = cancelMetaSchema.safeParse(meta);
          if (c.success) this.buffer.discardUnsent(session, c.data.req_id);
          return;
        }
        if (type !== FrameType.Data) throw new ProtocolError(`unexpected frame type ${type} on the init port`);
        const m = meta as DataMeta;
        const entry = target;
        target = null;
        const r = this.buffer.chunkArrived({ session, meta: m, entry, body, bodyLen, payloadSum });
        if (!sock.destroyed) writeFrame(sock, FrameType.Ack, { req_id: m.req_id, key: m.key, ok: r.ok, ...(r.error ? { error: r.error } : {}) });
      },
      (type) => (type === FrameType.Data ? HEADER_BYTES : null), // hash the payload while it arrives (see src/protocol/frame_reader.ts)
      (body) => this.buffer.hasher(body), // in place, in the slot's WASM memory
    );
    sock = readDirect(accepted, parser, (err) => {
      log.warn(`init connection from ${remote}: ${err.message}; closing it`);
      sock.destroy();
    });
    this.track(sock);
    sock.on('close', () => {
      clearTimeout(helloTimer);
      if (session === null) return;
      this.sessionSockets.delete(session);
      this.buffer.closeSession(session, target as Entry | null);
    });
  }
}

/** Why a sender's HELLO is refused (wrong secret, replayed or stale, protocol version, model, chunk size or KV layout), or null. */
export function checkHello(m: HelloMeta, ours: { modelId: string; chunkSize: number; layout: KvLayout }, nonces: NonceMemory): string | null {
  const refused = unseal(deploymentSecret(), nonces, m);
  if (refused) return `sender ${m.sender_id} refused (${refused.reason}): ${refused.message}`;
  if (m.version !== PROTOCOL_VERSION) return `incompatible sender: protocol version ${m.version}, receiver speaks ${PROTOCOL_VERSION}`;
  const l = ours.layout;
  const theirs: KvLayout = { dtype: m.dtype, numLayers: m.num_layers, numKvHeads: m.num_kv_heads, headDim: m.head_dim };
  const problems: string[] = [];
  if (m.model_id !== ours.modelId) problems.push(`model "${m.model_id}" (receiver serves "${ours.modelId}")`);
  if (m.chunk_size !== ours.chunkSize) problems.push(`chunk_size ${m.chunk_size} (receiver uses ${ours.chunkSize})`);
  if (theirs.dtype !== l.dtype || theirs.numLayers !== l.numLayers || theirs.numKvHeads !== l.numKvHeads || theirs.headDim !== l.headDim) {
    problems.push(`KV layout ${describeLayout(theirs)} (receiver has ${describeLayout(l)})`);
  }
  return problems.length ? `incompatible sender ${m.sender_id ?? '?'}: ${problems.join('; ')}` : null;
}

function listen(o: { host: string; port: number; what: string; onConnection: (s: net.Socket) => void; pauseOnConnect?: boolean }): Promise<net.Server> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer({ pauseOnConnect: o.pauseOnConnect ?? false }, o.onConnection);
    srv.once('error', (e: NodeJS.ErrnoException) =>
      reject(new Error(`xfer receiver cannot listen on ${o.host}:${o.port} (${o.what}): ${e.code === 'EADDRINUSE' ? 'port already in use' : e.message}`)),
    );
    srv.listen(o.port, o.host, () => resolve(srv));
  });
}

function closeServer(s: net.Server | null): Promise<void> {
  return new Promise((r) => (s ? s.close(() => r()) : r()));
}
